"""The pictures of a real run: examples/sanitizer_tour.py under torchlint-sanitize on a GPU."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu
ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_the_tour_records_a_timeline_an_html_page_and_a_trace(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torchlint.sanitizer", "--report-json", str(tmp_path / "r.json"),
         "--report-html", str(tmp_path / "r.html"), "--trace", str(tmp_path / "t.json"),
         os.path.join("examples", "sanitizer_tour.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    timeline = report["timeline"]
    assert len(timeline["steps"]) == report["steps"]["completed"] == 30
    assert {row[2] for row in timeline["syncs"]} >= {"item", "format", "bool"}
    assert all(row[1] is not None and row[1] >= 0 for row in timeline["syncs"] if row[2] == "item")
    assert len(timeline["races"]) == sum(1 for f in report["findings"] if f["kind"] == "race") >= 2
    [oom] = timeline["ooms"]
    assert oom[1] == 64 << 20 and oom[2].endswith("sanitizer_tour.py")
    assert timeline["memory"] and timeline["launches"]
    assert sum(timeline["overhead_s"].values()) < 0.05 * timeline["clock"]["duration_s"]
    page = (tmp_path / "r.html").read_text()
    assert page.count('class="race-mark"') == len(timeline["races"])
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("cat") == "oom" for e in trace["traceEvents"])
