"""The ``cuda-connections`` pack, always on: CUDA_DEVICE_MAX_CONNECTIONS.

Its table stays in ``rules.py`` and its evaluation in ``policy.py``, where
they have always been; this module only declares them as a pack, so that
the docs, ``explain`` and ``check`` can list every pack the same way. The
decision for its variable is today's precedence (``decision.decide``),
unchanged.
"""

from __future__ import annotations

from ..rules import CUDA_DEFAULT, RULES, VARIABLE, Rule
from . import CUDA_CONNECTIONS, LEAVE, PREFERRED, SET, Pack, PackRow


def _row(rule: Rule) -> PackRow:
    constraint = rule.requirement.is_constraint
    when = f"{rule.engine} engine on {rule.gpus}"
    return PackRow(rule.id, when, SET if constraint else LEAVE,
                   ((VARIABLE, rule.requirement.label),) if constraint else ((VARIABLE, ""),),
                   (f"required where {' or '.join(rule.required_by)} checks run, else preferred"
                    if rule.required_by else PREFERRED) if constraint else "none",
                   rule.why, rule.source)


PACK = Pack(
    name=CUDA_CONNECTIONS,
    summary=("How many hardware work queues CUDA gives each process. Megatron's tensor and "
             "context parallelism need 1 before Blackwell; FSDP-style and inference engines "
             "want more. The full table, with every condition, is in docs/rules.md."),
    variables=(VARIABLE,),
    node_facts=("the compute capability of every GPU (the oldest decides)",
                "the vendor of a node without NVIDIA GPUs"),
    config_facts=("each role's engine kind, tensor/context/expert parallel sizes, FSDP flags, "
                  "MoE overlap and the checks its framework runs (docs/field.md)",),
    rows=tuple(_row(rule) for rule in RULES),
    evaluate=None,
    defaults=((VARIABLE, f"{CUDA_DEFAULT} (CUDA)"),),
)
