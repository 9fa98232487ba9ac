"""``torchlint check --runtime-report``: the lint of examples/ joined with a run recorded on an H100.

The report (tests/sanitizer/data/reports/tour.json) is examples/sanitizer_tour.py
run under ``torchlint-sanitize``; nothing here imports torch.
"""
from __future__ import annotations

import json
import pathlib
import textwrap

import pytest

from torchlint.cli import main
from torchlint.runtime_join import RuntimeReportError, fix_command, join, load_reports

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPORT = ROOT / "tests" / "sanitizer" / "data" / "reports" / "tour.json"
TOUR = ROOT / "examples" / "sanitizer_tour.py"


FINDINGS = json.loads(REPORT.read_text())["findings"]


def _line(marker: str) -> int:
    for number, text in enumerate(TOUR.read_text().splitlines(), 1):
        if marker in text:
            return number
    raise AssertionError(marker)


def _sync_at(marker: str) -> dict:
    """The recorded sync finding whose innermost frame is the tour's line holding ``marker``."""
    line = _line(marker)
    [finding] = [f for f in FINDINGS if f["kind"] == "sync" and f["line"] == line]
    return finding


def _measured(finding: dict) -> str:
    return f"(measured: {finding['count']}x, {finding['details']['stall_ms']:.1f} ms host wait)"


ITEM = 'total += loss.item()'
HELPER = 'print(f"step {step}: loss {loss:.4f}")'
# The tour's two TL101 sites are measured; every other runtime finding is the linter's blind spot.
RUNTIME_ONLY = len(FINDINGS) - 2


@pytest.fixture
def in_examples(monkeypatch):
    monkeypatch.chdir(ROOT / "examples")


def run_cli(capsys, *args):
    code = main(["--jobs", "1", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_static_tl101_with_a_measured_stall_sorts_first(in_examples, capsys):
    code, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "sanitizer_tour.py")
    lines = out.splitlines()
    assert code == 1
    costliest = max((ITEM, HELPER), key=lambda marker: _sync_at(marker)["details"]["stall_ms"])
    cheaper = HELPER if costliest == ITEM else ITEM
    assert lines[0].startswith(f"sanitizer_tour.py:{_line(costliest)}:") and " TL101 " in lines[0]
    assert lines[0].endswith(_measured(_sync_at(costliest)))
    assert lines[1].startswith(f"sanitizer_tour.py:{_line(cheaper)}:") and " TL101 " in lines[1]
    # Without the report the file's order holds: the TL501 at the top comes first.
    _, plain, _ = run_cli(capsys, "sanitizer_tour.py")
    assert " TL501 " in plain.splitlines()[0]


def test_a_sync_in_a_helper_joins_the_finding_in_the_helper(in_examples, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "sanitizer_tour.py")
    helper = _line(HELPER)
    [row] = [line for line in out.splitlines() if line.startswith(f"sanitizer_tour.py:{helper}:")]
    finding = _sync_at(HELPER)
    assert finding["function"] == "log_metrics" and finding["stack"][1]["function"] == "sync_part"
    assert "TL101" in row and "log_metrics()" in row and row.endswith(_measured(finding))


def test_runtime_only_findings_are_listed_with_a_summary_line(in_examples, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "sanitizer_tour.py")
    clip = _sync_at("clip_grad_norm_")
    assert f"sanitizer_tour.py:{clip['line']}: seen at run time only: sync bool {_measured(clip)}" in out
    race = _line("torch.mul(source, 2.0, out=buffer)")
    assert f"sanitizer_tour.py:{race}: seen at run time only: race" in out
    assert "<process>: seen at run time only: fragmentation" in out
    assert (f"Runtime report: 2 findings measured at run time, {RUNTIME_ONLY} seen at run time only "
            "(the linter's blind spot).") in out


def test_a_static_finding_the_run_never_reached_stays_as_it_was(in_examples, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "sanitizer_tour.py")
    _, plain, _ = run_cli(capsys, "sanitizer_tour.py")
    [joined] = [line for line in out.splitlines() if " TL501 " in line]
    [before] = [line for line in plain.splitlines() if " TL501 " in line]
    assert joined == before


def test_json_and_sarif_carry_measured(in_examples, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "--output-format", "json", "sanitizer_tour.py")
    entries = json.loads(out)
    item = _sync_at(ITEM)
    [measured] = [e["measured"] for e in entries if e["code"] == "TL101" and e["location"]["row"] == item["line"]]
    assert measured == {"count": item["count"], "host_wait_ms": item["details"]["stall_ms"], "bytes": None,
                        "kinds": ["sync item"], "runtime_findings": 1}
    assert entries[0]["code"] == "TL101" and entries[0]["measured"] is not None
    assert [e["measured"] for e in entries if e["code"] == "TL501"] == [None]
    only = [e for e in entries if e["code"] is None]
    assert len(only) == RUNTIME_ONLY and {e["runtime_kind"] for e in only} >= {"race", "oom", "sync", "fragmentation"}
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "--output-format", "sarif", "sanitizer_tour.py")
    results = json.loads(out)["runs"][0]["results"]
    assert results[0]["ruleId"] == "TL101" and results[0]["properties"]["measured"]["runtime_findings"] == 1
    assert sum(r["ruleId"] == "seen-at-run-time-only" for r in results) == RUNTIME_ONLY


