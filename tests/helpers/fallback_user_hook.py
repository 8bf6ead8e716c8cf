"""A user's own worker_process_setup_hook, for tests/cluster/test_fallback.py."""

import os


def mark() -> None:
    os.environ["USER_HOOK_RAN"] = "string"
