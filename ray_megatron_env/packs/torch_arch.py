"""The ``torch-arch`` pack, opt-in: ``TORCH_CUDA_ARCH_LIST`` from the node's
own GPUs.

JIT-built CUDA kernels (torch.utils.cpp_extension: DeepEP, Transformer
Engine and Megatron fused kernels, custom ops) compile for the archs in
TORCH_CUDA_ARCH_LIST. PyTorch reads it in ``_get_cuda_arch_flags``
(torch/utils/cpp_extension.py): an empty value (``if not _arch_list``) is
its default, exactly as unset, and from 2.9 so is ``native``: the visible
GPUs' archs, the last with +PTX, which in a process that sees no GPU is
empty and ``arch_list[-1]`` fails the build. Otherwise spaces become ``;``,
named arches are expanded, the list is split on ``;``, and each entry must
be one of the release's ``supported_arches`` (with or without ``+PTX``) or
it raises ``ValueError`` (an empty entry too).

A list written for another node (an image's ``ENV``) builds kernels this
node cannot run (``no kernel image is available``). The node knows its own
GPUs, so it can say which list serves it; it cannot know which PyTorch the
job runs, so it writes only entries that every release from 2.7 to 2.13
accepts (``PORTABLE``), and it cannot know which kernels need an
arch-specific ``a`` target, so it never adds or strips one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Tuple

from ..names import ARCH_LIST_VARIABLE, TORCH_ARCH
from ..node import Capability, NodeFacts, format_capability
from .pack import KEEP, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, PREFERRED, REQUIRED, SET

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

_CPP_EXTENSION = "PyTorch torch/utils/cpp_extension.py _get_cuda_arch_flags"
# The PyTorch releases whose lists the pack's own values must pass: 2.7, the
# first whose cpp_extension knows 12.0 (2.6 ends at 10.0), to 2.13. Read from
# each release's wheel (torch/utils/cpp_extension.py):
#   2.7: supported_arches ... 9.0, 9.0a, 10.0, 10.0a, 10.1, 10.1a, 12.0, 12.0a
#   2.8: adds 10.3, 10.3a, 12.1, 12.1a
#   2.9 to 2.13: 10.1 and 10.1a removed, 11.0 and 11.0a added (CUDA 13 renamed
#   sm_101 to sm_110, pytorch/pytorch#166120); "native" read as unset.
# 2.6 ends at 10.0 (no 10.0a); every value written for a GPU before Blackwell
# passes it too.
TORCH_RANGE = "PyTorch 2.7 to 2.13"
PORTABLE = ((3, 5), (3, 7), (5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2),
            (7, 5), (8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (12, 0))
# Current PyTorch (2.9 to 2.13): what a value already there is read against.
SUPPORTED = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5",
             "8.0", "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a", "11.0", "11.0a",
             "10.3", "10.3a", "12.0", "12.0a", "12.1", "12.1a")
_VALID = frozenset(SUPPORTED) | frozenset(a + "+PTX" for a in SUPPORTED)
# Current PyTorch's named_arches, in its order (combined names before single
# ones, as its string replacement needs).
NAMED_ARCHES = (
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"), ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"), ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
    ("Blackwell+Tegra", "11.0"), ("Blackwell", "10.0;10.3;12.0;12.1+PTX"),
)
NATIVE = "native"

ROWS = (
    PackRow("unset",
            "NVIDIA GPUs on the node and TORCH_CUDA_ARCH_LIST unset, empty or 'native' "
            "(each is PyTorch's default)",
            SET, ((ARCH_LIST_VARIABLE, "the node's archs"),), PREFERRED,
            "the node's distinct archs, ascending, space separated (\"8.0\", \"8.6 12.0\"), "
            f"each the newest entry every {TORCH_RANGE} accepts that runs on the GPU (a 10.3 "
            "GPU gets 10.0, a 12.1 GPU 12.0: same-major SASS runs on a newer minor): every GPU "
            "here gets its own SASS, including in a process that sees no GPU, where PyTorch's "
            "default (the visible GPUs' archs) is empty and the build fails; a job's own empty "
            "value is kept, with a warning",
            f"{_CPP_EXTENSION} ('if not _arch_list' before splitting, and from 2.9 'or "
            "_arch_list == \"native\"': visible devices' archs, arch_list[-1] += '+PTX'); "
            "supported_arches of 2.7 to 2.13; CUDA binary compatibility"),
    PackRow("no-portable-arch",
            f"some GPU of the node has an arch for which no entry every {TORCH_RANGE} accepts "
            "runs (Thor: 10.1 up to 2.8, 11.0 from 2.9)",
            LEAVE, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "any value the pack could write is rejected by some of these releases "
            "('Unknown CUDA arch'); the value there, or PyTorch's default, stays, with a "
            "warning",
            f"{_CPP_EXTENSION} supported_arches of 2.7 to 2.13; pytorch/pytorch#166120 (10.1 "
            "rejected from 2.9)"),
    PackRow("misses-node-arch",
            "the value (the job's, or inherited from the node, e.g. an image's ENV) has "
            "neither SASS nor PTX for one of the node's GPUs, or an entry current PyTorch "
            "rejects (an empty entry in a non-empty list too: '8.0;', a double space)",
            SET, ((ARCH_LIST_VARIABLE, "the node's archs"),), REQUIRED,
            "kernels built from it fail on this node with 'no kernel image is available' "
            "(CUDA_ERROR_NO_BINARY_FOR_GPU), or a cached build for another generation is "
            "reused, or the build raises ValueError; an inherited value is replaced, a job's "
            "own is kept with a warning",
            f"{_CPP_EXTENSION} (one -gencode per entry; an entry outside supported_arches "
            "raises ValueError('Unknown CUDA arch')); NVIDIA-NeMo/RL#2723 (image pins "
            "\"9.0 10.0\"), NVIDIA/flashdreams PR #216"),
    PackRow("covers-node-archs",
            "the value has SASS for every GPU of the node (X.Y or X.Ya: \"9.0a\" covers 9.0; "
            "or the entry the pack itself would write: 10.0 on 10.3, 12.0 on 12.1); named "
            "arches as current PyTorch expands them (Blackwell is 10.0;10.3;12.0;12.1+PTX)",
            KEEP, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "it builds for this node; extra archs only cost build time; the 'a' suffix is "
            "the job's choice and stays",
            f"{_CPP_EXTENSION} (named_arches of 2.9 to 2.13)"),
    PackRow("covers-only-through-ptx",
            "the value covers some GPU of the node only through +PTX of an older arch, or "
            "through SASS of an older minor of the same major that is not the pack's own "
            "choice (8.0 on 8.6)",
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


def reads_as_default(value: str) -> bool:
    """Whether PyTorch takes its default path for ``value``: empty (``if not
    _arch_list``), or ``native`` (2.9 and later)."""
    return value == "" or value == NATIVE


def parse_arch_list(value: str) -> Tuple[List[Tuple[Capability, bool, bool]], List[str]]:
    """A non-default TORCH_CUDA_ARCH_LIST as current PyTorch reads it ->
    [(capability, 'a' suffix, +PTX)] and the entries it would reject (an
    empty one included)."""
    text = value.replace(" ", ";")
    for name, archs in NAMED_ARCHES:
        text = text.replace(name, archs)
    entries, rejected = [], []
    for entry in text.split(";"):
        if entry not in _VALID:
            rejected.append(entry)
            continue
        arch, ptx = entry[:-4] if entry.endswith("+PTX") else entry, entry.endswith("+PTX")
        specific = arch.endswith("a")
        major, minor = arch.rstrip("a").split(".")
        entries.append(((int(major), int(minor)), specific, ptx))
    return entries, rejected


def portable_arch(capability: Capability) -> Optional[Capability]:
    """The entry the pack writes for a GPU of ``capability``: its own arch
    where every release in the range accepts it, else the newest accepted
    minor below it in the same major (its SASS runs there); ``None`` where
    there is none."""
    fits = [arch for arch in PORTABLE if arch[0] == capability[0] and arch[1] <= capability[1]]
    return max(fits) if fits else None


def coverage(value: str, capability: Capability) -> str:
    """How ``value`` serves a GPU of ``capability``: 'sass' (its own code,
    'a' or not, or the pack's own portable entry for it), 'indirect' (PTX of
    an older arch, or SASS of another older minor of the same major), or
    'none'."""
    entries, _ = parse_arch_list(value)
    own = portable_arch(capability)
    if any(cap == capability or (cap == own and not specific) for cap, specific, _ in entries):
        return "sass"
    # Arch-specific ('a') code runs on that arch alone, its PTX too.
    if any(ptx and not specific and cap <= capability for cap, specific, ptx in entries) or \
            any(not specific and cap[0] == capability[0] and cap[1] < capability[1]
                for cap, specific, _ in entries):
        return "indirect"
    return "none"


def node_list(capabilities) -> str:
    """The value the pack writes for GPUs of ``capabilities`` (each has a
    portable arch)."""
    return " ".join(format_capability(c) for c in sorted({portable_arch(c) for c in capabilities}))


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
    where = f"GPUs {', '.join(format_capability(c) for c in archs)}"
    explicit = env_vars.get(ARCH_LIST_VARIABLE)
    seen = str(explicit) if explicit is not None else node_environ.get(ARCH_LIST_VARIABLE)
    orphans = [format_capability(c) for c in archs if portable_arch(c) is None]
    if orphans:
        outcome = _outcome("no-portable-arch", None,
                           f"{where}: no entry every {TORCH_RANGE} accepts runs on "
                           f"{', '.join(orphans)}; {ARCH_LIST_VARIABLE} is left as it is "
                           "[no-portable-arch]")
        return PackVerdict((outcome,), (f"{TORCH_ARCH} [no-portable-arch]: {outcome.reason}",))
    wanted = node_list(archs)
    if seen is None or reads_as_default(seen):
        said = "unset" if seen is None else f"{seen!r}, PyTorch's default,"
        return PackVerdict((_outcome("unset", wanted,
                                     f"{where}: {ARCH_LIST_VARIABLE} {said} builds for the visible GPUs "
                                     f"only; {wanted!r} builds for each [unset]"),))
    whose = "the job's" if explicit is not None else "the inherited"
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
    defaults=((ARCH_LIST_VARIABLE, "unset, empty (and from 2.9 'native'): the visible GPUs' archs, the "
                         "last +PTX; none visible: the build fails "
                         "(torch/utils/cpp_extension.py)"),),
)
