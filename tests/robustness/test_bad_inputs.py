"""The bad-input matrix: no single input aborts a run.

Each case is one bad file, directory or configuration next to a good file
with a known finding. The run must report the bad input on one line naming
it, still report the good file's finding, and exit with the documented code.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from torchlint.cli import main
from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules

GOOD = textwrap.dedent(
    """\
    import torch
    for batch in loader:
        batch = batch.to("cuda")
        loss = model(batch)
        total += loss.item()
    """
)
GOOD_FINDING = "good.py:5:14: TL101"
TORCHLINT = os.path.join(os.path.dirname(sys.executable), "torchlint")


@pytest.fixture
def tree(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.py").write_text(GOOD)
    return tmp_path


def run_cli(capsys, *args):
    code = main(["--jobs", "1", "--isolated", "--preview", *args])
    out, err = capsys.readouterr()
    return code, out, err


def run_process(*args, cwd, timeout=120):
    """The real command in its own process: a crash here cannot take the test run down."""
    return subprocess.run([TORCHLINT, "--isolated", "--preview", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


# -- discovery -------------------------------------------------------------------
@pytest.mark.parametrize(
    "links",
    [
        [("a.py", "b.py"), ("b.py", "a.py")],  # a loop of two links
        [("self", "self")],  # a link to itself, not named *.py
        [("self.py", "self.py")],
        [("dangling.py", "missing.py")],
    ],
)
def test_symlink_loops_and_dangling_links_do_not_stop_discovery(tree, capsys, links):
    directory = tree / "d"
    directory.mkdir()
    for name, target in links:
        os.symlink(target, directory / name)
    code, out, err = run_cli(capsys, ".")
    assert GOOD_FINDING in out, err
    assert "Traceback" not in err
    for name, _ in links:
        if name.endswith(".py"):
            assert f"{os.path.join('d', name)}:1:1: TL000 cannot read file" in out
    assert code == 1


def test_unreadable_directory_is_reported(tree, capsys, monkeypatch):
    locked = tree / "locked"
    locked.mkdir()
    (locked / "hidden.py").write_text(GOOD)
    real_scandir = os.scandir

    def scandir(path="."):  # root reads everything, so permissions cannot be tested by chmod here
        if os.path.basename(os.fspath(path)) == "locked":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, out, _ = run_cli(capsys, ".")
    assert GOOD_FINDING in out
    assert "locked:1:1: TL000 cannot read directory: Permission denied (os error 13)" in out
    assert code == 1


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory")
def test_unreadable_directory_is_reported_for_real(tree, capsys):
    locked = tree / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        code, out, _ = run_cli(capsys, ".")
    finally:
        locked.chmod(0o755)
    assert "locked:1:1: TL000 cannot read directory" in out and GOOD_FINDING in out


# -- deep code ---------------------------------------------------------------------
def _in_loop(body: str) -> str:
    return "import torch\nfor batch in loader:\n    batch = batch.cuda()\n    loss = model(batch)\n" + body


DEEP_VALID = {
    "elif chain of 320": _in_loop("    if loss.item() > 0:\n        pass\n" + "    elif x > 1:\n        pass\n" * 320),
    "elif chain of 1500": _in_loop("    if loss.item() > 0:\n        pass\n" + "    elif x > 1:\n        pass\n" * 1500),
    "sum of 320 terms": _in_loop("    y = loss.item() + " + " + ".join(["x"] * 320) + "\n"),
    "sum of 2500 terms": _in_loop("    y = loss.item() + " + " + ".join(["x"] * 2500) + "\n"),
    "chain of 160 .cuda()": _in_loop("    y = loss.item()\n    z = w" + ".cuda()" * 160 + "\n"),
    "chain of 1200 .cuda()": _in_loop("    y = loss.item()\n    z = w" + ".cuda()" * 1200 + "\n"),
}


@pytest.mark.parametrize("name", sorted(DEEP_VALID))
def test_deep_but_valid_code_is_linted(name):
    source = DEEP_VALID[name]
    compile(source, "deep.py", "exec")  # CPython accepts it, so must we
    out = lint_text(source, "deep.py", FileOptions(rules=list(all_rules().values())))
    assert not out.errors, out.errors[0]
    assert any(d.code == "TL101" and d.row == 5 for d in out.diagnostics)
    assert not any(d.code == "TL000" for d in out.diagnostics)


def test_too_deep_for_cpython_is_a_syntax_error_like_cpython_says(tree, capsys):
    (tree / "deep.py").write_text("x = " + " + ".join(["a"] * 100_000) + "\n")
    code, out, _ = run_cli(capsys, ".")
    assert "deep.py:1:1: TL000 SyntaxError: too deeply nested" in out and GOOD_FINDING in out
    assert code == 1


@pytest.mark.parametrize("depth", [1000, 1300, 5000])
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_nested_parentheses_agree_with_cpython_and_cost_one_file(tree, depth, jobs):
    """libcst's parser segfaults at ~1,273 levels; CPython rejects 200."""
    (tree / "parens.py").write_text("x = " + "(" * depth + "1" + ")" * depth + "\n")
    (tree / "zz_good.py").write_text(GOOD)  # sorted after the bad file: its result must survive
    result = run_process("--jobs", jobs, ".", cwd=tree)
    assert result.returncode == 1, result.stderr
    assert "parens.py:1:" in result.stdout and "TL000 SyntaxError: too many nested parentheses" in result.stdout
    assert GOOD_FINDING in result.stdout and "zz_good.py:5:14: TL101" in result.stdout


