"""bugbear-style fixtures: ``tests/fixtures/TL101_*.py`` with the expected
findings written as inline comments (``x.item()  # TL101``).

A first-line directive sets options: ``# fixture: target-torch=1.13 assume-pinned=true``.

Package fixtures are folders ``tests/fixtures/packages/TL201_*/``: every
``.py`` file in one is linted under its real path, so facts cross between
its files as they do in a project, and each file's inline comments say what
is expected in it. A package listed in ``_NOT_YET``
records a cross-file case the engine does not find yet: it is a strict
xfail, so it fails the day it starts passing and must move out.
"""
from __future__ import annotations

import json
import pathlib
import re

import pytest

from torchlint.rule import CHECK_TESTS
from torchlint.registry import all_rules

from ruletest import expectations, lint

FIXTURES = sorted((pathlib.Path(__file__).parent.parent / "fixtures").glob("TL*.py"))
PACKAGES = sorted(p for p in (pathlib.Path(__file__).parent.parent / "fixtures" / "packages").glob("TL*") if p.is_dir())
# Cross-file facts (per-function summaries shared between the project's
# modules) are not built yet: a loader made in one file and iterated in another.
_NOT_YET: dict = {}
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


def _package_params():
    for path in PACKAGES:
        marks = [pytest.mark.xfail(reason=_NOT_YET[path.name], strict=True)] if path.name in _NOT_YET else []
        yield pytest.param(path, id=path.name, marks=marks)


@pytest.mark.parametrize("package", list(_package_params()))
def test_package_fixture_findings_match_inline_expectations(package):
    code = package.name.split("_", 1)[0]
    files = sorted(package.rglob("*.py"))
    assert files, f"{package.name}: an empty package fixture"
    problems = []
    for path in files:
        source = path.read_text(encoding="utf-8")
        options, target = _directive(source)
        if CHECK_TESTS in all_rules()[code].options:
            # the package lies under tests/ because it is a fixture, not because it is a test module
            options.setdefault(CHECK_TESTS, True)
        found = {(d.row, d.code) for d in lint(code, source, rule_options=options, target_torch=target, path=str(path))}
        expected = {(row, c) for row, c in expectations(source) if c == code}
        if found != expected:
            problems.append(f"{path.name}: missing {sorted(expected - found)}, unexpected {sorted(found - expected)}")
    assert not problems, "; ".join(problems)
