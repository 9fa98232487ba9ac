"""A large top-level data literal is elided before libcst parses the file.

libcst's parse of one 5 MB literal took 47 s and 4.4 GB; the literal can hold
no finding, so libcst sees ``NAME = ...`` instead, with every line kept in
place. These tests pin what must not change: line numbers, findings after
the literal, comments, fixes, and literals that are not pure data.
"""
import ast

from torchlint.fixer import fix_text
from torchlint.linter import LARGE_LITERAL_CHARS, FileOptions, elide_large_literals, lint_text
from torchlint.registry import all_rules

ALL = FileOptions(rules=list(all_rules().values()))
ROWS = "".join(f'    [{i}, {i * 0.5}, "name_{i}", {{"k": -{i}}}],\n' for i in range(LARGE_LITERAL_CHARS // 20))
LOOP = "for batch in loader:\n    batch = batch.cuda()\n    x = torch.ones(3).cuda()\n    print(model(batch).item())\n"


def _source(middle: str) -> str:
    return "import torch\nWEIGHTS = [\n" + middle + "]  # the table\n" + LOOP


def test_the_literal_is_elided_and_every_line_keeps_its_number():
    source = _source("".join(ROWS.splitlines(keepends=True)[:5]) + "    # a comment line\n" + ROWS)
    elided = elide_large_literals(source, ast.parse(source))
    assert len(elided) < len(source) // 10
    assert elided.count("\n") == source.count("\n")
    assert elided.splitlines()[1] == "WEIGHTS = ..."
    assert "    # a comment line" in elided.splitlines()
    assert elided.splitlines()[-len(LOOP.splitlines()):] == LOOP.splitlines()


def test_findings_and_fixes_after_the_literal_land_where_they_did():
    source = _source(ROWS)
    loop_row = source.count("\n") - len(LOOP.splitlines()) + 1
    found = {(d.code, d.row) for d in lint_text(source, "x.py", ALL).diagnostics}
    assert ("TL101", loop_row + 3) in found and ("TL204", loop_row + 2) in found
    fixed = fix_text(source, "x.py", ALL).text
    assert ROWS in fixed and 'torch.ones(3, device="cuda")' in fixed  # the literal is untouched


def test_literals_that_are_not_pure_data_stay():
    calls = _source(ROWS.replace("[0, ", "[torch.ones(1).cuda().item(), ", 1))
    assert elide_large_literals(calls, ast.parse(calls)) == calls
    joined = "import torch\nWEIGHTS = [\n" + ROWS + "]; x = 1\n"
    assert elide_large_literals(joined, ast.parse(joined)) == joined
    small = _source("".join(ROWS.splitlines(keepends=True)[:20]))
    assert elide_large_literals(small, ast.parse(small)) == small
