"""The run as a Chrome trace-event file: open it in ui.perfetto.dev or chrome://tracing.

``torchlint-sanitize --trace trace.json script.py`` (or ``session.write_trace``)
writes, from the report's ``timeline`` field:

- the steps as slices on a "steps" thread;
- host syncs as slices on the "host" thread, as long as the host waited;
- races, OOMs, new allocator segments and fragmentation verdicts as instant events;
- allocated and reserved bytes as two counter tracks (the memory check's
  watcher's looks, steps or no steps; a counter holds until its next value);
- the kernel launches the race check analysed, as instant events on one
  thread per stream.

One clock with the PyTorch profiler
-----------------------------------
Kineto (``torch.profiler``) stamps its events on the Unix epoch: its CPU
clock (``c10::getApproximateTime``, the TSC) is converted to wall-clock
nanoseconds by ``ApproximateClockToUnixTimeConverter``, and CUPTI's GPU
timestamps by ``unixEpochTimestamp``. Its exported trace holds
``"baseTimeNanoseconds"`` (Unix ns) and every ``ts`` is microseconds after it.
This file follows the same convention — ``baseTimeNanoseconds`` is the
session's start on the Unix epoch, taken next to the ``perf_counter`` reading
every event is measured from — so an event at ``ts`` in either file happened
at ``baseTimeNanoseconds + 1000 * ts``. Neither viewer reads
``baseTimeNanoseconds`` itself; ``merge`` shifts both files onto one base::

    python -m torchlint.sanitizer.trace merge trace.json kineto.pt.trace.json -o both.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional, Sequence

from torchlint.runtime_join import read_json_object

HOST_TID = 1
STEPS_TID = 2
ALLOCATOR_TID = 3
STREAM_TID_BASE = 100


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def _where(file: Optional[str], line: Optional[int]) -> str:
    if not file:
        return "<process>"
    return f"{file}:{line}" if line is not None else file


def trace_events(report: Dict[str, Any]) -> Dict[str, Any]:
    """The trace of one report (``{"traceEvents": [...], "baseTimeNanoseconds": ...}``)."""
    timeline = report.get("timeline")
    if report.get("inactive"):
        return _inactive_trace(report["inactive"])
    if not isinstance(timeline, dict):
        raise ValueError("the report has no timeline (written by torchlint before the timeline field existed?)")
    rank = timeline.get("rank")
    # The run's own pid, so a merged torch.profiler trace of the same process shows one process.
    pid = timeline.get("pid") or 1 + (int(rank) if isinstance(rank, int) else 0)
    label = "torchlint sanitizer" + (f" (rank {rank})" if rank is not None else "")
    device = report.get("device") or {}
    events: List[Dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": HOST_TID, "args": {"name": "host (syncs)"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": STEPS_TID, "args": {"name": "steps"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": ALLOCATOR_TID, "args": {"name": "allocator"}},
    ]
    previous = 0.0
    for index, end in enumerate(timeline.get("steps", [])):
        events.append(
            {
                "ph": "X",
                "name": f"step {index}",
                "cat": "step",
                "pid": pid,
                "tid": STEPS_TID,
                "ts": _us(previous),
                "dur": max(_us(end - previous), 0.001),
            }
        )
        previous = end
    for start, wait, kind, file, line, rule, step in timeline.get("syncs", []):
        events.append(
            {
                "ph": "X",
                "name": f"sync {kind}",
                "cat": "sync",
                "pid": pid,
                "tid": HOST_TID,
                "ts": _us(start),
                "dur": max(_us(wait or 0.0), 0.001),
                "args": {
                    "where": _where(file, line),
                    "rule": rule,
                    "step": step,
                    "host_wait_ms": None if wait is None else round(wait * 1e3, 4),
                },
            }
        )
    for t, allocated, reserved, _segments, _step in timeline.get("memory", []):
        events.append(
            {
                "ph": "C",
                "name": "GPU memory allocated",
                "cat": "memory",
                "pid": pid,
                "ts": _us(t),
                "args": {"bytes": allocated},
            }
        )
        events.append(
            {
                "ph": "C",
                "name": "GPU memory reserved",
                "cat": "memory",
                "pid": pid,
                "ts": _us(t),
                "args": {"bytes": reserved},
            }
        )
    for t, added, nbytes, file, line, step in timeline.get("segments", []):
        events.append(
            {
                "ph": "i",
                "s": "t",
                "name": f"{added} new segment(s)",
                "cat": "memory",
                "pid": pid,
                "tid": ALLOCATOR_TID,
                "ts": _us(t),
                "args": {"reserved_growth_bytes": nbytes, "seen_at": _where(file, line), "step": step},
            }
        )
    for t, reason, category, free_bytes, step in timeline.get("snapshots", []):
        if category:
            events.append(
                {
                    "ph": "i",
                    "s": "t",
                    "name": f"{category} fragmentation",
                    "cat": "memory",
                    "pid": pid,
                    "tid": ALLOCATOR_TID,
                    "ts": _us(t),
                    "args": {"trigger": reason, "free_bytes": free_bytes, "step": step},
                }
            )
    for t, nbytes, file, line, step in timeline.get("ooms", []):
        events.append(
            {
                "ph": "i",
                "s": "p",
                "name": "OOM",
                "cat": "oom",
                "pid": pid,
                "tid": ALLOCATOR_TID,
                "ts": _us(t),
                "args": {"requested_bytes": nbytes, "where": _where(file, line), "step": step},
            }
        )
    for t, file, line, step in timeline.get("races", []):
        events.append(
            {
                "ph": "i",
                "s": "p",
                "name": "race",
                "cat": "race",
                "pid": pid,
                "tid": HOST_TID,
                "ts": _us(t),
                "args": {"where": _where(file, line), "step": step},
            }
        )
    streams: Dict[str, int] = {}
    for t, stream, op in timeline.get("launches", []):
        tid = streams.get(stream)
        if tid is None:
            tid = streams[stream] = STREAM_TID_BASE + len(streams)
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": tid,
                    "args": {"name": f"stream {stream} (launches seen by the race check)"},
                }
            )
        events.append({"ph": "i", "s": "t", "name": op, "cat": "launch", "pid": pid, "tid": tid, "ts": _us(t)})
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": int(timeline["clock"]["unix_ns_at_start"]),
        "otherData": {
            "tool": "torchlint-sanitizer",
            "torch": report.get("torch"),
            "device": device.get("name"),
            "dropped": timeline.get("dropped", {}),
        },
    }


def _inactive_trace(reason: str) -> Dict[str, Any]:
    """A trace that says nothing ran: one instant event with the reason, at time 0."""
    import time

    text = f"GPU sanitizer inactive ({reason}): nothing was checked"
    return {
        "traceEvents": [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "torchlint sanitizer"}},
            {"ph": "i", "s": "g", "name": text, "cat": "inactive", "pid": 1, "tid": HOST_TID, "ts": 0.0},
        ],
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": time.time_ns(),
        "otherData": {"tool": "torchlint-sanitizer", "inactive": reason},
    }


def write_trace(path: str, report: Dict[str, Any]) -> None:
    _write_json(path, trace_events(report))


def merge(traces: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Several traces (ours, Kineto's, other ranks') on the earliest ``baseTimeNanoseconds``."""
    bases = [int(trace.get("baseTimeNanoseconds") or 0) for trace in traces]
    if not all(bases):
        raise ValueError("every trace needs baseTimeNanoseconds (torch.profiler's and torchlint's have it)")
    base = min(bases)
    events: List[Dict[str, Any]] = []
    named = set()  # one process_name per pid: the first trace's (ours and the profiler's share the pid)
    for trace, own_base in zip(traces, bases):
        shift = (own_base - base) / 1000.0
        for event in trace.get("traceEvents", []):
            if event.get("ph") == "M" and event.get("name") == "process_name":
                if event.get("pid") in named:
                    continue
                named.add(event.get("pid"))
            if "ts" in event:
                event = dict(event, ts=round(float(event["ts"]) + shift, 3))
            events.append(event)
    return {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": base}


def _write_json(path: str, data: Dict[str, Any]) -> None:
    from .report import write_atomically

    write_atomically(path, json.dumps(data, separators=(",", ":")))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchlint.sanitizer.trace",
        description="Sanitizer reports to Chrome traces, and traces merged on one clock.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser("convert", help="a sanitizer JSON report to a trace")
    convert.add_argument("report")
    convert.add_argument("-o", "--output", required=True)
    merging = commands.add_parser("merge", help="traces (ours, torch.profiler's) shifted onto one base time")
    merging.add_argument("traces", nargs="+")
    merging.add_argument("-o", "--output", required=True)
    args = parser.parse_args(argv)
    try:
        if args.command == "convert":
            report = read_json_object(args.report)
            try:
                trace = trace_events(report)
            except ValueError as error:
                raise ValueError(f"{args.report}: {error}") from None
            _write_json(args.output, trace)
        else:
            _write_json(args.output, merge([read_json_object(path, "trace") for path in args.traces]))
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
