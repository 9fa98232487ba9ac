"""Suppression comments.

- ``# noqa: TL101, TL201`` on a finding's first line suppresses exactly those
  codes (exact match, as in ruff; flake8 itself matches prefixes). Whitespace
  around the colon does not matter (``# noqa:  TL101`` and ``# noqa : TL101``
  list TL101, as ruff reads them); text after the codes is a comment.
- A bare ``# noqa`` (or ``# noqa`` without a colon) suppresses every code on
  its line.

``line_noqa`` is the one line parser: the linter and the runtime sanitizer
(``# noqa`` on a sync site's line) both use it. This module imports neither
libcst nor torch.
- ``# torchlint: noqa`` (or ``# flake8: noqa``) on a line of its own
  suppresses the whole file; ``# torchlint: noqa: TL101`` only those codes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Set

from torchlint.source import split_lines

_CODES = r"[A-Z]+[0-9]+(?:(?:\s*,\s*|\s+)[A-Z]+[0-9]+)*"
_LINE = re.compile(rf"#\s*noqa(?:\s*:\s*(?P<codes>{_CODES}))?", re.IGNORECASE)
_FILE = re.compile(rf"^\s*#\s*(?:torchlint|flake8)\s*:\s*noqa(?:\s*:\s*(?P<codes>{_CODES}))?\s*$", re.IGNORECASE)
_SPLIT = re.compile(r"[\s,]+")

ALL = None  # a suppression that covers every code
NO_NOQA: FrozenSet[str] = frozenset({"<no noqa>"})  # line_noqa's answer for a line without one


def _codes(text: Optional[str]) -> Optional[FrozenSet[str]]:
    if not text:
        return ALL
    return frozenset(code.upper() for code in _SPLIT.split(text.strip()) if code)


def line_noqa(line: str) -> Optional[FrozenSet[str]]:
    """The codes a ``# noqa`` comment on ``line`` lists.

    Returns ``NO_NOQA`` when the line has none, ``ALL`` (None) for a blanket
    ``# noqa``, else the upper-cased codes.
    """
    if "#" not in line:
        return NO_NOQA
    match = _LINE.search(line)
    if match is None:
        return NO_NOQA
    return _codes(match.group("codes"))


def line_suppresses(line: str, code: Optional[str]) -> bool:
    """Whether a ``# noqa`` on ``line`` covers ``code`` (None: a finding without a code)."""
    codes = line_noqa(line)
    if codes is NO_NOQA:
        return False
    return codes is ALL or (code is not None and code in codes)


@dataclass
class Suppressions:
    lines: Dict[int, Optional[FrozenSet[str]]] = field(default_factory=dict)
    file_all: bool = False
    file_codes: FrozenSet[str] = frozenset()

    def suppresses(self, code: str, row: int) -> bool:
        if self.file_all or code in self.file_codes:
            return True
        if row not in self.lines:
            return False
        codes = self.lines[row]
        return codes is ALL or code in codes


def parse(text: str) -> Suppressions:
    found = Suppressions()
    if "noqa" not in text and "NOQA" not in text.upper():
        return found
    file_codes: Set[str] = set()
    for row, line in enumerate(split_lines(text), start=1):
        if "#" not in line:
            continue
        whole = _FILE.match(line)
        if whole:
            codes = _codes(whole.group("codes"))
            if codes is ALL:
                found.file_all = True
            else:
                file_codes |= codes
            continue
        codes = line_noqa(line)
        if codes is not NO_NOQA:
            found.lines[row] = codes
    found.file_codes = frozenset(file_codes)
    return found
