"""Every output format shows the facts a finding rests on (``Diagnostic.evidence``).

A fake rule reports `.item()` with two pieces of evidence: the line in the same
file where the model was moved (a node), and a place in another file (path
and row), so each format is checked for both kinds of place.
"""
from __future__ import annotations

import io
import json
import pathlib
import xml.etree.ElementTree as ElementTree
from typing import Optional

import jsonschema
import libcst as cst
import pytest

from torchlint import cli, docs
from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext, reporters
from torchlint.reporters import ci
from torchlint.rule import Evidence, Invalid, Rule, Valid

REPO = pathlib.Path(__file__).resolve().parents[2]
SCHEMA = json.loads((REPO / "tests" / "data" / "sarif-schema-2.1.0.json").read_text())

SOURCE = """\
import torch
model = Net().cuda()
for x in loader:
    loss = model(x)
    print(loss.item())
"""


class ReadsWithEvidence(Rule):
    """## What it does
    A test rule: reports `.item()` with the facts behind it.

    ## Why is this bad?
    It is a fake.

    ## Example
    ```python
    model = Net().cuda()
    print(model(x).item())
    ```

    Use instead:
    ```python
    print(x)
    ```

    ## Fix safety
    No fix.
    """

    code = "TL998"
    name = "reads-with-evidence"
    summary = "A fake rule that reports evidence"
    VALID = [Valid("print(x)\n")]
    INVALID = [Invalid("model = Net().cuda()\nprint(model(x).item())\n")]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.moved: Optional[cst.CSTNode] = None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        if func.attr.value == "cuda":
            self.moved = node
        elif func.attr.value == "item" and self.moved is not None:
            self.report(node, "`.item()` reads the GPU", evidence=[
                Evidence("`model` moved to the GPU", node=self.moved),
                Evidence("`loader` built, pinned", path=self.other_file, row=12, column=5),
            ])

    other_file = "data.py"


@pytest.fixture
def findings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ReadsWithEvidence, "other_file", str(tmp_path / "data.py"))
    (tmp_path / "train.py").write_text(SOURCE)
    (tmp_path / "data.py").write_text("x = 1\n" * 20)
    found = lint_text(SOURCE, "train.py", FileOptions(rules=[ReadsWithEvidence])).diagnostics
    return found, ReportContext(cwd=str(tmp_path), texts={"train.py": SOURCE})


@pytest.fixture
def registered(monkeypatch):
    """The fake rule in the one code table, for the formats that list rules."""
    table = {**all_rules(), ReadsWithEvidence.code: ReadsWithEvidence}
    monkeypatch.setattr(ci, "all_rules", lambda: table)
    monkeypatch.setattr(cli, "all_rules", lambda: table)
    return table


def _render(fmt, found, ctx) -> str:
    out = io.StringIO()
    reporters()[fmt](found, ctx, out)
    return out.getvalue()


def test_evidence_is_placed_like_the_finding(findings, tmp_path):
    found, _ = findings
    (d,) = found
    assert (d.row, d.column) == (5, 11)
    moved, loader = d.evidence
    assert (moved.text, moved.path, moved.row, moved.column) == ("`model` moved to the GPU", "train.py", 2, 9)
    assert (loader.path, loader.row, loader.column) == (str(tmp_path / "data.py"), 12, 5)


def test_full_prints_a_note_per_fact_and_concise_is_unchanged(findings):
    found, ctx = findings
    full = _render("full", found, ctx)
    assert "  note: `model` moved to the GPU at :2\n" in full
    assert "  note: `loader` built, pinned at data.py:12\n" in full
    # the notes come after the excerpt and before any help
    assert full.index("^^^") < full.index("note: `model`")
    for fmt in ("concise", "grouped", "pylint"):
        text = _render(fmt, found, ctx)
        assert "note:" not in text and "data.py" not in text and text.count("\n") <= 3


@pytest.mark.parametrize("fmt", ["json", "json-lines"])
def test_json_formats_carry_an_evidence_list(findings, tmp_path, fmt):
    found, ctx = findings
    text = _render(fmt, found, ctx)
    (entry,) = json.loads(text) if fmt == "json" else [json.loads(line) for line in text.splitlines()]
    assert entry["evidence"] == [
        {"message": "`model` moved to the GPU", "filename": str(tmp_path / "train.py"), "location": {"row": 2, "column": 9}},
        {"message": "`loader` built, pinned", "filename": str(tmp_path / "data.py"), "location": {"row": 12, "column": 5}},
    ]


def test_sarif_puts_evidence_in_related_locations_and_properties(findings, registered):
    found, ctx = findings
    document = ci.sarif_document(found, ctx)
    jsonschema.validate(document, SCHEMA)
    (result,) = document["runs"][0]["results"]
    related = result["relatedLocations"]
    assert [r["message"]["text"] for r in related] == ["`model` moved to the GPU", "`loader` built, pinned"]
    assert [r["physicalLocation"]["artifactLocation"]["uri"] for r in related] == ["train.py", "data.py"]
    assert [r["physicalLocation"]["region"]["startLine"] for r in related] == [2, 12]
    assert result["properties"]["evidence"][1] == {"message": "`loader` built, pinned", "uri": "data.py", "location": {"row": 12, "column": 5}}


def test_sarif_without_evidence_has_no_related_locations(findings, registered):
    found, ctx = findings
    found[0].evidence = ()
    (result,) = ci.sarif_document(found, ctx)["runs"][0]["results"]
    assert "relatedLocations" not in result and "properties" not in result


def test_github_and_junit_add_the_notes_to_the_message(findings):
    found, ctx = findings
    github = _render("github", found, ctx)
    assert github.count("\n") == 1
    assert "::TL998 `.item()` reads the GPU%0A  note: `model` moved to the GPU at :2%0A  note: `loader` built, pinned at data.py:12" in github
    failure = ElementTree.fromstring(_render("junit", found, ctx)).find("./testsuite/testcase/failure")
    assert failure.text.splitlines()[1:] == ["  note: `model` moved to the GPU at :2", "  note: `loader` built, pinned at data.py:12"]


def test_the_command_line_keeps_evidence_through_workers_and_cache(tmp_path, monkeypatch, capsys, registered):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ReadsWithEvidence, "other_file", str(tmp_path / "data.py"))
    (tmp_path / "train.py").write_text(SOURCE)
    args = ["--preview", "--select", "TL998", "--output-format", "json", "--cache-dir", str(tmp_path / "cache"), "train.py"]
    for _ in range(2):  # the second run reads the cache
        assert cli.main(args) == 1
        (entry,) = json.loads(capsys.readouterr().out)
        assert [e["location"]["row"] for e in entry["evidence"]] == [2, 12]


def test_rule_docs_show_a_finding_with_its_evidence():
    shown = docs.finding_shown(ReadsWithEvidence)
    assert "Each finding lists the facts it rests on" in shown
    assert "  note: `model` moved to the GPU at :1" in shown
    page = docs.render_markdown(ReadsWithEvidence)
    assert "## What a finding shows" in page
