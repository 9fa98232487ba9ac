"""Formats for CI systems: GitHub workflow commands and SARIF 2.1.0."""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse
from typing import Any, Dict, List, Sequence, TextIO

from torchlint import __version__, docs, lifecycle
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext
from torchlint.rule import DOCS_URL, Diagnostic


def escape_data(text: str) -> str:
    """Workflow-command message escaping (actions/toolkit ``escapeData``)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """Property-value escaping (``escapeProperty``): also ``:`` and ``,``."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    for d in diagnostics:
        props = ",".join(
            f"{key}={escape_property(str(value))}"
            for key, value in (
                ("file", ctx.display_path(d.path)),
                ("line", d.row),
                ("col", d.column),
                ("endLine", d.end_row),
                ("endColumn", d.end_column),
                ("title", f"{d.code} {d.name}"),
            )
        )
        notes = "".join(f"\n  note: {note}" for note in ctx.evidence_notes(d))
        # GitHub places annotations by file line only: a notebook's finding says its cell (as ruff's do).
        cell = f"{ctx.display_path(d.path)}:{d.place}: " if d.cell is not None else ""
        out.write(f"::error {props}::{escape_data(f'{cell}{d.code} {d.message}{ctx.measured_suffix(d)}{notes}')}\n")
    if ctx.runtime is not None:
        from torchlint.runtime_join import runtime_only_line

        for entry in ctx.runtime.runtime_only:
            where = (
                f"file={escape_property(ctx.display_path(entry['file']))},line={entry['line']},"
                if entry.get("file")
                else ""
            )
            out.write(
                f"::warning {where}title=seen at run time only::"
                f"{escape_data(runtime_only_line(entry, ctx.display_path))}\n"
            )


def _repo_root(start: str) -> str:
    directory = os.path.abspath(start)
    while True:
        if os.path.exists(os.path.join(directory, ".git")):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return os.path.abspath(start)
        directory = parent


def _fingerprint(d: Diagnostic, uri: str, ctx: ReportContext) -> str:
    line = (ctx.source_line(d) or "").strip()
    return hashlib.sha256(f"{d.code}\0{uri}\0{line}".encode()).hexdigest()[:32]


def sarif_document(diagnostics: Sequence[Diagnostic], ctx: ReportContext) -> Dict[str, Any]:
    rules = list(all_rules().values())
    index = {rule.code: i for i, rule in enumerate(rules)}
    root = _repo_root(ctx.cwd)
    results: List[Dict[str, Any]] = []
    for d in diagnostics:
        uri = _repo_uri(ctx, d.path, root)
        results.append(
            {
                "ruleId": d.code,
                "ruleIndex": index[d.code],
                "level": "error" if d.code == "TL000" else "warning",
                "message": {"text": d.message},
                "locations": [
                    {
                        "physicalLocation": {
                            "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
                            "region": {
                                "startLine": d.row,
                                "startColumn": d.column,
                                "endLine": d.end_row,
                                "endColumn": max(d.end_column, d.column + 1) if d.end_row == d.row else d.end_column,
                            },
                        }
                    }
                ],
                "partialFingerprints": {"torchlintFingerprint/v1": _fingerprint(d, uri, ctx)},
            }
        )
        if d.cell is not None:
            # SARIF regions count lines of the artifact; a notebook's finding counts
            # them in its cell, which the location's message and properties name.
            results[-1]["locations"][0]["message"] = {"text": f"cell {d.cell}, line {d.row}"}
            results[-1]["properties"] = {"cell": d.cell}
        if d.evidence:
            results[-1]["relatedLocations"] = _related_locations(d, ctx, root)
            results[-1].setdefault("properties", {})["evidence"] = _evidence_properties(results[-1]["relatedLocations"])
        if ctx.runtime is not None:
            results[-1].setdefault("properties", {})["measured"] = ctx.measured(d)
    if ctx.runtime is not None:
        results.extend(_runtime_only_results(ctx, root))
    return {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torchlint",
                        "semanticVersion": __version__,
                        "version": __version__,
                        "informationUri": DOCS_URL,
                        "rules": [_sarif_rule(rule) for rule in rules],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": _file_uri(root)}},
                "results": results,
            }
        ],
    }


def _repo_uri(ctx: ReportContext, path: str, root: str) -> str:
    """A relative URI reference: percent-encoded from the name's bytes, so a
    name that is not UTF-8 or holds control characters is still a valid URI."""
    absolute = ctx.absolute_path(path)
    relative = os.path.relpath(os.path.realpath(absolute), os.path.realpath(root)).replace(os.sep, "/")
    return urllib.parse.quote(os.fsencode(relative), safe="/")


def _related_locations(d: Diagnostic, ctx: ReportContext, root: str) -> List[Dict[str, Any]]:
    """The facts the finding rests on, each a place with its message."""
    return [
        {
            "id": index,
            "message": {"text": fact.text},
            "physicalLocation": {
                "artifactLocation": {"uri": _repo_uri(ctx, fact.path, root), "uriBaseId": "%SRCROOT%"},
                "region": {"startLine": fact.row, "startColumn": fact.column},
            },
        }
        for index, fact in enumerate(d.evidence)
    ]


def _evidence_properties(related: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The same facts flat, for tools that read properties rather than relatedLocations."""
    return [
        {
            "message": entry["message"]["text"],
            "uri": entry["physicalLocation"]["artifactLocation"]["uri"],
            "location": {
                "row": entry["physicalLocation"]["region"]["startLine"],
                "column": entry["physicalLocation"]["region"]["startColumn"],
            },
        }
        for entry in related
    ]


def _runtime_only_results(ctx: ReportContext, root: str) -> List[Dict[str, Any]]:
    """Runtime findings no static finding joined: notes without a rule, with ``measured``."""
    assert ctx.runtime is not None  # called only with a runtime report
    results = []
    for entry in ctx.runtime.runtime_only:
        result: Dict[str, Any] = {
            "ruleId": "seen-at-run-time-only",
            "level": "note",
            "message": {"text": f"seen at run time only: {entry['message']}"},
            "properties": {"measured": entry["measured"], "runtime_kind": entry["kind"]},
        }
        if entry.get("file"):
            uri = _repo_uri(ctx, entry["file"], root)
            region = {"startLine": entry["line"]} if entry.get("line") else {}
            result["locations"] = [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"},
                        **({"region": region} if region else {}),
                    }
                }
            ]
        results.append(result)
    return results


def _file_uri(path: str) -> str:
    path = os.path.abspath(path).replace(os.sep, "/")
    path = urllib.parse.quote(os.fsencode(path), safe="/:")
    return "file://" + (path if path.startswith("/") else "/" + path) + "/"


def _sarif_rule(rule) -> Dict[str, Any]:
    full = docs.what_it_does(rule)
    markdown = docs.render_markdown(rule)
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": full},
        "help": {"text": full, "markdown": markdown},
        "helpUri": f"{DOCS_URL}#{docs.anchor(rule)}",
        # Enabled: in the default set (stable and not opt-in); preview rules run only with --preview.
        "defaultConfiguration": {
            "level": "error" if rule.code == "TL000" else "warning",
            "enabled": lifecycle.in_default_set(rule),
        },
        "properties": {
            "tags": ["pytorch", "performance" if rule.code[2] in "12358" else "correctness"],
            "status": lifecycle.status(rule),
        },
    }


def sarif(diagnostics: Sequence[Diagnostic], ctx: ReportContext, out: TextIO) -> None:
    json.dump(sarif_document(diagnostics, ctx), out, indent=2)
    out.write("\n")
