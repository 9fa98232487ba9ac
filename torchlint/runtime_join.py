"""``torchlint check --runtime-report report.json src/``: the lint, joined with what a run measured.

A sanitizer report (``torchlint-sanitize --report-json``, ``pytest
--gpu-sanitize-report``) lists findings at the user's lines with their
stacks, innermost first. Each runtime finding joins the static finding of the
same rule (for a sync, any sync rule) at the first frame of its stack that has
one, so a sync inside a helper joins the finding in the helper, and one that
the linter reports at the helper's call site joins there. Paths join by their
trailing components, so a report recorded on another machine (or in another
checkout) joins a lint of this one.

A runtime finding also joins a static finding whose evidence
(``Diagnostic.evidence``) names its line: TL202 is reported at the
DataLoader, and a blocking copy from its unpinned batches is measured at the
copy. A TL202 copy with no such evidence joins the one TL202 finding of the
lint when there is exactly one.

What comes out:

- every joined static finding gets ``measured``: ``{"count", "host_wait_ms",
  "bytes", "kinds", "runtime_findings"}``, and the measured findings sort
  first, by cost (host wait, then bytes, then count);
- a runtime finding that joins no static finding is "seen at run time only".
  A race, an out-of-memory error or any other warning the run measured is
  never hidden: it is listed whatever ``--select`` chose and whether or not
  its file was linted (``RuntimeJoin.blocking``), and the lint does not end
  with "All checks passed!" over it. Notes of the run (periodic and one-off
  syncs, memory near capacity) are counted, not listed;
- a static finding the run never reached stays as it was.

A report that cannot be read, or whose findings lack what the join needs, is
one ``RuntimeReportError`` naming the file (and the finding) and the reason.
Nothing here imports torch: the report is plain JSON.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

# The static rules a runtime sync can stand for (sanitizer/sync/kinds.py's KINDS).
SYNC_RULES = frozenset({"TL101", "TL102", "TL103", "TL201", "TL303"})


class RuntimeReportError(ValueError):
    """A report that cannot be read; the message names the file and the reason."""


@dataclass
class RuntimeJoin:
    """The result: ``measured`` keyed by ``(path, row, column, code)``; the unjoined runtime findings."""

    measured: Dict[Tuple[str, int, int, str], Dict[str, Any]] = field(default_factory=dict)
    runtime_only: List[Dict[str, Any]] = field(default_factory=list)
    outside: int = 0  # notes of the run in files this lint did not cover (the listed ones say so themselves)
    notes: int = 0  # runtime notes (periodic and one-off syncs, near capacity) that joined nothing: counted

    def of(self, diagnostic) -> Optional[Dict[str, Any]]:
        return self.measured.get(_key(diagnostic))

    @property
    def blocking(self) -> bool:
        """Whether the run found something the lint's output must show (no "All checks passed!" then)."""
        return bool(self.runtime_only)


def _key(d) -> Tuple[str, int, int, str]:
    return (d.path, d.row, d.column, d.code)