def test_every_output_format_puts_the_measured_findings_first(in_examples, capsys):
    item_line = _line(ITEM)
    for fmt in ("full", "grouped", "pylint", "json-lines", "github", "junit"):
        _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "--output-format", fmt, "sanitizer_tour.py")
        first = out.index(str(item_line))
        assert "TL501" not in out[:first], fmt
        assert "measured" in out, fmt


def test_a_bad_report_is_a_one_line_error_naming_the_file(in_examples, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, _, err = run_cli(capsys, "--runtime-report", str(bad), "sanitizer_tour.py")
    assert code == 2 and err.startswith("torchlint: error: ") and "bad.json" in err and len(err.strip().splitlines()) == 1
    listing = tmp_path / "listing.json"
    listing.write_text("[]")
    with pytest.raises(RuntimeReportError, match="listing.json: the runtime report is not a JSON object"):
        load_reports([str(listing)])
    other = tmp_path / "other.json"
    other.write_text('{"tool": "something-else", "findings": []}')
    with pytest.raises(RuntimeReportError, match="other.json: not a torchlint sanitizer report"):
        load_reports([str(other)])
    with pytest.raises(RuntimeReportError, match="missing.json: cannot read"):
        load_reports([str(tmp_path / "missing.json")])


def test_paths_join_by_their_trailing_components():
    class D:
        def __init__(self, path, row, code):
            self.path, self.row, self.end_row, self.column, self.code = path, row, row, 1, code

    here = D("src/pkg/train.py", 10, "TL101")
    elsewhere = D("other/train.py", 10, "TL101")
    finding = {"kind": "sync", "rule": "TL101", "file": "/home/ci/checkout/src/pkg/train.py", "line": 10,
               "stack": [], "count": 3, "details": {"stall_ms": 2.0, "sync_kind": "item"}, "message": "m"}
    joined = join([elsewhere, here], [{"findings": [finding]}])
    assert joined.of(here)["count"] == 3 and joined.of(elsewhere) is None
    # A finding in a file this lint did not cover is neither joined nor "run time only".
    stranger = dict(finding, file="/elsewhere/data.py", stack=[])
    joined = join([here], [{"findings": [stranger]}])
    assert not joined.measured and not joined.runtime_only and joined.outside == 1


def test_the_sanitizers_closing_command_names_rules_with_a_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=32, pin_memory=True)
        for images, labels in loader:
            images = images.to("cuda")
            loss = model(images)
    """))
    copy = {"kind": "sync", "rule": "TL201", "file": "train.py", "line": 6, "stack": [], "count": 9,
            "details": {"stall_ms": 4.0, "sync_kind": "copy"}, "message": "blocking copy"}
    command = fix_command([copy])
    assert command is not None and command.startswith("torchlint --fix") and "--select TL201" in command
    assert command.endswith("train.py")
    assert fix_command([dict(copy, file=str(tmp_path / "train.py"))]) == command  # absolute paths shown relative
    race = {"kind": "race", "rule": None, "file": "train.py", "line": 7, "stack": [], "count": 1, "details": {}, "message": "r"}
    assert fix_command([race]) is None
    # The tour's measured TL101 sites have no autofix: no command is printed for them.
    tour = json.loads(REPORT.read_text())["findings"]
    monkeypatch.chdir(ROOT)
    assert fix_command(tour) is None
