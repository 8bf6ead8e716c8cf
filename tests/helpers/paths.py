"""Where the tests' data lives, for test modules at any depth under tests/."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent  # tests/
ROOT = TESTS.parent  # the repository
FIXTURES = TESTS / "fixtures"  # upstream configs and outputs, by framework or tool
FAKES = TESTS / "fakes"  # a fake nvidia-smi, a second plugin, a node without the package
GOLDEN = TESTS / "golden"  # expected values written from upstream sources
