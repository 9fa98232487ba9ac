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
from torchlint.fix_command import fix_command
from torchlint.lifecycle import is_preview
from torchlint.registry import all_rules
from torchlint.runtime_join import RuntimeReportError, join, load_reports

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
# The tour's two TL101 sites are measured; every other warning or error is listed as seen at run
# time only; its notes (the one-off syncs) are counted, not listed.
NOTES = sum(1 for f in FINDINGS if f["severity"] == "info")
RUNTIME_ONLY = len(FINDINGS) - NOTES - 2


@pytest.fixture
def in_examples(monkeypatch):
    monkeypatch.chdir(ROOT / "examples")


@pytest.fixture
def unreached(tmp_path):
    """A file with a static finding the run never reached (the tour itself is CUDA-only by
    design, so TL501 is silent on it)."""
    path = tmp_path / "placement.py"
    path.write_text("def place(x, device):\n    return x.cuda()\n")
    return str(path)


def run_cli(capsys, *args):
    code = main(["--jobs", "1", "--preview", *args])
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
    # Without the report the file's order holds.
    _, plain, _ = run_cli(capsys, "sanitizer_tour.py")
    assert plain.splitlines()[0].startswith(f"sanitizer_tour.py:{min(_line(ITEM), _line(HELPER))}:")


def test_a_sync_in_a_helper_joins_the_finding_in_the_helper(in_examples, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "--output-format", "full", "sanitizer_tour.py")
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
            f"(the linter's blind spot, or a rule not selected); {NOTES} notes of the run (periodic or one-off "
            "syncs, headroom) not listed.") in out


def test_a_static_finding_the_run_never_reached_stays_as_it_was(in_examples, unreached, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "sanitizer_tour.py", unreached)
    _, plain, _ = run_cli(capsys, "sanitizer_tour.py", unreached)
    [joined] = [line for line in out.splitlines() if " TL501 " in line]
    [before] = [line for line in plain.splitlines() if " TL501 " in line]
    assert joined == before


def test_json_and_sarif_carry_measured(in_examples, unreached, capsys):
    _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "--output-format", "json", "sanitizer_tour.py", unreached)
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


def test_every_output_format_puts_the_measured_findings_first(in_examples, unreached, capsys):
    item_line = _line(ITEM)
    for fmt in ("full", "grouped", "pylint", "json-lines", "github", "junit"):
        _, out, _ = run_cli(capsys, "--runtime-report", str(REPORT), "--output-format", fmt, "sanitizer_tour.py", unreached)
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
    # A note of the run in a file this lint did not cover is counted; a measured stall there is listed.
    stranger = dict(finding, file="/elsewhere/data.py", stack=[], severity="info")
    joined = join([here], [{"findings": [stranger]}])
    assert not joined.measured and not joined.runtime_only and joined.outside == 1
    joined = join([here], [{"findings": [dict(stranger, severity="warning")]}])
    assert [entry["linted"] for entry in joined.runtime_only] == [False] and joined.blocking


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
    assert ("--preview" in command.split()) == is_preview(all_rules()["TL201"])  # a preview rule's fix needs --preview
    assert fix_command([dict(copy, file=str(tmp_path / "train.py"))]) == command  # absolute paths shown relative
    race = {"kind": "race", "rule": None, "file": "train.py", "line": 7, "stack": [], "count": 1, "details": {}, "message": "r"}
    assert fix_command([race]) is None
    # The tour's measured TL101 sites have no autofix: no command is printed for them.
    tour = json.loads(REPORT.read_text())["findings"]
    monkeypatch.chdir(ROOT)
    assert fix_command(tour) is None


def _report(tmp_path, findings):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"tool": "torchlint-sanitizer", "version": 1, "findings": findings}))
    return str(path)


RACE = {"kind": "race", "severity": "error", "rule": None, "line": 4, "stack": [], "count": 1, "details": {},
        "message": "x written on side while the default stream reads it", "fix_hint": "wait_stream"}
