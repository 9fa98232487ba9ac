"""What happened when: the time series behind the HTML report and the trace.

The checks already see the events worth drawing; a few hook lines hand them
to the session's ``Timeline``:

- the session: every step boundary (``step``);
- the sync check: every recorded sync, with its host wait (``sync``) and the
  time its own bookkeeping took (``overhead``);
- the memory check's look (made by the step sample every 50 ms while the
  program steps, by a watcher thread every 20 ms when it does not, and once
  more at the program's end and at the session's end): allocated/reserved
  bytes (``memory``), each segment the allocator mapped (``new_segments``),
  triggered snapshots' verdicts (``snapshot``); the OOM observer adds the state at an OOM (``memory``,
  ``oom``). The memory series has one owner, this one: the check keeps no
  copy of it;
- the race check: launches the race engine analysed (``launches``) and each
  new race (``race``);
- the session's phase hooks (``phases.py``): compilation and ``torch.save``
  intervals and each ``Module.eval()`` (``phase_begin``/``phase_end``,
  ``mark``); the NVML sampler: the GPU's utilization (``utilization``).

Recording is cheap and bounded: one ``perf_counter`` read and a short list
append per event, and each event series keeps at most ``MAX_EVENTS`` entries
(the rest are counted in ``dropped``). The memory series is a sampled curve,
not events, so it is bounded differently (``MemorySeries``): a sample equal
to the previous one is not stored (an idle stretch costs nothing and stays a
gap the HTML report can cut short), and once ``MAX_MEMORY_ROWS`` rows are
stored, neighbouring rows merge in pairs into one row holding their maxima,
and later samples are merged in windows of the same width, so a long run
keeps its whole span and its peaks at a coarser resolution (the merged-away
samples are counted in ``dropped["memory"]``). Times are seconds since the
session started; one anchor pair ties them to the Unix epoch, the clock the
PyTorch profiler's (Kineto) traces use, so ``trace.py`` can line the two up.

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
     "phases": [[start, end | null, name], ...],   # compilation, checkpointing; evaluation marks have end null
     "utilization": [[t, percent], ...],          # NVML utilization.gpu samples (every other kept once full)
     "overhead_s": {"sync": float, "memory": float, "race": float},
     "dropped": {"syncs": int, ...}}          # events past MAX_EVENTS per series;
                                              # memory: samples merged into a neighbour

``t`` is seconds since the session started; ``step`` the 0-based count of
completed steps when the event happened. A ``memory`` row is the allocator's
state from ``t`` until the next row (a step curve: rows are written when the
state changed, and the last one holds until ``duration_s``); a merged row
holds the maxima of the samples it replaced, at the first one's ``t``. A
``segments`` row is one look of the watcher that saw ``added`` new
``cudaMalloc`` segments and reserved memory grow by ``bytes``; its
``file``/``line`` is the user's line the program was at when the watcher saw
them, not necessarily the line whose allocation mapped them; an OOM's line
is the allocating line. Reports written before the watcher fed the series
hold one ``memory`` row per sampled step boundary instead; they read the
same way.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

TIMELINE_VERSION = 1
MAX_EVENTS = 20000
# Rows of the memory curve kept before neighbours merge: about 200 KB of JSON,
# and 80 s of a run whose memory changes at every 20 ms look before the first merge.
MAX_MEMORY_ROWS = 4096
SERIES = ("syncs", "memory", "segments", "snapshots", "ooms", "races", "launches", "phases", "utilization")


def _rank() -> Optional[int]:
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


class MemorySeries:
    """The allocated/reserved curve: change points only, bounded by merging neighbours.

    Written by the memory check's look (the step sample on the main thread,
    or the watcher thread) and, at an OOM, by the allocating thread: one
    lock, taken once per look.
    """

    def __init__(self, now: Callable[[], float], max_rows: int = MAX_MEMORY_ROWS) -> None:
        self._now = now
        self.max_rows = max(2, max_rows)
        self.rows: List[list] = []
        self.merged = 0  # samples folded into a neighbour's row
        self._width = 1  # samples per stored row since the last merge of pairs
        self._open: Optional[list] = None  # the row filling up while _width > 1
        self._open_count = 0
        self._last: Optional[tuple] = None
        self._latest: Optional[tuple] = None  # the last sample as it was: the curve ends on it, never on a maximum
        self._lock = threading.Lock()

    def add(self, allocated: int, reserved: int, segments: int, step: Optional[int]) -> None:
        state = (allocated, reserved, segments)
        with self._lock:  # the time is read inside: two writers never store rows out of order
            if state == self._last:
                return  # the curve holds its value until the next change
            t = round(self._now(), 6)
            self._last = state
            self._latest = (t, allocated, reserved, segments, step)
            row = self._open
            if row is None:
                self._open = [t, allocated, reserved, segments, step]
            else:
                row[1], row[2], row[3] = max(row[1], allocated), max(row[2], reserved), max(row[3], segments)
                self.merged += 1
            self._open_count += 1
            if self._open_count >= self._width and self._open is not None:
                self.rows.append(self._open)
                self._open, self._open_count = None, 0
                if len(self.rows) >= self.max_rows:
                    self._merge_pairs()

    def _merge_pairs(self) -> None:
        rows = self.rows
        merged = []
        for first, second in zip(rows[::2], rows[1::2]):
            merged.append(
                [first[0], max(first[1], second[1]), max(first[2], second[2]), max(first[3], second[3]), first[4]]
            )
        if len(rows) % 2:
            merged.append(rows[-1])
        self.merged += len(rows) // 2
        self.rows = merged
        self._width *= 2

    def to_json(self) -> List[list]:
        with self._lock:
            rows = [list(row) for row in self.rows]
            if self._open is not None:
                rows.append(list(self._open))
            if self._latest is not None and (not rows or rows[-1] != list(self._latest)):
                rows.append(list(self._latest))
        return rows


class Timeline:
    """The session's event series; every method is safe to call from a hook."""

    def __init__(
        self, clock=time.perf_counter, max_events: int = MAX_EVENTS, max_memory_rows: int = MAX_MEMORY_ROWS
    ) -> None:
        self._clock = clock
        self.max_events = max_events
        self._t0 = clock()
        self._unix_ns_at_start = time.time_ns()
        self._end: Optional[float] = None
        self.rank = _rank()
        self.pid = os.getpid()
        self.alloc_conf = os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF")
        self.steps: List[float] = []
        self.series: Dict[str, List[list]] = {name: [] for name in SERIES if name != "memory"}
        self.memory_series = MemorySeries(self.now, max_memory_rows)
        self.dropped: Dict[str, int] = {name: 0 for name in SERIES}
        self.overhead_s: Dict[str, float] = {"sync": 0.0, "memory": 0.0, "race": 0.0}
        self._utilization_seen = 0
        self._utilization_stride = 1

    # -- time --
    def now(self) -> float:
        return self._clock() - self._t0

    def _add(self, name: str, row: list) -> None:
        rows = self.series[name]
        if len(rows) < self.max_events:
            rows.append(row)
        else:
            self.dropped[name] += 1

    # -- hooks --
    def step(self, index: int) -> None:
        # Stored raw and rounded by to_json, as sync rows are: this runs once a
        # step, after the step has evicted it from the caches.
        if len(self.steps) < self.max_events * 5:
            self.steps.append(self.now())

    def sync(
        self,
        kind: str,
        file: str,
        line: int,
        wait_s: Optional[float],
        rule: Optional[str],
        step: int,
        ended_at: Optional[float] = None,
    ) -> None:
        # Stored raw and rounded by to_json: this runs for every sync, often with
        # cold caches, where float rounding (a decimal conversion) costs µs.
        end = (ended_at if ended_at is not None else self._clock()) - self._t0
        self._add("syncs", [end - (wait_s or 0.0), wait_s, kind, file, line, rule, step])

    def memory(self, allocated: int, reserved: int, segments: int, step: Optional[int]) -> None:
        """One look at the allocator's counters (stored only when they changed)."""
        self.memory_series.add(int(allocated), int(reserved), int(segments), step)

    def new_segments(
        self, added: int, nbytes: int, file: Optional[str], line: Optional[int], step: Optional[int]
    ) -> None:
        """The allocator mapped ``added`` segments since the last look; reserved grew by ``nbytes``."""
        self._add("segments", [round(self.now(), 6), int(added), max(0, int(nbytes)), file, line, step])

    def snapshot(self, reason: str, category: Optional[str], free_bytes: int, step: Optional[int]) -> None:
        self._add("snapshots", [round(self.now(), 6), reason, category, int(free_bytes), step])

    def oom(self, nbytes: int, file: Optional[str], line: Optional[int], step: Optional[int]) -> None:
        self._add("ooms", [round(self.now(), 6), int(nbytes), file, line, step])

    def race(self, file: Optional[str], line: Optional[int], step: Optional[int]) -> None:
        self._add("races", [round(self.now(), 6), file, line, step])

    def launches(self, rows: list, describe: Optional[Callable[[Any], tuple]] = None) -> None:
        """The launches the race engine analysed just now: ``(stream, op)`` pairs, or any
        rows ``describe`` turns into such pairs.

        Once the series is full, rows are only counted (never described): the
        race check calls this for every launch it analyses, and a long run must
        not pay for rows it no longer keeps.
        """
        kept = self.series["launches"]
        room = self.max_events - len(kept)
        if room <= 0:
            self.dropped["launches"] += len(rows)
            return
        t = round(self.now(), 6)
        for row in rows[:room]:
            stream, op = describe(row) if describe is not None else row
            kept.append([t, str(stream), str(op)])
        if len(rows) > room:
            self.dropped["launches"] += len(rows) - room

    def phase_begin(self, name: str) -> int:
        """A phase (compilation, checkpointing) begins now; returns its row for ``phase_end``."""
        rows = self.series["phases"]
        if len(rows) >= self.max_events:
            self.dropped["phases"] += 1
            return -1
        rows.append([round(self.now(), 6), None, name])
        return len(rows) - 1

    def phase_end(self, index: int) -> None:
        if index >= 0:
            self.series["phases"][index][1] = round(self.now(), 6)

    def mark(self, name: str) -> None:
        """A moment that starts a phase running until the next step (``Module.eval()``)."""
        self._add("phases", [round(self.now(), 6), None, name])

    def utilization(self, percent: Optional[int]) -> None:
        """One NVML utilization sample (from the sampler's thread). Once the series is full, every
        other row is dropped and later samples are kept at half the rate, so the whole run stays covered."""
        if percent is None:
            return
        self._utilization_seen += 1
        if self._utilization_seen % self._utilization_stride:
            return
        rows = self.series["utilization"]
        if len(rows) >= self.max_events:
            del rows[1::2]
            self._utilization_stride *= 2
            self.dropped["utilization"] += len(rows)
        rows.append([round(self.now(), 6), int(percent)])

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
            "steps": [round(t, 6) for t in self.steps],
        }
        for name in SERIES:
            if name == "memory":
                data[name] = self.memory_series.to_json()
            elif name == "syncs":  # stored raw (see sync)
                data[name] = [
                    [round(start, 6), None if wait is None else round(wait, 7), *rest]
                    for start, wait, *rest in self.series[name]
                ]
            else:
                data[name] = [list(row) for row in self.series[name]]
        data["overhead_s"] = {name: round(value, 6) for name, value in self.overhead_s.items()}
        data["dropped"] = dict(self.dropped, memory=self.memory_series.merged)
        return data


def of(session: Any) -> Optional[Timeline]:
    """The session's timeline, or None (checks are also driven by fake sessions in tests)."""
    return getattr(session, "timeline", None)