def read_json_object(path: str, what: str = "report") -> Dict[str, Any]:
    """A JSON object from ``path``; ValueError naming the file and the reason otherwise."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as error:
        raise RuntimeReportError(f"{path}: cannot read the {what}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise RuntimeReportError(f"{path}: the {what} is not JSON: {error}") from None
    if not isinstance(data, dict):
        raise RuntimeReportError(f"{path}: the {what} is not a JSON object")
    return data


def load_reports(paths: Sequence[str]) -> List[Dict[str, Any]]:
    reports = []
    for path in paths:
        data = read_json_object(path, "runtime report")
        if data.get("tool") != "torchlint-sanitizer" or not isinstance(data.get("findings"), list):
            raise RuntimeReportError(
                f'{path}: not a torchlint sanitizer report (no "tool": "torchlint-sanitizer" and findings)'
            )
        if data.get("version") != 1:
            raise RuntimeReportError(
                f"{path}: sanitizer report version {data.get('version')!r}; this torchlint reads version 1"
            )
        for index, finding in enumerate(data["findings"]):
            problem = _malformed(finding)
            if problem:
                raise RuntimeReportError(f"{path}: finding {index}: {problem}")
        reports.append(data)
    return reports


def _malformed(finding: Any) -> Optional[str]:
    """What a finding lacks for the join, or None (the report's schema: sanitizer/report.py)."""
    if not isinstance(finding, dict):
        return f"not an object ({type(finding).__name__})"
    if not isinstance(finding.get("kind"), str):
        return 'no "kind"'
    for key, types in (
        ("file", (str, type(None))),
        ("line", (int, type(None))),
        ("rule", (str, type(None))),
        ("message", (str, type(None))),
        ("severity", (str, type(None))),
        ("details", (dict, type(None))),
        ("stack", (list, type(None))),
    ):
        if not isinstance(finding.get(key), types) or isinstance(finding.get(key), bool):
            return f'"{key}" is {finding.get(key)!r}'
    if "count" in finding and (not isinstance(finding["count"], int) or isinstance(finding["count"], bool)):
        return f'"count" is {finding["count"]!r}, not a whole number'
    for frame in finding.get("stack") or []:
        if not (isinstance(frame, dict) and isinstance(frame.get("file"), str) and isinstance(frame.get("line"), int)):
            return f"a stack frame is {frame!r}"
    return None


def _parts(path: str) -> List[str]:
    return [part for part in os.path.normpath(os.path.abspath(path)).split(os.sep) if part]


def _suffix_match(runtime_path: str, static_parts: List[str]) -> int:
    """How many trailing path components agree (0: not the same file)."""
    runtime_parts = [part for part in os.path.normpath(runtime_path).split(os.sep) if part and part != "."]
    common = 0
    for a, b in zip(reversed(runtime_parts), reversed(static_parts)):
        if a != b:
            break
        common += 1
    # A bare file name matches only itself; otherwise the folder must agree too.
    needed = min(2, len(runtime_parts), len(static_parts))
    return common if common >= needed else 0


def _frames(finding: Dict[str, Any]) -> List[Tuple[str, int]]:
    frames = [(f["file"], int(f["line"])) for f in finding.get("stack") or [] if f.get("file") and f.get("line")]
    if finding.get("file") and finding.get("line") and (finding["file"], finding["line"]) not in frames:
        frames.insert(0, (finding["file"], int(finding["line"])))
    return frames


def _must_show(finding: Dict[str, Any]) -> bool:
    """A race, an OOM, a per-step stall, memory the run paid for: never hidden behind --select or files not linted."""
    return finding.get("kind") in ("race", "oom") or finding.get("severity") in ("error", "warning")


def _rule_fits(finding: Dict[str, Any], code: str) -> bool:
    if finding.get("rule") == code:
        return True
    return finding.get("kind") == "sync" and code in SYNC_RULES


def _cost(finding: Dict[str, Any]) -> Tuple[Optional[float], int]:
    details = finding.get("details") or {}
    wait = details.get("stall_ms")
    nbytes = 0
    for key in ("requested_bytes", "excess_bytes", "growth_bytes", "total_free_bytes", "peak_reserved_bytes"):
        if isinstance(details.get(key), int):
            nbytes = details[key]
            break
    return (float(wait) if isinstance(wait, (int, float)) else None), nbytes


def join(diagnostics: Sequence[Any], reports: Iterable[Dict[str, Any]], linted: Sequence[str] = ()) -> RuntimeJoin:
    """Join each runtime finding to the static finding it measures; ``linted`` names every file the lint
    covered (those without a finding too), so a runtime finding there is not taken for one outside it."""
    result = RuntimeJoin()
    by_file: Dict[str, List[Any]] = {}
    for d in diagnostics:
        by_file.setdefault(d.path, []).append(d)
    static_parts = {path: _parts(path) for path in set(by_file) | set(linted)}
    evidence = _evidence_index(diagnostics)
    by_code: Dict[str, List[Any]] = {}
    for d in diagnostics:
        by_code.setdefault(d.code, []).append(d)

    def file_for(runtime_path: str) -> Optional[str]:
        best, score = None, 0
        for path, parts in static_parts.items():
            common = _suffix_match(runtime_path, parts)
            if common > score:
                best, score = path, common
        return best

    linted_cache: Dict[str, Optional[str]] = {}
    for report in reports:
        rank = (report.get("timeline") or {}).get("rank")
        for finding in report["findings"]:
            target = None
            seen_in_lint = finding.get("file") is None
            local_file = None  # the finding's own file as this lint names it
            for file, line in _frames(finding):
                if file not in linted_cache:
                    linted_cache[file] = file_for(file)
                path = linted_cache[file]
                if path is None:
                    continue
                seen_in_lint = True
                if file == finding.get("file"):
                    local_file = path
                candidates = [
                    d for d in by_file.get(path, ()) if d.row <= line <= d.end_row and _rule_fits(finding, d.code)
                ]
                candidates += [d for d in evidence.get((path, line), ()) if _rule_fits(finding, d.code)]
                if candidates:
                    target = min(candidates, key=lambda d: (d.code != finding.get("rule"), d.row, d.column))
                    break
            if target is None and finding.get("rule") == "TL202" and len(by_code.get("TL202", ())) == 1:
                target = by_code["TL202"][0]  # the one unpinned loader the lint found feeds this copy
            wait, nbytes = _cost(finding)
            if target is None:
                if not _must_show(finding):
                    if seen_in_lint:
                        result.notes += 1
                    else:
                        result.outside += 1
                    continue
                result.runtime_only.append(
                    {
                        "kind": finding["kind"],
                        "file": local_file or finding.get("file"),
                        "line": finding.get("line"),
                        "message": finding.get("message") or "",
                        "rule": finding.get("rule"),
                        "measured": {
                            "count": int(finding.get("count") or 0),
                            "host_wait_ms": wait,
                            "bytes": nbytes or None,
                            "kinds": [_label(finding)],
                            "runtime_findings": 1,
                        },
                        "rank": rank,
                        "linted": seen_in_lint,
                    }
                )
                continue
            entry = result.measured.setdefault(
                _key(target), {"count": 0, "host_wait_ms": None, "bytes": None, "kinds": [], "runtime_findings": 0}
            )
            entry["count"] += int(finding.get("count") or 0)
            if wait is not None:
                entry["host_wait_ms"] = round((entry["host_wait_ms"] or 0.0) + wait, 3)
            if nbytes:
                entry["bytes"] = (entry["bytes"] or 0) + nbytes
            if _label(finding) not in entry["kinds"]:
                entry["kinds"].append(_label(finding))
            entry["runtime_findings"] += 1
    result.runtime_only.sort(key=lambda e: (_SEVERITY_ORDER.get(e["kind"], 2),) + _cost_key(e["measured"]))
    return result


# Races first, then out-of-memory errors, then by cost (sanitizer/ranking.py's order).
_SEVERITY_ORDER = {"race": 0, "oom": 1}


def _evidence_index(diagnostics: Sequence[Any]) -> Dict[Tuple[str, int], List[Any]]:
    """``(path, row)`` of every fact a static finding rests on -> the findings resting on it."""
    index: Dict[Tuple[str, int], List[Any]] = {}
    for d in diagnostics:
        for fact in getattr(d, "evidence", ()) or ():
            index.setdefault((fact.path, fact.row), []).append(d)
    return index


def _label(finding: Dict[str, Any]) -> str:
    sync_kind = (finding.get("details") or {}).get("sync_kind")
    return f"sync {sync_kind}" if finding.get("kind") == "sync" and sync_kind else finding.get("kind", "?")


def _cost_key(measured: Dict[str, Any]) -> Tuple[float, int, int]:
    return (-(measured.get("host_wait_ms") or 0.0), -(measured.get("bytes") or 0), -measured.get("count", 0))


def _measured_cost(joined: RuntimeJoin, diagnostic: Any) -> Tuple[float, int, int]:
    measured = joined.of(diagnostic)
    assert measured is not None  # only measured findings are sorted by cost
    return _cost_key(measured)


def sort_measured_first(diagnostics: Sequence[Any], joined: RuntimeJoin) -> List[Any]:
    """Measured findings first, by cost; the rest keep their order."""
    measured = [d for d in diagnostics if joined.of(d) is not None]
    measured.sort(key=lambda d: _measured_cost(joined, d))
    rest = [d for d in diagnostics if joined.of(d) is None]
    return measured + rest


def describe(measured: Dict[str, Any]) -> str:
    """``measured: 28x, 33.1 ms host wait`` (text formats)."""
    parts = [f"{measured['count']}x"]
    if measured.get("host_wait_ms") is not None:
        parts.append(f"{measured['host_wait_ms']:.1f} ms host wait")
    if measured.get("bytes"):
        parts.append(f"{measured['bytes'] / (1 << 20):,.1f} MiB")
    return "measured: " + ", ".join(parts)


def runtime_only_line(entry: Dict[str, Any], display_path) -> str:
    where = f"{display_path(entry['file'])}:{entry['line']}" if entry.get("file") else "<process>"
    label = ", ".join(entry["measured"]["kinds"])
    outside = " (in a file this lint did not cover)" if entry.get("linted") is False else ""
    return f"{where}: seen at run time only{outside}: {label} ({describe(entry['measured'])}) — {entry['message']}"


def summary_line(joined: RuntimeJoin) -> str:
    """The runtime section's last line (text formats)."""
    measured, only = len(joined.measured), len(joined.runtime_only)
    line = (
        f"Runtime report: {measured} finding{'s' if measured != 1 else ''} measured at run time, "
        f"{only} seen at run time only (the linter's blind spot, or a rule not selected)"
    )
    notes = joined.notes + joined.outside
    if notes:
        line += f"; {notes} note{'s' if notes != 1 else ''} of the run (periodic or one-off syncs, headroom) not listed"
    return line + "."
