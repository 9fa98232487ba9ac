"""The Chrome trace of a run recorded on an H100 (tests/sanitizer/data/reports/tour.json)."""
import copy
import json
import pathlib

import pytest

from torchlint.sanitizer.trace import ALLOCATOR_TID, HOST_TID, main, merge, trace_events

from stepless_run import EXPECTED_MEMORY, EXPECTED_SEGMENTS, stepless_report

REPORTS = pathlib.Path(__file__).parent / "data" / "reports"


@pytest.fixture(scope="module")
def tour():
    return json.loads((REPORTS / "tour.json").read_text())


def _events(trace, **match):
    return [e for e in trace["traceEvents"] if all(e.get(k) == v for k, v in match.items())]


def test_host_syncs_are_slices_on_the_host_thread_as_long_as_the_wait(tour):
    trace = trace_events(tour)
    slices = _events(trace, ph="X", cat="sync")
    assert len(slices) == len(tour["timeline"]["syncs"])
    assert all(e["tid"] == HOST_TID for e in slices)
    first = tour["timeline"]["syncs"][0]
    assert slices[0]["ts"] == pytest.approx(first[0] * 1e6, abs=0.01)
    assert slices[0]["dur"] == pytest.approx(first[1] * 1e6, abs=0.01)
    assert slices[0]["args"]["where"] == f"{first[3]}:{first[4]}"


def test_races_and_ooms_are_instants_memory_is_two_counter_tracks(tour):
    trace = trace_events(tour)
    assert len(_events(trace, ph="i", cat="race")) == len(tour["timeline"]["races"]) >= 2
    [oom] = _events(trace, ph="i", cat="oom")
    assert oom["args"]["where"] == "examples/sanitizer_tour.py:69" and oom["tid"] == ALLOCATOR_TID
    counters = {e["name"] for e in _events(trace, ph="C")}
    assert counters == {"GPU memory allocated", "GPU memory reserved"}
    assert len(_events(trace, ph="C", name="GPU memory reserved")) == len(tour["timeline"]["memory"])
    steps = _events(trace, ph="X", cat="step")
    assert len(steps) == tour["steps"]["completed"]


def test_a_stepless_run_has_its_memory_counters_and_new_segments():
    report = stepless_report()
    trace = trace_events(report)
    reserved = _events(trace, ph="C", name="GPU memory reserved")
    assert [(e["ts"], e["args"]["bytes"]) for e in reserved] == [(t * 1e6, r) for t, _, r, _, _ in EXPECTED_MEMORY]
    segments = [e for e in _events(trace, ph="i", tid=ALLOCATOR_TID) if e["name"].endswith("new segment(s)")]
    assert [(e["ts"], e["name"]) for e in segments] == [(t * 1e6, f"{n} new segment(s)") for t, n, _ in EXPECTED_SEGMENTS]
    assert not _events(trace, cat="step")


def test_launches_get_one_thread_per_stream(tour):
    trace = trace_events(tour)
    launches = _events(trace, cat="launch")
    assert {e["name"] for e in launches} >= {"randn", "mul", "sum"}
    threads = {e["tid"] for e in launches}
    assert len(threads) == len({row[1] for row in tour["timeline"]["launches"]}) == 2
    named = {e["tid"] for e in _events(trace, ph="M", name="thread_name")}
    assert threads <= named


def test_the_base_time_is_the_sessions_start_on_the_unix_epoch(tour):
    trace = trace_events(tour)
    assert trace["baseTimeNanoseconds"] == tour["timeline"]["clock"]["unix_ns_at_start"]
    json.dumps(trace)


def test_merge_shifts_every_trace_onto_the_earliest_base():
    ours = {"baseTimeNanoseconds": 2_000_000_000, "traceEvents": [{"ph": "X", "name": "sync item", "ts": 10.0, "dur": 5}]}
    kineto = {"baseTimeNanoseconds": 1_999_000_000, "traceEvents": [{"ph": "X", "name": "aten::item", "ts": 1010.0, "dur": 5},
                                                                   {"ph": "M", "name": "process_name"}]}
    merged = merge([ours, kineto])
    assert merged["baseTimeNanoseconds"] == 1_999_000_000
    by_name = {e["name"]: e for e in merged["traceEvents"]}
    assert by_name["sync item"]["ts"] == by_name["aten::item"]["ts"] == 1010.0
    twice = merge([dict(kineto, traceEvents=[{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "a"}}]),
                   dict(kineto, traceEvents=[{"ph": "M", "name": "process_name", "pid": 7, "args": {"name": "b"}}])])
    assert [e["args"]["name"] for e in twice["traceEvents"]] == ["a"]
    with pytest.raises(ValueError, match="baseTimeNanoseconds"):
        merge([ours, {"traceEvents": []}])


def test_a_report_without_a_timeline_is_a_clear_error(tour, tmp_path, capsys):
    old = copy.deepcopy(tour)
    del old["timeline"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    assert main(["convert", str(path), "-o", str(tmp_path / "t.json")]) == 2
    assert "old.json: the report has no timeline" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no timeline"):
        trace_events(old)


def test_the_command_line_converts_and_merges(tour, tmp_path):
    out = tmp_path / "trace.json"
    assert main(["convert", str(REPORTS / "tour.json"), "-o", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"]
    both = tmp_path / "both.json"
    assert main(["merge", str(out), str(out), "-o", str(both)]) == 0
    assert len(json.loads(both.read_text())["traceEvents"]) == 2 * len(json.loads(out.read_text())["traceEvents"]) - 1  # one process name
    assert main(["convert", str(tmp_path / "missing.json"), "-o", str(out)]) == 2
