"""The ``torch-arch`` pack, opt-in: ``TORCH_CUDA_ARCH_LIST`` from the node's
own GPUs.

CUDA kernels built through torch.utils.cpp_extension (DeepEP's setup.py,
Megatron-Core's load_inline(..., with_cuda=True) in nccl_allocator.py and
inference/unified_memory.py, custom ops) compile for the archs in
TORCH_CUDA_ARCH_LIST. PyTorch reads it in ``_get_cuda_arch_flags``
(torch/utils/cpp_extension.py), unless the extension's own flags already
name an arch: an empty value (``if not _arch_list``) is its default, exactly
as unset, and from 2.9 so is ``native``: the visible GPUs' archs, the last
with +PTX, which in a process that sees no GPU is empty and
``arch_list[-1]`` fails the build. Otherwise spaces become ``;``, named
arches are expanded, the list is split on ``;``, and each entry must be one
of the release's ``supported_arches`` (with or without ``+PTX``) or it
raises ``ValueError`` (an empty entry too, and in 2.7 and 2.8 ``native``).

A list written for another node (an image's ``ENV``) builds kernels this
node cannot run (``no kernel image is available``). The node knows its own
GPUs, so it can say which list serves it; it cannot know which PyTorch the
job runs, so it writes only entries that every release from 2.7 to 2.15
accepts (``PORTABLE``), reads a value as the newest release does and warns
where an older one rejects it, and it cannot know which kernels need an
arch-specific ``a`` target, so it never adds or strips one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from ..names import ARCH_LIST_VARIABLE, TORCH_ARCH
from ..node import Capability, NodeFacts, format_capability
from .pack import KEEP, LEAVE, NONE, Outcome, Pack, PackRow, PackVerdict, PREFERRED, REQUIRED, SET

if TYPE_CHECKING:  # pragma: no cover
    from ..spec import Spec

_CPP_EXTENSION = "PyTorch torch/utils/cpp_extension.py _get_cuda_arch_flags"
NATIVE = "native"


class Release(NamedTuple):
    """What one run of PyTorch releases accepts in TORCH_CUDA_ARCH_LIST."""

    first: str
    last: str
    supported: Tuple[str, ...]  # supported_arches
    named: Tuple[Tuple[str, str], ...]  # named_arches, in its order
    native_is_default: bool  # 'or _arch_list == "native"' (2.9 and later)

    @property
    def name(self) -> str:
        return self.first if self.first == self.last else f"{self.first} to {self.last}"


# Read from each release's wheel, torch/utils/cpp_extension.py
# _get_cuda_arch_flags (2.7.0, 2.8.0, 2.9.0 to 2.13.0, 2.14.0, 2.14.1, 2.15.0;
# 2.6 ends at 10.0, without 10.0a). Combined names stay above single ones, as
# PyTorch's string replacement needs.
_TO_10_0 = ("3.5", "3.7", "5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0",
            "8.6", "8.7", "8.9", "9.0", "9.0a", "10.0", "10.0a")
_NAMED_TO_HOPPER = (
    ("Kepler+Tesla", "3.7"), ("Kepler", "3.5+PTX"), ("Maxwell+Tegra", "5.3"),
    ("Maxwell", "5.0;5.2+PTX"), ("Pascal", "6.0;6.1+PTX"), ("Volta+Tegra", "7.2"),
    ("Volta", "7.0+PTX"), ("Turing", "7.5+PTX"), ("Ampere+Tegra", "8.7"),
    ("Ampere", "8.0;8.6+PTX"), ("Ada", "8.9+PTX"), ("Hopper", "9.0+PTX"),
)
_BLACKWELL = ("Blackwell", "10.0;10.3;12.0;12.1+PTX")
RELEASES = (
    Release("2.7", "2.7", _TO_10_0 + ("10.1", "10.1a", "12.0", "12.0a"),
            _NAMED_TO_HOPPER + (("Blackwell+Tegra", "10.1"), ("Blackwell", "10.0;12.0+PTX")),
            False),
    Release("2.8", "2.8", _TO_10_0 + ("10.1", "10.1a", "10.3", "10.3a", "12.0", "12.0a", "12.1",
                                      "12.1a"),
            _NAMED_TO_HOPPER + (("Blackwell+Tegra", "10.1"), _BLACKWELL), False),
    # CUDA 13 renamed Thor from sm_101 to sm_110 (pytorch/pytorch#166120).
    Release("2.9", "2.13", _TO_10_0 + ("11.0", "11.0a", "10.3", "10.3a", "12.0", "12.0a", "12.1",
                                       "12.1a"),
            _NAMED_TO_HOPPER + (("Blackwell+Tegra", "11.0"), _BLACKWELL), True),
    Release("2.14", "2.15", _TO_10_0 + ("11.0", "11.0a", "10.3", "10.3a", "10.7", "10.7a", "12.0",
                                        "12.0a", "12.1", "12.1a"),
            _NAMED_TO_HOPPER + (("Blackwell+Tegra", "11.0"), _BLACKWELL, ("Rubin", "10.7+PTX")),
            True),
)
CURRENT = RELEASES[-1]  # how a value already there is read
TORCH_RANGE = f"PyTorch {RELEASES[0].first} to {CURRENT.last}"


def _capability(arch: str) -> Capability:
    major, minor = arch.rstrip("a").split(".")
    return int(major), int(minor)


# The archs every release in the range accepts, the only ones the pack writes.
PORTABLE = tuple(sorted(_capability(a) for a in set.intersection(
    *(set(r.supported) for r in RELEASES)) if not a.endswith("a")))

ROWS = (
    PackRow("unset",
            "NVIDIA GPUs on the node and TORCH_CUDA_ARCH_LIST unset, empty, or 'native' "
            "(each PyTorch's default; 'native' from 2.9)",
            SET, ((ARCH_LIST_VARIABLE, "the node's archs"),), PREFERRED,
            "the node's distinct archs, ascending, space separated (\"8.0\", \"8.6 12.0\"): "
            f"each GPU's own arch where every {TORCH_RANGE} accepts it, else the newest "
            "entry they all accept in its major, with +PTX (a 10.1, 10.3 or 10.7 GPU gets "
            "10.0+PTX, a 12.1 GPU 12.0+PTX): same-major SASS is meant to run on a newer "
            "minor, but that is contested on GB10, so the PTX, which the driver JIT-compiles "
            "for the GPU, is there if the SASS is refused. Every GPU here gets code, "
            "including in a process that sees no GPU, where PyTorch's default (the visible "
            "GPUs' archs) is empty and the build fails; a job's own empty value or 'native' "
            "is kept, with a warning (for 'native', that 2.7 and 2.8 reject it)",
            f"{_CPP_EXTENSION} ('if not _arch_list' before splitting, and from 2.9 'or "
            "_arch_list == \"native\"': visible devices' archs, arch_list[-1] += '+PTX'); "
            f"supported_arches of {RELEASES[0].first} to {CURRENT.last}; CUDA binary "
            "compatibility; against it on GB10, NVIDIA/cuvs PR #2568 (cudaLibraryGetKernel "
            "rejects an sm_120 cubin on 12.1) and FlashInfer flashinfer/compilation_context.py "
            "(each 12.x its own cubin 'to avoid running SM120 code on SM121'); slime "
            "docker/Dockerfile.gb10 sets \"12.0+PTX\""),
    PackRow("no-portable-arch",
            f"some GPU of the node has an arch for which no entry every {TORCH_RANGE} accepts "
            "runs: another major than any such entry (Thor under CUDA 13 reports 11.0, which "
            "2.7 and 2.8 reject; under CUDA 12 it reports 10.1 and gets 10.0+PTX)",
            LEAVE, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "any value the pack could write is rejected by some of these releases "
            "('Unknown CUDA arch') or has no code for that GPU; the value there, or "
            "PyTorch's default, stays, with a warning",
            f"{_CPP_EXTENSION} supported_arches of {RELEASES[0].first} to {CURRENT.last}; "
            "pytorch/pytorch#166120 (CUDA 13 renamed Thor's sm_101 to sm_110: 10.1 rejected "
            "from 2.9, 11.0 accepted from 2.9); CUDA binary compatibility (SASS runs only "
            "within its major)"),
    PackRow("misses-node-arch",
            "the value (the job's, or inherited from the node, e.g. an image's ENV) has "
            "neither SASS nor PTX for one of the node's GPUs, or an entry the newest release "
            f"({CURRENT.name}) rejects (an empty entry in a non-empty list too: '8.0;', a "
            "double space)",
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
            "or the entry the pack itself would write: 10.0+PTX on 10.3, 12.0+PTX on 12.1); "
            f"named arches as {CURRENT.name} expand them (Blackwell is "
            "10.0;10.3;12.0;12.1+PTX, Rubin 10.7+PTX)",
            KEEP, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "it builds for this node; extra archs only cost build time; the 'a' suffix is "
            "the job's choice and stays",
            f"{_CPP_EXTENSION} (named_arches of {CURRENT.name})"),
    PackRow("covers-only-through-ptx",
            "the value covers some GPU of the node only through +PTX of an older arch, or "
            "through SASS of an older minor of the same major without the pack's +PTX (8.0 "
            "on 8.6, 12.0 on 12.1)",
            KEEP, ((ARCH_LIST_VARIABLE, ""),), PREFERRED,
            "it runs, but +PTX is JIT-compiled by the driver at first launch, and older SASS "
            "lacks that arch's own features (and on GB10 may be refused); kept with a warning",
            f"{_CPP_EXTENSION} ('+PTX' adds code=compute_XY); CUDA binary compatibility "
            "(SASS for X.y runs on X.z, z >= y; PTX is JIT-compiled for newer GPUs)"),
    PackRow("older-torch-rejects",
            "a value that stays (the job's own, or an inherited one that serves the node) has "
            f"an entry the newest releases ({CURRENT.name}) accept and an older release of "
            "the range rejects: 10.7, 10.7a and Rubin before 2.14, 11.0 "
            "and 11.0a before 2.9, 10.3 and 12.1 in 2.7, 'native' in 2.7 and 2.8",
            LEAVE, (), NONE,
            "a warning that names those releases, nothing set: which PyTorch the job runs is "
            "not the node's to know, and under such a release the build raises "
            "ValueError('Unknown CUDA arch (...) or GPU not supported')",
            f"{_CPP_EXTENSION} (supported_arches and named_arches of each release; 2.7 and "
            "2.8 test only 'if not _arch_list', so 'native' is split and checked as an arch)"),
    PackRow("leave",
            "no NVIDIA GPU, or the GPUs could not be read",
            LEAVE, ((ARCH_LIST_VARIABLE, ""),), NONE,
            "nothing for the node to say; PyTorch's own default applies",
            _CPP_EXTENSION),
)
_BY_ID = {row.id: row for row in ROWS}


def reads_as_default(value: str, release: Release = CURRENT) -> bool:
    """Whether ``release`` takes its default path for ``value``: empty (``if
    not _arch_list``), or ``native`` (2.9 and later)."""
    return value == "" or (value == NATIVE and release.native_is_default)


def parse_arch_list(value: str, release: Release = CURRENT
                    ) -> Tuple[List[Tuple[Capability, bool, bool]], List[str]]:
    """A non-default TORCH_CUDA_ARCH_LIST as ``release`` reads it ->
    [(capability, 'a' suffix, +PTX)] and the entries it would reject (an
    empty one included)."""
    text = value.replace(" ", ";")
    for name, archs in release.named:
        text = text.replace(name, archs)
    valid = frozenset(release.supported) | frozenset(a + "+PTX" for a in release.supported)
    entries, rejected = [], []
    for entry in text.split(";"):
        if entry not in valid:
            rejected.append(entry)
            continue
        arch, ptx = entry[:-4] if entry.endswith("+PTX") else entry, entry.endswith("+PTX")
        entries.append((_capability(arch), arch.endswith("a"), ptx))
    return entries, rejected


def older_rejections(value: str) -> List[Tuple[str, List[str]]]:
    """(releases, entries) for each run of consecutive older releases that
    rejects the same entries of ``value`` the newest accepts, oldest first."""
    current = [] if reads_as_default(value) else parse_arch_list(value)[1]
    runs: List[Tuple[str, str, List[str]]] = []
    previous: List[str] = []
    for release in RELEASES[:-1]:
        rejected = [] if reads_as_default(value, release) else \
            [e for e in parse_arch_list(value, release)[1] if e not in current]
        if rejected and rejected == previous:
            runs[-1] = (runs[-1][0], release.last, rejected)
        elif rejected:
            runs.append((release.first, release.last, rejected))
        previous = rejected
    return [(first if first == last else f"{first} to {last}", rejected)
            for first, last, rejected in runs]


def portable_arch(capability: Capability) -> Optional[Tuple[Capability, bool]]:
    """The entry the pack writes for a GPU of ``capability``: (its own arch,
    no PTX) where every release in the range accepts it, else (the newest
    accepted minor below it in the same major, with +PTX); ``None`` where
    there is none."""
    fits = [arch for arch in PORTABLE if arch[0] == capability[0] and arch[1] <= capability[1]]
    if not fits:
        return None
    arch = max(fits)
    return arch, arch != capability


def coverage(value: str, capability: Capability) -> str:
    """How ``value`` (as the newest release reads it) serves a GPU of
    ``capability``: 'sass' (its own code, 'a' or not, or the pack's own
    entry for it), 'indirect' (PTX of an older arch, or SASS of another
    older minor of the same major), or 'none'."""
    entries, _ = parse_arch_list(value)
    own, own_ptx = portable_arch(capability) or (None, False)
    if any(cap == capability or (cap == own and not specific and (ptx or not own_ptx))
           for cap, specific, ptx in entries):
        return "sass"
    # Arch-specific ('a') code runs on that arch alone, its PTX too.
    if any(ptx and not specific and cap <= capability for cap, specific, ptx in entries) or \
            any(not specific and cap[0] == capability[0] and cap[1] < capability[1]
                for cap, specific, _ in entries):
        return "indirect"
    return "none"


def node_list(capabilities) -> str:
    """The value the pack writes for GPUs of ``capabilities`` (each has a
    portable arch): one entry per arch, +PTX where a GPU needs it."""
    ptx: Dict[Capability, bool] = {}
    for capability in capabilities:
        arch, needs = portable_arch(capability)
        ptx[arch] = ptx.get(arch, False) or needs
    return " ".join(format_capability(a) + ("+PTX" if ptx[a] else "") for a in sorted(ptx))


def _outcome(rule_id: str, value: Optional[str], reason: str) -> Outcome:
    row = _BY_ID[rule_id]
    return Outcome(ARCH_LIST_VARIABLE, row.action, value, row.strength, row.id, reason)


def _older_warning(where: str, whose: str, value: str) -> Tuple[str, ...]:
    """The [older-torch-rejects] warning for a value that stays, if any."""
    runs = older_rejections(value)
    if not runs:
        return ()
    said = "; ".join(f"PyTorch {releases} reject{'s' if ' to ' not in releases else ''} "
                     f"{', '.join(repr(e) for e in entries)}" for releases, entries in runs)
    return (f"{TORCH_ARCH} [older-torch-rejects]: {where}: {whose} {ARCH_LIST_VARIABLE}="
            f"{value!r} stays (read as by PyTorch {CURRENT.name}), but {said} "
            "(ValueError: Unknown CUDA arch) [older-torch-rejects]",)


def evaluate(spec: Spec, facts: NodeFacts, env_vars: Mapping[str, Any],
             node_environ: Mapping[str, str]) -> PackVerdict:
    """The pack's rows on one node: one outcome, and warnings where it keeps
    a value that serves the node only indirectly, or that an older PyTorch
    of the range rejects."""
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
    whose = "the job's" if explicit is not None else "the inherited"
    if seen is None or reads_as_default(seen):
        said = "unset" if seen is None else f"{seen!r}, PyTorch's default,"
        # An inherited default is replaced; only the job's own stays.
        older = _older_warning(where, whose, seen) if explicit is not None else ()
        return PackVerdict((_outcome("unset", wanted,
                                     f"{where}: {ARCH_LIST_VARIABLE} {said} builds for the "
                                     f"visible GPUs only; {wanted!r} builds for each "
                                     "[unset]"),), older)
    served = {cap: coverage(seen, cap) for cap in archs}
    _, rejected = parse_arch_list(seen)
    missing = [format_capability(c) for c, how in served.items() if how == "none"]
    if missing or rejected:
        problems = ([f"no code for {', '.join(missing)}"] if missing else []) + \
            ([f"PyTorch {CURRENT.name} rejects {', '.join(repr(r) for r in rejected)}"]
             if rejected else [])
        older = _older_warning(where, whose, seen) if explicit is not None else ()
        return PackVerdict((_outcome(
            "misses-node-arch", wanted,
            f"{where}: {whose} {ARCH_LIST_VARIABLE}={seen!r} has {'; '.join(problems)} "
            "[misses-node-arch]"),), older)
    older = _older_warning(where, whose, seen)
    indirect = [format_capability(c) for c, how in served.items() if how == "indirect"]
    if indirect:
        outcome = _outcome("covers-only-through-ptx", seen,
                           f"{where}: {whose} {ARCH_LIST_VARIABLE}={seen!r} serves "
                           f"{', '.join(indirect)} only through +PTX (JIT at first launch) or "
                           "an older minor's SASS [covers-only-through-ptx]")
        return PackVerdict((outcome,), (f"{TORCH_ARCH} [covers-only-through-ptx]: "
                                        f"{outcome.reason}; {wanted!r} would build for each",)
                           + older)
    return PackVerdict((_outcome("covers-node-archs", seen,
                                 f"{where}: {whose} {ARCH_LIST_VARIABLE}={seen!r} has code for "
                                 "each [covers-node-archs]"),), older)


PACK = Pack(
    name=TORCH_ARCH,
    summary=("TORCH_CUDA_ARCH_LIST, the archs CUDA kernels built through PyTorch's "
             "cpp_extension (at run time or in a job's setup.py) compile for, from each "
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
    defaults=((ARCH_LIST_VARIABLE, "unset, empty (and from 2.9 'native'): the visible GPUs' "
                                   "archs, the last +PTX; none visible: the build fails "
                                   "(torch/utils/cpp_extension.py)"),),
)
