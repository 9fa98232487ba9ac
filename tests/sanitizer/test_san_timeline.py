"""The run's timeline: bounded series, the hooks in the session and the checks, the report field."""
import json
import threading
import time
import types

import pytest

from torchlint.sanitizer.memory import check as memory
from torchlint.sanitizer.memory.check import AllocatorStats, MemoryCheck
from torchlint.sanitizer.session import StepCount
from torchlint.sanitizer.timeline import SERIES, MemorySeries, Timeline
from test_san_memory import FakeSource  # noqa: E402  (a sibling test module's fake allocator)

MiB = 1 << 20


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_times_are_seconds_since_the_start_and_the_anchor_is_unix_time():
    clock = Clock()
    timeline = Timeline(clock=clock)
    clock.now += 0.25
    timeline.step(1)
    timeline.sync("item", "train.py", 12, 0.002, "TL101", 1, ended_at=clock.now)
    data = timeline.to_json()
    assert data["steps"] == [0.25]
    start, wait, kind, file, line, rule, step = data["syncs"][0]
    assert start == pytest.approx(0.248) and wait == pytest.approx(0.002)
    assert (kind, file, line, rule, step) == ("item", "train.py", 12, "TL101", 1)
    assert data["clock"]["unix_ns_at_start"] > 1_600_000_000 * 10**9  # nanoseconds on the Unix epoch


def test_every_series_is_bounded_and_counts_what_it_dropped():
    timeline = Timeline(clock=Clock(), max_events=3)
    for index in range(5):
        timeline.sync("item", "a.py", index, None, "TL101", 0)
        timeline.race("a.py", index, 0)
    timeline.launches([(7, "mul")] * 5)
    data = timeline.to_json()
    assert len(data["syncs"]) == len(data["races"]) == len(data["launches"]) == 3
    assert data["dropped"]["syncs"] == data["dropped"]["races"] == data["dropped"]["launches"] == 2
    assert set(data["dropped"]) == set(SERIES)


def test_a_full_launch_series_counts_rows_without_describing_them():
    timeline = Timeline(clock=Clock(), max_events=2)
    described = []

    def describe(launch):
        described.append(launch)
        return launch["stream"], launch["op"]

    for _ in range(3):
        timeline.launches([{"stream": 7, "op": "mul"}] * 2, describe)
    data = timeline.to_json()
    assert data["launches"][0][1:] == ["7", "mul"] and len(data["launches"]) == 2
    assert len(described) == 2  # the four rows after the series filled were only counted
    assert data["dropped"]["launches"] == 4


