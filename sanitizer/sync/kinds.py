"""What a sync is: its kind, the static rule for the same line, and the fix.

A sync's *kind* names the operation that made the host wait (``.item()``, a
print of a tensor, ``torch.cuda.synchronize()``...). A wrapper that caught it
names the kind exactly; a sync that arrived only through torch's warning is
classified from the torch frame below the user's line and the line's text
(``classify``). Each kind maps to the static rule that flags the same code
and to the change a user makes (``KINDS``). Nothing here imports torch.
"""

from __future__ import annotations

import os
import re
from typing import AbstractSet, Dict, Optional, Tuple

# kind -> (static rule, label, fix hint)
KINDS: Dict[str, Tuple[Optional[str], str, str]] = {
    "item": (
        "TL101",
        ".item() / float(t) / int(t)",
        "keep the value on the GPU, or batch the reads into one torch.stack(...).cpu() outside the step",
    ),
    "tolist": ("TL101", ".tolist()", "read back once after the step, or keep the result on the GPU"),
    "cpu": (
        "TL101",
        ".cpu() / .to('cpu')",
        "copy into pinned memory with non_blocking=True and read after a later sync, or defer the read-back",
    ),
    "numpy": ("TL101", ".numpy()", "defer the read-back: convert outside the hot loop"),
    "bool": (
        "TL101",
        "implicit bool (if/while/assert on a tensor)",
        "use torch.where / masking instead of Python control flow on a GPU value",
    ),
    "format": (
        "TL101",
        "print / format of a tensor",
        "log detached GPU values every N steps, or accumulate and print after the loop",
    ),
    "nonzero": (
        "TL103",
        "nonzero / torch.where(cond) / masked_select",
        "use the 3-argument torch.where or a mask multiply; pass size= where the API allows",
    ),
    "mask-index": (
        "TL103",
        "boolean-mask indexing",
        "use torch.where(mask, x, y) or x * mask instead of x[mask]; x[mask] = scalar does not sync",
    ),
    "unique": ("TL103", "unique", "pass a known upper bound, or move the unique out of the step"),
    "synchronize": (
        "TL102",
        "explicit synchronize",
        "remove it, or replace it with an event record/wait between streams",
    ),
    "event-sync": (
        "TL102",
        "Event.synchronize",
        "use stream.wait_event(event) to order streams without blocking the host",
    ),
    "empty-cache": (
        "TL303",
        "torch.cuda.empty_cache()",
        "do not empty the cache inside the loop; it syncs the device and forces cudaMalloc later",
    ),
    "pageable-copy": (
        "TL202",
        "non_blocking copy from pageable memory",
        "pin the host tensor (DataLoader(pin_memory=True), or pin_memory()) so non_blocking=True is asynchronous",
    ),
    "copy": (
        None,
        "blocking host-to-device copy",
        "pin the source and pass non_blocking=True, or create the tensor on the device",
    ),
    # A host tensor moved again and again: the fix is to stop moving it, not to pin it.
    "host-slice": (
        "TL204",
        "copy of a slice of a long-lived host tensor",
        "move the whole host tensor to the device once, before the loop, and slice it there",
    ),
    "host-built": (
        "TL204",
        "host-built tensor (numpy / Python data) copied to the device",
        "create it on the device (torch.randn(..., device=...), torch.normal(..., device=...)) "
        "instead of building it on the host and copying it every step",
    ),
    "backward": (
        None,
        "sync inside backward()",
        "find the op with a data-dependent shape in forward (boolean-mask indexing, nonzero, unique) "
        "whose backward syncs, and change it there",
    ),
    "other": (None, "synchronizing CUDA operation", "find the op on this line that reads a GPU value on the host"),
}

# A blocking host-to-device copy stands for the rule whose fix removes the wait, which
# depends on what the run saw of its source: pinned memory needs only non_blocking=True
# (TL201); pageable memory needs pinning first (TL202, the DataLoader's pin_memory).
COPY_FROM = {
    True: ("TL201", "pass non_blocking=True: the source is already pinned, so the copy need not block the host"),
    False: ("TL202", "pin the source (DataLoader(pin_memory=True), or pin_memory()) and pass non_blocking=True"),
}


def rule_for(kind: str, pinned: Optional[AbstractSet[bool]]) -> Optional[str]:
    """The static rule of a sync kind; for a copy, from the pinnedness the run saw of its source
    (``pinned``: a set of the values seen, or None when unknown)."""
    if kind == "copy":
        if pinned and len(pinned) == 1:
            return COPY_FROM[next(iter(pinned))][0]
        return None  # unknown (seen only through torch's warning) or both seen
    return KINDS[kind][0]


def fix_for(kind: str, pinned: Optional[AbstractSet[bool]]) -> str:
    """The fix hint of a sync kind, a copy's from what the run saw of its source."""
    if kind == "copy" and pinned and len(pinned) == 1:
        return COPY_FROM[next(iter(pinned))][1]
    return KINDS[kind][2]


