"""A step-less script's report, made on the CPU by the real session, memory check and watcher thread.

The script has no optimizer step and no ``session.step()``: it loads a
cache, holds it, frees half of it and builds a second one. The allocator is
a scripted fake (``ScriptedAllocator``); everything else is the code a GPU
run goes through: ``SanitizerSession`` starts the memory check, whose
watcher thread reads the fake's counters every few milliseconds and feeds
the session's timeline, and ``session.report()`` writes the report the HTML
page and the trace read. The timeline's clock is scripted too, and each
phase waits until the watcher has seen it, so the report is the same
whatever the machine's load: one memory row per phase, at the phase's time.

Used by test_san_html.py, test_san_trace.py and tests/browser.
"""
import contextlib
import time

from torchlint.sanitizer import timeline
from torchlint.sanitizer.memory import check as memory
from torchlint.sanitizer.memory.allocator import AllocatorStats, TorchAllocatorSource
from torchlint.sanitizer.session import SanitizerSession

MiB = 1 << 20

# (allocated MiB, reserved MiB, segments): what the script holds in each phase.
PHASES = [
    (64, 80, 1),        # loading the cache
    (192, 240, 3),
    (384, 400, 5),      # the whole cache
    (192, 400, 5),      # half of it freed: the cache keeps the segments
    (320, 560, 7),      # a second cache: two more segments
    (0, 560, 7),        # the script's tensors are gone
]
START_S, PHASE_S = 2.0, 0.25  # two seconds of start-up with nothing allocated (cut short in the chart), then a phase every 0.25 s
# The report's timeline rows, exactly: the empty start, then one memory row per phase, one segments row per growth.
EXPECTED_MEMORY = [[0.0, 0, 0, 0, 0]] + [
    [START_S + PHASE_S * index, allocated * MiB, reserved * MiB, segments, 0]
    for index, (allocated, reserved, segments) in enumerate(PHASES)]
EXPECTED_SEGMENTS = [  # [t, segments added, reserved growth]
    [now[0], now[3] - before[3], now[2] - before[2]]
    for before, now in zip(EXPECTED_MEMORY, EXPECTED_MEMORY[1:]) if now[3] > before[3]]


class ScriptedClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class ScriptedAllocator(TorchAllocatorSource):
    """An allocator whose counters the script sets; a TorchAllocatorSource so the check starts its watcher."""

    def __init__(self):  # no torch, no device
        self.current = AllocatorStats()
        self._device = 0

    def is_initialized(self):
        return True

    def device_for_thread(self):
        return 0

    def on_init(self, callback):
        callback()

    def stats(self, device=None):
        return self.current

    def mem_get_info(self, device=None):
        return 8 << 30, 16 << 30

    def cap(self, total, device=None):
        return total

    def snapshot(self, device=None):
        return [], {"expandable_segments": False}

    def segment_frames(self, address):
        return None

    def record_history(self, enabled):
        return False

    def current_stream(self, device=None):
        return 0

    def attach_oom_observer(self, callback):
        return True

    def pci_bus_id(self):
        return None

    def alloc_conf(self):
        return None


@contextlib.contextmanager
def _scripted(allocator, clock, watch_interval_s):
    create, interval, timeline_class = TorchAllocatorSource.create, memory.WATCH_INTERVAL_S, timeline.Timeline
    attached, active = memory._observer_attached, list(memory._active_checks)
    TorchAllocatorSource.create = classmethod(lambda cls, device=None: allocator)
    original_init = memory.MemoryCheck.__init__

    def init(self, session, **options):
        options.setdefault("watch_interval_s", watch_interval_s)
        options.setdefault("use_nvml", False)
        original_init(self, session, **options)

    memory.MemoryCheck.__init__ = init
    timeline.Timeline = lambda: timeline_class(clock=clock)
    try:
        yield
    finally:
        TorchAllocatorSource.create, memory.WATCH_INTERVAL_S, timeline.Timeline = create, interval, timeline_class
        memory.MemoryCheck.__init__ = original_init
        memory._observer_attached, memory._active_checks[:] = attached, active


def _until_seen(session, state, timeout_s=10.0):
    """Wait until the watcher's look that stored ``state`` is over (a new segment is seen on this line)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = session.timeline.memory_series.to_json()
        if rows and rows[-1][1:4] == list(state):
            with session._checks[0]._watch_lock:  # held for the whole look: its new-segment row is written
                return
        if time.monotonic() > deadline:
            raise AssertionError(f"the watcher never saw {state}")
        time.sleep(0.002)  # WAITING_LINE


def stepless_report(watch_interval_s=0.003):
    """The report of the step-less script (one memory row per phase, one segments row per growth)."""
    allocator, clock = ScriptedAllocator(), ScriptedClock()
    with _scripted(allocator, clock, watch_interval_s):
        session = SanitizerSession(checks={"memory"})
        session.start()
        try:
            _until_seen(session, (0, 0, 0))  # CUDA is up, nothing allocated yet: the curve starts at 0 s
            for index, (allocated, reserved, segments) in enumerate(PHASES):
                clock.now = START_S + PHASE_S * index  # the time first: a look never stamps a new state early
                allocator.current = AllocatorStats(
                    allocated=allocated * MiB, reserved=reserved * MiB, segments=segments, num_device_alloc=segments,
                    allocated_peak=allocated * MiB, reserved_peak=reserved * MiB)
                _until_seen(session, (allocated * MiB, reserved * MiB, segments))
            clock.now = START_S + PHASE_S * len(PHASES)
            session.program_end()
        finally:
            session.stop()
    return session.report()
