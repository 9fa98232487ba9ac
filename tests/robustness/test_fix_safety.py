"""Fixes never break code.

Regressions for fixes that did (TL401, TL301, TL601, multi-line layout,
backslash-only lines), and a property over every rule with a fix: the fixed
versions of its INVALID examples and of the fixtures compile, and a second
fix changes nothing. Where a regression program can run on the CPU, it runs
before and after the fix.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import textwrap

import pytest

from torchlint.fixer import fix_text
from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules

ALL = FileOptions(rules=list(all_rules().values()))
FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "fixtures", "*.py")))


def only(code: str) -> FileOptions:
    return FileOptions(rules=[all_rules()[code]])


def run_python(source: str, tmp_path) -> subprocess.CompletedProcess:
    path = tmp_path / "program.py"
    path.write_text(source)
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)


def torch_on_cpu() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


# -- TL401: one unscale_ per optimizer per step ------------------------------------
TWO_CLIPS = textwrap.dedent(
    """\
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(3):
        loss = model(torch.randn(8, 4)).sum()
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model[0].parameters(), 1.0)
        torch.nn.utils.clip_grad_norm_(model[1].parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    print("done")
    """
)


def test_tl401_inserts_one_unscale_for_two_clips_of_one_optimizer():
    result = fix_text(TWO_CLIPS, "train.py", only("TL401"))
    assert result.error is None
    assert result.text.count("scaler.unscale_(optimizer)") == 1
    assert result.text.index("scaler.unscale_(optimizer)") < result.text.index("clip_grad_norm_(model[0]")
    assert not result.remaining.diagnostics  # the second clip is covered by the same unscale_


@pytest.mark.skipif(not torch_on_cpu(), reason="needs torch")
def test_tl401_fixed_code_runs_on_cpu(tmp_path):
    fixed = fix_text(TWO_CLIPS, "train.py", only("TL401")).text
    outcome = run_python(fixed, tmp_path)
    assert outcome.returncode == 0 and "done" in outcome.stdout, outcome.stderr[-2000:]


def test_tl401_clips_in_two_branches_each_get_their_unscale():
    source = textwrap.dedent(
        """\
        import torch
        scaler = torch.amp.GradScaler()
        scaler.scale(loss).backward()
        if small:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        """
    )
    assert fix_text(source, "x.py", only("TL401")).text.count("scaler.unscale_(optimizer)") == 2


# -- TL301: no fix that the code after it would crash on ------------------------------
GRAD_IN_PLACE = textwrap.dedent(
    """\
    import torch


    def add_weight_decay_by_hand(model):
        for p in model.parameters():
            p.grad += 0.01 * p.detach()


    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(8, 4)).sum().backward()
    for step in range(3):
        optimizer.zero_grad(set_to_none=False)
        add_weight_decay_by_hand(model)
        loss = model(torch.randn(8, 4)).sum()
        loss.backward()
        optimizer.step()
    print("done")
    """
)


@pytest.mark.parametrize("update", ["p.grad += 0.01 * p.detach()", "p.grad.add_(p.detach())", "p.grad.data.mul_(0.5)"])
def test_tl301_offers_no_fix_where_gradients_are_updated_in_place(update):
    source = GRAD_IN_PLACE.replace("p.grad += 0.01 * p.detach()", update)
    found = lint_text(source, "train.py", only("TL301")).diagnostics
    assert [d.code for d in found] == ["TL301"] and found[0].fix is None
    assert fix_text(source, "train.py", only("TL301"), unsafe_fixes=True).text == source


@pytest.mark.skipif(not torch_on_cpu(), reason="needs torch")
def test_tl301_the_fix_it_no_longer_offers_would_crash(tmp_path):
    assert run_python(GRAD_IN_PLACE, tmp_path).returncode == 0
    crashed = run_python(GRAD_IN_PLACE.replace("set_to_none=False", "set_to_none=True"), tmp_path)
    assert crashed.returncode != 0 and "NoneType" in crashed.stderr


def test_tl301_still_fixes_without_in_place_updates():
    source = GRAD_IN_PLACE.replace("        p.grad += 0.01 * p.detach()\n", "        print(p.grad is None)\n")
    assert "set_to_none=True" in fix_text(source, "train.py", only("TL301"), unsafe_fixes=True).text


# -- TL601: never a second no_grad decorator ------------------------------------------
@pytest.mark.parametrize("decorator", ["@torch.no_grad()", "@torch.inference_mode()", "@no_grad()"])
def test_tl601_never_stacks_a_second_no_grad(decorator):
    # torch comes from a star import, so the import table cannot see the decorator
    source = f"from helpers import *\n\n{decorator}\ndef evaluate(model, x):\n    model.eval()\n    return model(x)\n"
    fixed = fix_text(source, "x.py", only("TL601"), unsafe_fixes=True).text
    assert fixed.count("no_grad") + fixed.count("inference_mode") == 1


# -- multi-line replacements keep their layout ----------------------------------------
MULTI_LINE = textwrap.dedent(
    """\
    import torch


    def train(model, loader):
        for batch in loader:
            if batch is not None:
                weights = torch.ones(
                    3,
                    dtype=torch.float32,
                ).cuda()
                out = model.forward(
                    batch,
                    weights,
                )
    """
)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_multi_line_replacements_keep_block_indentation_and_newlines(newline):
    source = MULTI_LINE.replace("\n", newline)
    fixed = fix_text(source, "x.py", ALL, unsafe_fixes=True).text
    expected = MULTI_LINE.replace(
        "            ).cuda()\n", '                device="cuda",\n            )\n'
    ).replace("model.forward(", "model(")
    assert fixed == expected.replace("\n", newline)


# -- a line holding only a backslash -----------------------------------------------------
BACKSLASH = "import torch\nfor batch in loader:\n    loss = model(batch)\n    \\\n    total = loss.item()\n    other = loss.item()  # noqa: TL101\n    x = torch.ones(3).cuda()\n"


def test_backslash_only_line_keeps_positions_noqa_and_fixes():
    found = lint_text(BACKSLASH, "x.py", ALL).diagnostics
    assert ("TL101", 5, 13) in {(d.code, d.row, d.column) for d in found}
    assert not any(d.row == 6 and d.code == "TL101" for d in found)  # the noqa on line 6 applies
    assert not any(d.code == "TL000" for d in found)
    result = fix_text(BACKSLASH, "x.py", ALL)
    assert result.error is None and 'torch.ones(3, device="cuda")' in result.text
    assert result.text.splitlines()[3] == "    \\"  # the line itself is kept


def test_backslash_lines_inside_strings_are_left_alone():
    source = 'import torch\ns = """\n\\\n"""\nfor b in loader:\n    b.cuda().item()\n'
    assert [(d.code, d.row) for d in lint_text(source, "x.py", ALL).diagnostics if d.code == "TL101"] == [("TL101", 6)]


# -- the property ------------------------------------------------------------------------
FIXABLE = [rule for code, rule in all_rules().items() if code != "TL000" and rule.fix_availability != "never"]


def _sources():
    for rule in FIXABLE:
        for index, example in enumerate(rule.INVALID):
            yield pytest.param(example.source, id=f"{rule.code}-invalid-{index}")
    for path in FIXTURES:
        with open(path, encoding="utf-8") as handle:
            yield pytest.param(handle.read(), id=os.path.basename(path))


@pytest.mark.parametrize("unsafe", [False, True], ids=["safe", "unsafe"])
@pytest.mark.parametrize("source", list(_sources()))
def test_fixed_code_compiles_and_fixing_again_changes_nothing(source, unsafe):
    result = fix_text(source, "example.py", ALL, unsafe_fixes=unsafe)
    assert result.error is None, result.error
    compile(result.text, "example.py", "exec")
    again = fix_text(result.text, "example.py", ALL, unsafe_fixes=unsafe)
    assert again.text == result.text and not again.applied
