"""What happened when: the time series behind the HTML report and the trace.

The checks already see the events worth drawing; a few hook lines hand them
to the session's ``Timeline``:

- the session: every step boundary (``step``);
- the sync check: every recorded sync, with its host wait (``sync``) and the
  time its own bookkeeping took (``overhead``);
- the memory check: allocated/reserved at step boundaries (at most one raw
  stats call per ``MEMORY_SAMPLE_INTERVAL_S``), at each sample it already
  takes and at an OOM; new segments between two samples; triggered
  snapshots' verdicts (``memory``, ``snapshot``, ``oom``) — never a poll
  from a thread of its own;
- the race check: launches the race engine analysed (``launches``) and each
  new race (``race``).

Recording is cheap and bounded: one ``perf_counter`` read and a tuple append
per event, and each series keeps at most ``MAX_EVENTS`` entries (the rest are
counted in ``dropped``). Times are seconds since the session started; one
anchor pair ties them to the Unix epoch, the clock the PyTorch profiler's
(Kineto) traces use, so ``trace.py`` can line the two up.

The ``"timeline"`` field of the JSON report (version 1, additive)::

    {"version": 1,
     "clock": {"unix_ns_at_start": int, "duration_s": float},
     "rank": int | null,                      # RANK (or LOCAL_RANK) of the process
     "pid": int,                              # the process id (the trace's pid, as in torch.profiler's)
     "alloc_conf": str | null,                # PYTORCH_ALLOC_CONF (or the CUDA alias)
     "steps": [t, ...],                       # time each step ended, in order
     "syncs": [[t, wait_s | null, kind, file, line, rule | null, step], ...],
     "memory": [[t, allocated, reserved, segments, step], ...],
     "segments": [[t, added, bytes, file | null, line | null, step], ...],
     "snapshots": [[t, reason, category | null, free_bytes, step], ...],
     "ooms": [[t, bytes, file | null, line | null, step], ...],
     "races": [[t, file | null, line | null, step], ...],
     "launches": [[t, stream, op], ...],
     "overhead_s": {"sync": float, "memory": float, "race": float},
     "dropped": {"syncs": int, ...}}          # events past MAX_EVENTS per series

``t`` is seconds since the session started; ``step`` the 0-based count of
completed steps when the event happened. A new segment's ``file``/``line``
is the user's line running when the memory check saw the segment count rise
(its sample point), not necessarily the line whose allocation created it;
an OOM's line is the allocating line.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Optional

TIMELINE_VERSION = 1
MAX_EVENTS = 20000
# The memory chart's floor between two samples: one raw stats call (~8 µs) per
# millisecond at most keeps the chart under 1% of the run.
MEMORY_SAMPLE_INTERVAL_S = 0.001
SERIES = ("syncs", "memory", "segments", "snapshots", "ooms", "races", "launches")


def _rank() -> Optional[int]:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


class Timeline:
    """The session's event series; every method is safe to call from a hook."""

    def __init__(self, clock=time.perf_counter, max_events: int = MAX_EVENTS) -> None:
        self._clock = clock
        self.max_events = max_events
        self._t0 = clock()
        self._unix_ns_at_start = time.time_ns()
        self._end: Optional[float] = None
        self.rank = _rank()
        self.pid = os.getpid()
        self.alloc_conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        self.steps: List[float] = []
        self.series: Dict[str, List[list]] = {name: [] for name in SERIES}
        self.dropped: Dict[str, int] = {name: 0 for name in SERIES}
        self.overhead_s: Dict[str, float] = {"sync": 0.0, "memory": 0.0, "race": 0.0}
        self._last_segments: Optional[int] = None
        self._last_reserved = 0
        self._last_memory_sample = -float("inf")

    # -- time --
    def now(self) -> float:
        return self._clock() - self._t0

    def since_start(self, clock_value: float) -> float:
        """A raw clock reading (``perf_counter``) as seconds since the start."""
        return clock_value - self._t0

    def _add(self, name: str, row: list) -> None:
        rows = self.series[name]
        if len(rows) < self.max_events:
            rows.append(row)
        else:
            self.dropped[name] += 1

    # -- hooks --
    def step(self, index: int) -> None:
        if len(self.steps) < self.max_events * 5:
            self.steps.append(round(self.now(), 6))

    def sync(self, kind: str, file: str, line: int, wait_s: Optional[float], rule: Optional[str],
             step: int, ended_at: Optional[float] = None) -> None:
        end = self.since_start(ended_at) if ended_at is not None else self.now()
        start = end - (wait_s or 0.0)
        self._add("syncs", [round(start, 6), None if wait_s is None else round(wait_s, 7), kind, file, line, rule, step])

    def memory(self, allocated: int, reserved: int, segments: int, step: Optional[int],
               where: Optional[tuple] = None) -> None:
        """One allocator sample; a rise in the segment count becomes a ``segments`` event."""
        t = round(self.now(), 6)
        self._add("memory", [t, int(allocated), int(reserved), int(segments), step])
        previous = self._last_segments
        if previous is not None and segments > previous:
            file, line = where if where else (None, None)
            self._add("segments", [t, int(segments - previous), max(0, int(reserved - self._last_reserved)),
                                   file, line, step])
        self._last_segments = int(segments)
        self._last_reserved = int(reserved)

    def segments_grew(self, segments: int) -> bool:
        return self._last_segments is not None and segments > self._last_segments

    def memory_sample_due(self) -> bool:
        """At most one chart sample per ``MEMORY_SAMPLE_INTERVAL_S`` (asked at step boundaries)."""
        now = self._clock()
        if now - self._last_memory_sample < MEMORY_SAMPLE_INTERVAL_S:
            return False
        self._last_memory_sample = now
        return True

    def snapshot(self, reason: str, category: Optional[str], free_bytes: int, step: Optional[int]) -> None:
        self._add("snapshots", [round(self.now(), 6), reason, category, int(free_bytes), step])

    def oom(self, nbytes: int, file: Optional[str], line: Optional[int], step: Optional[int]) -> None:
        self._add("ooms", [round(self.now(), 6), int(nbytes), file, line, step])

    def race(self, file: Optional[str], line: Optional[int], step: Optional[int]) -> None:
        self._add("races", [round(self.now(), 6), file, line, step])

    def launches(self, rows) -> None:
        """``rows``: ``(stream, op)`` pairs the race engine analysed just now."""
        t = round(self.now(), 6)
        room = self.max_events - len(self.series["launches"])
        rows = list(rows)
        for stream, op in rows[:max(0, room)]:
            self.series["launches"].append([t, str(stream), str(op)])
        if len(rows) > room:
            self.dropped["launches"] += len(rows) - max(0, room)

    def overhead(self, check: str, seconds: float) -> None:
        self.overhead_s[check] = self.overhead_s.get(check, 0.0) + seconds

    def stop(self) -> None:
        if self._end is None:
            self._end = self.now()

    # -- the report field --
    def to_json(self) -> Dict[str, Any]:
        duration = self._end if self._end is not None else self.now()
        data: Dict[str, Any] = {
            "version": TIMELINE_VERSION,
            "clock": {"unix_ns_at_start": self._unix_ns_at_start, "duration_s": round(duration, 6)},
            "rank": self.rank,
            "pid": self.pid,
            "alloc_conf": self.alloc_conf,
            "steps": list(self.steps),
        }
        for name in SERIES:
            data[name] = [list(row) for row in self.series[name]]
        data["overhead_s"] = {name: round(value, 6) for name, value in self.overhead_s.items()}
        data["dropped"] = dict(self.dropped)
        return data


def of(session: Any) -> Optional[Timeline]:
    """The session's timeline, or None (checks are also driven by fake sessions in tests)."""
    return getattr(session, "timeline", None)
