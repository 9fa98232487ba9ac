"""The one code -> rule table, built from the modules of ``torchlint.rules``.

Codes are never reused: a retired rule keeps its code out of circulation.
Whether a rule is stable or in preview is measured, not declared here:
``torchlint.lifecycle`` reads it from ``stable_rules.json``.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from functools import lru_cache
from typing import Dict, Type

from torchlint.rule import Rule

_CODE = re.compile(r"^TL\d{3}$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_REQUIRED_SECTIONS = ("## What it does", "## Why is this bad?", "## Example", "## Fix safety")


class SyntaxErrorRule(Rule):
    """## What it does
    Reports a file that torchlint cannot read: a syntax error, or bytes that
    do not decode in the file's declared encoding.

    ## Why is this bad?
    A file that does not parse is not linted at all, so every other rule is
    silent on it. Python itself would refuse to import it.

    ## Example
    ```python
    for batch in loader
        loss = model(batch)
    ```

    Use instead:
    ```python
    for batch in loader:
        loss = model(batch)
    ```

    ## Fix safety
    There is no fix: the file must be repaired by hand.
    """

    about_running_code = False  # a file that does not parse is reported wherever it is
    code = "TL000"
    name = "syntax-error"
    summary = "The file does not parse or decode"


@lru_cache(maxsize=None)
def all_rules() -> Dict[str, Type[Rule]]:
    """Every rule by code, in code order. Raises on a malformed rule module."""
    import torchlint.rules as package

    found: Dict[str, Type[Rule]] = {SyntaxErrorRule.code: SyntaxErrorRule}
    names: Dict[str, str] = {SyntaxErrorRule.name: SyntaxErrorRule.code}
    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        rules = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.__module__ == module.__name__
        ]
        if len(rules) != 1:
            raise RuntimeError(f"{module.__name__}: expected exactly one rule class, found {len(rules)}")
        rule = rules[0]
        _check_rule(rule)
        if rule.code in found:
            raise RuntimeError(f"{module.__name__}: code {rule.code} is already used by {found[rule.code].__module__}")
        if rule.name in names:
            raise RuntimeError(f"{module.__name__}: name {rule.name} is already used by {names[rule.name]}")
        found[rule.code] = rule
        names[rule.name] = rule.code
    return dict(sorted(found.items()))


def _check_rule(rule: Type[Rule]) -> None:
    where = rule.__module__
    if not _CODE.match(getattr(rule, "code", "")):
        raise RuntimeError(f"{where}: bad rule code {getattr(rule, 'code', None)!r}")
    if not _NAME.match(getattr(rule, "name", "")):
        raise RuntimeError(f"{where}: rule name must be kebab-case, got {getattr(rule, 'name', None)!r}")
    if not getattr(rule, "summary", ""):
        raise RuntimeError(f"{where}: missing summary")
    doc = rule.doc()
    for section in _REQUIRED_SECTIONS:
        if section not in doc:
            raise RuntimeError(f"{where}: docstring lacks a {section!r} section")
    if rule.fix_availability not in ("always", "sometimes", "none"):
        raise RuntimeError(f"{where}: bad fix_availability {rule.fix_availability!r}")


def rule_by_name_or_code(key: str) -> Type[Rule]:
    rules = all_rules()
    if key.upper() in rules:
        return rules[key.upper()]
    for rule in rules.values():
        if rule.name == key:
            return rule
    raise KeyError(key)