@pytest.mark.parametrize(
    "source,message",
    [
        ("def f():\n    pass\nreturn 1\n", "'return' outside function"),
        ("for x in y:\n    pass\nbreak\n", "'break' outside loop"),
        ("def f(a, a):\n    pass\n", "duplicate argument"),
        ("import os\nfrom __future__ import annotations\n", "from __future__ imports must occur at the beginning"),
        ("import os\n\n\n@dec\ndef f():\n    x = 1\n    global x\n", "assigned to before global declaration"),
    ],
)
def test_syntax_errors_are_what_cpython_compile_says(tree, capsys, source, message):
    (tree / "bad.py").write_text(source)
    code, out, _ = run_cli(capsys, ".")
    with pytest.raises(SyntaxError) as cpython:
        compile(source, "bad.py", "exec")
    assert f"bad.py:{cpython.value.lineno}:" in out  # CPython's line, though files are compiled in pieces
    assert "TL000" in out and message in out
    assert GOOD_FINDING in out and code == 1


def test_undecodable_and_unreadable_files_are_findings(tree, capsys):
    (tree / "latin.py").write_bytes(b"x = '\xe9'\n")
    os.symlink("nowhere.py", tree / "gone.py")
    code, out, _ = run_cli(capsys, ".")
    assert "latin.py:1:1: TL000 cannot decode file" in out
    assert "gone.py:1:1: TL000 cannot read file" in out
    assert GOOD_FINDING in out and code == 1


# -- configuration ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "pyproject,message",
    [
        ("tool = 1\n", "tool: expected a table"),
        ('[tool]\ntorchlint = "x"\n', "[tool.torchlint] must be a table"),
        ('[tool.torchlint]\nselect = ["TL999"]\n', "select: Unknown rule selector: `TL999`"),
        ('[tool.torchlint]\nignore = ["XX1"]\n', "ignore: Unknown rule selector: `XX1`"),
        ('[tool.torchlint]\nunfixable = ["TL9"]\n', "unfixable: Unknown rule selector"),
        ('[tool.torchlint.per-file-ignores]\n"a.py" = ["TL999"]\n', "per-file-ignores.a.py: Unknown rule selector"),
    ],
)
def test_config_errors_are_one_line_naming_file_and_key(tree, pyproject, message):
    (tree / "pyproject.toml").write_text(pyproject)
    result = subprocess.run([TORCHLINT, "--preview", "."], cwd=tree, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "pyproject.toml" in result.stderr and message in result.stderr


@pytest.mark.parametrize(
    "pyproject",
    [
        'project = "x"\n[tool.torchlint]\n',
        '[project]\noptional-dependencies = ["torch>=2.1"]\n[tool.torchlint]\n',
        '[project]\ndependencies = "torch>=2.1"\n[tool.torchlint]\n',
        "[project.optional-dependencies]\ngpu = 3\n[tool.torchlint]\n",
    ],
)
def test_malformed_project_table_does_not_stop_the_lint(tree, pyproject):
    """[project] is packaging's to validate; torchlint only reads a torch bound from it."""
    (tree / "pyproject.toml").write_text(pyproject)
    result = subprocess.run([TORCHLINT, "--preview", "."], cwd=tree, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert GOOD_FINDING in result.stdout


def test_non_utf8_pyproject_names_the_file(tree):
    (tree / "pyproject.toml").write_bytes(b"[tool.torchlint]\n# caf\xe9\n")
    result = subprocess.run([TORCHLINT, "--preview", "."], cwd=tree, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "pyproject.toml: not UTF-8" in result.stderr


def test_null_bytes_are_a_syntax_error(tree, capsys):
    (tree / "bad.py").write_text("x = 1\0\n")
    code, out, _ = run_cli(capsys, ".")
    assert "bad.py:1:1: TL000" in out and "null bytes" in out and GOOD_FINDING in out and code == 1
