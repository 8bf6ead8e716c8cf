"""Megatron-Core's settings as the frameworks pass them, read as Megatron-Core
reads them (``transformer_config.py``, ``model_parallel_config.py``): the MoE
token dispatcher and its backend, the pipeline communication backend, the
MoE all-to-all overlap. Every reader that meets these keys reads them here;
their names are in ``engines`` (``DISPATCHER_KEYS``, ``SIZE_KEYS``, ...).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from .engines import (
    DISPATCHER_TYPES, FLEX_BACKENDS, MEGATRON_FLEX_BACKENDS, MOE_OVERLAP_KEY,
    PIPELINE_BACKEND_KEY, PIPELINE_BACKENDS,
)
from .errors import FieldValueError
from .names import FIELD
from .values import read_flag, read_name


def read_dispatcher(dispatcher_type: Any, backend: Any, enable_deepep: Any,
                    keys: Tuple[str, str, str]) -> Optional[str]:
    """The ``Engine.dispatcher`` of Megatron-Core settings as a framework
    passes them (``None`` where a setting is absent), read as Megatron-Core
    reads them (transformer_config.py): the flex dispatcher runs only when
    ``moe_token_dispatcher_type`` is "flex"; its backend defaults to deepep,
    and the deprecated ``moe_enable_deepep`` means deepep. ``keys`` name the
    three settings for errors."""
    type_key, backend_key, deepep_key = keys
    kind = None if dispatcher_type is None else _one_of(dispatcher_type, type_key,
                                                        DISPATCHER_TYPES)
    backend = None if backend is None else _one_of(backend, backend_key, MEGATRON_FLEX_BACKENDS)
    deepep = enable_deepep is not None and read_flag(enable_deepep, deepep_key)
    if kind != "flex":
        return None
    if deepep or backend is None:
        return "deepep"
    return backend if backend in FLEX_BACKENDS else None  # ncclep asks nothing


def _one_of(value: Any, key: str, allowed: Tuple[str, ...]) -> str:
    name = read_name(value, key)
    if name not in allowed:
        raise FieldValueError(f"{FIELD}: {key} is {name!r}; Megatron-Core accepts "
                              f"{', '.join(allowed)}")
    return name


def read_pipeline_backend(value: Any, key: str) -> Optional[str]:
    """Megatron-Core's ``pipeline_model_parallel_comm_backend`` (None: NCCL)."""
    return None if value is None else _one_of(value, key, PIPELINE_BACKENDS)


def read_config_keys(keys: Mapping[str, Any], where: str) -> Dict[str, Any]:
    """The MoE all-to-all overlap flag and the pipeline backend, from a
    mapping of Megatron-Core's TransformerConfig keys as a framework passes
    them (NeMo-RL's ``model_overrides``, SkyRL's ``transformer_config_kwargs``):
    only the keys present, as ``Engine`` fields."""
    settings: Dict[str, Any] = {}
    flag = keys.get(MOE_OVERLAP_KEY)
    if flag is not None:
        settings["moe_overlap"] = read_flag(flag, f"{where}.{MOE_OVERLAP_KEY}")
    backend = keys.get(PIPELINE_BACKEND_KEY)
    if backend is not None:
        settings["pipeline_backend"] = read_pipeline_backend(backend,
                                                             f"{where}.{PIPELINE_BACKEND_KEY}")
    return settings
