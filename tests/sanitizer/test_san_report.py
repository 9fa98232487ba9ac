"""The JSON report (schema, round trip) and the ten-second terminal summary, from Finding objects."""
import json

import jsonschema
import pytest

from torchlint.sanitizer.findings import Finding, Frame
from torchlint.sanitizer.report import (
    REPORT_SCHEMA, build_report, finding_line, rank, render_summary, write_report,
)


def sync_finding(line, kind="item", count=10, stall=None, per_step=1.0, every_step=True, rule="TL101",
                 hint="keep it on the GPU", file="/proj/train.py"):
    return Finding(
        kind="sync", severity="warning", message=f"{kind} syncs", file=file, line=line, function="train",
        stack=[Frame(file, line, "train"), Frame("/proj/main.py", 3, "<module>")], count=count, rule=rule,
        fix_hint=hint,
        details={"sync_kind": kind, "per_step": per_step, "every_step": every_step, "stall_ms": stall,
                 "steps": [2, 3], "warmup_count": 2, "timed_calls": 1 if stall is not None else 0},
    )


def oom_finding():
    return Finding(kind="oom", severity="error", message="out of memory caused by fragmentation",
                   file="/proj/train.py", line=50, function="train", fix_hint="PYTORCH_ALLOC_CONF=expandable_segments:True",
                   details={"cause": "fragmentation"})


def test_report_matches_the_documented_schema():
    findings = [sync_finding(12, stall=4.5), oom_finding()]
    report = build_report(findings, checks={"sync", "memory"}, steps={"completed": 5, "warmup": 2, "measured": 3,
                          "source": "optimizer"}, fail_on={"oom:fragmentation"}, device=None, torch="2.11.0")
    jsonschema.validate(report, REPORT_SCHEMA)
    assert report["version"] == 1 and report["tool"] == "torchlint-sanitizer"
    assert report["checks"] == ["memory", "sync"] and report["torch"] == "2.11.0" and report["device"] is None
    assert report["findings"][0]["stack"][0] == {"file": "/proj/train.py", "line": 12, "function": "train"}
    json.dumps(report)  # plain JSON all the way down


def test_pytest_report_has_tests_instead_of_steps():
    report = build_report([], checks={"sync"}, tests={"t.py::a": {"outcome": "passed", "findings": 0,
                          "failed_by_sanitizer": False}}, device=None, torch=None)
    jsonschema.validate(report, REPORT_SCHEMA)
    assert "steps" not in report
    with pytest.raises(ValueError):
        build_report([], steps={}, tests={})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**report, "steps": {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}},
                            REPORT_SCHEMA)


def test_findings_round_trip_through_json(tmp_path):
    original = [sync_finding(12, stall=4.5), oom_finding()]
    path = tmp_path / "out" / "report.json"
    write_report(str(path), build_report(original, steps={"completed": 0, "warmup": 0, "measured": 0, "source": "none"},
                                         device=None, torch=None))
    loaded = [Finding.from_json(f) for f in json.loads(path.read_text())["findings"]]
    assert loaded == original


def test_sync_line_format(tmp_path):
    line = finding_line(sync_finding(12, stall=4.25, per_step=2.0, file=str(tmp_path / "train.py")), root=str(tmp_path))
    assert line == "train.py:12: sync item x2/step, 4.2 ms stalled — keep it on the GPU [TL101]"
    untimed = finding_line(sync_finding(7, kind="mask-index", per_step=0.5, every_step=False, rule="TL103"),
                           root="/elsewhere")
    assert untimed == "/proj/train.py:7: sync mask-index x0.5/step, stall not timed — keep it on the GPU [TL103]"
    no_steps = finding_line(sync_finding(7, count=3, every_step=None), root="/proj")
    assert no_steps.startswith("train.py:7: sync item x3, stall not timed")


def test_other_kinds_line_format():
    line = finding_line(oom_finding(), root="/proj")
    assert line == "train.py:50: oom x1 — out of memory caused by fragmentation — PYTORCH_ALLOC_CONF=expandable_segments:True"
    process = Finding(kind="low-utilization", severity="warning", message="GPU busy 31% of the run")
    assert finding_line(process).startswith("<process>: low-utilization x1 — GPU busy 31%")


def test_rank_puts_errors_first_then_time_lost_then_count():
    slow = sync_finding(1, stall=50.0, count=2)
    frequent = sync_finding(2, stall=1.0, count=100)
    untimed = sync_finding(3, count=500)
    ordered = rank([untimed, frequent, slow, oom_finding()])
    assert [f.line for f in ordered] == [50, 1, 2, 3]


def test_summary_is_short_and_ranked():
    findings = [sync_finding(line, stall=float(line)) for line in range(1, 15)]
    text = render_summary(findings, {"completed": 10, "warmup": 2, "measured": 8, "source": "optimizer"},
                          limit=5, root="/proj")
    lines = text.splitlines()
    assert lines[0] == "torchlint sanitizer: 14 findings (14 sync), 105.0 ms stalled over 8 measured steps (2 warm-up)"
    assert len(lines) == 7 and lines[1].startswith("  train.py:14: sync item")
    assert lines[-1] == "  ... and 9 more (see the JSON report)"


def test_summary_without_findings_or_steps():
    assert render_summary([], {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}) == \
        "torchlint sanitizer: no findings over the whole run (no training steps seen)"
    assert render_summary([]) == "torchlint sanitizer: no findings"
