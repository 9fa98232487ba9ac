"""The finding model shared by every sanitizer check (sync, memory, race).

A finding is plain data: it must survive JSON (the run report), pytest-xdist
(``item.user_properties`` are pickled to the controller) and a terminal line.
Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

# Finding kinds. The report schema documents each one; add new kinds here only.
SYNC = "sync"
FRAGMENTATION = "fragmentation"
OOM = "oom"
ALLOC_CHURN = "alloc-churn"
ALLOC_RETRY = "alloc-retry"
LOW_UTILIZATION = "low-utilization"
NEAR_CAPACITY = "near-capacity"
RACE = "race"

KINDS = (SYNC, FRAGMENTATION, OOM, ALLOC_CHURN, ALLOC_RETRY, LOW_UTILIZATION, NEAR_CAPACITY, RACE)

# The checks a user can turn on, and the kinds each one produces.
CHECK_KINDS = {
    "sync": (SYNC,),
    "memory": (FRAGMENTATION, OOM, ALLOC_CHURN, ALLOC_RETRY, LOW_UTILIZATION, NEAR_CAPACITY),
    "race": (RACE,),
}
CHECKS = tuple(CHECK_KINDS)

SEVERITIES = ("error", "warning", "info")

# The cadence of a sync site that runs every N steps (sync/verdicts.py names them all).
PERIODIC = "periodic"


@dataclass(frozen=True)
class Frame:
    """One user frame: where in the user's code something happened."""

    file: str
    line: int
    function: str

    def to_json(self) -> Dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Frame":
        return cls(data["file"], int(data["line"]), data["function"])

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass
class Finding:
    """One problem the sanitizer saw, attributed to the user's own line.

    ``count`` is how often the same problem was seen at the same site; a check
    deduplicates before it hands findings to the session.
    """

    kind: str
    severity: str
    message: str
    file: Optional[str] = None
    line: Optional[int] = None
    function: Optional[str] = None
    stack: List[Frame] = field(default_factory=list)
    count: int = 1
    rule: Optional[str] = None
    fix_hint: str = ""
    details: Dict[str, Any] = field(default_factory=dict)
    test: Optional[str] = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def location(self) -> str:
        if self.file is None:
            return "<process>"
        return f"{self.file}:{self.line}"

    def to_json(self) -> Dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stack"] = [frame.to_json() for frame in self.stack]
        return data

    @classmethod
    def from_json(cls, data: Dict[str, Any]) -> "Finding":
        data = dict(data)
        data["stack"] = [Frame.from_json(f) for f in data.get("stack", [])]
        return cls(**data)


def parse_checks(text: str) -> frozenset:
    """``"sync,memory"`` -> ``{"sync", "memory"}``; ``"all"`` -> every check.

    Raises ValueError naming the valid checks on an unknown name.
    """
    names = {part.strip() for part in text.split(",") if part.strip()}
    if not names or names == {"all"}:
        return frozenset(CHECKS)
    unknown = sorted(names - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; valid checks: {', '.join(CHECKS)}")
    return frozenset(names)


def parse_kinds(text: str) -> frozenset:
    """Finding kinds for ``--gpu-sanitize-fail-on``; ``none`` gives the empty set."""
    names = {part.strip() for part in text.split(",") if part.strip()}
    if names == {"none"}:
        return frozenset()
    if names == {"all"}:
        return frozenset(KINDS)
    unknown = sorted(names - set(KINDS))
    if unknown:
        raise ValueError(f"unknown finding kind(s) {', '.join(unknown)}; valid kinds: {', '.join(KINDS)}, all, none")
    return frozenset(names)


def is_one_off(finding: Finding) -> bool:
    """A sync site that ran only a few times (a final read, a checkpoint save, an assert after a loop),
    or only inside torch.compile's own work.

    It stays in the JSON report as ``info`` with no rule code; summaries and
    ``fail_on`` leave it out (sync/verdicts.py's docstring defines the cadences).
    """
    return (
        finding.kind == SYNC
        and isinstance(finding.details, dict)
        and finding.details.get("repeated") is False
        and finding.details.get("cadence") != PERIODIC
    )


def is_periodic(finding: Finding) -> bool:
    """A sync site that runs every N steps (logging already periodic): ``info``, listed apart, never failed on."""
    return finding.kind == SYNC and isinstance(finding.details, dict) and finding.details.get("cadence") == PERIODIC


def is_no_stall(finding: Finding) -> bool:
    """A repeated sync site that costs nothing (the GPU was idle, the host needs the value, a symptom
    of another site): ``info``, never listed as a cost nor failed on (sync/verdicts.py says why)."""
    return finding.kind == SYNC and isinstance(finding.details, dict) and bool(finding.details.get("no_stall"))


def is_per_step_cost(finding: Finding) -> bool:
    """Neither one-off, periodic nor without a stall: what a summary lists and ``fail_on`` may fail on."""
    return not (is_one_off(finding) or is_periodic(finding) or is_no_stall(finding))
