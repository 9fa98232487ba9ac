"""MemoryCheck's sampling, triggers, findings and OOM handling, with a fake allocator."""
import dataclasses
import json
import pathlib
import types

import pytest

from torchlint.sanitizer.memory import check as memory
from torchlint.sanitizer.findings import Finding
from torchlint.sanitizer.session import StepCount
from torchlint.sanitizer.memory.check import AllocatorStats, MemoryCheck

DATA = pathlib.Path(__file__).parent / "data"
MiB = 1 << 20
GiB = 1 << 30


def load(name):
    return json.loads((DATA / f"snapshot_{name}.json").read_text())


def unflatten(flat):
    nested = {}
    for key, value in flat.items():
        parts = key.split(".")
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeSource:
    """Stands in for TorchAllocatorSource: counts calls, returns what a test set."""

    def __init__(self, stats=None, segments=(), total=80 * GiB, free=70 * GiB, cap=None, initialized=True):
        self.current = stats or AllocatorStats()
        self.segments = list(segments)
        self.total = total
        self.free = free
        self._cap = cap
        self.initialized = initialized
        self.calls = {"stats": 0, "mem_get_info": 0, "snapshot": 0}
        self.observers = []
        self.init_callbacks = []
        self.device = 0
        self.stream = 0
        self.conf = None
        self.fail_stats = False

    def is_initialized(self):
        return self.initialized

    def on_init(self, callback):
        if self.initialized:
            callback()
        else:
            self.init_callbacks.append(callback)

    def stats(self, device=None):
        if self.fail_stats:
            raise RuntimeError("stats failed")
        self.calls["stats"] += 1
        return self.current

    def mem_get_info(self, device=None):
        self.calls["mem_get_info"] += 1
        return self.free, self.total

    def cap(self, total, device=None):
        return self._cap or total

    def snapshot(self, device=None):
        self.calls["snapshot"] += 1
        return list(self.segments), {"expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": ""}

    def current_stream(self, device=None):
        return self.stream

    def attach_oom_observer(self, callback):
        self.observers.append(callback)
        return True

    def pci_bus_id(self):
        return None

    def alloc_conf(self):
        return self.conf

    def bump(self, **changes):
        self.current = dataclasses.replace(self.current, **changes)


def session(warmup=2, test_id=None):
    s = types.SimpleNamespace(step_index=0, warmup_steps=warmup, test_id=test_id)
    s.step_count = lambda: StepCount(s.step_index, min(warmup, max(0, s.step_index - 1)))
    s.in_warmup = True
    return s


def advance(sess, check, clock, dt):
    sess.step_index += 1
    sess.in_warmup = sess.step_index < sess.warmup_steps
    clock.now += dt
    check.on_step(sess.step_index)


@pytest.fixture(autouse=True)
def fresh_observer(monkeypatch):
    # The real observer is attached once per process; tests start from "not attached".
    monkeypatch.setattr(memory, "_observer_attached", False)
    monkeypatch.setattr(memory, "_active_checks", [])


def make(source=None, warmup=2, **kwargs):
    clock = Clock()
    sess = session(warmup)
    source = source or FakeSource()
    check = MemoryCheck(sess, source=source, use_nvml=False, clock=clock, **kwargs)
    return check, sess, source, clock


# ------------------------------------------------------------ stats parsing


@pytest.mark.parametrize("name", ["fragmented", "expandable", "streams"])
def test_stats_from_flat_and_nested_agree(name):
    flat = load(name)["stats"]
    a = AllocatorStats.from_flat(flat)
    b = AllocatorStats.from_nested(unflatten(flat))
    assert a == b
    assert a.reserved == flat["reserved_bytes.all.current"]
    assert a.num_device_alloc == flat["num_device_alloc"]


def test_probe_recorded_the_raw_stats_keys_the_adapter_reads():
    probe = json.loads((DATA / "allocator_probe.json").read_text())
    needed = {stat for _, stat, _ in AllocatorStats._POOLED} | set(AllocatorStats._SCALARS)
    assert needed <= set(probe["raw_stats_top_keys"])
    assert probe["has_oom_observer"]


# ------------------------------------------------------------ sampling cadence


def test_one_clock_read_per_step_and_sparse_samples_on_a_fast_loop():
    check, sess, source, clock = make(warmup=0, sample_interval_s=0.05)
    sess.in_warmup = False
    check.start()
    start_calls = source.calls["stats"]
    for _ in range(1000):
        advance(sess, check, clock, 0.001)  # a 1 ms step
    sampled = source.calls["stats"] - start_calls
    assert 15 <= sampled <= 22  # ~1 s of steps / 50 ms
    # The device's free memory is read on the first sample, then once per DEVICE_READ_EVERY_S (1 s) at most.
    assert 1 <= source.calls["mem_get_info"] <= 2
    check.stop()
    assert source.calls["stats"] == start_calls + sampled + 2  # the watcher's last look, one final sample


