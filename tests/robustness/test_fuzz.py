"""Generated programs through ``lint_text`` and ``fix_text``: no exception,
no internal error, and fixes that compile and reach a fixed point.

Two generators, both bounded and derandomized so CI sees the same programs
every run: hypothesmith's Python grammar (odd syntax the engine must
survive), and one that stacks the statements the rules look for (batch
loops, AMP steps, evaluation, device moves) in random nesting, so that
fixes meet each other.
"""
from __future__ import annotations

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from torchlint.fixer import fix_text
from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules

ALL = FileOptions(rules=list(all_rules().values()))
FUZZ = settings(
    max_examples=120,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def check(source: str) -> int:
    """Fixes applied (safe, then with unsafe)."""
    out = lint_text(source, "fuzz.py", ALL)
    assert not out.errors, "\n".join(str(e) for e in out.errors)
    applied = 0
    for unsafe in (False, True):
        result = fix_text(source, "fuzz.py", ALL, unsafe_fixes=unsafe)
        assert result.error is None, result.error
        applied += sum(result.applied.values())
        if result.applied:
            compile(result.text, "fuzz.py", "exec")
            again = fix_text(result.text, "fuzz.py", ALL, unsafe_fixes=unsafe)
            assert not again.applied and again.text == result.text, "fixes are not idempotent"
    return applied


@pytest.mark.filterwarnings("ignore::SyntaxWarning")
@seed(20261124)
@FUZZ
@given(hypothesmith.from_grammar())
def test_grammar_generated_programs(source):
    check(source)


_STATEMENTS = [
    "x = batch.item()",
    "batch = batch.cuda()",
    "t = torch.ones(3).cuda()",
    "w = torch.tensor(\n    [1.0, 2.0],\n    dtype=torch.float32,\n).cuda()",
    "loss = model(batch)",
    "out = model.forward(\n    batch,\n)",
    "loss.backward()",
    "scaler.scale(loss).backward()",
    "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)",
    "scaler.unscale_(optimizer)",
    "scaler.step(optimizer)",
    "scaler.update()",
    "optimizer.step()",
    "optimizer.zero_grad()",
    "optimizer.zero_grad(set_to_none=False)",
    "model.eval()",
    "model.train()",
    "p.grad += g",
    "torch.cuda.synchronize()",
    "torch.cuda.empty_cache()",
    "total += loss",
    "print(loss.item())",
    "data = data.to('cuda')",
    "continue",
    "\\",
]
_HEADERS = [
    "for batch in loader:",
    "for i, batch in enumerate(loader):",
    "while step < 10:",
    "if step % 10 == 0:",
    "with torch.no_grad():",
    "with torch.autocast('cuda'):",
    "def evaluate(model, loader):",
    "def train_step(model, batch, optimizer, scaler):",
    "@torch.no_grad()\ndef predict(model, x):",
    "try:",
]


def _indent(text: str, by: str) -> str:
    return "".join(by + line if line.strip() else line for line in text.splitlines(True))


@st.composite
def torch_programs(draw, depth: int = 0):
    lines = []
    for _ in range(draw(st.integers(1, 5))):
        if depth < 3 and draw(st.booleans()):
            header = draw(st.sampled_from(_HEADERS))
            body = draw(torch_programs(depth + 1))
            block = header + "\n" + _indent(body, "    ")
            if header == "try:":
                block += "except RuntimeError:\n    pass\n"
            lines.append(block)
        else:
            statement = draw(st.sampled_from(_STATEMENTS))
            if statement == "\\":
                statement = "\\\npass"
            lines.append(statement + "\n")
    text = "".join(lines)
    if depth == 0:
        text = "import torch\nscaler = torch.amp.GradScaler()\n" + text
    return text


@seed(20261124)
@FUZZ
@given(torch_programs())
def test_programs_made_of_the_patterns_the_rules_fix(source):
    try:
        compile(source, "fuzz.py", "exec")
    except SyntaxError:  # `continue` outside a loop and the like: TL000, nothing to fix
        assert [d.code for d in lint_text(source, "fuzz.py", ALL).diagnostics] == ["TL000"]
        return
    check(source)


def test_every_pattern_in_one_batch_loop_is_fixed_cleanly():
    """The generator's statements do reach the fixer: all of them in one loop."""
    body = "".join(_indent(st + "\n", "    ") for st in _STATEMENTS if st not in ("continue", "\\"))
    source = "import torch\nscaler = torch.amp.GradScaler()\nfor batch in loader:\n" + body
    assert check(source) >= 3
