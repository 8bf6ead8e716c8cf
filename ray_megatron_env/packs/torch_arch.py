"""The ``torch-arch`` pack, opt-in: ``TORCH_CUDA_ARCH_LIST`` from the node's
own GPUs.

JIT-built CUDA kernels (torch.utils.cpp_extension: DeepEP, Transformer
Engine and Megatron fused kernels, custom ops) compile for the archs in
TORCH_CUDA_ARCH_LIST. PyTorch reads it in ``_get_cuda_arch_flags``
(torch/utils/cpp_extension.py): spaces become ``;``, named arches
("Ampere" -> "8.0;8.6+PTX") are expanded, the list is split on ``;``, and
each entry ``X.Y`` (or ``X.Ya``) gives SASS for that arch, ``+PTX`` PTX
besides; an entry it does not know raises ``ValueError``. Unset, it takes
the visible GPUs' archs (the last with +PTX), and in a process that sees no
GPU that list is empty and ``arch_list[-1]`` fails the build.

A list written for another node (an image's ``ENV``) builds kernels this
node cannot run (``no kernel image is available``). The node knows its own
GPUs, so it can say which list serves it; it cannot know which kernels need
an arch-specific ``a`` target, so it never adds or strips one.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Tuple

from ..node import Capability, NodeFacts, format_capability
from .pack import (
    KEEP, LEAVE, NONE, PREFERRED, REQUIRED, SET, TORCH_ARCH, Outcome, Pack, PackRow, PackVerdict,
)

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

ARCH_LIST_VARIABLE = "TORCH_CUDA_ARCH_LIST"
_CPP_EXTENSION = "PyTorch torch/utils/cpp_extension.py _get_cuda_arch_flags"
# PyTorch's named_arches, in its order (combined names before single ones,
# as its string replacement needs).
NAMED_ARCHES = (
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"), ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"), ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "10.1"), ("Blackwell", "10.0;12.0+PTX"),
)
_ENTRY = re.compile(r"^(\d+)\.(\d+)(a?)(\+PTX)?$")

ROWS = (
    PackRow("unset",
            "NVIDIA GPUs on the node and TORCH_CUDA_ARCH_LIST unset",
            SET, ((ARCH_LIST_VARIABLE, "the node's archs"),), PREFERRED,
            "the node's distinct compute capabilities, ascending, space separated "
            "(\"8.0\", \"8.6 12.0\"): every GPU here gets its own SASS, including in a "
            "process that sees no GPU, where PyTorch's default (the visible GPUs' archs) "
            "is empty and the build fails",
            f"{_CPP_EXTENSION} (unset: visible devices' archs, arch_list[-1] += '+PTX')"),
    PackRow("misses-node-arch",
            "the value (the job's, or inherited from the node, e.g. an image's ENV) has "
            "neither SASS nor PTX for one of the node's GPUs, or an entry PyTorch rejects",
            SET, ((ARCH_LIST_VARIABLE, "the node's archs"),), REQUIRED,
            "kernels built from it fail on this node with 'no kernel image is available' "
            "(CUDA_ERROR_NO_BINARY_FOR_GPU), or a cached build for another generation is "
            "reused; an inherited value is replaced, a job's own is kept with a warning",
            f"{_CPP_EXTENSION} (one -gencode per entry; an unknown entry raises ValueError); "
            "NVIDIA-NeMo/RL#2723 (image pins \"9.0 10.0\"), NVIDIA/flashdreams PR #216"),
    PackRow("covers-node-archs",
            "the value has SASS for every GPU of the node (X.Y or X.Ya: \"9.0a\" covers 9.0)",
            KEEP, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "it builds for this node; extra archs only cost build time; the 'a' suffix is "
            "the job's choice and stays",
            _CPP_EXTENSION),
    PackRow("covers-only-through-ptx",
            "the value covers some GPU of the node only through +PTX of an older arch, or "
            "through SASS of an older minor of the same major (8.0 on 8.6)",
            KEEP, ((ARCH_LIST_VARIABLE, ""),), PREFERRED,
            "it runs, but +PTX is JIT-compiled by the driver at first launch, and older SASS "
            "lacks that arch's own features; kept with a warning",
            f"{_CPP_EXTENSION} ('+PTX' adds code=compute_XY); CUDA binary compatibility "
            "(SASS for X.y runs on X.z, z >= y; PTX is JIT-compiled for newer GPUs)"),
    PackRow("leave",
            "no NVIDIA GPU, or the GPUs could not be read",
            LEAVE, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "nothing for the node to say; PyTorch's own default applies",
            _CPP_EXTENSION),
)
_BY_ID = {row.id: row for row in ROWS}


def parse_arch_list(value: str) -> Tuple[List[Tuple[Capability, bool, bool]], List[str]]:
    """TORCH_CUDA_ARCH_LIST as PyTorch reads it -> [(capability, 'a' suffix,
    +PTX)] and the entries it would reject (an empty one included)."""
    text = value.replace(" ", ";")
    for name, archs in NAMED_ARCHES:
        text = text.replace(name, archs)
    entries, rejected = [], []
    for entry in text.split(";"):
        match = _ENTRY.match(entry)
        if match is None:
            rejected.append(entry)
        else:
            entries.append(((int(match.group(1)), int(match.group(2))), bool(match.group(3)),
                            bool(match.group(4))))
    return entries, rejected


def coverage(value: str, capability: Capability) -> str:
    """How ``value`` serves a GPU of ``capability``: 'sass' (its own code,
    'a' or not), 'indirect' (PTX of an older arch, or SASS of an older minor
    of the same major), or 'none'."""
    entries, _ = parse_arch_list(value)
    if any(cap == capability for cap, _, _ in entries):
        return "sass"
    # Arch-specific ('a') code runs on that arch alone, its PTX too.
    if any(ptx and not specific and cap <= capability for cap, specific, ptx in entries) or \
            any(not specific and cap[0] == capability[0] and cap[1] < capability[1]
                for cap, specific, _ in entries):
        return "indirect"
    return "none"


def node_list(capabilities) -> str:
    return " ".join(format_capability(c) for c in sorted(set(capabilities)))


def _outcome(rule_id: str, value: Optional[str], reason: str) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(ARCH_LIST_VARIABLE, row.action, value, row.strength, row.id, reason)


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome, and a warning where it keeps
    a value that serves the node only indirectly."""
    gpus = facts.gpus
    if not gpus.capabilities:
        warnings = () if gpus.is_known else (
            f"{TORCH_ARCH}: the node's GPUs could not be read ({gpus.error}); "
            f"{ARCH_LIST_VARIABLE} is left as it is",)
        return PackVerdict((_outcome("leave", None, f"{gpus.describe()}: nothing to decide "
                                                     "[leave]"),), warnings)
    archs = sorted(set(gpus.capabilities))
    wanted = node_list(archs)
    where = f"GPUs {', '.join(format_capability(c) for c in archs)}"
    explicit = env_vars.get(ARCH_LIST_VARIABLE)
    seen = str(explicit) if explicit is not None else node_environ.get(ARCH_LIST_VARIABLE)
    if seen is None:
        return PackVerdict((_outcome("unset", wanted, f"{where}: builds for each [unset]"),))
    whose = "the job's" if explicit is not None else "the node's"
    served = {cap: coverage(seen, cap) for cap in archs}
    _, rejected = parse_arch_list(seen)
    missing = [format_capability(c) for c, how in served.items() if how == "none"]
    if missing or rejected:
        problems = ([f"no code for {', '.join(missing)}"] if missing else []) + \
            ([f"PyTorch rejects {', '.join(repr(r) for r in rejected)}"] if rejected else [])
        return PackVerdict((_outcome(
            "misses-node-arch", wanted,
            f"{where}: {whose} {ARCH_LIST_VARIABLE}={seen!r} has {'; '.join(problems)} "
            "[misses-node-arch]"),))
    indirect = [format_capability(c) for c, how in served.items() if how == "indirect"]
    if indirect:
        outcome = _outcome("covers-only-through-ptx", seen,
                           f"{where}: {whose} {ARCH_LIST_VARIABLE}={seen!r} serves "
                           f"{', '.join(indirect)} only through +PTX (JIT at first launch) or "
                           "an older minor's SASS [covers-only-through-ptx]")
        return PackVerdict((outcome,), (f"{TORCH_ARCH} [covers-only-through-ptx]: "
                                        f"{outcome.reason}; {wanted!r} would build for each",))
    return PackVerdict((_outcome("covers-node-archs", seen,
                                 f"{where}: {whose} {ARCH_LIST_VARIABLE}={seen!r} has code for "
                                 "each [covers-node-archs]"),))


PACK = Pack(
    name=TORCH_ARCH,
    summary=("TORCH_CUDA_ARCH_LIST, the archs JIT-built CUDA kernels compile for, from each "
             "node's own GPUs. PyTorch's default (unset) takes the visible GPUs, which is "
             "right in a process that sees this node's GPUs and fails in one that sees none; "
             "a list baked into an image for other GPUs builds kernels this node cannot run. "
             "Leave the pack out where no job builds kernels at run time, or where every "
             "node's image already lists its GPUs."),
    variables=(ARCH_LIST_VARIABLE,),
    node_facts=("the compute capability of each NVIDIA GPU on the node (the GPU probe)",),
    config_facts=("the job's own TORCH_CUDA_ARCH_LIST (its env_vars), else the node's",),
    rows=ROWS,
    evaluate=evaluate,
    defaults=((ARCH_LIST_VARIABLE, "the visible GPUs' archs, the last +PTX; none visible: the "
                                   "build fails (torch/utils/cpp_extension.py)"),),
)
