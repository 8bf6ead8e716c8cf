"""One worker's decision on a node given by its GPUs, for the unit tables:
``decision.decide_node`` with the CUDA variable's job and node values
spelt as keywords."""

from typing import Mapping, Optional

from ray_megatron_env.decision import decide_node
from ray_megatron_env.record import Decision
from ray_megatron_env.names import CONNECTIONS_VARIABLE
from ray_megatron_env.node import NodeFacts, NodeGpus
from ray_megatron_env.spec import Spec


def decided(spec: Spec, gpus: NodeGpus, *, explicit: Optional[str] = None,
            inherited: Optional[str] = None,
            worker_env: Optional[Mapping[str, str]] = None) -> Decision:
    env_vars = dict(worker_env or {})
    if explicit is not None:
        env_vars[CONNECTIONS_VARIABLE] = explicit
    node_environ = {CONNECTIONS_VARIABLE: inherited} if inherited is not None else {}
    return decide_node(spec, NodeFacts(gpus), env_vars, node_environ).decision


UNSET = "unset"


def shown(decision: Decision) -> str:
    """A decision as the golden tables write it: the value and its strength,
    or ``unset``."""
    if decision.value is None:
        return UNSET
    strengths = set(decision.strengths.values())
    return f"{decision.value} ({'required' if 'required' in strengths else 'preferred'})"