def test_the_device_is_read_again_when_reserved_moves_or_its_reading_ages():
    check, sess, source, clock = make(warmup=0, sample_interval_s=0.05)
    sess.in_warmup = False
    check.start()
    advance(sess, check, clock, 0.05)
    reads = source.calls["mem_get_info"]
    advance(sess, check, clock, 0.05)
    assert source.calls["mem_get_info"] == reads  # reserved unchanged, the reading fresh: not read
    source.bump(reserved=source.current.reserved + 2 * MiB, segments=source.current.segments + 1)
    advance(sess, check, clock, 0.05)
    assert source.calls["mem_get_info"] == reads + 1  # this process mapped a segment
    # Another process takes most of the device: seen within DEVICE_READ_EVERY_S, with reserved unchanged.
    source.free = 2 * GiB
    steps = 0
    while check.summary()["min_device_free_bytes"] != 2 * GiB:
        advance(sess, check, clock, 0.05)
        steps += 1
        assert steps * 0.05 <= memory.DEVICE_READ_EVERY_S + 0.05
    assert check._under_pressure()
    check.stop()


def test_slow_steps_are_sampled_every_step():
    check, sess, source, clock = make(warmup=0)
    check.start()
    before = source.calls["stats"]
    for _ in range(10):
        advance(sess, check, clock, 0.2)
    assert source.calls["stats"] - before == 10


def test_no_sampling_in_warmup_and_baseline_at_its_end():
    check, sess, source, clock = make(warmup=3)
    check.start()
    before = source.calls["stats"]
    advance(sess, check, clock, 10.0)
    advance(sess, check, clock, 10.0)
    assert source.calls["stats"] == before
    advance(sess, check, clock, 0.0)  # step 3 ends the warm-up: sampled even with no time passed
    assert source.calls["stats"] == before + 1
    assert check._baseline[1] == 3


# ------------------------------------------------------------ churn and retries


def run_steps(check, sess, source, clock, steps, per_step=None, dt=0.1):
    for _ in range(steps):
        if per_step:
            per_step(source, sess)
        advance(sess, check, clock, dt)


def test_steady_malloc_free_churn_after_warmup_is_reported():
    check, sess, source, clock = make()
    check.start()

    def churn(src, s):
        src.bump(num_device_alloc=src.current.num_device_alloc + 1, num_device_free=src.current.num_device_free + 1)

    run_steps(check, sess, source, clock, 12, churn)
    check.stop()
    [finding] = [f for f in check.findings() if f.kind == "alloc-churn"]
    assert finding.details["steps"] == 10
    assert finding.details["num_device_alloc"] == 10 and finding.details["num_device_free"] == 10
    assert finding.details["per_step"] == 2.0
    assert "cudaFree" in finding.message


def test_warmup_mallocs_and_growth_without_frees_are_not_churn():
    check, sess, source, clock = make()
    check.start()

    def warmup_only(src, s):
        if s.step_index < 2:
            src.bump(num_device_alloc=src.current.num_device_alloc + 5, num_device_free=src.current.num_device_free + 5)
        else:
            src.bump(num_device_alloc=src.current.num_device_alloc + 1)

    run_steps(check, sess, source, clock, 12, warmup_only)
    check.stop()
    assert not [f for f in check.findings() if f.kind == "alloc-churn"]


def test_allocation_retries_are_reported_and_trigger_a_snapshot():
    fragmented = load("fragmented")
    source = FakeSource(stats=AllocatorStats.from_flat(fragmented["stats"]), segments=fragmented["segments"])
    check, sess, source, clock = make(source)
    check.start()
    run_steps(check, sess, source, clock, 3)
    source.bump(num_alloc_retries=2, num_sync_all_streams=2)
    run_steps(check, sess, source, clock, 2)
    check.stop()
    kinds = {f.kind: f for f in check.findings()}
    assert kinds["alloc-retry"].count == 2
    assert kinds["alloc-retry"].details["steps"] == [4]
    # 700 MiB of inactive split blocks trigger the first snapshot at the baseline.
    assert [s.reason for s in check._snapshots] == ["inactive-split", "alloc-retry", "session-end"]
    (state,) = kinds["alloc-retry"].details["fragmented_states"]  # the retries' evidence
    assert (state["category"], state["seen"]) == ("hard", 3)


def test_retries_that_ended_in_an_oom_are_not_double_reported():
    check, sess, source, clock = make()
    check.start()
    source.bump(num_alloc_retries=1, num_ooms=1)
    check.stop()
    assert not [f for f in check.findings() if f.kind == "alloc-retry"]


