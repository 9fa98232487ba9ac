"""The race check's report text: a ``Race`` of the engine, told with the user's names.

Pure functions over the engine's records (tested on CPU), and the helpers that
look up the user's variable names for streams and tensors in the user's frame.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Hashable, List

from ..findings import RACE, Finding, Frame
from .happens_before import CollectiveStream, Race
from .ops import DEFAULT_STREAM, TensorInfo


def _is_stream(value) -> bool:
    module = type(value).__module__
    return "cuda" in module and type(value).__name__ in ("Stream", "ExternalStream")


def _scope_items(frame) -> list:
    """(name, value) pairs of a frame's locals and globals, without keeping the locals alive.

    Reading ``f_locals`` of a function frame (Python < 3.13) caches a dict of
    strong references on the frame until it returns: a ``del x`` in the user's
    code would no longer free x, which would change what the allocator does
    (and hide the very reuse races this check looks for). So the cache is
    emptied right after the copy.
    """
    items = []
    if frame.f_code.co_flags & 0x1:  # CO_OPTIMIZED: a function frame, locals cached on read
        local_dict = frame.f_locals
        items.extend(local_dict.items())
        if sys.version_info < (3, 13):
            local_dict.clear()
    else:
        items.extend(frame.f_locals.items())
    items.extend(frame.f_globals.items())
    return items


def _user_frame():
    """The innermost user frame on the current stack (or None)."""
    try:
        from ..frames import is_user_file
    except ImportError:  # pragma: no cover
        return None
    frame = sys._getframe(1)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def _frames(site) -> List[Frame]:
    return [Frame(file, line, function) for file, line, function in (site or ())]


def _where(site) -> str:
    if not site:
        return "<unknown>"
    file, line, _ = site[0]
    return f"{file}:{line}" if line else file


def stream_label(key, names: Dict[Hashable, str]) -> str:
    if isinstance(key, CollectiveStream):
        return str(key)
    if key == DEFAULT_STREAM:
        return "the default stream"
    name = names.get(key)
    if name:
        return f"stream `{name}`"
    return f"stream {key:#x}" if isinstance(key, int) else f"stream {key}"


def stream_expr(key, names: Dict[Hashable, str], current: bool = False) -> str:
    """How to write the stream in code at the user's site."""
    if key == DEFAULT_STREAM:
        return "torch.cuda.current_stream()" if current else "torch.cuda.default_stream()"
    name = names.get(key)
    if name:
        return name
    return "side_stream" if isinstance(key, int) else str(key)


def describe_sync(race: Race, names: Dict[Hashable, str]) -> str:
    note = race.last_sync
    if note is None:
        return (
            f"{stream_label(race.later.stream, names)} and {stream_label(race.earlier.stream, names)} "
            "were never synchronized"
        )
    how = {
        "wait_stream": "wait_stream",
        "event": "an event wait",
        "stream_sync": "a stream synchronize (or a syncing call such as .item())",
        "event_sync": "Event.synchronize()",
        "device_sync": "torch.cuda.synchronize()",
        "work_wait": "Work.wait()",
        "collective_launch": "the collective launch",
    }.get(note.kind, note.kind)
    return (
        f"last synchronized by {how} at {_where(note.site)}, which covers "
        f"{stream_label(race.earlier.stream, names)} up to seq {note.covered_seq}; the first access is seq "
        f"{race.earlier.seq}, issued after it"
    )


def fix_hint(race: Race, names: Dict[Hashable, str], tensor_names: Dict[int, str]) -> str:
    earlier, later = race.earlier, race.later
    first, second = _where(earlier.site), _where(later.site)
    waiter = stream_expr(later.stream, names, current=True)
    waitee = stream_expr(earlier.stream, names)
    via = earlier.via or ()
    if via and via[0] == "collective":
        return (
            f"call `work.wait()` on the handle returned by {earlier.op} at {first} before {later.op} at {second} "
            f"(or pass async_op=False)"
        )
    if race.kind == "reuse":
        previous = earlier.alloc
        owner = tensor_names.get(getattr(previous, "start", -1), "the previous tensor")
        return (
            f"the memory was freed while {stream_label(earlier.stream, names)} could still use it: call "
            f"`{owner}.record_stream({waitee})` after its last use there ({first}), or make the allocating stream "
            f"wait for it (`torch.cuda.current_stream().wait_stream({waitee})`) before the tensor is freed"
        )
    if race.early_event is not None:
        return (
            f"the event waited on at {_where(race.early_event.site)} was recorded at "
            f"{_where(race.early_event.record_site)}, before {earlier.op} at {first}: record it after that "
            f"access (`event.record({waitee})` below {first}) and keep `event.wait({waiter})`"
        )
    if via and via[0] == "graph replay":
        return (
            f"after `graph.replay()` at {_where(via[1])} on {stream_label(earlier.stream, names)}, call "
            f"`{waiter}.wait_stream({waitee})` before {later.op} at {second}"
        )
    return (
        f"before {later.op} at {second}, make {stream_label(later.stream, names)} wait for "
        f"{stream_label(earlier.stream, names)}: `{waiter}.wait_stream({waitee})`, or record an event on "
        f"{waitee} after {earlier.op} at {first} and call `event.wait({waiter})`"
        + (
            f"; if the tensor is freed while {waitee} may still use it, also call `tensor.record_stream({waitee})`"
            if earlier.stream != DEFAULT_STREAM and later.stream == DEFAULT_STREAM and earlier.is_write is False
            else ""
        )
    )


