"""bench/precision_sample.py on a small corpus of its own: the draw, the judging
sheet, the table and the promotion check, as the lead runs them."""
from __future__ import annotations

import csv
import importlib.util
import json
import pathlib
import sys
import textwrap

import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


measure = _load("precision_sample")
sheet = measure.precision_sheet

TRAIN = textwrap.dedent(
    """\
    import torch
    from helpers import log_value


    def train(model, loader, optimizer, device=None):
        for batch in loader:
            loss = model(batch.cuda())
            loss.backward()
            optimizer.step()
            a = loss.item()
            loss = model(batch)
            b = loss.item()
            loss = model(batch)
            c = loss.item()
            loss = model(batch)
            d = loss.item()


    if __name__ == "__main__":
        train(None, None, None)
    """
)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six projects, each with four TL101 findings in train.py (and TL501 on .cuda())."""
    root = tmp_path_factory.mktemp("corpus")
    rows = ["repo\tcommit\tfiles\tlicense\tsubtree"]
    for index in range(1, 7):
        project = root / f"owner+p{index}"
        project.mkdir()
        (project / "train.py").write_text(TRAIN)
        (project / "helpers.py").write_text("def log_value(x):\n    return x\n")
        (project / "requirements.txt").write_text("torch>=2.1\n")
        rows.append(f"owner/p{index}\tabc\t2\tLICENSE\tall .py")
    (root / "MANIFEST.tsv").write_text("\n".join(rows) + "\n")
    return root


@pytest.fixture(scope="module")
def drawn(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("measure")
    assert measure.main(["--corpus", str(corpus), "--out", str(out), "--for-promotion", "--rules", "TL101,TL501"]) == 0
    return out


def _rows(path):
    lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
    return list(csv.DictReader(lines, delimiter="\t"))


def _fill(path, verdicts):
    """Write the verdicts {id: (T|F, reason)} into a copy of the blank file."""
    text = path.read_text()
    out = []
    for line in text.splitlines():
        cells = line.split("\t")
        if not line.startswith("#") and cells[0] in verdicts:
            cells[-2:] = verdicts[cells[0]]
        out.append("\t".join(cells))
    filled = path.with_name("filled.tsv")
    filled.write_text("\n".join(out) + "\n")
    return filled


def test_the_draw_records_commit_seed_and_counts(drawn):
    text = (drawn / "verdicts.tsv").read_text()
    meta = json.loads(next(line for line in text.splitlines() if line.startswith("# draw: "))[len("# draw: "):])
    assert meta["seed"] == 0 and meta["per_rule"] == 15 and meta["for_promotion"] == 20 and len(meta["commit"]) == 40
    assert meta["population"]["TL101"] == {f"owner+p{i}": 4 for i in range(1, 7)}
    assert meta["files"] == {"py": 12}
    rows = _rows(drawn / "verdicts.tsv")
    by_rule = {code: [r for r in rows if r["code"] == code] for code in ("TL101", "TL501")}
    assert len(by_rule["TL101"]) == 20  # could meet the bar: at least 20
    assert len(by_rule["TL501"]) == 6  # six findings in all, fewer than the bar: all drawn
    assert all(r["verdict"] == "" and r["reason"] == "" for r in rows)


def test_the_draw_is_seeded(corpus, drawn):
    findings, files, errors = measure.lint_corpus(corpus, measure.projects_of(corpus))
    assert (files, errors) == ({"py": 12}, [])
    findings = [f for f in findings if f["code"] in ("TL101", "TL501")]
    again = measure.draw(findings, 0, 15, 20)
    assert [(f["id"], f["fingerprint"]) for f in again] == [(r["id"], r["fingerprint"]) for r in _rows(drawn / "verdicts.tsv")]
    other = measure.draw(findings, 5, 15, 20)
    assert {f["fingerprint"] for f in other if f["code"] == "TL101"} != {f["fingerprint"] for f in again if f["code"] == "TL101"}
    assert len(measure.draw(findings, 0, 15, 0)) == 15 + 6  # without --for-promotion: 15 per rule at most


def test_the_sheet_shows_each_finding_with_its_function_and_pointers(drawn):
    text = (drawn / "sheet.md").read_text()
    rows = _rows(drawn / "verdicts.tsv")
    for row in rows:
        assert f"## {row['id']}  {row['code']}  `{row['project']}/train.py:{row['row']}:{row['column']}`" in text
    first = text.split("## TL101-01 ", 1)[1].split("\n## ", 1)[0]
    assert "**Finding:** `.item()` forces a host-device sync" in first
    assert "(`train`, lines 5-16 of train.py, in full)" in first
    assert ">>" in first and "def train(model, loader, optimizer, device=None):" in first
    assert "project modules this file imports: `helpers.py`" in first
    assert "calls of `train(` in the project: `train.py:20`" in first
    assert "the torch version is declared in: `requirements.txt`" in first
    assert "judging.md" in text and "verdicts.tsv" in text


def test_the_sheet_stays_out_of_the_repository(corpus, capsys):
    assert measure.main(["--corpus", str(corpus), "--out", str(REPO / "bench" / "sheet"), "--rules", "TL501"]) == 1
    assert "write it outside the repository" in capsys.readouterr().err
    assert not (REPO / "bench" / "sheet").exists()


def test_table_gives_precision_interval_projects_and_reasons(drawn, tmp_path, capsys):
    rows = [r for r in _rows(drawn / "verdicts.tsv") if r["code"] == "TL101"]
    verdicts = {r["id"]: ("T", "") for r in rows}
    verdicts[rows[0]["id"]] = ("F", "periodic: a logger every 10 steps")
    filled = _fill(drawn / "verdicts.tsv", verdicts)
    designed_on = tmp_path / "designed-on.txt"
    designed_on.write_text("# comment\nowner+p1\tTL101 tuning\n")
    assert measure.main(["--table", str(filled), "--designed-on", str(designed_on)]) == 0
    out = capsys.readouterr().out
    all_projects, rest = out.split("## Projects not designed on")
    assert "| TL101 | 24 | 6 | 20 | 19 | 1 | 0 | 0.95 | [0.76, 0.99] | 6 | meets |" in all_projects
    assert "| TL501 | 6 | 6 | 6 | 0 | 0 | 6 | — | — | 0 | open |" in all_projects
    p1 = sum(1 for r in rows if r["project"] == "owner+p1")
    judged = 20 - p1
    true = judged - (0 if rows[0]["project"] == "owner+p1" else 1)
    assert f"| TL101 | 20 | 5 | {judged} | {true} | {judged - true} |" in rest and "left out: owner+p1" in rest
    assert f"  - periodic (1): {rows[0]['id']} periodic: a logger every 10 steps" in out


def test_promotion_follows_the_bar_and_refuses_a_changed_sample(drawn, capsys):
    rows = [r for r in _rows(drawn / "verdicts.tsv") if r["code"] == "TL101"]
    tl501 = [r for r in _rows(drawn / "verdicts.tsv") if r["code"] == "TL501"]
    verdicts = {r["id"]: ("T", "") for r in rows}
    verdicts.update({r["id"]: ("F", "device chosen elsewhere: the caller passes it") for r in tl501})
    filled = _fill(drawn / "verdicts.tsv", verdicts)
    assert measure.main(["--promote", str(filled), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "TL101: promoted to stable (20/20 TRUE = 1.00 from 6 projects)" in out
    assert "TL501: stays in preview (0/6 TRUE = 0.00 from 6 projects, below 0.90)" in out

    # The findings change (one judged finding gone, another drawn in its place): the verdicts are stale.
    meta, judged = measure.read_verdicts([filled])
    now = [dict(r) for r in judged[1:]] + [dict(judged[0], fingerprint="0123456789ab")]
    with pytest.raises(measure.MeasureError, match="the findings changed since the sample was drawn .*: .* for TL101; draw a fresh sample"):
        measure.check_reproduced(meta, judged, now)
    measure.check_reproduced(meta, judged, [dict(r) for r in judged])


def test_promote_can_decide_chosen_rules_only(drawn, capsys):
    """Each rule's sample is drawn on its own: ``--rules`` decides those rules
    from a draw whose other rules may have changed since."""
    rows = [r for r in _rows(drawn / "verdicts.tsv") if r["code"] == "TL101"]
    filled = _fill(drawn / "verdicts.tsv", {r["id"]: ("T", "") for r in rows})
    assert measure.main(["--promote", str(filled), "--rules", "TL101", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "TL101: promoted to stable (20/20 TRUE = 1.00 from 6 projects)" in out and "TL501" not in out


def test_promote_decides_each_rule_by_its_own_measure():
    meta = {"commit": "c" * 40, "seed": 0}

    def rows(code, true, false, projects):
        return [{"code": code, "project": f"p{i % projects}", "verdict": "T" if i < true else "F", "reason": ""}
                for i in range(true + false)]

    judged = rows("TL101", 19, 1, 5) + rows("TL201", 15, 0, 6) + rows("TL202", 18, 3, 6) + rows("TL203", 25, 0, 4)
    current = {"TL201": {"since": "0.1.0"}, "TL202": {"since": "0.1.0"}}
    stable, report = measure.promote(meta, judged, [pathlib.Path("/tmp/v.tsv")], current)
    assert set(stable) == {"TL101", "TL201"}  # TL201 keeps its status: 15 judged cannot tell
    assert stable["TL101"]["judged"] == 20 and stable["TL101"]["precision"] == 0.95 and stable["TL101"]["projects"] == 5
    assert stable["TL101"]["interval"] == [0.764, 0.991] and stable["TL101"]["commit"] == "c" * 40
    assert "TL202: back to preview" in "\n".join(report)
    assert "TL203: stays preview: not enough judged to decide" in "\n".join(report)  # four projects only


def test_bad_verdicts_are_one_line_errors(drawn, tmp_path, capsys):
    bad = _fill(drawn / "verdicts.tsv", {"TL101-01": ("maybe", "")})
    assert measure.main(["--table", str(bad)]) == 1
    assert capsys.readouterr().err.strip() == f"precision_sample: error: {bad}: TL101-01: verdict must be T or F, got 'maybe'"
    other = tmp_path / "other.tsv"
    other.write_text((drawn / "verdicts.tsv").read_text().replace('"seed": 0', '"seed": 9'))
    assert measure.main(["--table", str(drawn / "verdicts.tsv"), str(other)]) == 1
    assert "drawn at another commit or seed" in capsys.readouterr().err
    assert measure.main(["--table", str(tmp_path / "missing.tsv")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_notebook_findings_show_their_cell(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("import torch\nmodel = Net().cuda()"),
        nbformat.v4.new_code_cell("for x in loader:\n    loss = model(x)\n    print(loss.item())"),
    ]
    path = tmp_path / "nb.ipynb"
    nbformat.write(notebook, str(path))
    title, code = sheet.excerpt(path, {"row": 5})  # rows of the code cells read one after another
    assert title == "notebook cell 3 of nb.ipynb, in full"  # numbered as the linter does: from 1, markdown included
    assert ">>    3      print(loss.item())" in code
    title, code = sheet.excerpt(path, {"row": 2, "cell": 2})  # the linter's own cell and row
    assert title.startswith("notebook cell 2") and ">>    2  model = Net().cuda()" in code


def test_a_long_block_shows_a_window_under_the_lines_that_open_it(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(300))
    path = tmp_path / "long.py"
    path.write_text("import torch\nif __name__ == '__main__':\n    for step in range(10):\n" + body + "        loss.item()\n")
    row = 304
    title, code = sheet.excerpt(path, {"row": row})
    assert title == "the top-level statement, lines 244-304 of its 2-304 in long.py"
    assert code.startswith("      2  if __name__ == '__main__':\n  ...\n      3      for step in range(10):\n  ...\n    244          x240 = 240\n")
    assert f">>  {row}          loss.item()" in code
    assert list(sheet.follow(tmp_path, path, {"path": "long.py", "row": row, "evidence": []})) == [
        "no file of the project declares the torch version"]


# -- recall by reading --------------------------------------------------------------------

recall = _load("recall")


def test_recall_counts_a_problem_reported_near_its_line_and_script_wide_flags_anywhere(tmp_path):
    reading = tmp_path / "recall.tsv"
    reading.write_text(
        "script\tfile:line\tkind\twhy\n"
        "p/a.py\tp/a.py:10\tTL101 \tper-step item\n"
        "p/a.py\tp/a.py:20\tTL601\tno no_grad\n"
        "p/a.py\tp/a.py:30\tTL801\tno benchmark flag\n"
        "p/a.py\tp/a.py:40\tTL204\tnumpy noise each step\n"
        "p/b.py\tp/b.py:5\tTL202\tunpinned\n",
        encoding="utf-8",
    )
    problems = recall.read_problems(reading)
    assert [(p["project"], p["path"], p["line"], p["code"]) for p in problems][0] == ("p", "a.py", 10, "TL101")
    findings = [
        {"project": "p", "path": "a.py", "row": 10, "code": "TL101"},
        {"project": "p", "path": "a.py", "row": 17, "code": "TL601"},  # the .eval() three lines above
        {"project": "p", "path": "a.py", "row": 1, "code": "TL801"},  # a script-wide flag, anywhere
        {"project": "p", "path": "a.py", "row": 41, "code": "TL201"},  # another code: not counted
        {"project": "p", "path": "c.py", "row": 5, "code": "TL202"},  # another file: not counted
    ]
    reported, elsewhere, missed = recall.match(problems, findings)
    assert [p["line"] for p in reported] == [10, 20, 30]
    assert [(p["line"], p["found"]) for p in elsewhere] == [(40, "TL201")]
    assert [p["path"] for p in missed] == ["b.py"]


def test_recall_maps_a_notebook_line_to_the_cell_and_row_findings_name(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Training"),
            nbformat.v4.new_code_cell("import torch\nloader = make_loader()"),
            nbformat.v4.new_code_cell("for x, y in loader:\n    loss = model(x.cuda())\n    print(loss.item())"),
        ]
    )
    path = tmp_path / "p" / "nb.ipynb"
    path.parent.mkdir()
    nbformat.write(notebook, str(path))
    raw_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "loss.item()" in line)
    assert recall.notebook_places(path)[raw_line] == (3, 3)
    problems = [{"project": "p", "path": "nb.ipynb", "line": raw_line, "code": "TL101", "why": "per-step item"}]
    same_row_other_cell = {"project": "p", "path": "nb.ipynb", "cell": 2, "row": 3, "code": "TL101"}
    assert recall.match(problems, [same_row_other_cell], tmp_path)[0] == []
    found = {"project": "p", "path": "nb.ipynb", "cell": 3, "row": 3, "code": "TL101"}
    assert recall.match(problems, [found], tmp_path)[0] == problems
