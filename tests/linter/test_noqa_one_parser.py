"""One noqa parser for both halves: ``# noqa:  TL101`` (two spaces) lists TL101 to the linter
and to the sanitizer alike, as ruff reads it (any whitespace around the colon)."""
import subprocess
import sys

import pytest

from ruletest import lint
from torchlint import noqa

LOOP = """
def train(model, loader, optimizer, device):
    for images, labels in loader:
        images = images.to(device)
        loss = model(images).sum()
        loss.backward()
        optimizer.step()
        print_value = loss.item(){comment}
"""


@pytest.mark.parametrize("comment, reported", [
    ("", True),
    ("  # noqa:  TL101", False),   # two spaces: TL101 only (it used to be a blanket)
    ("  # noqa : TL101", False),
    ("  # noqa:  TL201", True),    # another code: TL101 is still reported
    ("  # noqa", False),
    ("  # noqa TL201", False),      # no colon: a blanket, as in ruff and flake8
])
def test_the_linter_reads_the_codes_after_any_whitespace(comment, reported):
    found = [d.code for d in lint("TL101", LOOP.format(comment=comment))]
    assert ("TL101" in found) is reported, found


def test_the_sanitizer_and_the_linter_agree_line_by_line():
    from torchlint.sanitizer.sync import check as sync  # the sanitizer imports the same function

    assert sync.line_suppresses is noqa.line_suppresses
    for line in ("x.item()  # noqa:  TL101", "x.item()  # noqa:  TL201", "x.item()  # noqa", "x.item()"):
        parsed = noqa.parse(line + "\n")
        assert parsed.suppresses("TL101", 1) == noqa.line_suppresses(line, "TL101"), line


def test_the_parser_needs_neither_libcst_nor_torch():
    code = ("import sys; from torchlint import noqa; "
            "assert noqa.line_noqa('x  # noqa:  TL101') == frozenset({'TL101'}); "
            "assert 'libcst' not in sys.modules and 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
