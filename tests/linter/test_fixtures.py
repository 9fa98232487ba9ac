"""bugbear-style fixtures: ``tests/fixtures/TL101_*.py`` with the expected
findings written as inline comments (``x.item()  # TL101``).

A first-line directive sets options: ``# fixture: target-torch=1.13 assume-pinned=true``.
"""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from ruletest import expectations, lint

FIXTURES = sorted((pathlib.Path(__file__).parent.parent / "fixtures").glob("TL*.py"))
_DIRECTIVE = re.compile(r"^#\s*fixture:(.*)$")


def _directive(source: str):
    first = source.splitlines()[0] if source else ""
    match = _DIRECTIVE.match(first)
    options, target = {}, None
    if match:
        for pair in match.group(1).split():
            key, _, value = pair.partition("=")
            if key == "target-torch":
                target = value
            else:
                options[key] = json.loads(value)
    return options, target


@pytest.mark.parametrize("path", FIXTURES, ids=[p.name for p in FIXTURES])
def test_fixture_findings_match_inline_expectations(path):
    code = path.name.split("_", 1)[0]
    source = path.read_text(encoding="utf-8")
    options, target = _directive(source)
    found = sorted((d.row, d.code) for d in lint(code, source, rule_options=options, target_torch=target))
    expected = [(row, c) for row, c in expectations(source) if c == code]
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    assert not missing and not unexpected, f"{path.name}: missing {missing}, unexpected {unexpected}"