def test_triggered_snapshots_are_rate_limited():
    check, sess, source, clock = make(warmup=0)
    check.start()
    for i in range(1, 200):
        source.bump(num_alloc_retries=i)
        advance(sess, check, clock, 0.1)
    triggered = [s for s in check._snapshots if s.reason != "session-end"]
    assert len(triggered) == memory.MAX_TRIGGERED_SNAPSHOTS
    check.stop()


def test_high_slack_near_the_cap_triggers_a_snapshot():
    stats = AllocatorStats(allocated=300 * MiB, reserved=950 * MiB)
    check, sess, source, clock = make(FakeSource(stats=stats, cap=1 * GiB), warmup=0)
    check.start()
    advance(sess, check, clock, 0.1)
    assert [s.reason for s in check._snapshots] == ["high-slack-near-cap"]
    check.stop()
    near = [f for f in check.findings() if f.kind == "near-capacity"]
    assert near and near[0].details["cap_bytes"] == 1 * GiB


# ------------------------------------------------------------ fragmentation findings


def test_fragmented_state_at_session_end_is_reported():
    data = load("fragmented")
    source = FakeSource(stats=AllocatorStats.from_flat(data["stats"]), segments=data["segments"])
    check, sess, source, clock = make(source)
    sess.test_id = "tests/test_x.py::test_frag"
    check.start()
    run_steps(check, sess, source, clock, 5)
    check.stop()
    [finding] = check.findings()  # 1000 MiB reserved against 300 MiB allocated: 700 MiB the run paid for
    assert isinstance(finding, Finding)
    assert finding.kind == "fragmentation" and finding.severity == "warning"
    assert finding.test == "tests/test_x.py::test_frag"
    details = finding.details
    assert details["cost"] == ["reserved-over-allocated"] and details["excess_bytes"] == 700 * MiB
    assert details["reserved_over_allocated"] == pytest.approx(3.333, abs=1e-3)
    assert details["suggested_alloc_conf"] == "expandable_segments:True"
    (state,) = details["fragmented_states"]
    assert state["largest_free_block_bytes"] == 14 * MiB
    assert state["trigger"] == "inactive-split"  # seen first at the end of warm-up
    assert state["seen"] == 2  # and again at the session's end
    json.dumps(finding.to_json())


def test_clean_run_has_no_findings():
    data = load("clean")
    source = FakeSource(stats=AllocatorStats.from_flat(data["stats"]), segments=data["segments"])
    check, sess, source, clock = make(source)
    check.start()
    run_steps(check, sess, source, clock, 20)
    check.stop()
    assert check.findings() == []
    summary = check.summary()
    assert summary["available"] and summary["reserved_bytes"] == data["stats"]["reserved_bytes.all.current"]
    json.dumps(summary)


# ------------------------------------------------------------ OOM observer


def fragmented_source():
    data = load("fragmented")
    return FakeSource(stats=AllocatorStats.from_flat(data["oom_observer_calls"][0]["stats_in_observer"]), segments=data["segments"])


def test_observer_is_attached_once_per_process():
    a, _, source_a, _ = make()
    a.start()
    a.stop()
    b, _, source_b, _ = make()
    b.start()
    b.stop()
    assert len(source_a.observers) + len(source_b.observers) == 1


def test_fragmentation_oom_finding_names_the_users_line():
    check, sess, source, clock = make(fragmented_source())
    check.start()
    memory._on_out_of_memory(0, 64 * MiB, 1 * GiB, 138 * GiB)  # the line the finding must name
    check.stop()
    [oom] = [f for f in check.findings() if f.kind == "oom"]
    assert oom.severity == "error"
    assert oom.details["cause"] == "fragmentation"
    assert oom.details["largest_free_block_bytes"] == 14 * MiB
    assert oom.details["requested_bytes"] == 64 * MiB
    assert oom.details["reserved_bytes"] == 1000 * MiB and oom.details["allocated_bytes"] == 300 * MiB
    assert oom.details["cap_bytes"] == 1 * GiB
    assert oom.details["suggested_alloc_conf"] == "expandable_segments:True"
    assert oom.details["empty_cache_helps"] is False
    assert oom.file is not None and oom.file.endswith("test_san_memory.py")
    assert oom.function == "test_fragmentation_oom_finding_names_the_users_line"
    json.dumps(oom.to_json())


def test_exhaustion_oom_and_deduplication():
    data = load("exhaustion")
    source = FakeSource(stats=AllocatorStats.from_flat(data["oom_observer_calls"][0]["stats_in_observer"]), segments=data["segments"])
    check, sess, source, clock = make(source)
    check.start()
    for _ in range(3):
        memory._on_out_of_memory(0, 128 * MiB, 1 * GiB, 138 * GiB)
    check.stop()
    [oom] = [f for f in check.findings() if f.kind == "oom"]
    assert oom.details["cause"] == "exhaustion"
    assert oom.count == 3
    assert oom.details["suggested_alloc_conf"] is None


