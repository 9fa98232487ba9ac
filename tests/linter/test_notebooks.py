"""Jupyter notebooks in the linter: discovery, one program across cells,
magics in place, cell positions in every format, fixes that touch only the
edited source lines, broken notebooks."""
from __future__ import annotations

import difflib
import io
import json
import shutil
import sys
from pathlib import Path

import jsonschema
import nbformat
import pytest

from torchlint.cli import main
from torchlint.linter import FileOptions
from torchlint.notebook import lint_notebook, program_of
from torchlint.registry import all_rules

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "notebooks"
SARIF_SCHEMA = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())

# train.ipynb: 1 markdown, 2 imports (%matplotlib, !nvidia-smi), 3 the loader and model,
# 4 the loop (%%time, an indented %time), 5 %%bash, 6 evaluation (x = !ls, model?, a noqa'd .item()).
LOADER_UNPINNED = "train.ipynb:cell 3:3:10: TL202"  # the loader is in cell 3, its batches copied in cell 4
ITEM_PER_STEP = "train.ipynb:cell 4:10:19: TL101"
# The edits --fix --unsafe-fixes makes (pin_memory on the loader, an unsafe fix: the dataset may return CUDA
# tensors; non_blocking copies) as lines of the JSON text.
FIXED_JSON_LINES = {
    '    "loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)\\n",',
    '    "    x = x.to(device, non_blocking=True)\\n",',
    '    "    y = y.to(device, non_blocking=True)\\n",',
    '    "        total += model(x.to(device, non_blocking=True)).sum().item()  # noqa: TL101\\n"',
}


