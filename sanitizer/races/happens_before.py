"""The happens-before engine behind the race check: plain Python, no torch.

The input is a sequence of small event objects (the dataclasses below) that
``check.py`` builds from what it sees in torch, and that the CPU tests build by
hand. The engine keeps a vector clock per stream, per recorded event and for
the host, and an interval map over device addresses that holds, for every byte
range and every stream, the latest write and the latest read.

Two accesses race when they come from different streams, overlap in memory, at
least one writes, and no chain of synchronizations orders the earlier before
the later. The check is exact per (access, other stream): a new access on
stream S races with stream T iff some earlier conflicting, overlapping access
from T is not ordered before it, and the engine then reports the latest such
access. Why keeping one write and one read per stream per byte suffices: every
access of T with a smaller sequence number than an ordered one is ordered too
(clocks only grow), so the latest is the only one that can decide.

Sequence numbers are global (one counter for every launch), which makes them
usable in reports ("seq 41"); clock entries are compared per stream, as in any
vector clock.

Accesses are keyed by absolute address ranges, so a view at another offset of
the same storage overlaps exactly where it should, and memory that the caching
allocator hands out again still carries the history of its previous owner:
that is what finds allocator-reuse races. ``record_stream`` is a pledge: the
allocator holds the block back until the pledged stream's work, up to the
free, is done, so at the free the engine drops that stream's history of the
block.

Collectives run on a pseudo-stream per process group that first waits on the
issuing stream (as NCCL's stream does) and is joined by ``WorkWait``. A CUDA
graph capture records its accesses instead of running them; each replay runs
them as one launch on the replay stream.

Cost: a launch allocates one header (``_Launch``) shared by its accesses, and
does one bisect in the interval map per tensor argument; an argument that
covers a whole segment only its own stream has touched (most tensors of a
training step) is two stores. Other arguments touch only the segments they
overlap; the per-stream state of a segment is a dict of at most one entry per
stream. ``AccessRecord``s are built only when a race is reported. History
that every stream is already ordered after is dropped (garbage collection
runs when the map has doubled since the last pass, so it is O(1) amortized,
and after a device sync).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Any, Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

# --------------------------------------------------------------------------
# Events: the engine's whole input.


@dataclass
class Access:
    """One tensor argument of a launch: bytes [start, end) of device memory."""

    start: int
    end: int
    is_write: bool
    arg: str = ""
    # Opaque description of the tensor for reports (check.py puts shape, dtype,
    # storage base and offset here); the engine never looks inside.
    tensor: Any = None
    # The allocation this access belongs to (an AllocInfo, or None if unknown).
    alloc: Any = None
    # For graph replays: the op and site captured for this access.
    op: Optional[str] = None
    site: Any = None


@dataclass(frozen=True)
class Kernel:
    """A launch on ``stream`` touching ``accesses``; ``site`` is opaque and hashable."""

    stream: Hashable
    accesses: Tuple[Access, ...]
    op: str = ""
    site: Any = None


@dataclass(frozen=True)
class StreamCreated:
    stream: Hashable


@dataclass(frozen=True)
class EventRecord:
    event: Hashable
    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class EventWait:
    event: Hashable
    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class EventSync:
    """The host waits for an event (``Event.synchronize()``)."""

    event: Hashable
    site: Any = None


@dataclass(frozen=True)
class StreamSync:
    """The host waits for a stream (``Stream.synchronize()``, ``.item()``...)."""

    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class DeviceSync:
    """The host waits for every stream (``torch.cuda.synchronize()``)."""

    site: Any = None


@dataclass(frozen=True)
class WaitStream:
    """``waiter.wait_stream(waitee)``: future work on waiter waits for waitee's work so far."""

    waiter: Hashable
    waitee: Hashable
    site: Any = None


@dataclass(frozen=True)
class Alloc:
    """The caching allocator handed out bytes [start, end) on ``stream``."""

    start: int
    end: int
    stream: Hashable = None
    site: Any = None
    label: str = ""


