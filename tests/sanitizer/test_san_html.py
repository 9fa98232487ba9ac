"""The HTML report's content, without a browser (tests/browser/ renders it in Chromium)."""
import copy
import json
import os
import pathlib
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest

from torchlint.sanitizer.html_report import main, render

from stepless_run import EXPECTED_MEMORY, EXPECTED_SEGMENTS, stepless_report

REPORTS = pathlib.Path(__file__).parent / "data" / "reports"


@pytest.fixture(scope="module")
def tour():
    return json.loads((REPORTS / "tour.json").read_text())


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def _tags(page):
    parser = _Collect()
    parser.feed(page)
    return parser.tags


def _with_class(tags, name):
    return [attrs for tag, attrs in tags if name in (attrs.get("class") or "").split()]


def test_one_self_contained_page_with_no_network(tour):
    page = render([tour])
    tags = _tags(page)
    assert not [attrs for tag, attrs in tags if tag in ("script", "img", "link") and (attrs.get("src") or attrs.get("href"))]
    assert "http://" not in page.split("<h2>The static rules")[0] and "https://cdn" not in page


def test_marks_match_the_recorded_events(tour):
    tags = _tags(render([tour]))
    timeline = tour["timeline"]
    assert len(_with_class(tags, "sync-mark")) == len(timeline["syncs"])
    assert len(_with_class(tags, "race-mark")) == len(timeline["races"]) >= 2
    assert len(_with_class(tags, "oom-mark")) == 2  # on the timeline and on the memory chart
    assert len(_with_class(tags, "segment-mark")) == len(timeline["segments"])
    assert len(_with_class(tags, "frag-peak-mark")) == 1
    assert len(_with_class(tags, "step")) == len(timeline["steps"])
    radii = {float(a["r"]) for a in _with_class(tags, "sync-mark")}
    assert len(radii) > 3  # sized by the host wait


def test_tables_sort_by_cost_and_link_the_rule_text(tour):
    page = render([tour])
    waits = [float(a["data-host-wait-ms"]) for a in _with_class(_tags(page), "site-row") if "data-host-wait-ms" in a]
    assert waits == sorted(waits, reverse=True) and len(waits) == sum(f["kind"] == "sync" for f in tour["findings"])
    assert 'href="#rule-TL101"' in page and 'id="rule-TL101"' in page and "What it does" in page
    race_table = page.split('id="race-table"')[1].split("</table>")[0]
    assert race_table.count('class="site-row"') == sum(f["kind"] == "race" for f in tour["findings"])
    assert "wait_stream" in race_table
    assert "examples/sanitizer_tour.py:80</code> race_part" in race_table  # the first access's stack
    memory_table = page.split('id="memory-table"')[1].split("</table>")[0]
    assert memory_table.index("fragmentation") < memory_table.index("oom")  # 1000 MiB before 64 MiB


def test_hovering_the_oom_names_the_allocating_line(tour):
    page = render([tour])
    assert "OOM (fragmentation): 64.0 MiB requested, allocated at examples/sanitizer_tour.py:69" in page


def test_the_runs_facts(tour):
    page = render([tour])
    steps = tour["steps"]
    for text in (tour["device"]["name"], tour["torch"], "default (PYTORCH_ALLOC_CONF unset)",
                 f"{steps['completed']} ({steps['warmup']} warm-up, {steps['measured']} measured; from optimizer)",
                 "sanitizer&#x27;s own time"):
        assert text in page, text


def test_a_run_without_optimizer_steps(tour):
    report = copy.deepcopy(tour)
    report["steps"] = {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}
    report["timeline"]["steps"] = []
    page = render([report])
    assert "no optimizer steps: the whole run is one step" in page
    assert not _with_class(_tags(page), "step")
    assert len(_with_class(_tags(page), "sync-mark")) == len(report["timeline"]["syncs"])


@pytest.fixture(scope="module")
def stepless():
    return stepless_report()


def _corners(attrs):
    return [tuple(float(v) for v in point.split(",")) for point in attrs["points"].split()]


def test_a_stepless_run_gets_its_memory_curve_from_the_watcher(stepless):
    """No optimizer step at all: the chart still follows every phase the watcher saw."""
    rows = stepless["timeline"]["memory"]
    assert stepless["steps"]["completed"] == 0 and stepless["timeline"]["steps"] == []
    assert rows == EXPECTED_MEMORY
    assert [row[:3] for row in stepless["timeline"]["segments"]] == EXPECTED_SEGMENTS
    tags = _tags(render([stepless]))
    [allocated] = _with_class(tags, "allocated")
    corners = _corners(allocated)
    # A step curve: each row holds until the next, the last until the run's end.
    assert len(corners) == 2 * len(rows)
    assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(corners, corners[1:]))
    assert [x for x, _ in corners] == sorted(x for x, _ in corners)
    assert len({y for _, y in corners}) == len({row[1] for row in EXPECTED_MEMORY})
    assert corners[-1][0] > corners[0][0] + 600  # spread over the chart, not squeezed into a step band
    held = [round(b[0] - a[0]) for a, b in zip(corners, corners[1:]) if a[1] == b[1] and b[0] > a[0]]
    assert held[0] == 36 and len(set(held[1:])) == 1  # the empty start-up cut short; the phases alike
    marks = _with_class(tags, "segment-mark")
    assert len(marks) == len(EXPECTED_SEGMENTS)
    page = render([stepless])
    assert page.count("step 0: allocated") == len(rows)  # one hover per row
    assert "stepless_run.py:" in page.split('id="memory-chart"')[1]  # a new segment's line