@pytest.fixture
def notebooks(tmp_path, monkeypatch):
    """The fixtures in a folder of their own (under tests/ they would be test modules)."""
    for path in FIXTURES.glob("*.ipynb"):
        shutil.copy(path, tmp_path / path.name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_cli(capsys, *args):
    code = main(["--jobs", "1", "--no-cache", "--preview", "--select", "ALL", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_notebooks_are_discovered_like_python_files(notebooks, capsys):
    (notebooks / "module.py").write_text("x = 1\n")
    _, out, _ = run_cli(capsys, "--show-files", ".")
    assert sorted(out.split()) == sorted(["./broken_json.ipynb", "./module.py", "./train.ipynb", "./train_indent2.ipynb",
                                          "./unknown_nbformat.ipynb"])
    _, out, _ = run_cli(capsys, "--show-files", "--extend-exclude", "*.ipynb", ".")
    assert out.split() == ["./module.py"]
    (notebooks / "tool.pyw").write_text("x = 1\n")
    _, out, _ = run_cli(capsys, "--show-files", "--extend-exclude", "*.ipynb", "--extend-include", "*.pyw", ".")
    assert sorted(out.split()) == ["./module.py", "./tool.pyw"]


def test_extend_include_and_exclude_from_the_config(notebooks, capsys):
    (notebooks / "pyproject.toml").write_text('[tool.torchlint]\nextend-exclude = ["broken_*", "unknown_*"]\nextend-include = ["*.pyw"]\n')
    (notebooks / "tool.pyw").write_text("x = 1\n")
    _, out, _ = run_cli(capsys, "--show-files", ".")
    assert sorted(out.split()) == ["./tool.pyw", "./train.ipynb", "./train_indent2.ipynb"]


def test_cells_are_one_program_and_magics_keep_positions(notebooks, capsys):
    code, out, _ = run_cli(capsys, "train.ipynb")
    assert code == 1
    lines = out.splitlines()
    # Built in cell 3, iterated and copied in cell 4: the finding needs both cells.
    assert any(line.startswith(LOADER_UNPINNED) for line in lines), out
    # %%time is line 1 of cell 4 and `%time pass` sits in the loop's body: the .item() stays at 10:19.
    assert any(line.startswith(ITEM_PER_STEP) for line in lines), out
    # The noqa'd line of cell 6 and the %%bash cell 5 report nothing.
    assert not any("cell 5:" in line or "cell 6:" in line for line in lines), out


def test_noqa_works_per_line_of_a_cell(notebooks, capsys):
    _, out, _ = run_cli(capsys, "--ignore-noqa", "train.ipynb")
    assert "train.ipynb:cell 6:6:18: TL101" in out


def test_a_cell_alone_does_not_make_the_finding(notebooks, capsys):
    """Without the cells that copy its batches, the loader is not reported: the finding is cross-cell."""
    notebook = nbformat.read(notebooks / "train.ipynb", as_version=4)
    del notebook.cells[5], notebook.cells[3]
    nbformat.write(notebook, notebooks / "no_loop.ipynb")
    _, out, _ = run_cli(capsys, "no_loop.ipynb")
    assert "TL202" not in out


@pytest.mark.parametrize("output_format, expected", [
    ("concise", LOADER_UNPINNED),
    ("full", LOADER_UNPINNED),
    ("grouped", "  cell 3:3:10 TL202"),
    ("pylint", "train.ipynb:cell 3:3: [TL202]"),
    ("junit", "cell 3, line 3, col 10,"),
    ("github", "line=3,col=10,endLine=3,endColumn=73,title=TL202 dataloader-not-pinned::" + LOADER_UNPINNED),
])
def test_every_text_format_names_the_cell(notebooks, capsys, output_format, expected):
    _, out, _ = run_cli(capsys, "--output-format", output_format, "train.ipynb")
    assert expected in out


def test_full_format_shows_the_cells_line(notebooks, capsys):
    _, out, _ = run_cli(capsys, "--output-format", "full", "train.ipynb")
    assert "   3 | loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4)\n" in out
    assert "  10 |     losses.append(loss.item())\n" in out


@pytest.mark.parametrize("output_format", ["json", "json-lines"])
def test_json_carries_the_cell(notebooks, capsys, output_format):
    _, out, _ = run_cli(capsys, "--output-format", output_format, "train.ipynb")
    entries = json.loads(out) if output_format == "json" else [json.loads(line) for line in out.splitlines()]
    pinned = next(entry for entry in entries if entry["code"] == "TL202")
    assert (pinned["cell"], pinned["location"], pinned["end_location"]) == (3, {"row": 3, "column": 10}, {"row": 3, "column": 73})
    edit = pinned["fix"]["edits"][0]
    assert edit["location"]["row"] == 3 and edit["content"].endswith("pin_memory=True")


def test_sarif_names_the_cell_and_stays_valid(notebooks, capsys):
    _, out, _ = run_cli(capsys, "--output-format", "sarif", "train.ipynb")
    document = json.loads(out)
    jsonschema.validate(document, SARIF_SCHEMA)
    pinned = next(result for result in document["runs"][0]["results"] if result["ruleId"] == "TL202")
    assert pinned["properties"]["cell"] == 3
    assert pinned["locations"][0]["message"]["text"] == "cell 3, line 3"
    assert pinned["locations"][0]["physicalLocation"]["region"]["startLine"] == 3


def _changed_lines(before: str, after: str):
    """The lines a byte-level comparison finds changed: (removed, added)."""
    removed, added = set(), set()
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), n=0, lineterm=""):
        if line.startswith(("---", "+++", "@@")):
            continue
        (removed if line.startswith("-") else added).add(line[1:])
    return removed, added


@pytest.mark.parametrize("name, indent", [("train.ipynb", "    "), ("train_indent2.ipynb", "        ")])
def test_fix_changes_only_the_edited_source_lines(notebooks, capsys, name, indent):
    before = (notebooks / name).read_bytes()
    code, out, err = run_cli(capsys, "--fix", "--unsafe-fixes", name)
    after = (notebooks / name).read_bytes()
    assert "fixed" in out and not err
    removed, added = _changed_lines(before.decode(), after.decode())
    # Jupyter's layout (1-space indent) or another tool's (2 spaces, ASCII escapes, no final newline) is kept.
    assert added == {indent + line[4:] for line in FIXED_JSON_LINES}
    assert len(removed) == len(added)
    assert before.endswith(b"\n") == after.endswith(b"\n")
    assert after.count(b"\n") == before.count(b"\n")
    nbformat.validate(nbformat.reads(after.decode(), as_version=nbformat.NO_CONVERT))
    old, new = json.loads(before), json.loads(after)
    for old_cell, new_cell in zip(old["cells"], new["cells"]):
        assert {k: v for k, v in old_cell.items() if k != "source"} == {k: v for k, v in new_cell.items() if k != "source"}
    assert new["cells"][3]["source"][0] == "%%time\n" and "    %time pass\n" in new["cells"][3]["source"]
    # Fixed: a second run changes nothing.
    run_cli(capsys, "--fix", "--unsafe-fixes", name)
    assert (notebooks / name).read_bytes() == after


def test_diff_is_per_cell_and_writes_nothing(notebooks, capsys):
    before = (notebooks / "train.ipynb").read_bytes()
    code, out, _ = run_cli(capsys, "--diff", "--unsafe-fixes", "train.ipynb")
    assert code == 1
    assert (notebooks / "train.ipynb").read_bytes() == before
    assert "--- a/train.ipynb:cell 3\n+++ b/train.ipynb:cell 3\n" in out
    assert "+loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)\n" in out
    assert "--- a/train.ipynb:cell 4\n" in out and "--- a/train.ipynb:cell 6\n" in out
    assert "cell 5" not in out


def test_add_noqa_writes_into_the_cells_line(notebooks, capsys):
    run_cli(capsys, "train.ipynb", "--add-noqa")
    cells = json.loads((notebooks / "train.ipynb").read_text())["cells"]
    assert cells[3]["source"][9] == "    losses.append(loss.item())  # noqa: TL101\n"
    assert cells[3]["source"][10] == "    %time pass\n"
    code, out, _ = run_cli(capsys, "train.ipynb", "--select", "TL101")
    assert code == 0, out


@pytest.mark.parametrize("name, reason", [
    ("broken_json.ipynb", "broken_json.ipynb:1:1: TL000 not a notebook: invalid JSON"),
    ("unknown_nbformat.ipynb", "unknown_nbformat.ipynb:1:1: TL000 unknown nbformat 9"),
])
def test_a_broken_notebook_is_one_error_and_the_others_are_linted(notebooks, capsys, name, reason):
    code, out, err = run_cli(capsys, name, "train.ipynb")
    assert code == 1 and "internal error" not in err
    assert [line for line in out.splitlines() if line.startswith(name)] == [line for line in out.splitlines() if reason in line]
    assert sum(reason in line for line in out.splitlines()) == 1
    assert LOADER_UNPINNED in out


def test_a_broken_notebook_is_left_alone_by_fix(notebooks, capsys):
    before = (notebooks / "broken_json.ipynb").read_bytes()
    run_cli(capsys, "--fix", "--unsafe-fixes", "broken_json.ipynb")
    assert (notebooks / "broken_json.ipynb").read_bytes() == before


def test_stdin_with_a_notebook_name(notebooks, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO((notebooks / "train.ipynb").read_bytes())))
    code, out, _ = run_cli(capsys, "--stdin-filename", "train.ipynb", "-")
    assert code == 1 and LOADER_UNPINNED in out


