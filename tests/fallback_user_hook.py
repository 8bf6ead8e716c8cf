"""A user's own worker_process_setup_hook, for tests/test_fallback_cluster.py."""

import os


def mark() -> None:
    os.environ["USER_HOOK_RAN"] = "string"
