"""What to fix first: every finding ranked by what it costs, and its cost in words.

One order for the terminal summary, the HTML report and the pytest summary
(the bridge, ``torchlint.runtime_join``, sorts the linter's joined findings the
same way from the same fields):

1. **races**: the program computes wrong results;
2. **out-of-memory errors**: the program crashed;
3. **per-step costs measured in time**: syncs that stall the host on every
   step, evaluation batch or loop iteration, by the host wait measured
   (untimed ones after, by count);
4. **memory the run paid for**, by bytes: retries, fragmentation and growth
   with a cost, cudaMalloc/cudaFree churn;
5. **utilization** of the steady-state steps;
6. everything else (notes: periodic and one-off syncs, memory near capacity).

Works on findings as objects or as their JSON, so saved reports rank too.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Tuple

from .findings import FRAGMENTATION, LOW_UTILIZATION, OOM, RACE, SYNC

MiB = 1 << 20
# Bytes a memory finding costs, by the first of these details it carries.
_BYTES_KEYS = (
    "requested_bytes",
    "excess_bytes",
    "growth_bytes",
    "total_free_bytes",
    "peak_reserved_bytes",
    "reserved_bytes",
)


def _field(finding: Any, name: str) -> Any:
    return finding.get(name) if isinstance(finding, dict) else getattr(finding, name, None)


def _details(finding: Any) -> Dict[str, Any]:
    details = _field(finding, "details")
    return details if isinstance(details, dict) else {}


def cost_bytes(finding: Any) -> int:
    details = _details(finding)
    for key in _BYTES_KEYS:
        if isinstance(details.get(key), int):
            return details[key]
    return 0


def stall_ms(finding: Any) -> float:
    value = _details(finding).get("stall_ms")
    return float(value) if isinstance(value, (int, float)) else 0.0


def is_note(finding: Any) -> bool:
    """Info that costs nothing worth a fix: periodic and one-off syncs, near-capacity notes."""
    return _field(finding, "severity") == "info"


def tier(finding: Any) -> int:
    kind, severity = _field(finding, "kind"), _field(finding, "severity")
    if severity == "info":
        return 6
    if kind == RACE:
        return 1
    if kind == OOM:
        return 2
    if kind == SYNC:
        return 3
    if kind == LOW_UTILIZATION:
        return 5
    return 4


def rank_key(finding: Any) -> Tuple:
    """Sort key: the tier, then the measured cost within it, then the count, then the place."""
    return (
        tier(finding),
        -stall_ms(finding),
        -cost_bytes(finding),
        -int(_field(finding, "count") or 0),
        _field(finding, "file") or "",
        _field(finding, "line") or 0,
    )


def ranked(findings: Iterable[Any]) -> List[Any]:
    return sorted(findings, key=rank_key)


def format_bytes(n: float) -> str:
    if n >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / MiB:.1f} MiB"


def cost_text(finding: Any) -> str:
    """The cost in a few words: what a reader weighs first."""
    kind, details, count = _field(finding, "kind"), _details(finding), int(_field(finding, "count") or 0)
    if kind == RACE:
        return "wrong results: nothing orders the two accesses"
    if kind == OOM:
        requested = details.get("requested_bytes")
        return "the run crashed" + (f" asking for {format_bytes(requested)}" if isinstance(requested, int) else "")
    if kind == SYNC:
        stall = details.get("stall_ms")
        cadence = details.get("cadence")
        if cadence == "periodic":
            per_read = details.get("per_read_ms")
            return f"every {details.get('period_steps')} steps, " + (
                f"{per_read:.3f} ms per read" if isinstance(per_read, (int, float)) else "not timed"
            )
        if details.get("every_step") is None or cadence in ("per-eval-batch", "per-iteration"):
            rate = f"x{count}"
        else:
            per_step = float(details.get("per_step", count))
            rate = f"x{per_step:.0f}/step" if abs(per_step - round(per_step)) < 1e-9 else f"x{per_step:.2g}/step"
        return f"{rate}, " + (f"{stall:.1f} ms stalled" if isinstance(stall, (int, float)) else "stall not timed")
    if kind == LOW_UTILIZATION:
        mean = details.get("utilization_mean_percent")
        return f"GPU busy {mean:.0f}% of steady-state time" if isinstance(mean, (int, float)) else "GPU starved"
    nbytes = cost_bytes(finding)
    if kind == FRAGMENTATION and isinstance(details.get("excess_bytes"), int):
        return f"{format_bytes(details['excess_bytes'])} reserved that no tensor used at the peak"
    return f"x{count}" + (f", {format_bytes(nbytes)}" if nbytes else "")