@dataclass(frozen=True)
class Free:
    """The block at ``start`` was freed; ``end`` is needed only if the Alloc was not seen."""

    start: int
    end: Optional[int] = None
    site: Any = None


@dataclass(frozen=True)
class RecordStream:
    """``tensor.record_stream(stream)`` on the block at ``start``: a pledge honoured at free."""

    start: int
    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class Collective:
    """A collective issued from ``stream`` on process group ``group``.

    It runs on the group's pseudo-stream, which first waits for ``stream``;
    ``work`` names the handle that ``WorkWait`` completes.
    """

    group: Hashable
    stream: Hashable
    work: Hashable
    accesses: Tuple[Access, ...]
    op: str = ""
    site: Any = None


@dataclass(frozen=True)
class WorkWait:
    """``work.wait()``: ``stream`` waits for the collective behind ``work``."""

    work: Hashable
    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class CaptureBegin:
    graph: Hashable
    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class CaptureEnd:
    graph: Hashable
    site: Any = None


@dataclass(frozen=True)
class GraphReplay:
    graph: Hashable
    stream: Hashable
    site: Any = None


@dataclass(frozen=True)
class CollectiveStream:
    """The pseudo-stream on which a process group's collectives run."""

    group: Hashable

    def __str__(self) -> str:
        return f"collective stream of process group {self.group}"


HOST = "host"

# --------------------------------------------------------------------------
# What the engine remembers and reports.


class AllocInfo:
    """One allocation: where it lives and who made it. ``generation`` tells owners apart."""

    __slots__ = ("start", "end", "stream", "site", "label", "generation", "freed")

    def __init__(self, start, end, stream, site, label, generation):
        self.start = start
        self.end = end
        self.stream = stream
        self.site = site
        self.label = label
        self.generation = generation
        self.freed = False

    def __repr__(self) -> str:
        return f"AllocInfo({self.start:#x}..{self.end:#x}, gen={self.generation}, label={self.label!r})"


class AccessRecord:
    """One access as remembered: a launch's seq on a stream plus one tensor argument."""

    __slots__ = ("stream", "seq", "is_write", "start", "end", "op", "arg", "site", "tensor", "alloc", "via", "index")

    def __init__(self, stream, seq, is_write, start, end, op, arg, site, tensor, alloc, via, index):
        self.stream = stream
        self.seq = seq
        self.is_write = is_write
        self.start = start
        self.end = end
        self.op = op
        self.arg = arg
        self.site = site
        self.tensor = tensor
        self.alloc = alloc
        # How the access was issued when not by a plain launch: ("graph replay", site)
        # or ("collective", work).
        self.via = via
        # Position of the access in the engine's input (for tests and ordering).
        self.index = index

    @property
    def mode(self) -> str:
        return "write" if self.is_write else "read"

    def __repr__(self) -> str:
        return (
            f"AccessRecord({self.mode} {self.op or '?'} on {self.stream!r} seq={self.seq} "
            f"[{self.start:#x}, {self.end:#x}))"
        )


class _Launch:
    """What every access of one launch shares. The interval map stores
    (launch, item) pairs, so a launch allocates one object, not one per tensor;
    ``AccessRecord``s are built only for reports."""

    __slots__ = ("stream", "seq", "op", "site", "via", "index")

    def __init__(self, stream, seq, op, site, via, index):
        self.stream = stream
        self.seq = seq
        self.op = op
        self.site = site
        self.via = via
        self.index = index

    def record(self, item: tuple) -> AccessRecord:
        start, end, is_write, arg, tensor, alloc, item_op, item_site = item
        return AccessRecord(
            self.stream,
            self.seq,
            is_write,
            start,
            end,
            item_op or self.op,
            arg,
            item_site if item_site is not None else self.site,
            tensor,
            alloc,
            self.via,
            self.index,
        )


