"""The errors a user can get from a bad ``megatron_env`` value.

Both subclass the built-in error a caller would expect (``TypeError`` for a
value of the wrong type, ``ValueError`` for a wrong value), so code that
already catches those keeps working, and ``MegatronEnvError`` catches both.
"""


class MegatronEnvError(Exception):
    """Base class: the ``megatron_env`` field or config is not usable."""


class FieldTypeError(MegatronEnvError, TypeError):
    """A key holds a value of the wrong type."""


class FieldValueError(MegatronEnvError, ValueError):
    """A key holds a value of the right type that is not allowed."""


class RegistrationError(MegatronEnvError, ValueError):
    """RAY_RUNTIME_ENV_PLUGINS cannot be merged without losing something."""


class NodeSelectionError(MegatronEnvError, ValueError):
    """A node asked for by ID or IP is not an alive node of the cluster."""


class EnvironmentVariableError(MegatronEnvError, ValueError):
    """A RAY_MEGATRON_ENV_* variable this package reads has a value it cannot use."""
