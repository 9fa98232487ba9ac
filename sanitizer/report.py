"""The sanitizer's JSON report and its ten-second terminal summary.

JSON report, version 1 (stable: add fields, never rename or remove them)
-------------------------------------------------------------------------
::

    {
      "version": 1,                      # bumped only on an incompatible change
      "tool": "torchlint-sanitizer",
      "torch": "2.11.0+cu130" | null,    # torch.__version__, null when torch is absent
      "device": {"name": str, "index": int, "capability": "9.0",
                 "total_memory_bytes": int} | null,   # null without CUDA
      "checks": ["memory", "race", "sync"],           # the checks that ran
      "fail_on": ["oom:fragmentation"],               # selectors that fail a run/test
      "findings": [Finding, ...],
      # exactly one of:
      "steps": {"completed": int, "warmup": int, "measured": int,
                "source": "optimizer" | "explicit" | "none"},   # script / library
      "tests": {"<nodeid>": {"outcome": "passed" | "failed" | "skipped",
                             "findings": int, "failed_by_sanitizer": bool,
                             "one_off": int,              # of findings, the one-off syncs
                             "memory": {...} | absent}},  # pytest; memory: the test's summary
      "sites": [{"kind": str, "file": str | null, "line": int | null, "function": str | null,
                 "rule": str | null, "sync_kind": str | null, "severity": str, "one_off": bool,
                 "count": int, "runs": int, "stall_ms": float | null, "tests": int,
                 "test_ids": [str, ...], "failing_tests": int, "fix_hint": str, "message": str}, ...],
                 # pytest only: findings grouped by site across tests, the summary's order
      # when the memory check ran (script / library runs):
      "memory": {"available": bool, "peak_allocated_bytes": int, "peak_reserved_bytes": int,
                 "peak_exact": bool, "reserved_unallocated_bytes": int, "slack": float,
                 "inactive_split_bytes": int, "num_alloc_retries": int, "num_ooms": int, ...,
                 # added (issue 13): what the check saw while the program ran
                 "observed_peak_reserved_bytes": int, "observed_peak_allocated_bytes": int,
                 "worst_fragmentation": {"trigger": str, "step": int | null, "reserved_bytes": int,
                                         "allocated_bytes": int, "free_between_live_blocks_bytes": int,
                                         "largest_free_block_bytes": int, "external_fragmentation": float,
                                         "suggested_alloc_conf": str | null} | absent,
                 "internal_errors": {"count": int, "first": [str, ...]} | absent}
                 # MemoryCheck.summary(); docs/sanitizer-memory.md defines each field.
                 # Memory over time is the top-level timeline's "memory" and "segments"
                 # rows, fed by the check's watcher. (Reports written while issue 13 was
                 # under way also hold "memory.timeline": {"points", "new_segments"}, a
                 # second copy of those series; nothing reads it.)
      # when the race check ran (script / library runs):
      "race": {"active": bool, "activation_reason": str | null,
               "interception": "native tap" | "dispatch mode" | null,
               "native_tap_unavailable": str | absent,   # why the fallback ran
               "native_tap": {"ops_seen": int, "ops_recorded": int, "accesses_local": int,
                              "accesses_forwarded": int, ...} | absent,
               "host_syncs_before_activation": int | absent,   # docs/races.md, "order, never timing"
               "internal_errors": {"count": int, "first": [str, ...]} | absent}
               # RaceCheck.summary(); docs/races.md explains the tap
      # script / library runs: the time series behind the HTML report and the trace,
      # memory over time included (the memory check's watcher feeds it, steps or no steps)
      "timeline": {"version": 1, "clock": {...}, "steps": [...], "syncs": [...], "memory": [...],
                   "segments": [...], "snapshots": [...], "ooms": [...], "races": [...],
                   "launches": [...], "overhead_s": {...}, "dropped": {...}, ...}
                   # Timeline.to_json(); sanitizer/timeline.py documents each row
      # under torchrun (sanitizer/ranks.py): a rank's own report adds
      "rank": int, "world_size": int, "local_rank": int, "run_id": str, "started_at": float,
      # and the merged report (at --report-json PATH) adds, next to rank 0's run-wide fields,
      "world_size": int, "run_id": str,
      "ranks": [{"rank": int, "local_rank": int, "device": {...} | null, "steps": {...},
                 "findings": int, "by_kind": {"race": int, ...}, "failing": int,
                 "report": "PATH.rank<r>.json", "memory": {...} | absent, "race": {...} | absent}, ...]
      # and each of its findings carries "rank": int
    }

A Finding (``Finding.to_json()``)::

    {"kind": "sync" | "fragmentation" | "oom" | "alloc-churn" | "alloc-retry"
             | "low-utilization" | "near-capacity" | "race",
     "severity": "error" | "warning" | "info",
     "message": str,                   # one sentence
     "file": str | null, "line": int | null, "function": str | null,  # innermost user frame
     "stack": [{"file": str, "line": int, "function": str}, ...],     # user frames, innermost first
     "count": int,                     # occurrences at this site (measured steps only)
     "rule": "TL101" | ... | null,     # the static rule for the same line, when one exists
     "fix_hint": str,
     "details": {...},                 # kind-specific, below
     "test": str | null}               # pytest node id

``details`` of a ``sync`` finding::

    {"sync_kind": "item" | "tolist" | "cpu" | "numpy" | "bool" | "format" | "nonzero"
                  | "mask-index" | "unique" | "synchronize" | "event-sync" | "empty-cache"
                  | "pageable-copy" | "copy" | "other",
     "api": "Tensor.item" | ... | null,  # the wrapped entry point, null when seen via the warning
     "per_step": float,                  # count / measured steps (the whole run is one step without steps)
     "steps": [int, ...],                # measured steps (0-based) it occurred in, first 100
     "steps_truncated": bool,
     "every_step": bool | null,          # null when the program had no steps
     "warmup_count": int,                # occurrences during warm-up, not in count
     "stall_ms": float | null,           # host time lost in the timed calls; null: never timed
     "timed_calls": int,
     "via": "torch/_tensor_str.py:123 _str" | null,   # the torch frame below the user frame
     "in_test": bool,                    # attributed to a test file
     "user_frame": bool,                 # false: no user frame, attributed to the library frame
     "runs": int,                        # executions of the line that synced (one call = one run)
     "repeated": bool,                   # false: a one-off sync, severity info and rule null
     "tensor": {"shape": [...], "dtype": str, "device": str}}   # when a wrapper saw it

The other kinds' ``details`` are documented by the memory and race checks.
"""
from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterable, List, Optional