def test_observer_never_raises_and_ignores_stopped_checks():
    check, sess, source, clock = make(fragmented_source())
    check.start()
    source.fail_stats = True
    memory._on_out_of_memory(0, 64 * MiB, 1 * GiB, 0)  # stats fail: still recorded, no exception
    check.stop()  # the final sample fails too: recorded, not raised
    assert "stats failed" in check.error
    memory._on_out_of_memory(0, 64 * MiB, 1 * GiB, 0)  # after stop: not recorded
    assert len(check._ooms) == 1
    [oom] = [f for f in check.findings() if f.kind == "oom"]
    assert oom.details["cause"] in ("fragmentation", "exhaustion")


def test_nested_checks_route_the_oom_to_the_innermost():
    outer, _, _, _ = make(fragmented_source())
    inner, _, _, _ = make(fragmented_source())
    outer.start()
    inner.start()
    memory._on_out_of_memory(0, 64 * MiB, 1 * GiB, 0)
    inner.stop()
    memory._on_out_of_memory(0, 64 * MiB, 1 * GiB, 0)
    outer.stop()
    assert len(inner._ooms) == 1 and len(outer._ooms) == 1
    assert memory._active_checks == []


def test_oom_reports_memory_held_by_other_processes():
    class Nvml:
        available = True

        def process_usage(self):
            return 1200 * MiB, 5 * GiB

        def start(self):
            return True

        def stop(self):
            pass

        def findings(self):
            return []

        def summary(self):
            return {"available": True}

        def mark_measurement_start(self):
            pass

    clock = Clock()
    check = MemoryCheck(session(), source=fragmented_source(), nvml_sampler=Nvml(), clock=clock)
    check.start()
    memory._on_out_of_memory(0, 64 * MiB, 1 * GiB, 0)
    check.stop()
    [oom] = [f for f in check.findings() if f.kind == "oom"]
    assert oom.details["other_processes_bytes"] == 5 * GiB
    assert oom.details["non_pytorch_bytes"] == 200 * MiB  # process usage minus reserved
    assert check.summary()["nvml"] == {"available": True}


# ------------------------------------------------------------ lifecycle


def test_without_cuda_the_check_is_inactive(monkeypatch):
    monkeypatch.setattr(memory.TorchAllocatorSource, "create", classmethod(lambda cls, device=None: None))
    check = MemoryCheck(session(), use_nvml=False)
    check.start()
    check.on_step(1)
    check.stop()
    check.stop()
    assert check.findings() == []
    assert check.summary() == {"available": False, "reason": "no CUDA device"}


def test_cuda_not_yet_initialized_is_not_initialized_by_the_check():
    source = FakeSource(initialized=False)
    check, sess, source, clock = make(source, warmup=0)
    check.start()
    advance(sess, check, clock, 1.0)
    assert source.calls["stats"] == 0 and source.observers == []
    assert len(source.init_callbacks) == 1
    source.initialized = True
    source.init_callbacks[0]()  # what torch's lazy init runs
    assert len(source.observers) == 1
    source.bump(allocated=10 * MiB, reserved=20 * MiB, allocated_peak=10 * MiB, reserved_peak=20 * MiB)
    advance(sess, check, clock, 1.0)
    check.stop()
    summary = check.summary()
    assert summary["peak_allocated_bytes"] == 10 * MiB and summary["peak_exact"]


def test_stop_is_idempotent_and_restores_the_active_pointer():
    check, sess, source, clock = make()
    check.start()
    assert memory._active_checks == [check]
    check.stop()
    check.stop()
    assert memory._active_checks == []
    assert source.calls["snapshot"] == 1


def test_peak_is_a_lower_bound_when_the_allocators_peak_did_not_rise():
    stats = AllocatorStats(allocated=10 * MiB, reserved=20 * MiB, allocated_peak=500 * MiB, reserved_peak=600 * MiB)
    check, sess, source, clock = make(FakeSource(stats=stats), warmup=0)
    check.start()
    source.bump(allocated=30 * MiB, reserved=40 * MiB)
    advance(sess, check, clock, 1.0)
    source.bump(allocated=5 * MiB)
    check.stop()
    summary = check.summary()
    assert summary["peak_allocated_bytes"] == 30 * MiB
    assert summary["peak_exact"] is False
    source2 = FakeSource(stats=stats)
    check2, sess2, _, clock2 = make(source2, warmup=0)
    check2.start()
    source2.bump(allocated_peak=700 * MiB, reserved_peak=800 * MiB)
    check2.stop()
    assert check2.summary()["peak_allocated_bytes"] == 700 * MiB and check2.summary()["peak_exact"]
