"""The package's version: one line on the bottom floor, so any module may
read it (the record carries it) without importing the package's face."""

__version__ = "0.2.0"
