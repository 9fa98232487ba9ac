"""Data formats: json (ruff's layout), json-lines, and JUnit XML."""

from __future__ import annotations

import json
from itertools import groupby
from typing import Any, Dict, Sequence, TextIO
from xml.sax.saxutils import escape, quoteattr

from torchlint.reporters import ReportContext
from torchlint.rule import Diagnostic


def to_json(d: Diagnostic, ctx: ReportContext) -> Dict[str, Any]:
    fix = None
    if d.fix is not None:
        fix = {
            "applicability": d.fix.applicability,
            "message": d.fix.message,
            "edits": [
                {
                    "content": e.content,
                    "location": {"row": e.start[0], "column": e.start[1] + 1},
                    "end_location": {"row": e.end[0], "column": e.end[1] + 1},
                }
                for e in d.fix.edits
            ],
        }
    entry = {
        "code": d.code,
        "name": d.name,
        "message": d.message,
        "filename": ctx.absolute_path(d.path),
        "location": {"row": d.row, "column": d.column},
        "end_location": {"row": d.end_row, "column": d.end_column},
        "fix": fix,
        "noqa_row": d.noqa_row,
        "url": d.url,
        "evidence": ctx.evidence_json(d),
    }
    if d.cell is not None:  # ruff's key: the notebook cell that rows count in
        entry["cell"] = d.cell
    if ctx.runtime is not None:
        entry["measured"] = ctx.measured(d)
    return entry


def runtime_only_json(entry: Dict[str, Any], ctx: ReportContext) -> Dict[str, Any]:
    """A runtime finding no static finding joined (``--runtime-report``): ``code`` is null."""
    location = {"row": entry["line"], "column": 1} if entry.get("line") else None
    return {
        "code": None,
        "name": "seen-at-run-time-only",
        "message": entry["message"],
        "filename": ctx.absolute_path(entry["file"]) if entry.get("file") else None,
        "location": location,
        "end_location": location,
        "fix": None,
        "noqa_row": None,
        "url": None,
        "evidence": [],
        "measured": entry["measured"],
        "runtime_kind": entry["kind"],
    }


def _entries(diagnostics: Sequence[Diagnostic], ctx: ReportContext):
    entries = [to_json(d, ctx) for d in diagnostics]
    if ctx.runtime is not None:
        entries.extend(runtime_only_json(entry, ctx) for entry in ctx.runtime.runtime_only)
    return entries


def json_array(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    json.dump(_entries(diagnostics, ctx), out, indent=2)
    out.write("\n")


def json_lines(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for entry in _entries(diagnostics, ctx):
        out.write(json.dumps(entry) + "\n")


def junit(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(f'<testsuites name="torchlint" tests="{len(diagnostics)}" failures="{len(diagnostics)}" errors="0">\n')
    for path, group in groupby(diagnostics, key=lambda d: d.path):
        items = list(group)
        shown = ctx.display_path(path)
        out.write(
            f'  <testsuite name={quoteattr(shown)} tests="{len(items)}" disabled="0" errors="0" '
            f'failures="{len(items)}" package="org.torchlint">\n'
        )
        for d in items:
            out.write(
                f"    <testcase name={quoteattr(f'org.torchlint.{d.code}')} classname={quoteattr(shown)} "
                f'line="{d.row}" column="{d.column}">\n'
            )
            message = d.message + ctx.measured_suffix(d)
            body = "".join(f"\n  note: {note}" for note in ctx.evidence_notes(d))
            cell = f"cell {d.cell}, " if d.cell is not None else ""
            out.write(
                f"      <failure message={quoteattr(message)}>"
                f"{escape(f'{cell}line {d.row}, col {d.column}, {message}{body}')}</failure>\n"
            )
            out.write("    </testcase>\n")
        out.write("  </testsuite>\n")
    out.write("</testsuites>\n")
