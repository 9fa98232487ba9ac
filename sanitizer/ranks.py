"""Many processes: one report per rank, merged into one report.

Under ``torchrun`` (or any launcher that sets ``RANK`` and ``WORLD_SIZE``
above 1) every process runs its own sanitizer session: its checks see its own
ops, streams, collectives and allocator. At exit each rank writes its own
report next to ``--report-json PATH`` (``PATH`` with ``.rank<r>`` before the
extension); whichever rank finds every rank's report of this run on disk
merges them into ``PATH``:

* ``findings``: every rank's findings, each with ``rank`` added;
* ``ranks``: one entry per rank, in rank order: its device, steps, finding
  counts by kind, failing count, peak memory, how the race check ran, and the
  path of its own report;
* the run-wide fields (``torch``, ``device``, ``steps``) are rank 0's;
  ``checks`` is the union; ``world_size`` and ``run_id`` say which run it was.

"This run": a rank's report carries the launcher's run id
(``TORCHELASTIC_RUN_ID`` with the master address and port) and the time its
session started; reports of another run, or started more than
``SAME_RUN_WINDOW_S`` apart, are left out of the merge. The last rank to
finish always sees every report (each writes its own before it looks), and
two ranks merging at once write the same file atomically.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional

SAME_RUN_WINDOW_S = 600.0


@dataclass(frozen=True)
class RankInfo:
    rank: int
    world_size: int
    local_rank: int
    run_id: str


def rank_info(environ: Mapping[str, str] = os.environ) -> Optional[RankInfo]:
    """This process's rank under a multi-process launcher, or None for a single process."""
    try:
        world_size = int(environ.get("WORLD_SIZE", "1"))
        rank = int(environ.get("RANK", "0"))
    except ValueError:
        return None
    if world_size <= 1:
        return None
    try:
        local_rank = int(environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        local_rank = rank
    run_id = "/".join(
        environ.get(key, "")
        for key in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")
    )
    return RankInfo(rank, world_size, local_rank, run_id)


def rank_path(path: str, rank: int) -> str:
    """``out/report.json`` -> ``out/report.rank1.json``."""
    base, extension = os.path.splitext(path)
    return f"{base}.rank{rank}{extension or '.json'}"


def stamp(report: Dict[str, Any], info: RankInfo, started_at: float) -> Dict[str, Any]:
    """Mark a rank's own report with its rank and run (additive fields)."""
    report["rank"] = info.rank
    report["world_size"] = info.world_size
    report["local_rank"] = info.local_rank
    report["run_id"] = info.run_id
    report["started_at"] = started_at
    return report


def _rank_summary(report: Dict[str, Any], path: Optional[str], fail_on) -> Dict[str, Any]:
    from .findings import Finding
    from .session import finding_fails

    by_kind: Dict[str, int] = {}
    failing = 0
    for data in report.get("findings", []):
        by_kind[data["kind"]] = by_kind.get(data["kind"], 0) + 1
        if finding_fails(Finding.from_json(data), fail_on):
            failing += 1
    memory = report.get("memory") or {}
    race = report.get("race") or {}
    summary: Dict[str, Any] = {
        "rank": report.get("rank"),
        "local_rank": report.get("local_rank"),
        "device": report.get("device"),
        "steps": report.get("steps"),
        "findings": len(report.get("findings", [])),
        "by_kind": by_kind,
        "failing": failing,
        "report": path,
    }
    if memory.get("available"):
        summary["memory"] = {key: memory.get(key) for key in ("peak_allocated_bytes", "peak_reserved_bytes")}
    if race:
        summary["race"] = {key: race.get(key) for key in ("active", "activation_reason", "interception")}
    return summary


def merge_reports(reports: List[Dict[str, Any]], paths: Optional[List[Optional[str]]] = None) -> Dict[str, Any]:
    """One report of a run from every rank's report (rank 0's run-wide fields, findings tagged by rank)."""
    if not reports:
        raise ValueError("no rank reports to merge")
    paths = paths or [None] * len(reports)
    ordered = sorted(zip(reports, paths), key=lambda pair: pair[0].get("rank", 0))
    first = ordered[0][0]
    fail_on = first.get("fail_on", [])
    merged: Dict[str, Any] = {key: first.get(key) for key in ("version", "tool", "torch", "device")}
    merged["checks"] = sorted({name for report, _ in ordered for name in report.get("checks", [])})
    merged["fail_on"] = fail_on
    merged["findings"] = [
        dict(finding, rank=report.get("rank")) for report, _ in ordered for finding in report.get("findings", [])
    ]
    if "steps" in first:
        merged["steps"] = first["steps"]
    else:
        merged["tests"] = first.get("tests", {})
    merged["world_size"] = first.get("world_size", len(ordered))
    merged["run_id"] = first.get("run_id")
    merged["ranks"] = [_rank_summary(report, path, fail_on) for report, path in ordered]
    return merged


def collect(path: str, info: RankInfo, started_at: float) -> Optional[List[tuple]]:
    """Every rank's (report, path) of this run, or None while some rank has not written its report."""
    found = []
    for rank in range(info.world_size):
        candidate = rank_path(path, rank)
        try:
            with open(candidate, encoding="utf-8") as handle:
                report = json.load(handle)
        except (OSError, ValueError):
            return None
        apart_s = abs(float(report.get("started_at", 0)) - started_at)
        if report.get("run_id") != info.run_id or apart_s > SAME_RUN_WINDOW_S:
            return None  # a report of another run: this run's rank has not written yet
        found.append((report, candidate))
    return found


def write_rank_report(path: str, report: Dict[str, Any], info: RankInfo, started_at: float) -> Optional[Dict[str, Any]]:
    """Write this rank's report; merge into ``path`` when every rank's is there. Returns the merged report."""
    from .report import write_report

    write_report(rank_path(path, info.rank), stamp(report, info, started_at))
    found = collect(path, info, started_at)
    if found is None:
        return None
    merged = merge_reports([report for report, _ in found], [candidate for _, candidate in found])
    write_report(path, merged)
    return merged


def render_merged(merged: Dict[str, Any], title: str, limit: int = 10) -> str:
    """The merged summary: a headline over every rank, the top sites tagged with their rank, one line per rank."""
    from .findings import Finding, is_per_step_cost
    from .report import finding_line, render_summary
    from .report import rank as rank_findings

    tagged = []
    for data in merged["findings"]:
        finding = Finding.from_json({key: value for key, value in data.items() if key != "rank"})
        tagged.append((finding, data.get("rank")))
    of_rank = {id(finding): rank for finding, rank in tagged}
    findings = [finding for finding, _ in tagged]
    head = render_summary(findings, merged.get("steps"), limit=0, title=title).splitlines()[0]
    lines = [head]
    ranked = rank_findings(f for f in findings if is_per_step_cost(f))
    for finding in ranked[:limit]:
        lines.append(f"  [rank {of_rank[id(finding)]}] {finding_line(finding)}")
    if len(ranked) > limit:
        lines.append(f"  ... and {len(ranked) - limit} more (see the JSON report)")
    lines.append(render_ranks(merged))
    return "\n".join(lines)


def render_ranks(merged: Dict[str, Any]) -> str:
    """The per-rank lines under a merged summary."""
    lines = [f"merged report of {merged['world_size']} ranks:"]
    for entry in merged["ranks"]:
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(entry["by_kind"].items())) or "no findings"
        device = (entry.get("device") or {}).get("name") or "no device"
        lines.append(f"  rank {entry['rank']} ({device}): {kinds}")
    return "\n".join(lines)
