"""Which rules are stable and which are in preview, as in ruff.

A rule is **stable** when measurement put it there: ``stable_rules.json``
(next to this module) lists each rule that reached judging.md's bar
(precision >= 0.90 on >= 20 blindly judged findings from >= 5 projects), with
the measure that earned it. ``bench/precision_sample.py --promote`` writes
that file from a verdict sheet; nobody edits it by hand. Every other rule is
in **preview**: it runs only with ``--preview`` (``preview = true``).

Status and the default set are two questions, as in ruff:

- status (stable / preview) says whether a rule can run at all without
  ``--preview``;
- ``default_enabled`` (a rule's own flag) says whether it belongs to the
  default selection. Opinionated rules (``default_enabled = False``, "opt-in")
  stay out of it even when stable, like ruff's stable rules outside its
  default ``select``: ``--extend-select TL802`` or ``ALL`` turns them on.

So the default set is the stable rules that are not opt-in; ``--preview`` adds
the preview rules that are not opt-in. ``TL000`` (the file does not parse) is
the engine's own finding: always stable, always on.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from typing import Any, Dict, Mapping, Optional, Tuple, Type

from torchlint.rule import Rule

STABLE_RULES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stable_rules.json")
ALWAYS_STABLE = frozenset({"TL000"})
STABLE = "stable"
PREVIEW = "preview"

_ABOUT = (
    "The rules out of preview, each with the measure that earned it (judging.md's bar: precision >= 0.90 "
    "on >= 20 blindly judged findings from >= 5 projects). Written by `bench/precision_sample.py --promote`; "
    "do not edit by hand."
)


@lru_cache(maxsize=None)
def stable_rules(path: str = STABLE_RULES_FILE) -> Mapping[str, Mapping[str, Any]]:
    """code -> the record of the measure that made it stable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise RuntimeError(f"{path}: cannot read the stable rule list: {exc}") from None
    stable = data.get("stable") if isinstance(data, dict) else None
    if not isinstance(stable, dict):
        raise RuntimeError(f"{path}: expected an object with a `stable` table of code -> measure")
    return stable


def is_preview(rule: Type[Rule]) -> bool:
    return rule.code not in ALWAYS_STABLE and rule.code not in stable_rules()


def status(rule: Type[Rule]) -> str:
    return PREVIEW if is_preview(rule) else STABLE


def since(rule: Type[Rule]) -> str:
    """The version the rule entered its current status in."""
    record = stable_rules().get(rule.code)
    return str(record.get("since", rule.added)) if record else rule.added


def in_default_set(rule: Type[Rule]) -> bool:
    """On with no selection and no ``--preview``."""
    return rule.default_enabled and not is_preview(rule)


def status_json(rule: Type[Rule]) -> Dict[str, Dict[str, str]]:
    """ruff's ``status`` field: ``{"Preview": {"since": "0.1.0"}}`` or ``{"Stable": {...}}``."""
    return {status(rule).capitalize(): {"since": since(rule)}}


def write_stable_rules(records: Mapping[str, Mapping[str, Any]], path: str = STABLE_RULES_FILE) -> None:
    """Replace the stable rule list (the measurement's output; see the module docstring)."""
    data = {"about": _ABOUT, "stable": {code: dict(records[code]) for code in sorted(records)}}
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")
    stable_rules.cache_clear()


def preview_codes(rules: Mapping[str, Type[Rule]]) -> Tuple[str, ...]:
    return tuple(code for code, rule in rules.items() if is_preview(rule))


def describe(rule: Type[Rule]) -> Optional[str]:
    """One sentence for the rule's page, or None for a stable rule on by default."""
    if is_preview(rule):
        return "This rule is in preview and is not stable. The `--preview` flag is required for use."
    if not rule.default_enabled:
        return f"This rule is stable but opt-in: enable it with `--extend-select {rule.code}`."
    return None