from .findings import KINDS, SEVERITIES, Finding, is_one_off

REPORT_VERSION = 1
_AUTO = object()

_FRAME_SCHEMA = {
    "type": "object",
    "required": ["file", "line", "function"],
    "properties": {"file": {"type": "string"}, "line": {"type": "integer"}, "function": {"type": "string"}},
}
FINDING_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "required": ["kind", "severity", "message", "file", "line", "function", "stack", "count",
                 "rule", "fix_hint", "details", "test"],
    "properties": {
        "kind": {"enum": list(KINDS)},
        "severity": {"enum": list(SEVERITIES)},
        "message": {"type": "string"},
        "file": {"type": ["string", "null"]},
        "line": {"type": ["integer", "null"]},
        "function": {"type": ["string", "null"]},
        "stack": {"type": "array", "items": _FRAME_SCHEMA},
        "count": {"type": "integer", "minimum": 0},
        "rule": {"type": ["string", "null"], "pattern": "^TL[0-9]{3}$"},
        "fix_hint": {"type": "string"},
        "details": {"type": "object"},
        "test": {"type": ["string", "null"]},
    },
}
REPORT_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "required": ["version", "tool", "torch", "device", "checks", "fail_on", "findings"],
    "properties": {
        "version": {"const": REPORT_VERSION},
        "tool": {"const": "torchlint-sanitizer"},
        "torch": {"type": ["string", "null"]},
        "device": {"type": ["object", "null"]},
        "checks": {"type": "array", "items": {"enum": ["sync", "memory", "race"]}},
        "fail_on": {"type": "array", "items": {"type": "string"}},
        "findings": {"type": "array", "items": FINDING_SCHEMA},
        "steps": {
            "type": "object",
            "required": ["completed", "warmup", "measured", "source"],
            "properties": {"source": {"enum": ["optimizer", "explicit", "none"]}},
        },
        "tests": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["outcome", "findings", "failed_by_sanitizer"],
            },
        },
    },
    "oneOf": [{"required": ["steps"]}, {"required": ["tests"]}],
}


def torch_version() -> Optional[str]:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", None) if torch is not None else None


