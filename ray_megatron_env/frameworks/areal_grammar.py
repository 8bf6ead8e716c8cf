"""AReaL's allocation grammar: one engine's backend and parallel layout as a
string (``actor.backend: "megatron:d2p2t2"``, ``rollout.backend:
"sglang:d4t2"``), and the deprecated top-level ``allocation_mode``
(``"sglang:d4+megatron:d2t2"``). A small, strict parser for
``ALLOCATION_GRAMMAR`` in areal/api/alloc_mode.py (AReaL 4aef98d8 and the
PyPI 1.0.4 wheel), kept to what the rules need: the backend, and TP, CP and
EP. Neither AReaL nor lark is needed. The AReaL reader (``areal.py``) calls it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..engines import FSDP, INFERENCE, MEGATRON
from ..errors import FieldValueError
from ..names import FIELD
from ..values import MAX_PARALLEL_SIZE, fail_type, read_name, show

# The deprecated top-level key holding every engine's allocation.
LEGACY = "allocation_mode"

# Backend -> kind. Archon is AReaL's PyTorch-native engine modelled on
# torchtitan: FSDP2 over a DeviceMesh, DTensor TP, Ulysses CP
# (docs/en/tutorial/archon.md), so it uses streams as FSDP does.
TRAIN_BACKENDS = {"megatron": MEGATRON, "fsdp": FSDP, "archon": FSDP}
INFER_BACKENDS = {"sglang": INFERENCE, "vllm": INFERENCE}

# Which dimension letters each part of the grammar takes.
TRAIN_DIMS = "dtpce"
ATTN_DIMS = "dtpc"
FFN_DIMS = "dtpe"
INFER_DIMS = "dtp"


@dataclass(frozen=True)
class Allocation:
    """One parsed component: ``megatron[actor]:d2t2`` and the like."""

    backend: str
    name: Optional[str]
    sizes: Tuple[Tuple[str, int], ...]  # letter -> size; hybrid MoE: attn t/c, ffn e
    text: str  # the component as written, for error messages

    def size(self, letter: str) -> int:
        return dict(self.sizes).get(letter, 1)

    @property
    def kind(self) -> str:
        return {**TRAIN_BACKENDS, **INFER_BACKENDS}[self.backend]


class _Scanner:
    """A cursor over one allocation string; every error names key and text."""

    def __init__(self, text: str, key: str) -> None:
        self.text, self.key, self.pos = text, key, 0

    def fail(self, what: str) -> FieldValueError:
        return FieldValueError(
            f"{FIELD}: {self.key} {show(self.text)} is not an AReaL allocation: {what} "
            f"(at character {self.pos + 1}; e.g. 'megatron:d2p2t2', "
            "'megatron:(attn:d2t2c1|ffn:e4t1)', 'sglang:d4t2')")

    def skip(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self, pattern: str) -> Optional[str]:
        self.skip()
        found = re.compile(pattern).match(self.text, self.pos)
        return found.group(0) if found else None

    def take(self, pattern: str, what: str) -> str:
        found = self.peek(pattern)
        if found is None:
            raise self.fail(f"expected {what}")
        self.pos += len(found)
        return found

    def at_end(self) -> bool:
        self.skip()
        return self.pos == len(self.text)


def _dims(scan: _Scanner, letters: str, section: str) -> Dict[str, int]:
    """One or more ``<letter><size>``; a letter twice is ambiguous, so an error."""
    sizes: Dict[str, int] = {}
    while not sizes or scan.peek("[A-Za-z]") is not None:
        letter = scan.peek("[A-Za-z]")
        if letter is None or letter not in letters:
            raise scan.fail(f"expected {section} dimension ({', '.join(letters)})"
                            + (f", not {letter!r}" if letter else ""))
        scan.pos += 1
        number = scan.take(r"[1-9][0-9]*", f"a size from 1 after {letter!r}")
        if letter in sizes:
            raise scan.fail(f"{letter!r} is given twice")
        if int(number) > MAX_PARALLEL_SIZE:
            raise scan.fail(f"{letter}{number} is over {MAX_PARALLEL_SIZE}")
        sizes[letter] = int(number)
    return sizes


def _single(scan: _Scanner) -> Allocation:
    scan.skip()
    start = scan.pos
    backends = ", ".join([*TRAIN_BACKENDS, *INFER_BACKENDS])
    word = scan.peek(r"[A-Za-z_][A-Za-z0-9_]*")
    if word is None or re.fullmatch(f"(?:[{TRAIN_DIMS}][0-9]+)+", word):
        raise scan.fail(f"it must start with a backend, one of {backends} (AReaL no "
                        "longer accepts bare dimensions)")
    if word not in TRAIN_BACKENDS and word not in INFER_BACKENDS:
        raise scan.fail(f"unknown backend {word!r}; AReaL's are {backends}")
    backend = scan.take(re.escape(word), word)
    name = None
    if scan.peek(r"\[") is not None:
        scan.take(r"\[", "'['")
        name = scan.take(r"[A-Za-z_][A-Za-z0-9_]*", "a name in brackets")
        scan.take(r"\]", "']'")
    scan.take(":", f"':' after {backend!r}")
    training = backend in TRAIN_BACKENDS
    if training and scan.peek(r"\(|attn(?![A-Za-z0-9_])") is not None:
        if name is not None:
            raise scan.fail("a named component cannot use the attn/ffn form")
        sizes = _hybrid(scan)
    else:
        sizes = _dims(scan, TRAIN_DIMS if training else INFER_DIMS,
                      "a training" if training else "an inference")
    found = Allocation(backend, name, tuple(sorted(sizes.items())),
                       scan.text[start:scan.pos].strip())
    if backend == "fsdp" and (found.size("p") > 1 or found.size("e") > 1):
        raise scan.fail("fsdp takes only d, t and c (AReaL rejects pipeline and expert "
                        "parallelism for it)")
    return found


def _hybrid(scan: _Scanner) -> Dict[str, int]:
    """``(attn:...|ffn:...)``: TP and CP come from attn, EP from ffn (ffn's t
    is the expert tensor parallel size, which no rule reads)."""
    opened = scan.peek(r"\(") is not None
    if opened:
        scan.take(r"\(", "'('")
    scan.take("attn", "'attn'")
    scan.take(":", "':' after 'attn'")
    attn = _dims(scan, ATTN_DIMS, "an attn")
    scan.take(r"\|", "'|ffn:' after the attn dimensions")
    scan.take("ffn", "'ffn'")
    scan.take(":", "':' after 'ffn'")
    ffn = _dims(scan, FFN_DIMS, "an ffn")
    if opened:
        scan.take(r"\)", "')' closing '(attn:...|ffn:...'")
    sizes = {k: v for k, v in attn.items() if k in "tc"}
    if "e" in ffn:
        sizes["e"] = ffn["e"]
    return sizes


def parse_backend(text: Any, key: str) -> Allocation:
    """One engine's ``backend`` string (``ModelAllocation.from_str``)."""
    scan = _start(text, key)
    if "+" in text:
        raise scan.fail("one engine's backend is a single component; '+' belongs only in "
                        "the deprecated allocation_mode")
    found = _single(scan)
    if not scan.at_end():
        raise scan.fail("unexpected text after the component")
    return found


def parse_allocation_mode(text: Any, key: str = LEGACY) -> List[Tuple[Allocation, bool]]:
    """The legacy expression: components joined by '+' (separate GPUs), each
    one or more joined by '|' (colocated). Returns (component, colocated)."""
    scan = _start(text, key)
    found: List[Tuple[Allocation, bool]] = []
    while True:
        found.append((_single(scan), False))
        while scan.peek(r"\|") is not None:
            scan.take(r"\|", "'|'")
            found.append((_single(scan), True))
        if scan.at_end():
            return found
        scan.take(r"\+", "'+', '|' or the end")


def _start(text: Any, key: str) -> _Scanner:
    if not isinstance(text, str):
        raise fail_type(key, "an AReaL allocation string like 'megatron:d2t2'", text)
    if "${" in text:
        read_name(text, key)  # the unresolved-interpolation message
    scan = _Scanner(text, key)
    if scan.at_end():
        raise scan.fail("it is empty")
    return scan
