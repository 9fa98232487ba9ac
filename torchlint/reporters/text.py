"""The formats meant for people: concise, full, grouped, and pylint's."""
from __future__ import annotations

from itertools import groupby
from typing import Sequence, TextIO

from torchlint.fixer import is_applicable
from torchlint.reporters import ReportContext
from torchlint.rule import SAFE, UNSAFE, Diagnostic


def _marker(d: Diagnostic, ctx: ReportContext) -> str:
    return " [*]" if is_applicable(d.fix, ctx.unsafe_fixes) else ""


def concise(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for d in diagnostics:
        out.write(f"{ctx.display_path(d.path)}:{d.place}: {d.code}{_marker(d, ctx)} {d.message}{ctx.measured_suffix(d)}\n")
    ctx.write_runtime_section(out)


def grouped(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for path, items in groupby(diagnostics, key=lambda d: d.path):
        out.write(f"{ctx.display_path(path)}:\n")
        for d in items:
            out.write(f"  {d.place} {d.code}{_marker(d, ctx)} {d.message}{ctx.measured_suffix(d)}\n")
        out.write("\n")
    ctx.write_runtime_section(out)


def pylint(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for d in diagnostics:
        cell = f"cell {d.cell}:" if d.cell is not None else ""
        out.write(f"{ctx.display_path(d.path)}:{cell}{d.row}: [{d.code}] {d.message}{ctx.measured_suffix(d)}\n")
    ctx.write_runtime_section(out)


def full(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for d in diagnostics:
        out.write(f"{ctx.display_path(d.path)}:{d.place}: {d.code}{_marker(d, ctx)} {d.message}{ctx.measured_suffix(d)}\n")
        source = ctx.source_line(d)
        if source is not None:
            gutter = f"{d.row:>4} | "
            out.write(f"{gutter}{source}\n")
            width = max(1, (d.end_column - d.column) if d.end_row == d.row else len(source) - d.column + 1)
            out.write(" " * (len(gutter) - 2) + "| " + " " * (d.column - 1) + "^" * width + "\n")
        for note in ctx.evidence_notes(d):
            out.write(f"  note: {note}\n")
        if d.fix is not None:
            out.write(f"  help: {d.fix.message}\n")
            if d.fix.applicability == UNSAFE:
                out.write("  note: This is an unsafe fix and may change runtime behavior\n")
            elif d.fix.applicability != SAFE:
                out.write("  note: This fix is display-only: torchlint never applies it\n")
            for edit in d.fix.edits:
                (r1, c1), (r2, c2) = edit.start, edit.end
                out.write(f"    {r1}:{c1 + 1}-{r2}:{c2 + 1} -> {edit.content!r}\n")
        out.write("\n")
    ctx.write_runtime_section(out)
