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
      "inactive": str | absent,          # why nothing was checked ("no CUDA device"); then
                                         # findings is empty because nothing ran, not because all is well
      "phases": {"duration_s": float,    # script / library runs: where the time went (phases.py)
                 "phases": [{"phase": "start-up" | "compilation" | "steady-state training" | "evaluation"
                                      | "checkpointing" | "other", "seconds": float, "share": float,
                             "utilization_mean_percent": float | null}, ...],
                 "steady_state": {"steps": int, "seconds": float, "utilization_samples": int}},
      # exactly one of:
      "steps": {"completed": int, "warmup": int, "measured": int,
                "source": "optimizer" | "explicit" | "none"},   # script / library
      "tests": {"<nodeid>": {"outcome": "passed" | "failed" | "skipped",
                             "findings": int, "failed_by_sanitizer": bool,
                             "one_off": int,              # of findings, the one-off syncs
                             "memory": {...} | absent}},  # pytest; memory: the test's summary
      "sites": [{"kind": str, "file": str | null, "line": int | null, "function": str | null,
                 "rule": str | null, "sync_kind": str | null, "severity": str, "one_off": bool,
                 "periodic": bool,                # added: a sync site that runs every N steps
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
                 # memory/verdicts.py memory_summary(); docs/sanitizer-memory.md defines each field.
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
                  | "pageable-copy" | "copy" | "host-slice" | "host-built" | "backward" | "other",
     "api": "Tensor.item" | ... | null,  # the wrapped entry point, null when seen via the warning
     "cadence": "per-step" | "per-eval-batch" | "per-iteration" | "periodic" | "few" | "once" | "compile",
                                         # added (issue 32): sync/verdicts.py defines each
     "period_steps": int | null,         # for "periodic": the steps between reads
     "per_read_ms": float | null,        # host wait per timed read
     "eval_runs": int,                   # runs made with autograd off
     "source_pinned": bool | absent,     # a host-to-device copy's source: pinned (TL201) or not (TL202)
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
     "repeated": bool,                   # true for the per-step, per-eval-batch and per-iteration
                                         # cadences; false: info, rule null (periodic ones say so)
     "no_stall": "host-needs-value" | "backward-symptom" | absent,
                                         # a repeated site that costs nothing: info, rule null
                                         # (sync/verdicts.py says why)
     "idle-on-arrival": {"idle": int, "asked": int} | absent,  # the stream was idle when nearly every
                                         # asked read arrived: said beside a finding that stays one
     "caused_by": ["file:line", ...] | absent,   # a backward-symptom: the forward op(s) to change
     "backward_site": "file:line" | absent,      # a data-dependent-shape op whose backward syncs there
     "tensor": {"shape": [...], "dtype": str, "device": str}}   # when a wrapper saw it

The other kinds' ``details`` are documented by the memory and race checks.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Dict, Iterable, List, Optional

from . import ranking
from .findings import KINDS, SEVERITIES, Finding, is_one_off, is_per_step_cost, is_periodic

REPORT_VERSION = 1
_AUTO = object()

_FRAME_SCHEMA = {
    "type": "object",
    "required": ["file", "line", "function"],
    "properties": {"file": {"type": "string"}, "line": {"type": "integer"}, "function": {"type": "string"}},
}
FINDING_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "required": [
        "kind",
        "severity",
        "message",
        "file",
        "line",
        "function",
        "stack",
        "count",
        "rule",
        "fix_hint",
        "details",
        "test",
    ],
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
    inactive: Optional[str] = None,
) -> Dict[str, Any]:
    """The run report. Pass exactly one of ``steps`` (script, library) or ``tests`` (pytest).

    ``summaries`` maps a check name to its plain-data summary; each becomes a
    top-level key (``"memory"``). ``inactive`` says why nothing was checked."""
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
    if inactive is not None:
        report["inactive"] = inactive
    if steps is not None:
        report["steps"] = dict(steps)
    elif tests is not None:  # exactly one of the two (checked above)
        report["tests"] = dict(tests)
    for name, summary in (summaries or {}).items():
        report[name] = summary
    return report


class ReportWriteError(OSError):
    """A report file that cannot be written; the message names the path and the reason, in one line."""


def unwritable(path: str) -> Optional[str]:
    """Why a report could not be written at ``path`` (checked before a run), or None.

    The folders that do not exist yet are made when the report is written;
    the nearest existing one must be a writable folder.
    """
    full = os.path.abspath(path)
    if os.path.isdir(full):
        return "is a directory"
    folder = os.path.dirname(full)
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if not os.path.isdir(folder):
        return f"{folder} is not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"cannot write in {folder}"
    if os.path.exists(full) and not os.access(full, os.W_OK):
        return "the file is read-only"
    return None


