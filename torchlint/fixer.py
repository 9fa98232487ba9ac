"""Apply fixes to a fixed point, and never leave code that does not parse."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

from torchlint.linter import FileOptions, LintOutput, lint_text, why_unparsable
from torchlint.project import Projects
from torchlint.rule import SAFE, UNSAFE, ResolvedEdit, ResolvedFix
from torchlint.source import split_lines

MAX_PASSES = 100  # ruff's limit; a rule pair that undoes each other stops here


@dataclass
class FixResult:
    text: str
    applied: Counter = field(default_factory=Counter)  # code -> fixes applied
    remaining: Optional[LintOutput] = None  # the lint of ``text``
    error: Optional[str] = None  # why the file was left as it was


def is_applicable(fix: Optional[ResolvedFix], unsafe_fixes: bool) -> bool:
    if fix is None or not fix.edits:
        return False
    return fix.applicability == SAFE or (unsafe_fixes and fix.applicability == UNSAFE)


def fix_text(
    text: str,
    path: str,
    options: FileOptions,
    unsafe_fixes: bool = False,
    fixable: Callable[[str], bool] = lambda code: True,
    projects: Optional[Projects] = None,
) -> FixResult:
    original = text
    applied: Counter = Counter()
    for _ in range(MAX_PASSES):
        output = lint_text(text, path, options, projects)
        candidates = [(d.code, d.fix) for d in output.diagnostics if fixable(d.code) and is_applicable(d.fix, unsafe_fixes)]
        if not candidates:
            return FixResult(text, applied, output)
        new_text, codes = apply_fixes(text, candidates)
        message = why_unparsable(new_text)
        if message is not None:  # the result must parse, or nothing is written
            return FixResult(original, Counter(), lint_text(original, path, options, projects), f"a fix produced code that does not parse ({message}); file left unchanged")
        text = new_text
        applied.update(codes)
    return FixResult(original, Counter(), lint_text(original, path, options, projects), f"fixes did not converge after {MAX_PASSES} passes; file left unchanged")


def apply_fixes(text: str, fixes: Sequence[Tuple[str, ResolvedFix]]) -> Tuple[str, List[str]]:
    """Apply every fix whose edits overlap no fix already taken in this pass."""
    starts = _line_starts(text)
    taken: List[Tuple[int, int, ResolvedEdit]] = []
    codes: List[str] = []
    for code, fix in sorted(fixes, key=lambda item: min(e.start for e in item[1].edits)):
        spans = [(_offset(starts, e.start), _offset(starts, e.end), e) for e in fix.edits]
        if any(_overlaps(span, other) for span in spans for other in taken):
            continue
        taken.extend(spans)
        codes.append(code)
    # Back to front, so earlier offsets stay valid; insertions at one point
    # land in the order their fix lists them (`import torch`, then the decorator).
    ordered = sorted(enumerate(taken), key=lambda item: (item[1][0], item[1][1], item[0]), reverse=True)
    result = text
    for _, (start, end, edit) in ordered:
        result = result[:start] + edit.content + result[end:]
    return result, codes


def _overlaps(a, b) -> bool:
    if a[0] == a[1] or b[0] == b[1]:  # insertions clash only at the same point
        return a[0] == b[0] and a[2] != b[2]
    return a[0] < b[1] and b[0] < a[1]


def _line_starts(text: str) -> List[int]:
    starts = [0]
    for line in split_lines(text):
        starts.append(starts[-1] + len(line))
    return starts


def _offset(starts: List[int], position: Tuple[int, int]) -> int:
    row, column = position
    return starts[min(row - 1, len(starts) - 1)] + column
