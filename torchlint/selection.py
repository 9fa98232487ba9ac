"""Which rules run: ruff's selection model.

The highest-priority ``select`` (command line over config) is the base;
``extend-select`` and ``ignore`` of that layer and of higher layers adjust it.
Within a layer the most specific selector wins (``TL101`` beats ``TL1``
beats ``ALL``), and on a tie ``ignore`` wins. With no ``select`` anywhere the
base is the default set: every stable rule not marked opt-in.

Preview rules (``torchlint.lifecycle``) take part only with ``preview``: without
it no selector reaches them, and naming one by its exact code has no effect
(``preview_selections`` lists those, for ruff's warning).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Set, Tuple, Type

from torchlint.lifecycle import is_preview
from torchlint.rule import Rule


class SelectorError(ValueError):
    pass


@dataclass
class Layer:
    select: Optional[List[str]] = None
    extend_select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


def _specificity(selector: str) -> int:
    return 0 if selector == "ALL" else len(selector)


def normalize(selectors: Iterable[str], rules: Dict[str, Type[Rule]]) -> List[str]:
    """Upper-case codes, accept rule names, and reject selectors that match nothing."""
    names = {rule.name: code for code, rule in rules.items()}
    result = []
    for raw in selectors:
        selector = raw.strip()
        if not selector:
            continue
        if selector in names:
            result.append(names[selector])
            continue
        selector = selector.upper()
        if selector != "ALL" and not any(code.startswith(selector) for code in rules):
            raise SelectorError(f"Unknown rule selector: `{raw.strip()}`")
        result.append(selector)
    return result


def resolve(layers: Sequence[Layer], rules: Dict[str, Type[Rule]], preview: bool = False) -> FrozenSet[str]:
    if not preview:
        rules = {code: rule for code, rule in rules.items() if not is_preview(rule)}
    base_index = max((i for i, layer in enumerate(layers) if layer.select is not None), default=None)
    if base_index is None:
        enabled = {code for code, rule in rules.items() if rule.default_enabled}
        active = list(layers)
    else:
        enabled = set()
        active = list(layers[base_index:])
    for index, layer in enumerate(active):
        enable = list(layer.extend_select)
        if index == 0 and base_index is not None:
            enable = list(layer.select or []) + enable
        for code in rules:
            best: Optional[Tuple[int, bool]] = None  # (specificity, is_ignore)
            for selector in enable:
                if _matches(selector, code):
                    candidate = (_specificity(selector), False)
                    best = candidate if best is None or candidate[0] > best[0] else best
            for selector in layer.ignore:
                if _matches(selector, code):
                    candidate = (_specificity(selector), True)
                    best = candidate if best is None or candidate[0] >= best[0] else best
            if best is None:
                continue
            if best[1]:
                enabled.discard(code)
            else:
                enabled.add(code)
    enabled.add("TL000")  # a file that does not parse is always reported
    return frozenset(enabled)


def preview_selections(layers: Sequence[Layer], rules: Dict[str, Type[Rule]]) -> List[str]:
    """Exact codes of preview rules that a layer selects: without ``--preview``
    they have no effect (ruff warns about those; a prefix is silently narrowed)."""
    named = []
    for layer in layers:
        for selector in list(layer.select or []) + list(layer.extend_select):
            rule = rules.get(selector)
            if rule is not None and is_preview(rule) and selector not in named:
                named.append(selector)
    return named


@dataclass(frozen=True)
class PerFileIgnore:
    pattern: str
    codes: Tuple[str, ...]
    negated: bool
    root: str  # patterns are relative to this directory

    def applies_to(self, path: str) -> bool:
        absolute = os.path.abspath(path)
        relative = os.path.relpath(absolute, self.root).replace(os.sep, "/")
        hit = (
            fnmatch.fnmatch(relative, self.pattern)
            or fnmatch.fnmatch(os.path.basename(absolute), self.pattern)
            or fnmatch.fnmatch(absolute.replace(os.sep, "/"), self.pattern)
        )
        return hit != self.negated


def parse_per_file_ignores(
    entries: Dict[str, List[str]], root: str, rules: Dict[str, Type[Rule]]
) -> List[PerFileIgnore]:
    result = []
    for pattern, listed in entries.items():
        negated = pattern.startswith("!")
        codes = tuple(sorted(expand(normalize(listed, rules), rules)))
        result.append(PerFileIgnore(pattern[1:] if negated else pattern, codes, negated, root))
    return result


def parse_cli_per_file_ignores(values: Sequence[str]) -> Dict[str, List[str]]:
    """``'tests/*:TL101,TL2'`` (repeatable) -> {pattern: codes}."""
    entries: Dict[str, List[str]] = {}
    for value in values:
        pattern, sep, codes = value.rpartition(":")
        if not sep or not pattern:
            raise SelectorError(f"--per-file-ignores expects PATTERN:CODES, got `{value}`")
        entries.setdefault(pattern, []).extend(c for c in codes.split(",") if c.strip())
    return entries


def ignored_for(path: str, ignores: Sequence[PerFileIgnore]) -> FrozenSet[str]:
    codes: Set[str] = set()
    for entry in ignores:
        if entry.applies_to(path):
            codes.update(entry.codes)
    return frozenset(codes)


def expand(selectors: Iterable[str], rules: Dict[str, Type[Rule]]) -> FrozenSet[str]:
    """The codes a list of (already normalized) selectors names."""
    return frozenset(code for code in rules for s in selectors if _matches(s, code))