def device_info() -> Optional[Dict[str, Any]]:
    """The current CUDA device, without importing torch or initialising CUDA needlessly."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return {
            "name": props.name,
            "index": index,
            "capability": f"{props.major}.{props.minor}",
            "total_memory_bytes": int(props.total_memory),
        }
    except Exception:
        return None


def build_report(
    findings: Iterable[Finding],
    checks: Iterable[str] = (),
    steps: Optional[Dict[str, Any]] = None,
    tests: Optional[Dict[str, Any]] = None,
    fail_on: Iterable[str] = (),
    device: Any = _AUTO,
    torch: Any = _AUTO,
    summaries: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The run report. Pass exactly one of ``steps`` (script, library) or ``tests`` (pytest).

    ``summaries`` maps a check name to its plain-data summary; each becomes a
    top-level key (``"memory"``)."""
    if (steps is None) == (tests is None):
        raise ValueError("a report has either steps or tests")
    report: Dict[str, Any] = {
        "version": REPORT_VERSION,
        "tool": "torchlint-sanitizer",
        "torch": torch_version() if torch is _AUTO else torch,
        "device": device_info() if device is _AUTO else device,
        "checks": sorted(checks),
        "fail_on": sorted(fail_on),
        "findings": [f.to_json() for f in findings],
    }
    if steps is not None:
        report["steps"] = dict(steps)
    else:
        report["tests"] = dict(tests)
    for name, summary in (summaries or {}).items():
        report[name] = summary
    return report


def write_report(path: str, report: Dict[str, Any]) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2, sort_keys=False)
        handle.write("\n")
    os.replace(tmp, path)


# --- the terminal summary ----------------------------------------------------------

_SEVERITY_RANK = {"error": 0, "warning": 1, "info": 2}


def display_path(path: Optional[str], root: Optional[str] = None) -> str:
    if path is None:
        return "<process>"
    base = os.path.abspath(root or os.getcwd())
    full = os.path.abspath(path)
    if full == base or full.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(full, base)
    return path


def _stall_ms(finding: Finding) -> float:
    value = finding.details.get("stall_ms") if isinstance(finding.details, dict) else None
    return float(value) if isinstance(value, (int, float)) else 0.0


def rank(findings: Iterable[Finding]) -> List[Finding]:
    """Errors first, then the most time lost, then the most frequent."""
    return sorted(
        findings,
        key=lambda f: (_SEVERITY_RANK.get(f.severity, 3), -_stall_ms(f), -f.count, f.file or "", f.line or 0),
    )


def _rate(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.2g}"


def finding_line(finding: Finding, root: Optional[str] = None) -> str:
    """``path:line: kind xN/step, M ms stalled — hint`` (sync); ``path:line: kind xN — message — hint`` (others)."""
    where = display_path(finding.file, root)
    if finding.line is not None:
        where = f"{where}:{finding.line}"
    details = finding.details if isinstance(finding.details, dict) else {}
    rule = f" [{finding.rule}]" if finding.rule else ""
    if finding.kind == "sync":
        kind = f"sync {details.get('sync_kind', 'other')}"
        if details.get("every_step") is None:
            rate = f"x{finding.count}"
        else:
            rate = f"x{_rate(float(details.get('per_step', finding.count)))}/step"
        stall = details.get("stall_ms")
        stalled = f"{stall:.1f} ms stalled" if isinstance(stall, (int, float)) else "stall not timed"
        return f"{where}: {kind} {rate}, {stalled} — {finding.fix_hint}{rule}"
    parts = [f"{where}: {finding.kind} x{finding.count}", finding.message]
    if finding.fix_hint:
        parts.append(finding.fix_hint)
    return " — ".join(parts) + rule


def render_summary(
    findings: Iterable[Finding],
    steps: Optional[Dict[str, Any]] = None,
    limit: int = 10,
    root: Optional[str] = None,
    title: str = "torchlint sanitizer",
) -> str:
    """A few lines a person reads in ten seconds: a headline, then the top sites.

    One-off syncs (``findings.is_one_off``) are counted, not listed: they stay in the JSON report."""
    findings = list(findings)
    ranked = rank(f for f in findings if not is_one_off(f))
    one_off = len(findings) - len(ranked)
    left_out = f" ({one_off} one-off sync{'s' if one_off != 1 else ''} in the JSON report)" if one_off else ""
    if steps is not None:
        if steps.get("completed"):
            scope = f"{steps['measured']} measured steps ({steps['warmup']} warm-up)"
        else:
            scope = "the whole run (no training steps seen)"
    else:
        scope = None
    if not ranked:
        head = f"{title}: no findings"
        return head + (f" over {scope}" if scope else "") + left_out
    by_kind: Dict[str, int] = {}
    for finding in ranked:
        by_kind[finding.kind] = by_kind.get(finding.kind, 0) + 1
    kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])))
    total_stall = sum(_stall_ms(f) for f in ranked)
    head = f"{title}: {len(ranked)} finding{'s' if len(ranked) != 1 else ''} ({kinds})"
    if total_stall:
        head += f", {total_stall:.1f} ms stalled"
    if scope:
        head += f" over {scope}"
    lines = [head + left_out]
    for finding in ranked[:limit]:
        lines.append("  " + finding_line(finding, root))
    if len(ranked) > limit:
        lines.append(f"  ... and {len(ranked) - limit} more (see the JSON report)")
    return "\n".join(lines)