@dataclass(frozen=True)
class SyncNote:
    """A synchronization that taught ``waiter`` about ``source``'s work up to ``covered_seq``."""

    kind: str  # wait_stream | event | stream_sync | event_sync | device_sync | work_wait
    waiter: Hashable
    source: Hashable
    covered_seq: int
    site: Any = None
    # For event waits: the stream the event was recorded on and the record's site.
    event_stream: Hashable = None
    record_site: Any = None
    # Input position of the synchronization (tests, and the early-event hint).
    index: int = 0


@dataclass
class Race:
    """Two unordered conflicting accesses: ``earlier`` (another stream) and ``later``."""

    earlier: AccessRecord
    later: AccessRecord
    overlap: Tuple[int, int]
    kind: str  # "race", or "reuse" when the memory changed owner in between
    last_sync: Optional[SyncNote]
    # The event the later stream waited on that was recorded too early, if any.
    early_event: Optional[SyncNote] = None
    count: int = 1

    @property
    def key(self) -> tuple:
        return (
            self.earlier.stream,
            self.later.stream,
            self.earlier.op,
            self.later.op,
            self.earlier.site,
            self.later.site,
            self.kind,
        )


class _Segment:
    """Bytes [start, end) and, per stream, the latest write and the latest read
    as ``[write launch, write item, read launch, read item]``."""

    __slots__ = ("start", "end", "streams")

    def __init__(self, start: int, end: int, streams: Dict[Hashable, list]):
        self.start = start
        self.end = end
        self.streams = streams

    def copy_range(self, start: int, end: int) -> "_Segment":
        return _Segment(start, end, {s: list(pair) for s, pair in self.streams.items()})


# --------------------------------------------------------------------------
# The engine.


