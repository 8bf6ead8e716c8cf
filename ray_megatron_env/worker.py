"""Reading the decision back inside a worker (an actor or a task)."""

from __future__ import annotations

import os
from typing import Mapping, Optional

from .decision import DECISION_VARIABLE, Decision


def read_decision(environ: Optional[Mapping[str, str]] = None) -> Optional[Decision]:
    """The decision the plugin made for this worker's node, or ``None`` when
    the worker was started without the ``megatron_env`` field or on a node
    where the plugin is not registered."""
    text = (os.environ if environ is None else environ).get(DECISION_VARIABLE)
    return Decision.from_json(text) if text else None
