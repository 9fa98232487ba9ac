"""The torchlint command as users run it: exit codes, formats, config, noqa, stdin."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from torchlint.cli import main

SYNC = textwrap.dedent(
    """\
    import torch
    for batch in loader:
        loss = model(batch)
        loss.backward()
        total += loss.item()
    """
)
CLEAN = "import torch\nx = torch.ones(3)\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(SYNC)
    (tmp_path / "clean.py").write_text(CLEAN)
    return tmp_path


def run_cli(capsys, *args):
    code = main(["--jobs", "1", "--preview", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_findings_exit_one_and_concise_format(project, capsys):
    code, out, _ = run_cli(capsys, ".")
    assert code == 1
    assert "train.py:5:14: TL101 " in out
    assert "Found 1 error." in out


def test_clean_exit_zero(project, capsys):
    code, out, _ = run_cli(capsys, "clean.py")
    assert code == 0 and "All checks passed!" in out


def test_exit_zero_flag_keeps_errors_at_two(project, capsys):
    assert run_cli(capsys, "--exit-zero", ".")[0] == 0
    (project / "pyproject.toml").write_text("[tool.torchlint]\nbogus = 1\n")
    code, _, err = run_cli(capsys, "--exit-zero", ".")
    assert code == 2 and "unknown key `bogus`" in err and "pyproject.toml" in err


def test_unknown_selector_is_usage_error(project, capsys):
    code, _, err = run_cli(capsys, "--select", "TL999", ".")
    assert code == 2 and "Unknown rule selector" in err and len(err.strip().splitlines()) == 1


def test_select_ignore_and_prefixes(project, capsys):
    assert run_cli(capsys, "--ignore", "TL101", ".")[0] == 0
    assert run_cli(capsys, "--select", "TL1", ".")[0] == 1
    assert run_cli(capsys, "--select", "TL2", ".")[0] == 0
    assert run_cli(capsys, "--select", "ALL", "--ignore", "TL1", ".")[0] == 0


def test_cli_select_beats_config(project, capsys):
    (project / "pyproject.toml").write_text('[tool.torchlint]\nselect = ["TL1", "TL2"]\nignore = ["TL101"]\n')
    assert run_cli(capsys, ".")[0] == 0
    assert run_cli(capsys, "--select", "TL101", ".")[0] == 1


def test_per_file_ignores_cli_and_config(project, capsys):
    assert run_cli(capsys, "--per-file-ignores", "train.py:TL101", ".")[0] == 0
    (project / "pyproject.toml").write_text('[tool.torchlint.per-file-ignores]\n"train*.py" = ["TL1"]\n')
    assert run_cli(capsys, ".")[0] == 0
    (project / "pyproject.toml").write_text('[tool.torchlint.per-file-ignores]\n"!train*.py" = ["TL1"]\n')
    assert run_cli(capsys, ".")[0] == 1


@pytest.mark.parametrize(
    "table,message",
    [
        ("select = \"TL101\"", "expected a list of strings"),
        ("target-torch = \"latest\"", "target-torch"),
        ("output-format = \"xml\"", "unknown format"),
        ("[tool.torchlint.rules.TL101]\nnope = 1", "unknown option `nope`"),
        ("[tool.torchlint.rules.TL999]\nx = 1", "unknown rule"),
        ("select = [\"TL1\"", "invalid TOML"),
    ],
)
def test_config_errors_name_the_file_and_exit_two(project, capsys, table, message):
    body = table if table.startswith("[") else f"[tool.torchlint]\n{table}"
    (project / "pyproject.toml").write_text(body + "\n")
    code, _, err = run_cli(capsys, ".")
    assert code == 2
    assert message in err and "pyproject.toml" in err
    assert len(err.strip().splitlines()) == 1


def test_nearest_pyproject_wins_and_explicit_config(project, capsys):
    sub = project / "pkg"
    sub.mkdir()
    (sub / "train.py").write_text(SYNC)
    (sub / "pyproject.toml").write_text('[tool.torchlint]\nignore = ["TL101"]\n')
    code, out, _ = run_cli(capsys, ".")
    assert "pkg" not in out and "train.py:5" in out
    other = project / "strict.toml"
    other.write_text('select = ["TL2"]\n')
    assert run_cli(capsys, "--config", str(other), ".")[0] == 0
    assert run_cli(capsys, "--config", "select = ['TL2']", ".")[0] == 0


def test_noqa_forms(project, capsys):
    (project / "train.py").write_text(SYNC.replace("loss.item()", "loss.item()  # noqa: TL101"))
    assert run_cli(capsys, ".")[0] == 0
    (project / "train.py").write_text(SYNC.replace("loss.item()", "loss.item()  # noqa: TL201"))
    assert run_cli(capsys, ".")[0] == 1
    (project / "train.py").write_text(SYNC.replace("loss.item()", "loss.item()  # noqa"))
    assert run_cli(capsys, ".")[0] == 0
    assert run_cli(capsys, "--ignore-noqa", ".")[0] == 1
    (project / "train.py").write_text("# torchlint: noqa\n" + SYNC)
    assert run_cli(capsys, ".")[0] == 0
    (project / "train.py").write_text("# torchlint: noqa: TL201\n" + SYNC)
    assert run_cli(capsys, ".")[0] == 1


def test_add_noqa_then_clean(project, capsys):
    code, _, err = run_cli(capsys, "--add-noqa", ".")
    assert code == 0 and "Added 1 noqa directive." in err
    assert "total += loss.item()  # noqa: TL101" in (project / "train.py").read_text()
    assert run_cli(capsys, ".")[0] == 0


def test_syntax_error_and_undecodable_files_are_findings(project, capsys):
    (project / "broken.py").write_text("for x in y\n    pass\n")
    (project / "latin.py").write_bytes(b"x = '\xe9'\n")
    code, out, err = run_cli(capsys, ".")
    assert code == 1
    assert "broken.py:1:" in out and "TL000" in out
    assert "latin.py:1:1: TL000 cannot decode" in out
    assert "train.py:5:14: TL101" in out  # the other files are still linted


def test_declared_latin1_file_is_read(project, capsys):
    (project / "latin.py").write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    assert run_cli(capsys, "latin.py")[0] == 0


def test_missing_path(project, capsys):
    code, out, _ = run_cli(capsys, "nope.py")
    assert code == 1 and "nope.py:1:1: TL000 No such file or directory" in out


def test_json_format(project, capsys):
    code, out, _ = run_cli(capsys, "--output-format", "json", ".")
    data = json.loads(out)
    assert code == 1 and len(data) == 1
    item = data[0]
    assert set(item) >= {"code", "name", "message", "filename", "location", "end_location", "fix", "url", "noqa_row"}
    assert item["location"] == {"row": 5, "column": 14}
    assert item["fix"]["applicability"] == "display-only"
    assert item["fix"]["edits"][0]["content"] == "loss.detach()"
    assert os.path.isabs(item["filename"]) and item["url"].endswith("#tl101")


def test_json_lines_pylint_grouped_full(project, capsys):
    out = run_cli(capsys, "--output-format", "json-lines", ".")[1]
    assert json.loads(out.splitlines()[0])["code"] == "TL101"
    assert run_cli(capsys, "--output-format", "pylint", ".")[1].startswith("train.py:5: [TL101] ")
    grouped = run_cli(capsys, "--output-format", "grouped", ".")[1]
    assert grouped.startswith("train.py:\n  5:14 TL101 ")
    full = run_cli(capsys, "--output-format", "full", ".")[1]
    assert "    total += loss.item()" in full and "^^^^^^^^^^^" in full and "help:" in full


def test_junit_is_xml(project, capsys):
    import xml.etree.ElementTree as ET

    root = ET.fromstring(run_cli(capsys, "--output-format", "junit", ".")[1])
    case = root.find("testsuite/testcase")
    assert root.tag == "testsuites" and case.get("name") == "org.torchlint.TL101" and case.get("line") == "5"


def test_statistics(project, capsys):
    out = run_cli(capsys, "--statistics", ".")[1]
    assert out.strip() == "1\tTL101\t[ ] host-sync-in-loop"
    data = json.loads(run_cli(capsys, "--statistics", "--output-format", "json", ".")[1])
    assert data == [{"code": "TL101", "name": "host-sync-in-loop", "count": 1, "fixable": False, "fixable_count": 0}]


def test_output_file(project, capsys):
    run_cli(capsys, "-o", "report.json", "--output-format", "json", ".")
    assert json.loads((project / "report.json").read_text())[0]["code"] == "TL101"


def test_stdin(project, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(SYNC.encode())))
    code, out, _ = run_cli(capsys, "-", "--stdin-filename", "src/train.py")
    assert code == 1 and out.startswith("src/train.py:5:14: TL101")


def test_discovery_respects_gitignore_and_excludes(project, capsys):
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("generated/\n*_skip.py\n")
    for name in ("generated/a.py", "build/b.py", "c_skip.py", "src/d.py", "src/e.pyi", "src/f.txt", ".venv/g.py"):
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CLEAN)
    files = run_cli(capsys, "--show-files", ".")[1].split()
    names = sorted(os.path.basename(f) for f in files)
    assert names == ["clean.py", "d.py", "e.pyi", "train.py"]
    files = run_cli(capsys, "--show-files", "--no-respect-gitignore", ".")[1].split()
    assert any(f.endswith("a.py") for f in files) and any(f.endswith("c_skip.py") for f in files)
    files = run_cli(capsys, "--show-files", "--extend-exclude", "src", ".")[1].split()
    assert not any("src" in f for f in files)
    # A file named explicitly is linted unless --force-exclude.
    assert run_cli(capsys, "--show-files", "c_skip.py")[1].split() == ["c_skip.py"]
    assert run_cli(capsys, "--show-files", "--force-exclude", "c_skip.py")[1].split() == []
    assert run_cli(capsys, "--show-files", "--force-exclude", "build/b.py")[1].split() == []


def test_directory_named_explicitly_inside_an_excluded_one_is_linted(project, capsys):
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("vendor/\n")
    for name in (".venv/lib/site-packages/pkg/a.py", "vendor/lib/b.py"):
        path = project / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(CLEAN)
    assert [os.path.basename(f) for f in run_cli(capsys, "--show-files", ".venv/lib/site-packages/pkg")[1].split()] == ["a.py"]
    assert [os.path.basename(f) for f in run_cli(capsys, "--show-files", "vendor/lib")[1].split()] == ["b.py"]
    assert run_cli(capsys, "--show-files", "--force-exclude", "vendor/lib/b.py")[1].split() == []
    assert run_cli(capsys, "--show-files", "--force-exclude", ".venv/lib/site-packages/pkg/a.py")[1].split() == []
    assert "a.py" not in run_cli(capsys, "--show-files", ".")[1]


def test_parallel_output_is_stable(project, capsys):
    for i in range(12):
        (project / f"m{i:02d}.py").write_text(SYNC)
    serial = run_cli(capsys, ".")[1]
    parallel = main(["--jobs", "2", "--preview", "."])
    assert parallel == 1
    assert capsys.readouterr()[0] == serial


def test_internal_error_reports_file_rule_and_continues(project, capsys, monkeypatch):
    from torchlint.registry import all_rules

    rule = all_rules()["TL101"]

    def boom(self, node):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(rule, "visit_If", boom, raising=False)
    (project / "other.py").write_text("for x in y:\n    if x:\n        pass\n")
    code, out, err = run_cli(capsys, ".")
    assert code == 2
    assert "other.py: internal error in rule TL101" in err and "kaboom" in err


def test_version_and_rule_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr()[0].startswith("torchlint ")
    assert main(["rule", "TL101"]) == 0
    doc = capsys.readouterr()[0]
    for heading in ("# host-sync-in-loop (TL101)", "## What it does", "## Why is this bad?", "## Example", "## Fix safety", "## References"):
        assert heading in doc
    assert main(["rule", "TL999"]) == 2
    assert main(["rule", "--all", "--output-format", "json"]) == 0
    assert any(r["code"] == "TL101" for r in json.loads(capsys.readouterr()[0]))


def test_console_script_installed():
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "torchlint"), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("torchlint")


def _run_with_terminal_stderr(args, cwd):
    """Run torchlint with stderr on a pseudo-terminal and stdout on a pipe."""
    import pty

    primary, secondary = pty.openpty()
    process = subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=secondary, stdin=subprocess.DEVNULL)
    os.close(secondary)
    terminal = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        terminal += chunk
    stdout = process.stdout.read()
    process.wait(timeout=120)
    os.close(primary)
    return process.returncode, stdout.decode(), terminal.decode()


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
def test_progress_on_a_terminal_only(project):
    for i in range(250):
        (project / f"m{i:03d}.py").write_text(SYNC)
    torchlint = os.path.join(os.path.dirname(sys.executable), "torchlint")
    code, stdout, terminal = _run_with_terminal_stderr([torchlint, "--isolated", "--preview", "--jobs", "1", "."], project)
    assert code == 1
    assert "linting: " in terminal and "/252 files" in terminal
    assert terminal.endswith("\r\x1b[K")  # erased before the report
    assert "\x1b" not in stdout and "linting" not in stdout and stdout.count("TL101") == 251
    for quiet in ("-q", "-s"):
        _, _, terminal = _run_with_terminal_stderr([torchlint, "--isolated", "--preview", "--jobs", "1", quiet, "."], project)
        assert "linting" not in terminal
    not_a_terminal = subprocess.run([torchlint, "--isolated", "--preview", "--jobs", "1", "."], cwd=project, capture_output=True, text=True)
    assert not_a_terminal.stderr == ""
