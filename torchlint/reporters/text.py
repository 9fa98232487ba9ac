"""The formats meant for people: concise, full, grouped, and pylint's.

concise (the default) is one line per finding that fits in 100 columns: the
message is shortened to its first clause (``concise_message``); full keeps
the whole message, the source excerpt, the evidence notes and the fix."""

from __future__ import annotations

from itertools import groupby
from typing import Sequence, TextIO

from torchlint.fixer import is_applicable
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext
from torchlint.reporters.concise_message import LINE_WIDTH, shorten
from torchlint.rule import SAFE, UNSAFE, Diagnostic


def _marker(d: Diagnostic, ctx: ReportContext) -> str:
    return " [*]" if is_applicable(d.fix, ctx.unsafe_fixes) else ""


def _heading(d: Diagnostic, ctx: ReportContext) -> str:
    """`path:row:col: CODE [*] `, plain (for measuring) and painted."""
    return f"{ctx.display_path(d.path)}:{d.place}: {d.code}{_marker(d, ctx)} "


def _painted_heading(d: Diagnostic, ctx: ReportContext) -> str:
    paint, colon = ctx.paint, ctx.paint("punctuation", ":")
    marker = " " + paint("fixable", "[*]") if _marker(d, ctx) else ""
    return (
        f"{paint('path', ctx.display_path(d.path))}{colon}{d.place.replace(':', colon)}{colon} "
        f"{paint('code', d.code)}{marker} "
    )


def concise_line(d: Diagnostic, ctx: ReportContext) -> str:
    """The finding in one line of at most 100 columns (unless its path alone is too long)."""
    suffix = ctx.measured_suffix(d)
    rule = all_rules().get(d.code)
    if rule is None or d.code == "TL000":  # an error's reason is its message: never cut
        return f"{_painted_heading(d, ctx)}{d.message}{suffix}"
    message = shorten(d.message, LINE_WIDTH - len(_heading(d, ctx)) - len(suffix), rule.summary)
    return f"{_painted_heading(d, ctx)}{message}{suffix}"


def concise(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for d in diagnostics:
        out.write(concise_line(d, ctx) + "\n")
    ctx.write_runtime_section(out)


def grouped(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for path, items in groupby(diagnostics, key=lambda d: d.path):
        out.write(f"{ctx.paint('path', ctx.display_path(path))}:\n")
        for d in items:
            marker = " " + ctx.paint("fixable", "[*]") if _marker(d, ctx) else ""
            out.write(f"  {d.place} {ctx.paint('code', d.code)}{marker} {d.message}{ctx.measured_suffix(d)}\n")
        out.write("\n")
    ctx.write_runtime_section(out)


def pylint(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for d in diagnostics:
        cell = f"cell {d.cell}:" if d.cell is not None else ""
        out.write(f"{ctx.display_path(d.path)}:{cell}{d.row}: [{d.code}] {d.message}{ctx.measured_suffix(d)}\n")
    ctx.write_runtime_section(out)


def full(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    paint = ctx.paint
    for d in diagnostics:
        out.write(f"{_painted_heading(d, ctx)}{d.message}{ctx.measured_suffix(d)}\n")
        source = ctx.source_line(d)
        if source is not None:
            gutter = f"{d.row:>4} | "
            out.write(f"{paint('dim', gutter)}{source}\n")
            width = max(1, (d.end_column - d.column) if d.end_row == d.row else len(source) - d.column + 1)
            out.write(
                " " * (len(gutter) - 2) + paint("dim", "| ") + " " * (d.column - 1) + paint("caret", "^" * width) + "\n"
            )
        note = paint("note", "note:")
        for fact in ctx.evidence_notes(d):
            out.write(f"  {note} {fact}\n")
        if d.fix is not None:
            out.write(f"  {paint('help', 'help:')} {d.fix.message}\n")
            if d.fix.applicability == UNSAFE:
                out.write(f"  {note} This is an unsafe fix and may change runtime behavior\n")
            elif d.fix.applicability != SAFE:
                out.write(f"  {note} This fix is display-only: torchlint never applies it\n")
            for edit in d.fix.edits:
                (r1, c1), (r2, c2) = edit.start, edit.end
                out.write(f"    {r1}:{c1 + 1}-{r2}:{c2 + 1} -> {edit.content!r}\n")
        out.write("\n")
    ctx.write_runtime_section(out)
