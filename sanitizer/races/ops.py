"""How the race check classifies an op's memory accesses: the Python twin of ``race_tap.cpp``.

The native tap does the same in C++ (``classify`` and ``access_of`` there);
``tests/sanitizer/test_race_tap_properties.py`` holds the two to the same
results. Per op: ``Tensor(a!)`` arguments are writes, other tensor arguments
reads, fresh outputs writes; views (non-writing aliases), the inputs of
``*_like``/``new_*`` factories and Python numbers touch no memory; ``empty*``
allocates without writing. A site is the user's stack at the op, captured as
code pointers and symbolized only when a report reads it.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ..frames import raw_user_stack as _raw_user_stack
from ..frames import user_frames_of

DEFAULT_STREAM = 0  # cudaStream_t of the legacy default stream
SITE_FRAMES = 4  # frames kept per access (cheap); races get 8 for the later access
LONG_SITE_FRAMES = 8  # frames kept for a sync, an event or a collective
NO_USER_FRAME = (("<no user frame: autograd engine or library thread>", 0, "?"),)

# Ops whose tensor inputs are used for metadata only.
_METADATA_INPUT_PREFIXES = ("new_",)
_METADATA_INPUT_SUFFIXES = ("_like",)
# Ops that allocate without touching memory.
NO_WRITE_OUTPUT = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}

SKIP = "skip"
RECORD_STREAM = "record_stream"
PLAIN = "plain"


# torch._C._profiler.gather_traceback / symbolize_tracebacks, bound by
# bind_tracebacks() where this torch has them.
_gather: Optional[Callable[..., Any]] = None
_symbolize: Optional[Callable[..., Any]] = None


def bind_tracebacks(torch) -> None:
    global _gather, _symbolize
    profiler = getattr(torch._C, "_profiler", None)
    if (
        _gather is None
        and profiler is not None
        and hasattr(profiler, "gather_traceback")
        and hasattr(profiler, "symbolize_tracebacks")
    ):
        _gather, _symbolize = profiler.gather_traceback, profiler.symbolize_tracebacks


class Site:
    """The user's stack at one op, captured as code pointers and symbolized on first use.

    Every analysed op needs its site, but only the few that end up in a report
    are ever read: capturing (one C call, no frame objects) is a fraction of
    the cost of walking the stack in Python. Behaves as the tuple of
    ``(file, line, function)`` frames it stands for (``==``, ``hash``,
    indexing, iteration).
    """

    __slots__ = ("_traceback", "_frames")
    LIMIT = SITE_FRAMES  # user frames kept when symbolized

    def __init__(self, traceback):
        self._traceback = traceback
        self._frames = None

    def frames(self) -> tuple:
        frames = self._frames
        if frames is None:
            try:
                if _symbolize is None:
                    raise RuntimeError("tracebacks are not bound (bind_tracebacks)")
                entries = _symbolize([self._traceback])[0]
                user = user_frames_of(((e["filename"], e["line"], e["name"]) for e in entries), self.LIMIT)
            except Exception:
                user = None
            frames = self._frames = tuple(user) if user else NO_USER_FRAME
            self._traceback = None  # the code objects it pins are no longer needed
        return frames

    def __iter__(self):
        return iter(self.frames())

    def __len__(self) -> int:
        return len(self.frames())

    def __getitem__(self, index):
        return self.frames()[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, Site):
            other = other.frames()
        return self.frames() == other

    def __hash__(self) -> int:
        return hash(self.frames())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.frames()!r})"


class LongSite(Site):
    """A ``Site`` that keeps more frames: syncs, events and collectives are rare and explain a report."""

    __slots__ = ()
    LIMIT = LONG_SITE_FRAMES


def capture_site():
    if _gather is not None:
        return Site(_gather(True, False, False))
    frames, _, _ = _raw_user_stack(limit=SITE_FRAMES, skip=2)
    return tuple(frames) if frames else NO_USER_FRAME


def capture_long_site():
    if _gather is not None:
        return LongSite(_gather(True, False, False))
    frames, _, _ = _raw_user_stack(limit=LONG_SITE_FRAMES, skip=2)
    return tuple(frames) if frames else NO_USER_FRAME


_LABELS: Dict[str, List[str]] = {}


def list_labels(name: str, count: int) -> List[str]:
    """``["name[0]", "name[1]", ...]`` (at least ``count`` of them), cached."""
    labels = _LABELS.get(name)
    if labels is None or len(labels) < count:
        labels = _LABELS[name] = [f"{name}[{position}]" for position in range(max(count, 16))]
    return labels


def plan(func) -> tuple:
    """How an op touches memory, from its schema: (kind, inputs, output_writes, name, is_c10d)."""
    schema = func._schema
    name = schema.name.split("::")[-1]
    namespace = schema.name.split("::")[0]
    collective = namespace in ("c10d", "_c10d_functional")
    if name == "record_stream":
        return (RECORD_STREAM, (), False, name, False)
    metadata_inputs = name.startswith(_METADATA_INPUT_PREFIXES) or name.endswith(_METADATA_INPUT_SUFFIXES)
    inputs = []
    for index, arg in enumerate(schema.arguments):
        type_text = str(arg.type)
        if "Tensor" not in type_text:
            continue
        alias = arg.alias_info
        is_write = bool(alias is not None and alias.is_write)
        if alias is not None and not is_write:
            continue  # a view's base: no memory touched
        if metadata_inputs and not is_write:
            continue
        inputs.append((index, arg.name, is_write, "List" in type_text or "[]" in type_text, arg.kwarg_only))
    output_write = name not in NO_WRITE_OUTPUT and any(
        "Tensor" in str(ret.type) and ret.alias_info is None for ret in schema.returns
    )
    if not inputs and not output_write:
        return (SKIP, (), False, name, collective)
    return (PLAIN, tuple(inputs), output_write, name, collective)


class TensorInfo:
    """What a report needs about a tensor, captured at access time (the tensor may die)."""

    __slots__ = ("shape", "dtype", "storage_offset", "base", "data_ptr", "stride")

    def __init__(self, shape, dtype, storage_offset, base, data_ptr, stride):
        self.shape = shape
        self.dtype = dtype
        self.storage_offset = storage_offset
        self.base = base
        self.data_ptr = data_ptr
        self.stride = stride

    @classmethod
    def of(cls, value) -> Optional["TensorInfo"]:
        """Reports take the tuple the hot path stored (shape, dtype, offset, base, data_ptr, stride)."""
        if isinstance(value, cls) or value is None:
            return value
        return cls(*value)

    def to_json(self) -> Dict[str, Any]:
        return {
            "shape": list(self.shape),
            "dtype": str(self.dtype).replace("torch.", ""),
            "stride": list(self.stride) if self.stride is not None else None,
            "storage_offset": self.storage_offset,
            "storage_base": hex(self.base),
            "data_ptr": hex(self.data_ptr),
        }
