"""Apply fixes to a fixed point, and never leave code that does not parse."""

from __future__ import annotations

import io
import sys
import tokenize
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
        candidates = [
            (d.code, d.fix)
            for d in output.diagnostics
            if fixable(d.code) and d.fix is not None and is_applicable(d.fix, unsafe_fixes)
        ]
        if not candidates:
            return FixResult(text, applied, output)
        new_text, codes = apply_fixes(text, candidates)
        message = why_unparsable(new_text) or needs_newer_python(text, new_text)
        if message is not None:  # the result must parse, or nothing is written
            return FixResult(
                original,
                Counter(),
                lint_text(original, path, options, projects),
                f"a fix produced code that does not parse ({message}); file left unchanged",
            )
        text = new_text
        applied.update(codes)
    return FixResult(
        original,
        Counter(),
        lint_text(original, path, options, projects),
        f"fixes did not converge after {MAX_PASSES} passes; file left unchanged",
    )


def needs_newer_python(before: str, after: str) -> Optional[str]:
    """Why ``after`` would not parse on Pythons older than the one running
    (fixes must not raise the Python a project needs), or None.

    CPython's ``compile()`` checks the running grammar only. From 3.12 on, an
    f-string may hold its own quote, backslashes and comments (PEP 701), which
    3.11 and older reject: a fix that adds such an f-string is refused, as it
    is when torchlint runs on 3.11. Counting against ``before`` keeps code
    that already needs 3.12 fixable."""
    if sys.version_info < (3, 12):
        return None  # compile() already applied the older grammar
    added = pre_pep701_problems(after) - pre_pep701_problems(before)
    if added > 0:
        return (
            "a fix would put a quote, backslash or comment inside an f-string, which Python 3.11 and older cannot parse"
        )
    return None


def pre_pep701_problems(text: str) -> int:
    """How many places in ``text``'s f-strings Python < 3.12 rejects (PEP 701 lifted them)."""
    problems = 0
    enclosing: List[str] = []  # the quote of each open f-string, innermost last
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            kind = token.type
            if kind == tokenize.FSTRING_START:  # type: ignore[attr-defined]
                quote = token.string.lstrip("fFrRbBuU")
                problems += any(outer in quote for outer in enclosing)
                enclosing.append(quote)
            elif kind == tokenize.FSTRING_END:  # type: ignore[attr-defined]
                if enclosing:
                    enclosing.pop()
            elif enclosing and kind != tokenize.FSTRING_MIDDLE:  # type: ignore[attr-defined]
                if kind == tokenize.STRING:
                    problems += any(outer in token.string for outer in enclosing) or "\\" in token.string
                elif kind == tokenize.COMMENT:
                    problems += 1
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return 0
    return problems


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