class HappensBefore:
    """Feed events with ``apply``; read ``races`` (deduplicated) at the end.

    ``keep_all=True`` also keeps every detection in ``all_races`` (the tests
    compare that with a brute-force reference).
    """

    def __init__(self, keep_all: bool = False, gc_min: int = 256, ticker=None):
        self._seq = 0
        self._index = 0  # input position, for tests
        # One counter for input positions and launch seqs when given (the
        # native tap's, which numbers the launches it keeps to itself).
        self._ticker = ticker
        self._clocks: Dict[Hashable, Dict[Hashable, int]] = {}
        self._host: Dict[Hashable, int] = {}
        self._host_epoch = 0
        self._clock_epoch: Dict[Hashable, int] = {}
        self._events: Dict[Hashable, tuple] = {}  # event -> (clock, stream, site, seq)
        self._work: Dict[Hashable, tuple] = {}  # work -> (clock, pseudo-stream, site)
        self._last_sync: Dict[Tuple[Hashable, Hashable], SyncNote] = {}
        # Event waits per (waiter, recording stream): the latest one, to spot an
        # event recorded before the access it was meant to cover.
        self._event_waits: Dict[Tuple[Hashable, Hashable], SyncNote] = {}
        self._starts: List[int] = []
        self._segs: List[_Segment] = []
        self._gc_min = gc_min
        self._gc_threshold = gc_min
        self._live: Dict[int, AllocInfo] = {}
        self._generation = 0
        self._pledges: Dict[int, set] = {}
        # CUDA graph capture.
        self._capturing: set = set()
        self._capture_graph: Hashable = None
        self._captured_events: set = set()
        self._graphs: Dict[Hashable, list] = {}
        self.keep_all = keep_all
        # Called with each new unique race, while the later access is being made.
        self.on_race: Optional[Callable[[Race], None]] = None
        self.all_races: List[Race] = []
        self._races: Dict[tuple, Race] = {}
        self._handlers = {
            Kernel: lambda e: self.kernel(e.stream, e.accesses, e.op, e.site),
            StreamCreated: lambda e: self.stream_created(e.stream),
            EventRecord: lambda e: self.event_record(e.event, e.stream, e.site),
            EventWait: lambda e: self.event_wait(e.event, e.stream, e.site),
            EventSync: lambda e: self.event_sync(e.event, e.site),
            StreamSync: lambda e: self.stream_sync(e.stream, e.site),
            DeviceSync: lambda e: self.device_sync(e.site),
            WaitStream: lambda e: self.wait_stream(e.waiter, e.waitee, e.site),
            Alloc: lambda e: self.alloc(e.start, e.end, e.stream, e.site, e.label),
            Free: lambda e: self.free(e.start, e.end, e.site),
            RecordStream: lambda e: self.record_stream(e.start, e.stream, e.site),
            Collective: lambda e: self.collective(e.group, e.stream, e.work, e.accesses, e.op, e.site),
            WorkWait: lambda e: self.work_wait(e.work, e.stream, e.site),
            CaptureBegin: lambda e: self.capture_begin(e.graph, e.stream, e.site),
            CaptureEnd: lambda e: self.capture_end(e.graph, e.site),
            GraphReplay: lambda e: self.graph_replay(e.graph, e.stream, e.site),
        }

    # -- input ------------------------------------------------------------

    def apply(self, event) -> None:
        try:
            handler = self._handlers[type(event)]
        except KeyError:
            raise TypeError(f"not a happens-before event: {event!r}") from None
        handler(event)

    def run(self, events: Iterable) -> "HappensBefore":
        for event in events:
            self.apply(event)
        return self

    def _tick(self) -> int:
        if self._ticker is not None:
            return self._ticker()
        return self._index + 1

    # -- results ----------------------------------------------------------

    @property
    def races(self) -> List[Race]:
        """Unique races (by stream pair, op pair, sites and kind), with repeat counts."""
        return list(self._races.values())

    @property
    def seq(self) -> int:
        return self._seq

    def streams(self) -> List[Hashable]:
        return list(self._clocks)

    def last_sync(self, waiter: Hashable, source: Hashable) -> Optional[SyncNote]:
        return self._last_sync.get((waiter, source))

    def segment_count(self) -> int:
        return len(self._segs)

    def live_alloc(self, address: int) -> Optional[AllocInfo]:
        """The live allocation holding ``address``, if the engine saw it."""
        info = self._live.get(address)
        if info is not None:
            return info
        for info in self._live.values():
            if info.start <= address < info.end:
                return info
        return None

    # -- clocks -------------------------------------------------------------

    def _clock(self, stream: Hashable) -> Dict[Hashable, int]:
        """The stream's clock, with what the host knows merged in (lazily)."""
        clock = self._clocks.get(stream)
        if clock is None:
            # A new stream has seen nothing but what the host has waited for.
            clock = dict(self._host)
            self._clocks[stream] = clock
            self._clock_epoch[stream] = self._host_epoch
            for source in self._host:
                note = self._last_sync.get((HOST, source))
                if note is not None:
                    self._last_sync[(stream, source)] = note
            return clock
        if self._clock_epoch[stream] != self._host_epoch:
            self._clock_epoch[stream] = self._host_epoch
            for source, seq in self._host.items():
                if seq > clock.get(source, 0):
                    clock[source] = seq
                    note = self._last_sync.get((HOST, source))
                    if note is not None:
                        self._last_sync[(stream, source)] = note
        return clock

    def _merge(
        self, waiter: Hashable, into: Dict[Hashable, int], source_clock: Dict[Hashable, int], note: SyncNote
    ) -> None:
        for source, seq in source_clock.items():
            if source == waiter:
                continue
            if seq > into.get(source, 0):
                into[source] = seq
                self._last_sync[(waiter, source)] = SyncNote(
                    note.kind, waiter, source, seq, note.site, note.event_stream, note.record_site, note.index
                )

    def _host_merge(self, source_clock: Dict[Hashable, int], note: SyncNote) -> None:
        changed = False
        for source, seq in source_clock.items():
            if seq > self._host.get(source, 0):
                self._host[source] = seq
                self._last_sync[(HOST, source)] = SyncNote(note.kind, HOST, source, seq, note.site, index=note.index)
                changed = True
        if changed:
            self._host_epoch += 1

    def advance(self, stream: Hashable, seq: int) -> None:
        """``stream`` has launched up to ``seq`` (launches the engine was not shown)."""
        clock = self._clock(stream)
        if seq > clock.get(stream, 0):
            clock[stream] = seq
        if seq > self._seq:
            self._seq = seq

    def stream_created(self, stream: Hashable) -> None:
        self._index = self._tick()
        self._clock(stream)

    def event_record(self, event: Hashable, stream: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        if stream in self._capturing:
            self._captured_events.add(event)
            return
        self._captured_events.discard(event)
        clock = self._clock(stream)
        self._events[event] = (dict(clock), stream, site, clock.get(stream, 0))

    def event_wait(self, event: Hashable, stream: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        if self._capture_graph is not None and event in self._captured_events:
            # A fork inside the capture: the waiting stream joins it.
            self._capturing.add(stream)
            return
        if stream in self._capturing:
            return
        recorded = self._events.get(event)
        if recorded is None:
            return  # waiting on a never-recorded event completes at once
        clock, event_stream, record_site, record_seq = recorded
        note = SyncNote("event", stream, event_stream, record_seq, site, event_stream, record_site, self._index)
        self._event_waits[(stream, event_stream)] = note
        self._merge(stream, self._clock(stream), clock, note)

    def wait_stream(self, waiter: Hashable, waitee: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        if waiter in self._capturing or waitee in self._capturing:
            if waitee in self._capturing and self._capture_graph is not None:
                self._capturing.add(waiter)
            return
        source = self._clock(waitee)
        note = SyncNote("wait_stream", waiter, waitee, source.get(waitee, 0), site, index=self._index)
        self._event_waits.pop((waiter, waitee), None)
        self._merge(waiter, self._clock(waiter), source, note)

    def stream_sync(self, stream: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        if stream in self._capturing:
            return
        clock = self._clock(stream)
        self._host_merge(clock, SyncNote("stream_sync", HOST, stream, clock.get(stream, 0), site, index=self._index))

    def event_sync(self, event: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        recorded = self._events.get(event)
        if recorded is None:
            return
        clock, event_stream, _, record_seq = recorded
        self._host_merge(clock, SyncNote("event_sync", HOST, event_stream, record_seq, site, index=self._index))

    def device_sync(self, site: Any = None) -> None:
        self._index = self._tick()
        everything: Dict[Hashable, int] = {}
        for stream in list(self._clocks):
            for source, seq in self._clock(stream).items():
                if seq > everything.get(source, 0):
                    everything[source] = seq
        self._host_merge(everything, SyncNote("device_sync", HOST, None, 0, site, index=self._index))
        self.collect_garbage()

    # -- memory -----------------------------------------------------------

    def alloc(self, start: int, end: int, stream: Hashable = None, site: Any = None, label: str = "") -> AllocInfo:
        # The allocator hands bytes out only after their previous owner was
        # freed: a pledged owner overlapping them is freed now, even when the
        # free itself was not seen (the native tap takes frees from new owners).
        for pledged_start in list(self._pledges):
            owner = self._live.get(pledged_start)
            if owner is not None and owner.start < end and start < owner.end:
                self._release(pledged_start)
        self._index = self._tick()
        self._generation += 1
        info = AllocInfo(start, end, stream, site, label, self._generation)
        self._live[start] = info
        self._pledges.pop(start, None)
        return info

    def free(self, start: int, end: Optional[int] = None, site: Any = None) -> None:
        self._index = self._tick()
        self._release(start, end)

    def _release(self, start: int, end: Optional[int] = None) -> None:
        """The block at ``start`` is no longer its owner's: honour its ``record_stream`` pledges."""
        info = self._live.pop(start, None)
        if info is not None:
            info.freed = True
            end = info.end
        pledged = self._pledges.pop(start, None)
        if not pledged or end is None:
            return
        # The allocator will not hand these bytes out again before the pledged
        # streams have finished the work issued so far: their history of the
        # block can never race with a later owner.
        for seg in self._cover(start, end):
            for stream in pledged:
                seg.streams.pop(stream, None)
        self._drop_empty(start, end)

    def has_pledge(self, start: int) -> bool:
        """True when a ``record_stream`` pledge waits for the free of the block at ``start``."""
        return start in self._pledges

    def record_stream(self, start: int, stream: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        self._pledges.setdefault(start, set()).add(stream)

    # -- collectives and graphs --------------------------------------------

    def collective(self, group, stream, work, accesses: Sequence[Access], op: str = "", site: Any = None) -> None:
        self.collective_launch(
            group,
            stream,
            work,
            [(a.start, a.end, a.is_write, a.arg, a.tensor, a.alloc, a.op, a.site) for a in accesses],
            op,
            site,
        )

    def collective_launch(self, group, stream, work, items: Sequence[tuple], op: str = "", site: Any = None) -> None:
        """``collective`` with ``launch``-style items (the hot path of check.py)."""
        pseudo = CollectiveStream(group)
        issuing = self._clock(stream)
        note = SyncNote("collective_launch", pseudo, stream, issuing.get(stream, 0), site, index=self._index)
        self._merge(pseudo, self._clock(pseudo), issuing, note)
        self.launch(pseudo, items, op, site, via=("collective", work))
        self._work[work] = (dict(self._clock(pseudo)), pseudo, site)

    def work_wait(self, work: Hashable, stream: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        done = self._work.get(work)
        if done is None:
            return
        clock, pseudo, _ = done
        note = SyncNote("work_wait", stream, pseudo, clock.get(pseudo, 0), site, index=self._index)
        self._merge(stream, self._clock(stream), clock, note)

    def capture_begin(self, graph: Hashable, stream: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        self._capture_graph = graph
        self._capturing = {stream}
        self._captured_events = set()
        self._graphs[graph] = []

    def capture_end(self, graph: Hashable, site: Any = None) -> None:
        self._index = self._tick()
        self._capture_graph = None
        self._capturing = set()
        self._captured_events = set()

    def graph_replay(self, graph: Hashable, stream: Hashable, site: Any = None) -> None:
        captured = self._graphs.get(graph)
        if captured is None:
            self._index = self._tick()
            return
        self.kernel(stream, captured, "graph replay", site, via=("graph replay", site))

    # -- accesses -----------------------------------------------------------

    def kernel(
        self, stream: Hashable, accesses: Sequence[Access], op: str = "", site: Any = None, via: Any = None
    ) -> int:
        """One launch on ``stream``; returns its seq (0 when captured into a graph)."""
        return self.launch(
            stream,
            [(a.start, a.end, a.is_write, a.arg, a.tensor, a.alloc, a.op, a.site) for a in accesses],
            op,
            site,
            via,
        )

    def launch(
        self,
        stream: Hashable,
        items: Sequence[tuple],
        op: str = "",
        site: Any = None,
        via: Any = None,
        seq: Optional[int] = None,
    ) -> int:
        """``kernel`` without the Access objects, for the hot path.

        Each item is ``(start, end, is_write, arg, tensor, alloc, op_or_None, site_or_None)``.
        ``seq`` is given for a launch numbered outside (the native tap's): it is
        also its input position, and it may be older than the stream's latest.
        """
        if seq is None:
            self._index = self._tick()
        else:
            self._index = max(self._index, seq)
        if stream in self._capturing:
            graph = self._graphs[self._capture_graph]
            for start, end, is_write, arg, tensor, alloc, item_op, item_site in items:
                graph.append(
                    Access(
                        start,
                        end,
                        is_write,
                        arg,
                        tensor,
                        alloc,
                        item_op or op,
                        item_site if item_site is not None else site,
                    )
                )
            return 0
        clock = self._clock(stream)
        if seq is None:
            index = self._index
            seq = self._seq = self._tick() if self._ticker is not None else self._seq + 1
        else:
            index = seq
            self._seq = max(self._seq, seq)
        if seq > clock.get(stream, 0):
            clock[stream] = seq
        launch = _Launch(stream, seq, op, site, via, index)
        starts = self._starts
        segs = self._segs
        for item in items:
            start = item[0]
            # Fast path: a whole segment that only this stream has touched
            # (most tensors of a training step): nothing to check, two stores.
            i = bisect_right(starts, start) - 1
            if i >= 0:
                seg = segs[i]
                if seg.start == start and seg.end == item[1]:
                    seg_streams = seg.streams
                    if len(seg_streams) == 1:
                        pair = seg_streams.get(stream)
                        if pair is not None:
                            if item[2]:
                                pair[0] = launch
                                pair[1] = item
                            else:
                                pair[2] = launch
                                pair[3] = item
                            continue
            if item[1] <= start:
                continue
            self._access(launch, item, clock)
            starts = self._starts
            segs = self._segs
        if len(self._segs) > self._gc_threshold:
            self.collect_garbage()
        return seq

    def _access(self, launch: _Launch, item: tuple, clock: Dict[Hashable, int]) -> None:
        stream = launch.stream
        is_write = item[2]
        worst: Optional[Dict[Hashable, tuple]] = None
        covered = self._cover(item[0], item[1])
        for seg in covered:
            streams = seg.streams
            if len(streams) > 1 or stream not in streams:
                for other, (write_launch, write_item, read_launch, read_item) in streams.items():
                    if other == stream:
                        continue
                    known = clock.get(other, 0)
                    hit = None
                    if write_launch is not None and write_launch.seq > known:
                        hit = (write_launch, write_item)
                    if is_write and read_launch is not None and read_launch.seq > known:
                        if hit is None or read_launch.seq > hit[0].seq:
                            hit = (read_launch, read_item)
                    if hit is not None:
                        if worst is None:
                            worst = {}
                        best = worst.get(other)
                        if best is None or hit[0].seq > best[0].seq:
                            worst[other] = hit
            pair = streams.get(stream)
            if is_write:
                # A write supersedes the stream's earlier read of these bytes:
                # whenever that read is unordered for a later access, so is this
                # write, with a larger seq, and the latest one is what is
                # reported. Dropping it lets equal segments merge below.
                streams[stream] = [launch, item, None, None]
            elif pair is None:
                streams[stream] = [None, None, launch, item]
            else:
                pair[2] = launch
                pair[3] = item
        if len(covered) > 1:
            self._merge_equal(covered)
        if worst is not None:
            later = launch.record(item)
            for earlier_launch, earlier_item in worst.values():
                self._report(earlier_launch.record(earlier_item), later)

    def _merge_equal(self, covered: List[_Segment]) -> None:
        """Fold adjacent covered segments whose history is now the same into one.

        Without this, memory that the allocator hands out again at the same
        address with another size stays split at every old boundary, and each
        later access to it leaves the fast path.
        """
        first = covered[0]
        state = first.streams
        for seg in covered[1:]:
            other = seg.streams
            if len(other) != len(state):
                return
            for stream, mine in state.items():
                if other.get(stream) != mine:  # launches compare by identity
                    return
        first.end = covered[-1].end  # _cover returns contiguous segments
        lo = bisect_left(self._starts, covered[1].start)
        hi = lo + len(covered) - 1
        del self._starts[lo:hi]
        del self._segs[lo:hi]

    def _report(self, earlier: AccessRecord, later: AccessRecord) -> None:
        overlap = (max(earlier.start, later.start), min(earlier.end, later.end))
        reuse = earlier.alloc is not None and later.alloc is not None and earlier.alloc is not later.alloc
        last = self._last_sync.get((later.stream, earlier.stream))
        early = self._event_waits.get((later.stream, earlier.stream))
        # Case "event recorded before the write": the later stream waited on an
        # event of the earlier stream after the access, but the event had been
        # recorded before it.
        if early is not None and not (early.covered_seq < earlier.seq and early.index > earlier.index):
            early = None
        race = Race(earlier, later, overlap, "reuse" if reuse else "race", last, early)
        if self.keep_all:
            self.all_races.append(race)
        known = self._races.get(race.key)
        if known is None:
            self._races[race.key] = race
            if self.on_race is not None:
                self.on_race(race)
        else:
            known.count += 1

    # -- the interval map ---------------------------------------------------

    def _cover(self, start: int, end: int) -> List[_Segment]:
        """Segments exactly covering [start, end): split at the ends, fill the gaps."""
        starts = self._starts
        segs = self._segs
        i = bisect_right(starts, start) - 1
        # Fast path: one existing segment is exactly the range (whole tensors).
        if i >= 0:
            seg = segs[i]
            if seg.start == start and seg.end == end:
                return [seg]
            if seg.end <= start:
                i += 1
            elif seg.start < start:
                # Split off the head of the segment that contains start.
                tail = seg.copy_range(start, seg.end)
                seg.end = start
                i += 1
                starts.insert(i, start)
                segs.insert(i, tail)
        else:
            i = 0
        out = []
        pos = start
        while pos < end:
            if i < len(segs) and segs[i].start <= pos:
                seg = segs[i]
                if seg.end > end:
                    tail = seg.copy_range(end, seg.end)
                    seg.end = end
                    starts.insert(i + 1, end)
                    segs.insert(i + 1, tail)
                out.append(seg)
                pos = seg.end
                i += 1
            else:
                gap_end = end if i >= len(segs) else min(end, segs[i].start)
                seg = _Segment(pos, gap_end, {})
                starts.insert(i, pos)
                segs.insert(i, seg)
                out.append(seg)
                pos = gap_end
                i += 1
        return out

    def _drop_empty(self, start: int, end: int) -> None:
        """Remove segments without history inside [start, end) (boundaries already split)."""
        lo = bisect_left(self._starts, start)
        hi = bisect_left(self._starts, end)
        kept = [seg for seg in self._segs[lo:hi] if seg.streams]
        self._segs[lo:hi] = kept
        self._starts[lo:hi] = [seg.start for seg in kept]

    def forget_event(self, event: Hashable) -> None:
        """The event was destroyed; its handle may come back as a new event."""
        self._events.pop(event, None)

    def ordered_floor(self) -> Dict[Hashable, int]:
        """Per stream, a seq that every present and future stream is ordered after."""
        floor: Optional[Dict[Hashable, int]] = None
        for stream in list(self._clocks):
            clock = self._clock(stream)
            if floor is None:
                floor = dict(clock)
            else:
                for source in list(floor):
                    seq = clock.get(source, 0)
                    if seq < floor[source]:
                        floor[source] = seq
        if floor is None:
            return {}
        # A stream not yet seen starts from the host's clock.
        for source in list(floor):
            floor[source] = min(floor[source], self._host.get(source, 0))
        return floor

    def collect_garbage(self) -> None:
        """Drop history that no present or future access can race with."""
        floor = self.ordered_floor()
        keep_starts, keep_segs = [], []
        for seg in self._segs:
            streams = seg.streams
            for stream in list(streams):
                bound = floor.get(stream, 0)
                pair = streams[stream]
                if pair[0] is not None and pair[0].seq <= bound:
                    pair[0] = pair[1] = None
                if pair[2] is not None and pair[2].seq <= bound:
                    pair[2] = pair[3] = None
                if pair[0] is None and pair[2] is None:
                    del streams[stream]
            if streams:
                keep_starts.append(seg.start)
                keep_segs.append(seg)
        self._starts, self._segs = keep_starts, keep_segs
        self._gc_threshold = max(self._gc_min, 2 * len(self._segs))