OOM = {"kind": "oom", "severity": "error", "rule": None, "line": 5, "stack": [], "count": 1,
       "details": {"requested_bytes": 1 << 30}, "message": "CUDA out of memory"}


def test_select_never_hides_a_race_an_oom_or_a_measured_sync_and_never_says_all_passed(tmp_path, monkeypatch, capsys):
    """issue #32: `--select TL101` filed a race and an OOM under "files not linted" and said All checks passed!"""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(4)\ny = x * 2\nz = y + 1\nw = z * 3\n")
    sync = {"kind": "sync", "severity": "warning", "rule": "TL102", "file": "train.py", "line": 3, "stack": [],
            "count": 40, "details": {"stall_ms": 12.0, "sync_kind": "synchronize"}, "message": "explicit synchronize"}
    report = _report(tmp_path, [dict(RACE, file="train.py"), dict(OOM, file="train.py"), sync])
    code, out, _ = run_cli(capsys, "-n", "--select", "TL101", "--runtime-report", report, "train.py")
    assert code == 1 and "All checks passed!" not in out
    lines = out.splitlines()
    assert lines[0].startswith("train.py:4: seen at run time only: race")
    assert lines[1].startswith("train.py:5: seen at run time only: oom")
    assert lines[2].startswith("train.py:3: seen at run time only: sync synchronize (measured: 40x, 12.0 ms")
    assert "No lint findings, but the run found the problems listed above." in out


def test_a_race_in_a_file_the_lint_did_not_cover_is_listed_as_such(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import torch\n")
    report = _report(tmp_path, [dict(RACE, file="/cluster/job/prefetch.py")])
    code, out, _ = run_cli(capsys, "-n", "--runtime-report", report, "train.py")
    assert code == 1
    assert out.startswith("/cluster/job/prefetch.py:4: seen at run time only (in a file this lint did not cover): race")


@pytest.mark.parametrize("finding, reason", [
    ({"path": "m.py", "line": 3}, 'finding 0: no "kind"'),
    (3, "finding 0: not an object (int)"),
    ({"kind": "sync", "file": "m.py", "line": 3, "count": "many"}, 'finding 0: "count" is \'many\', not a whole number'),
    ({"kind": "sync", "file": "m.py", "line": "3"}, 'finding 0: "line" is \'3\''),
    ({"kind": "sync", "stack": [{"file": "m.py"}]}, "finding 0: a stack frame is"),
])
def test_an_incomplete_report_is_a_one_line_error_naming_the_file_and_the_finding(tmp_path, capsys, finding, reason):
    """issue #31 (24): these gave a KeyError or AttributeError traceback."""
    (tmp_path / "m.py").write_text("import torch\n")
    report = _report(tmp_path, [finding])
    code, _, err = run_cli(capsys, "-n", "--runtime-report", report, str(tmp_path / "m.py"))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"torchlint: error: {report}: {reason}")


def test_a_copy_from_an_unpinned_loader_joins_the_tl202_finding_at_the_loader(tmp_path, monkeypatch, capsys):
    """The runtime says TL202 at the copy; the linter reports TL202 at the DataLoader: they are one problem."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import torch
        from torch.utils.data import DataLoader

        loader = DataLoader(dataset, batch_size=32, num_workers=4)
        for images, labels in loader:
            images = images.to("cuda", non_blocking=True)
            loss = model(images)
            loss.backward()
    """))
    copy = {"kind": "sync", "severity": "warning", "rule": "TL202", "file": "train.py", "line": 6, "stack": [],
            "count": 98, "details": {"stall_ms": 30.0, "sync_kind": "pageable-copy"}, "message": "pageable copy"}
    code, out, _ = run_cli(capsys, "-n", "--runtime-report", _report(tmp_path, [copy]), "train.py")
    first = out.splitlines()[0]
    assert first.startswith("train.py:4:") and " TL202 " in first and first.endswith("(measured: 98x, 30.0 ms host wait)")
    assert "1 finding measured at run time, 0 seen at run time only" in out