# Source-line patterns, in priority order. The first group holds the kinds
# whose entry points are not wrapped all the time: when a sync arrives through
# the warning hook with no wrapper running, those are the likely causes.
_UNWRAPPED_PATTERNS = [
    # The autograd engine's syncs reach the user at the line that started backward.
    ("backward", re.compile(r"\.backward\s*\(|\bautograd\.(?:backward|grad)\s*\(")),
    # Built on the host from numpy (or Python data) and made a CUDA tensor on the spot: before
    # mask-index, since such lines index shapes (``np.random.normal(0, 1, (x.shape[0], n))``).
    ("host-built", re.compile(r"\b(?:np|numpy)\.\w")),
    ("nonzero", re.compile(r"\b(?:masked_select|argwhere|where)\s*\(")),
    ("mask-index", re.compile(r"\w[\w\)\]]*\s*\[[^\]]")),
    ("cpu", re.compile(r"\.to\s*\(\s*(?:device\s*=\s*)?(?:torch\.device\s*\()?['\"]cpu")),
    ("copy", re.compile(r"\b(?:tensor|as_tensor|from_numpy)\s*\(|\.(?:to|cuda|copy_|type)\s*\(")),
]
_WRAPPED_PATTERNS = [
    ("event-sync", re.compile(r"event\w*\.synchronize\s*\(", re.IGNORECASE)),
    ("synchronize", re.compile(r"\bsynchronize\s*\(")),
    ("empty-cache", re.compile(r"\bempty_cache\s*\(")),
    ("tolist", re.compile(r"\.tolist\s*\(")),
    ("numpy", re.compile(r"\.numpy\s*\(")),
    ("item", re.compile(r"\.item\s*\(")),
    ("cpu", re.compile(r"\.cpu\s*\(|\.to\s*\(\s*(?:device\s*=\s*)?(?:torch\.device\s*\()?['\"]cpu")),
    ("unique", re.compile(r"\bunique(?:_consecutive)?\s*\(")),
    ("nonzero", re.compile(r"\bnonzero\s*\(")),
    ("format", re.compile(r"\b(?:print|repr|str|format)\s*\(|\bf['\"]|\.format\s*\(|%\s*\(?\w|\blog\w*\.\w+\s*\(")),
    ("item", re.compile(r"\b(?:float|int)\s*\(")),
    ("bool", re.compile(r"^\s*(?:if|elif|while|assert)\b|\b(?:and|or|not)\b|\bbool\s*\(|\bif\b.*\belse\b")),
]

# The torch function on the stack names the cause when the user line cannot.
_LIBRARY_HINTS = [
    ("_tensor_str.py", None, "format"),
    ("_tensor.py", "__format__", "format"),
    ("_tensor.py", "__repr__", "format"),
    ("functional.py", "unique", "unique"),
    ("functional.py", "_return_output", "unique"),
    ("functional.py", "_consecutive", "unique"),
    ("grad_scaler.py", None, "item"),
    ("streams.py", "Event.synchronize", "event-sync"),
    ("streams.py", "Stream.synchronize", "synchronize"),
    ("memory.py", "empty_cache", "empty-cache"),
    ("_tensor.py", "backward", "backward"),
]

# The torch.autograd functions that run the engine: a sync under them is the backward of some op.
_AUTOGRAD_ENTRY = ("backward", "grad", "_engine_run_backward")
# A host-built copy is told from the user's line: numpy data made into a tensor on it.
HOST_BUILT_LINE = re.compile(r"\b(?:np|numpy)\.\w")
# A read of a value just chosen on the device (the next token of a sampling or decoding loop):
# the read is applied straight to the choice, e.g. ``torch.multinomial(p, 1).item()``.
_HOST_CHOICE = re.compile(
    r"\b(?:multinomial|argmax|argmin|topk|sample\w*|choice)\s*\((?:[^()]|\([^()]*\))*\)\s*(?:\[[^\]]*\]\s*)?"
    r"\.(?:item|tolist|cpu)\s*\("
)


def chooses_on_host(source_line: str) -> bool:
    """The line reads back a value it has just chosen on the device (a sampled or argmax'd token)."""
    return bool(_HOST_CHOICE.search(_strip_comment(source_line)))


# Kinds the user asks for on purpose: a wait for the whole device (or one stream or event).
EXPLICIT_SYNC_KINDS = ("synchronize", "event-sync")
# A clock read: the lines right after an explicit synchronize that read one time the region it ends.
_CLOCK_READ = re.compile(
    r"\b(?:time\.(?:time|perf_counter|monotonic)(?:_ns)?|perf_counter(?:_ns)?|monotonic(?:_ns)?|default_timer)\s*\(\s*\)"
    r"|\.elapsed_time\s*\("
)
# How many code lines after a synchronize may hold the clock read that makes it a timer.
CLOCK_LOOKAHEAD = 3


def reads_clock(source_line: str) -> bool:
    """The line reads a wall clock (``time.time()``, ``perf_counter()``) or an event's elapsed time."""
    return bool(_CLOCK_READ.search(_strip_comment(source_line)))


def builds_on_host(source_line: str) -> bool:
    """The line builds its tensor from numpy data (a host-built tensor copied to the device)."""
    return bool(HOST_BUILT_LINE.search(_strip_comment(source_line)))


def classify(source_line: str, library: Optional[Tuple[str, int, str]] = None, wrapped_ran: bool = False) -> str:
    """The sync kind of a warning-path sync, from the torch frame and the user's line.

    ``wrapped_ran`` is False when no timed wrapper was running: the entry
    points with wrappers are then unlikely causes, so the unwrapped kinds are
    tried first.
    """
    if library is not None:
        base = os.path.basename(library[0])
        parts = library[0].replace("\\", "/").split("/")
        if "autograd" in parts and library[2].split(".")[-1] in _AUTOGRAD_ENTRY:
            return "backward"
        for file_name, function, kind in _LIBRARY_HINTS:
            if base == file_name and (function is None or library[2].endswith(function)):
                return kind
    code = _strip_comment(source_line)
    groups = (_WRAPPED_PATTERNS,) if wrapped_ran else (_UNWRAPPED_PATTERNS, _WRAPPED_PATTERNS)
    for group in groups:
        for kind, pattern in group:
            if pattern.search(code):
                return kind
    return "other"


def _strip_comment(line: str) -> str:
    # Good enough for classification: a '#' inside a string is rare on a sync line.
    index = line.find("#")
    return line if index < 0 else line[:index]