def test_the_memory_curve_stores_changes_only_and_ends_on_the_last_look():
    clock = Clock()
    timeline = Timeline(clock=clock)
    for allocated in (10, 10, 10, 30, 30, 20):
        clock.now += 0.02
        timeline.memory(allocated * MiB, 40 * MiB, 2, 0)
    timeline.new_segments(1, 20 * MiB, "train.py", 40, 0)
    timeline.new_segments(1, -4 * MiB, None, None, 0)  # reserved fell meanwhile: no negative growth
    data = timeline.to_json()
    assert [row[1] // MiB for row in data["memory"]] == [10, 30, 20]
    assert [row[0] for row in data["memory"]] == [pytest.approx(0.02), pytest.approx(0.08), pytest.approx(0.12)]
    assert [row[1:] for row in data["segments"]] == [[1, 20 * MiB, "train.py", 40, 0], [1, 0, None, None, 0]]
    assert data["dropped"]["memory"] == 0


def test_a_full_memory_curve_merges_neighbours_and_keeps_span_peaks_and_end():
    clock = Clock()
    series = MemorySeries(clock, max_rows=4)
    values = [1, 5, 2, 3, 9, 4, 6, 7, 8, 1, 2, 3, 4]
    for index, value in enumerate(values):
        clock.now = float(index)
        series.add(value, 2 * value, 1, index)
    rows = series.to_json()
    assert rows[0][0] == 0.0 and rows[-1] == [12.0, 4, 8, 1, 12]  # the first look and the last one, as it was
    assert max(row[1] for row in rows) == 9 and max(row[2] for row in rows) == 18
    assert len(rows) <= 4 + 2
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    # Each stored row holds the maxima of the looks it replaced, from the first one's time.
    assert rows[0][1] == max(values[:int(rows[1][0])])


def test_two_writers_keep_the_curve_bounded_and_in_time_order():
    series = MemorySeries(time.perf_counter, max_rows=64)

    def write(offset):
        for index in range(5000):
            series.add(offset + index, offset + index, 1, 0)

    threads = [threading.Thread(target=write, args=(offset,)) for offset in (0, 10**6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = series.to_json()
    assert len(rows) <= 64 + 2
    assert [row[0] for row in rows] == sorted(row[0] for row in rows)
    assert max(row[1] for row in rows) == 10**6 + 4999  # the peak survives every merge


# --- the hooks ----------------------------------------------------------------------

@pytest.fixture
def fresh_observer(monkeypatch):
    monkeypatch.setattr(memory, "_observer_attached", False)
    monkeypatch.setattr(memory, "_active_checks", [])


def test_the_memory_checks_watcher_feeds_memory_and_new_segments_and_the_oom_adds_its_point(fresh_observer):
    clock = Clock()
    session = types.SimpleNamespace(step_index=0, warmup_steps=0, test_id=None, in_warmup=False,
                                    step_count=lambda: StepCount(0, 0),
                                    timeline=Timeline(clock=clock))
    source = FakeSource(stats=AllocatorStats(allocated=10 * MiB, reserved=20 * MiB, segments=1))
    check = MemoryCheck(session, source=source, use_nvml=False, clock=clock)
    check.start()
    for look in (1, 2, 3):  # no step: the watcher alone
        clock.now += 0.02
        source.bump(allocated=look * 100 * MiB, reserved=look * 120 * MiB, segments=look * 2,
                    num_device_alloc=look * 2)
        check._watch_tick()  # WATCHED_LINE
    source.bump(allocated=370 * MiB)
    memory._on_out_of_memory(0, 64 * MiB, 1 << 30, 0)  # OOM_LINE
    check.stop()
    data = session.timeline.to_json()
    assert [row[2] for row in data["memory"]][:3] == [120 * MiB, 240 * MiB, 360 * MiB]
    assert data["memory"][3][1] == 370 * MiB  # the state at the OOM
    assert all(row[4] == 0 for row in data["memory"])
    assert [row[1] for row in data["segments"]] == [2, 2, 2]
    assert [row[2] for row in data["segments"]][1:] == [120 * MiB, 120 * MiB]
    lines = open(__file__).read().splitlines()
    assert data["segments"][0][3] == __file__  # the user's line running when the watcher saw the growth
    assert lines[data["segments"][0][4] - 1].strip().endswith("# WATCHED_LINE")
    [oom] = data["ooms"]
    assert oom[1] == 64 * MiB and oom[2] == __file__
    assert lines[oom[3] - 1].strip().endswith("# OOM_LINE")
    assert data["overhead_s"]["memory"] > 0


def test_steps_cost_the_chart_no_allocator_call(fresh_observer):
    """The curve comes from the watcher: a fast loop's step boundaries read the clock, nothing more."""
    clock = Clock()
    session = types.SimpleNamespace(step_index=0, warmup_steps=0, test_id=None, in_warmup=False,
                                    step_count=lambda: StepCount(0, 0),
                                    timeline=Timeline(clock=clock))
    source = FakeSource()
    check = MemoryCheck(session, source=source, use_nvml=False, clock=clock, sample_interval_s=0.05)
    check.start()
    before = source.calls["stats"]
    for step in range(1, 1001):
        clock.now += 0.001
        session.step_index = step
        check.on_step(step)
    assert source.calls["stats"] - before <= 22  # the check's own samples (~1 s / 50 ms), none for the chart
    check.stop()


def test_a_session_report_carries_the_timeline_and_its_steps():
    from torchlint.sanitizer.session import SanitizerSession

    session = SanitizerSession(checks=set())
    session.start()
    session.step()
    session.step()
    session.stop()
    report = session.report()
    assert report["timeline"]["version"] == 1
    assert len(report["timeline"]["steps"]) == 2
    json.dumps(report)  # plain data


def test_syncs_reach_the_timeline_with_their_host_wait(tmp_path):
    torch = pytest.importorskip("torch")
    from san_sync_helpers import install_fake_library, line_of, write_user_module

    from torchlint.sanitizer import sanitize

    install_fake_library(tmp_path)
    model = write_user_module(tmp_path, "model_timeline", """
        import fakecuda

        def evaluate(x):
            return fakecuda.read_back(x).item()  # ITEM
    """)
    with sanitize(checks={"sync"}) as session:
        for _ in range(3):
            model.evaluate(torch.ones(1))
            session.step()
    syncs = session.report()["timeline"]["syncs"]
    assert len(syncs) == 3
    assert {(row[3], row[4], row[5]) for row in syncs} == {(model.__file__, line_of(model.__file__, "# ITEM"), "TL101")}
    assert [row[6] for row in syncs] == [0, 1, 2]
    starts = [row[0] for row in syncs]
    assert starts == sorted(starts)


def test_sync_rows_are_stored_raw_and_rounded_in_the_report():
    clock = iter([10.0, 10.123456789, 11.0]).__next__
    timeline = Timeline(clock=clock)
    timeline.sync("item", "train.py", 3, 0.0001234567891, "TL101", 2)
    assert timeline.series["syncs"][0][1] == 0.0001234567891  # nothing rounded while the program runs
    [row] = timeline.to_json()["syncs"]
    assert row == [round(0.123456789 - 0.0001234567891, 6), 0.0001235, "item", "train.py", 3, "TL101", 2]


def test_step_times_are_stored_raw_and_rounded_in_the_report():
    clock = iter([10.0, 10.123456789, 11.0]).__next__
    timeline = Timeline(clock=clock)
    timeline.step(1)
    assert timeline.steps == [10.123456789 - 10.0]  # the step hook does no decimal work
    assert timeline.to_json()["steps"] == [0.123457]