def write_atomically(path: str, text: str) -> None:
    """``text`` at ``path``, whole or not at all: a temporary file renamed over it.

    Raises ``ReportWriteError`` (one line: the path and the reason) and leaves
    no temporary file behind when the write fails.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as error:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise ReportWriteError(f"{path}: cannot write it: {error.strerror or error}") from None


def write_report(path: str, report: Dict[str, Any]) -> None:
    write_atomically(path, json.dumps(report, indent=2, sort_keys=False) + "\n")


# --- the terminal summary ----------------------------------------------------------


def display_path(path: Optional[str], root: Optional[str] = None) -> str:
    if path is None:
        return "<process>"
    base = os.path.abspath(root or os.getcwd())
    full = os.path.abspath(path)
    if full == base or full.startswith(base.rstrip(os.sep) + os.sep):
        return os.path.relpath(full, base)
    return path


def rank(findings: Iterable[Finding]) -> List[Finding]:
    """What to fix first (``ranking.py``): races, OOMs, then measured stalls, bytes, utilization, notes."""
    return ranking.ranked(findings)


def finding_line(finding: Finding, root: Optional[str] = None) -> str:
    """One line a reader acts on: the place, what it is, its cost, the fix.

    ``path:line: sync KIND RATE, STALL — hint [RULE]`` for a sync,
    ``path:line: KIND xN — message — hint [RULE]`` for the others.
    """
    where = display_path(finding.file, root)
    if finding.line is not None:
        where = f"{where}:{finding.line}"
    details = finding.details if isinstance(finding.details, dict) else {}
    rule = f" [{finding.rule}]" if finding.rule else ""
    if finding.kind == "sync":
        cost = ranking.cost_text(finding)
        return f"{where}: sync {details.get('sync_kind', 'other')} {cost} — {finding.fix_hint}{rule}"
    parts = [f"{where}: {finding.kind} x{finding.count}", finding.message]
    if finding.fix_hint:
        parts.append(finding.fix_hint)
    return " — ".join(parts) + rule


def _scope(steps: Optional[Dict[str, Any]]) -> Optional[str]:
    if steps is None:
        return None
    if steps.get("completed"):
        return f"{steps['measured']} measured steps ({steps['warmup']} warm-up)"
    return "the whole run (no training steps seen)"


def render_summary(
    findings: Iterable[Finding],
    steps: Optional[Dict[str, Any]] = None,
    limit: int = 10,
    root: Optional[str] = None,
    title: str = "torchlint sanitizer",
    phases: Optional[Dict[str, Any]] = None,
) -> str:
    """A few lines a person reads in ten seconds: a headline, then what to fix first, one line each.

    Periodic syncs (``findings.is_periodic``) are listed apart, after the
    findings, as what they are: logging that already runs every N steps.
    One-off syncs (``findings.is_one_off``) are counted, not listed: they stay
    in the JSON report. With ``phases`` (``phases.py``) a last line says where
    the run's time went.
    """
    findings = list(findings)
    ranked = rank(f for f in findings if is_per_step_cost(f))
    periodic = rank(f for f in findings if is_periodic(f))
    one_off = sum(1 for f in findings if is_one_off(f))
    left_out = f" ({one_off} one-off sync{'s' if one_off != 1 else ''} in the JSON report)" if one_off else ""
    scope = _scope(steps)
    if not ranked:
        head = f"{title}: no findings" + (f" over {scope}" if scope else "") + left_out
        lines = [head]
    else:
        by_kind: Dict[str, int] = {}
        for finding in ranked:
            by_kind[finding.kind] = by_kind.get(finding.kind, 0) + 1
        kinds = ", ".join(f"{n} {kind}" for kind, n in sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0])))
        total_stall = sum(ranking.stall_ms(f) for f in ranked)
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
    if periodic:
        lines.append(
            f"  periodic, already every N steps (info, not per-step stalls): {len(periodic)} site"
            f"{'s' if len(periodic) != 1 else ''}"
        )
        for finding in periodic[:limit]:
            lines.append("    " + finding_line(finding, root))
    if phases:
        from .phases import describe

        line = describe(phases)
        if line:
            lines.append(f"  {line}")
    return "\n".join(lines)