@pytest.mark.parametrize("name", sorted(p.name for p in REPORTS.glob("*.json") if p.name != "profiler_alignment.json"))
def test_recorded_reports_still_draw_their_memory_rows(name):
    """Reports recorded before the watcher fed the curve (one row per sampled step) read the same way."""
    report = json.loads((REPORTS / name).read_text())
    rows = report["timeline"]["memory"]
    tags = _tags(render([report]))
    [reserved] = _with_class(tags, "reserved")
    corners = _corners(reserved)
    assert len(corners) == 2 * len(rows) - 1 + (report["timeline"]["clock"]["duration_s"] > rows[-1][0])
    assert all(a[0] == b[0] or a[1] == b[1] for a, b in zip(corners, corners[1:]))


def test_merged_ranks_get_a_filter_and_tagged_rows(tour):
    ranks = []
    for rank in (0, 1):
        report = copy.deepcopy(tour)
        report["timeline"]["rank"] = rank
        ranks.append(report)
    page = render(ranks)
    tags = _tags(page)
    assert [a["value"] for t, a in tags if t == "option"] == ["all", "0", "1"]
    rows = [a for a in _with_class(tags, "site-row")]
    assert {a["data-rank"] for a in rows} == {"0", "1"} and len(rows) == 2 * len(tour["findings"])


def test_a_pytest_report_says_why_it_has_no_charts(tour):
    report = {key: tour[key] for key in ("version", "tool", "torch", "device", "checks", "fail_on", "findings")}
    report["tests"] = {"tests/test_a.py::test_one": {"outcome": "passed", "findings": 1, "failed_by_sanitizer": False}}
    page = render([report])
    assert "sanitizes each test on its own" in page and "1 tests" in page


def test_command_line_and_errors(tmp_path, tour):
    out = tmp_path / "report.html"
    assert main([str(REPORTS / "tour.json"), "-o", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert main([str(tmp_path / "missing.json"), "-o", str(out)]) == 2


def test_the_runner_writes_the_page_and_the_trace(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "steps.py").write_text(textwrap.dedent("""
        import torch
        w = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for _ in range(3):
            (w * 2).sum().backward()
            opt.step()
    """))
    env = dict(os.environ, TORCHLINT_SANITIZER_FORCE="1")
    done = subprocess.run([sys.executable, "-m", "torchlint.sanitizer", "--checks", "sync", "--report-html", "r.html",
                           "--trace", "t.json", "steps.py"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "HTML report written to r.html" in done.stderr and "trace written to t.json" in done.stderr
    assert len(_with_class(_tags((tmp_path / "r.html").read_text()), "step")) == 3
    trace = json.loads((tmp_path / "t.json").read_text())
    assert len([e for e in trace["traceEvents"] if e.get("cat") == "step"]) == 3


pytest_plugins = ["pytester"]


def test_pytest_writes_the_page_of_the_whole_run(pytester, monkeypatch):
    pytest.importorskip("torch")
    from san_sync_helpers import write_distribution

    monkeypatch.setenv("TORCHLINT_SANITIZER_FORCE", "1")
    # An installed library is told by its metadata, not by a folder name.
    write_distribution(pytester.path / "deps", "fakecuda")
    pytester.makeconftest("import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'deps'))\n")
    pytester.makepyfile(model="import fakecuda\n\ndef step(x):\n    return fakecuda.read_back(x)  # SYNC\n")
    pytester.makepyfile(test_train="import model\n\ndef test_syncs():\n    for _ in range(3):\n        model.step(1)\n")
    result = pytester.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync", "--gpu-sanitize-html=out/run.html")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["HTML report written to out/run.html"])
    page = (pytester.path / "out" / "run.html").read_text()
    rows = _with_class(_tags(page), "site-row")
    assert len(rows) == 1 and "model.py:4" in page and "1 tests" in page


def test_a_library_session_writes_both_pictures(tmp_path):
    from torchlint.sanitizer.session import SanitizerSession

    session = SanitizerSession(checks=set())
    with session:
        session.step()
    session.write_html(str(tmp_path / "run.html"))
    session.write_trace(str(tmp_path / "run.json"))
    assert len(_with_class(_tags((tmp_path / "run.html").read_text()), "step")) == 1
    assert json.loads((tmp_path / "run.json").read_text())["baseTimeNanoseconds"] > 0