def _access_json(record, names, stack) -> Dict[str, Any]:
    site = stack or record.site
    frames = _frames(site)
    data = {
        "op": record.op,
        "argument": record.arg,
        "mode": record.mode,
        "stream": stream_label(record.stream, names),
        "seq": record.seq,
        "bytes": [hex(record.start), hex(record.end)],
        "file": frames[0].file if frames else None,
        "line": frames[0].line if frames else None,
        "stack": [f.to_json() for f in frames],
    }
    if record.via:
        data["via"] = record.via[0]
        if record.via[0] == "graph replay":
            data["replay_site"] = _where(record.via[1])
    return data


def build_finding(race: Race, names, tensor_names, context) -> Finding:
    earlier, later = race.earlier, race.later
    later_stack = context.get("stack") or later.site
    frames = _frames(later_stack)
    tensor = TensorInfo.of(later.tensor) or TensorInfo.of(earlier.tensor)
    tensor_json = tensor.to_json() if isinstance(tensor, TensorInfo) else None
    tensor_name = None
    if isinstance(tensor, TensorInfo):
        tensor_name = tensor_names.get(tensor.base)
        if tensor_json is not None:
            tensor_json["name"] = tensor_name
            tensor_json["byte_ranges"] = {
                "first": [earlier.start - tensor.base, earlier.end - tensor.base],
                "second": [later.start - tensor.base, later.end - tensor.base],
                "overlap": [race.overlap[0] - tensor.base, race.overlap[1] - tensor.base],
            }
    described = ""
    if isinstance(tensor, TensorInfo):
        named = f"`{tensor_name}` " if tensor_name else ""
        described = f" on {named}{tuple(tensor.shape)} {str(tensor.dtype).replace('torch.', '')}"
    reuse = race.kind == "reuse"
    message = (
        f"{'allocator-reuse race' if reuse else 'cross-stream race'}{described}: "
        f"{earlier.mode} by {earlier.op} on {stream_label(earlier.stream, names)} ({_where(earlier.site)}) and "
        f"{later.mode} by {later.op} on {stream_label(later.stream, names)} ({_where(later_stack)}) are not ordered; "
        f"{describe_sync(race, names)}"
    )
    details: Dict[str, Any] = {
        "cause": race.kind,
        "tensor": tensor_json,
        "first": _access_json(earlier, names, None),
        "second": _access_json(later, names, later_stack),
        "last_sync": describe_sync(race, names),
        "never_synchronized": race.last_sync is None,
        "step": context.get("step"),
    }
    alloc = later.alloc
    if alloc is not None:
        details["allocation"] = {"file": _where(alloc.site), "stack": [f.to_json() for f in _frames(alloc.site)]}
    if reuse and earlier.alloc is not None:
        details["previous_owner"] = {
            "file": _where(earlier.alloc.site),
            "stack": [f.to_json() for f in _frames(earlier.alloc.site)],
            "bytes": [hex(earlier.alloc.start), hex(earlier.alloc.end)],
        }
    if race.early_event is not None:
        details["early_event"] = {
            "recorded_at": _where(race.early_event.record_site),
            "waited_at": _where(race.early_event.site),
        }
    first = frames[0] if frames else None
    return Finding(
        kind=RACE,
        severity="error",
        message=message,
        file=first.file if first else None,
        line=first.line if first else None,
        function=first.function if first else None,
        stack=frames,
        count=race.count,
        rule=None,
        fix_hint=fix_hint(race, names, tensor_names),
        details=details,
    )