def test_the_result_cache_keeps_cell_positions(notebooks, capsys):
    first = main(["--jobs", "1", "--preview", "--select", "ALL", "--cache-dir", str(notebooks / ".cache"), "train.ipynb"])
    out_first = capsys.readouterr().out
    second = main(["--jobs", "1", "--preview", "--select", "ALL", "--cache-dir", str(notebooks / ".cache"), "train.ipynb"])
    assert (first, out_first) == (second, capsys.readouterr().out) and LOADER_UNPINNED in out_first


def test_lint_notebook_returns_findings_with_cell_positions():
    output = lint_notebook((FIXTURES / "train.ipynb").read_text(), "nb/train.ipynb", FileOptions(rules=list(all_rules().values())))
    places = {(d.code, d.cell, d.row, d.column) for d in output.diagnostics}
    assert ("TL202", 3, 3, 10) in places and ("TL101", 4, 10, 19) in places


def _program(*sources, kind="code"):
    cells = [nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source) for source in sources]
    return program_of(nbformat.writes(nbformat.v4.new_notebook(cells=cells)))


def test_magics_become_pass_lines_at_their_indentation():
    program = _program("for i in range(3):\n    !echo {i} \\\n        --flag\n    x = %env HOME\n    y = i\nobj?\n")
    assert program.text.splitlines()[1:] == ["for i in range(3):", "    pass", "    pass", "    pass", "    y = i", "pass"]


def test_percent_lines_inside_a_string_are_text():
    program = _program('text = """\n%d items\n!important\n"""\n')
    assert program.text.splitlines()[1:] == ['text = """', "%d items", "!important", '"""']


def test_cells_of_another_language_are_left_out():
    program = _program("%%bash\nls -l\n", "%%timeit\nx = 1\n", "%%writefile a.py\nimport os\n")
    assert program.text == "# torchlint: cell 2\npass\nx = 1\n"
    assert program.place(3) == (2, 2)


def test_nbformat_3_notebooks_are_linted():
    cell = {"cell_type": "code", "input": ["import torch\n", "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n",
                                          "x = torch.ones(3).cuda()\n"], "language": "python",
            "metadata": {}, "outputs": []}
    text = json.dumps({"metadata": {}, "nbformat": 3, "nbformat_minor": 0,
                       "worksheets": [{"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# v3"]}, cell],
                                       "metadata": {}}]})
    output = lint_notebook(text, "old.ipynb", FileOptions(rules=[all_rules()["TL501"]]))
    assert [(d.code, d.cell, d.row) for d in output.diagnostics] == [("TL501", 2, 3)]
