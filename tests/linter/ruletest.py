"""Shared helpers for rule tests: lint a snippet, apply its fixes."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from torchlint.config import parse_version
from torchlint.fixer import fix_text
from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules


def options_for(code: str, rule_options: Optional[Dict[str, Any]] = None, target_torch: Optional[str] = None) -> FileOptions:
    return FileOptions(
        rules=[all_rules()[code]],
        rule_options={code: dict(rule_options or {})},
        target_torch=parse_version(target_torch) if target_torch else None,
    )


def lint(code: str, source: str, path: str = "example.py", **kwargs):
    out = lint_text(source, path, options_for(code, **kwargs))
    assert not out.errors, "\n".join(str(e) for e in out.errors)
    return out.diagnostics


def fixed(code: str, source: str, unsafe: bool = False, **kwargs) -> str:
    result = fix_text(source, "example.py", options_for(code, **kwargs), unsafe_fixes=unsafe)
    return result.text


_EXPECT = re.compile(r"#(?P<body>[^#]*)$")
_CODE = re.compile(r"\bTL\d{3}\b")


def expectations(source: str) -> List[Tuple[int, str]]:
    """(row, code) pairs from inline ``# TL101`` comments; ``noqa`` comments don't count."""
    found = []
    for row, line in enumerate(source.splitlines(), start=1):
        if "#" not in line:
            continue
        for comment in line.split("#")[1:]:
            if comment.strip().lower().startswith("noqa"):
                continue
            found.extend((row, code) for code in _CODE.findall(comment))
    return sorted(found)
