"""Every rule's VALID and INVALID examples, and its doc's Example/Use instead
blocks, run as tests: rule, docs and tests cannot drift apart."""
from __future__ import annotations

import re

import libcst as cst
import pytest

from torchlint.registry import all_rules
from ruletest import fixed, lint

RULES = [rule for code, rule in all_rules().items() if code != "TL000"]


def _cases(kind):
    for rule in RULES:
        for index, example in enumerate(getattr(rule, kind)):
            yield pytest.param(rule, example, id=f"{rule.code}-{kind.lower()}-{index}")


@pytest.mark.parametrize("rule,example", list(_cases("VALID")))
def test_valid_example_is_silent(rule, example):
    found = lint(rule.code, example.source, rule_options=example.options, target_torch=example.target_torch)
    assert found == [], f"{rule.code} fired on a VALID example:\n{example.source}\n{found}"


@pytest.mark.parametrize("rule,example", list(_cases("INVALID")))
def test_invalid_example_fires_and_fixes(rule, example):
    kwargs = dict(rule_options=example.options, target_torch=example.target_torch)
    found = lint(rule.code, example.source, **kwargs)
    assert len(found) == example.count, f"{rule.code}: expected {example.count} finding(s), got {found}"
    if example.line is not None:
        assert found[0].row == example.line
    if example.message is not None:
        assert example.message in found[0].message
    # A rule that cannot state its evidence does not fire: every finding names the facts it rests on.
    assert all(d.evidence for d in found), f"{rule.code}: a finding without evidence: {found}"
    result = fixed(rule.code, example.source, unsafe=example.unsafe_fixes, **kwargs)
    expected = example.fixed_source if example.fixed_source is not None else example.source
    assert result == expected
    cst.parse_module(result)
    assert fixed(rule.code, result, unsafe=example.unsafe_fixes, **kwargs) == result, "a second --fix changed the code"


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_rule_has_enough_examples(rule):
    assert rule.VALID and rule.INVALID
    if rule.fix_availability != "none":
        assert any(e.fixed is not None for e in rule.INVALID) or rule.fix_availability == "sometimes"


_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_doc_example_fires_and_use_instead_is_silent(rule):
    doc = rule.doc()
    example_part, _, rest = doc.partition("Use instead:")
    example = _BLOCK.findall(example_part.split("## Example", 1)[1])
    use_instead = _BLOCK.findall(rest.split("##", 1)[0])
    assert example and use_instead, f"{rule.code}: doc needs a python Example and a Use instead block"
    assert lint(rule.code, example[0]), f"{rule.code}: the doc's Example does not trigger the rule"
    assert lint(rule.code, use_instead[0]) == [], f"{rule.code}: the doc's 'Use instead' triggers the rule"
