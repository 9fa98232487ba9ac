"""The sync check's findings: pure functions of what the check recorded.

``SyncCheck`` records, per user site, when each sync happened (the step),
how long the host waited, how often the line ran and whether autograd was on;
``sync_findings`` turns those frozen records into findings. Nothing here
touches torch or the live session, so every verdict can be tested from
records alone.

Cadence
-------
A *run* of a site is one execution of the user's line that synced (every
sync inside one call the line makes is one run; ``check.py`` says how runs
are counted). How often a site runs decides whether it costs the program
something worth changing. Its *cadence* is measured from the steps its runs
fell in (a step is the stretch between two optimizer steps), and stated in
the finding (``details["cadence"]``):

- ``per-step``: in most measured steps (every one, or all but a few, with no
  regular gap): a stall paid on every training step. A warning with its rule.
- ``per-eval-batch``: with autograd off (``torch.no_grad()``,
  ``inference_mode``), at least ``min_count`` runs, several per step
  interval: a read on every batch of an evaluation or inference loop. A
  warning with its rule.
- ``periodic``: in steps a regular gap apart (every N steps, N >= 2):
  logging that already runs every N steps. ``info``, with its period and the
  host wait per read; no rule code (the static rule does not flag a read
  under a periodic guard).
- ``per-iteration``: at least ``min_count`` runs (``--gpu-sanitize-min-count``,
  default ``DEFAULT_MIN_COUNT``; warm-up runs count) that are none of the
  above: a loop without optimizer steps, such as a script's top-level loop.
  A warning with its rule.
- ``few`` / ``once``: any other site (a final read, a checkpoint save, an
  ``assert`` after the loop). ``info`` with no rule code.
- ``compile``: made by torch.compile's own machinery (Dynamo, Inductor,
  Triton's autotuner) under the user's line: the compilation phase's cost.
  ``info`` with no rule code.

``details["repeated"]`` is true for the three warning cadences;
``findings.is_one_off`` picks the ``few``, ``once`` and ``compile`` sites and
``findings.is_periodic`` the periodic ones, which summaries list apart and
``--gpu-sanitize-fail-on`` never fails on. A site in a test file is ``info``
whatever its cadence (the test's own read).

No stall
--------
Some repeated sites cost nothing worth changing, whatever their cadence;
their finding is ``info`` with no rule code, keeps its cadence and names why
in ``details["no_stall"]`` (``findings.is_no_stall``), so summaries leave it
out and ``--gpu-sanitize-fail-on`` never fails on it:

- ``host-needs-value``: with autograd off, the line reads back a value it
  has just chosen on the device (``torch.multinomial(p, 1).item()``, an
  argmax'd token): a sampling or decoding loop needs it on the host to pick
  the next step.
- ``timing``: an explicit ``synchronize()`` followed within a few lines by
  a clock read (``time.time()``, ``perf_counter()``, ``elapsed_time``): the
  wait that makes a per-step time accurate, there on purpose.
- ``after-sync``: a read that came after an explicit synchronize in the same
  step and found the GPU idle (nearly) every time: the synchronize already
  waited, so this read adds no wait; the synchronize's own finding carries
  the cost.
- ``one-eval-pass``: a read on every batch of the run's only evaluation
  pass, made after training: paid once, not on every step.
- ``backward-symptom``: a sync inside ``backward()`` is the backward of an
  op with a data-dependent shape in forward (boolean-mask indexing,
  ``nonzero``, ``unique``); when the run recorded such a site with autograd
  on, the finding names it (``details["caused_by"]``) and the cause's
  finding names the backward site (``details["backward_site"]``). Without a
  recorded cause, the backward site stays a warning (no rule code) whose fix
  points at forward.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from statistics import median
from typing import Any, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .. import frames as _frames
from ..findings import SYNC, Finding, Frame
from ..session import StepCount
from .kinds import EXPLICIT_SYNC_KINDS, KINDS, fix_for, rule_for

# Runs of a site (executions of its line) that make a loop of it.
DEFAULT_MIN_COUNT = 5

# The share of queried reads that must find the GPU idle for a site to be "no stall".
IDLE_SHARE = 0.9
# Why a repeated site costs nothing (the module docstring defines each).
IDLE_ON_ARRIVAL = "idle-on-arrival"
HOST_NEEDS_VALUE = "host-needs-value"
TIMING = "timing"
AFTER_SYNC = "after-sync"
ONE_EVAL_PASS = "one-eval-pass"
BACKWARD_SYMPTOM = "backward-symptom"
# Sync kinds whose backward syncs too (a data-dependent shape), the causes of a "backward" site.
_DATA_DEPENDENT_KINDS = ("mask-index", "nonzero", "unique")
# Copies whose fix removes the transfer itself (TL204), worth it even when the GPU was idle.
_MOVE_ONCE_KINDS = ("host-slice", "host-built")
# Read-backs a decoding loop makes of the value it chose.
_READ_KINDS = ("item", "tolist", "cpu", "numpy")

PER_STEP = "per-step"
PER_EVAL_BATCH = "per-eval-batch"
PER_ITERATION = "per-iteration"
PERIODIC = "periodic"
FEW = "few"
ONCE = "once"
COMPILE = "compile"
# The cadences that cost the program on every step or batch: warnings with the rule's code.
REPEATED = (PER_STEP, PER_EVAL_BATCH, PER_ITERATION)


@dataclass(frozen=True)
class SiteRecord:
    """What the check saw at one user site, frozen when the findings are read."""

    kind: str
    api: Optional[str]  # the wrapped entry point, None when seen through the warning
    stack: Tuple[Tuple[str, int, str], ...]  # user frames, innermost first
    library: Optional[Tuple[str, int, str]]  # the torch frame below the user frame
    steps: Mapping[int, int]  # step -> syncs in it
    stall: Mapping[int, float]  # step -> seconds the host waited in timed calls
    timed: Mapping[int, int]  # step -> timed calls
    runs: int  # executions of the line that synced, warm-up included
    in_test: bool
    tensor: Optional[Dict[str, Any]]
    run_steps: Optional[Mapping[int, int]] = None  # step -> runs that began in it (None: taken as ``steps``)
    no_grad_runs: int = 0  # runs made with autograd off
    compiler: bool = False  # made by torch.compile's machinery
    pinned: FrozenSet[bool] = frozenset()  # a copy's source as seen: True pinned, False pageable
    host_choice: bool = False  # the line reads back a value it chose on the device (kinds.chooses_on_host)
    queried: Optional[Mapping[int, int]] = None  # step -> reads preceded by a stream query
    idle_arrivals: Optional[Mapping[int, int]] = None  # step -> of those, reads that found the GPU idle
    after_sync: Optional[Mapping[int, int]] = None  # step -> runs after an explicit synchronize in that step
    clock_line: Optional[int] = None  # an explicit synchronize: the line after it that reads a clock


@dataclass(frozen=True)
class Cadence:
    """How often a site ran, as a finding states it."""

    kind: str  # one of PER_STEP, PER_EVAL_BATCH, PERIODIC, PER_ITERATION, FEW, ONCE, COMPILE
    occurrences: int  # measured steps with a run (1 for a program without steps)
    period: Optional[int] = None  # steps between runs, for PERIODIC (the mean gap when the gaps differ)
    regular: bool = True  # PERIODIC: most gaps are the same
    gap_range: Optional[Tuple[int, int]] = None  # PERIODIC and irregular: the smallest and largest gap
    every_step: Optional[bool] = None  # in every measured step; None without steps

    @property
    def repeated(self) -> bool:
        return self.kind in REPEATED


def cadence_of(site: SiteRecord, steps: StepCount, min_count: int) -> Cadence:
    """The site's cadence over the measured steps (the module docstring defines each)."""
    run_steps = site.run_steps if site.run_steps is not None else site.steps
    measured = sorted(step for step, runs in run_steps.items() if runs and steps.is_measured(step))
    measured_runs = sum(run_steps[step] for step in measured)
    occurrences = len(measured)
    stepped = steps.completed > 0
    required = set(range(steps.warmup, steps.completed))
    every_step = (bool(required) and required.issubset(measured)) if stepped else None
    if site.compiler:
        return Cadence(COMPILE, occurrences, every_step=every_step)
    gaps = [b - a for a, b in zip(measured, measured[1:])]
    if stepped and gaps and median(gaps) <= 1 and occurrences >= max(2, steps.measured / 2):
        return Cadence(PER_STEP, occurrences, every_step=every_step)
    if site.no_grad_runs >= min_count and measured_runs >= 2 * max(1, occurrences):
        return Cadence(PER_EVAL_BATCH, occurrences, every_step=every_step)
    if stepped and gaps and median(gaps) >= 2:
        period, times = Counter(gaps).most_common(1)[0]
        if times * 2 > len(gaps):
            return Cadence(PERIODIC, occurrences, period=period, every_step=every_step)
        # Gaps that differ (a guard on a per-epoch counter fires at its start and again near its end):
        # the mean gap, and the range, rather than one gap picked as "the" period.
        mean_gap = max(2, round((measured[-1] - measured[0]) / len(gaps)))
        return Cadence(
            PERIODIC,
            occurrences,
            period=mean_gap,
            regular=False,
            gap_range=(min(gaps), max(gaps)),
            every_step=every_step,
        )
    if site.runs >= min_count:
        return Cadence(PER_ITERATION, occurrences, every_step=every_step)
    return Cadence(ONCE if site.runs <= 1 else FEW, occurrences, every_step=every_step)


def sync_findings(
    sites: Sequence[SiteRecord], steps: StepCount, min_count: int, test_id: Optional[str] = None
) -> List[Finding]:
    """One finding per site that synced in a measured step, the costliest first."""
    explicit = _explicit_sync_places(sites, steps, min_count)
    pairs = [(site, _site_finding(site, steps, min_count, test_id, explicit)) for site in sites]
    results = _link_backward_symptoms([(site, finding) for site, finding in pairs if finding is not None])
    results.sort(key=lambda f: (-(f.details["stall_ms"] or 0.0), -f.count, f.file or "", f.line or 0))
    return results


def _explicit_sync_places(sites: Sequence[SiteRecord], steps: StepCount, min_count: int) -> List[Tuple[str, int, str]]:
    """(file, line, function) of the explicit synchronizes that repeat: a read after one may wait for nothing."""
    return [
        site.stack[0]
        for site in sites
        if site.kind in EXPLICIT_SYNC_KINDS and site.stack and cadence_of(site, steps, min_count).repeated
    ]


def _link_backward_symptoms(pairs: List[Tuple[SiteRecord, Finding]]) -> List[Finding]:
    """A sync inside backward() points at the forward op whose backward made it, and back."""
    causes = [
        (site, finding)
        for site, finding in pairs
        if site.kind in _DATA_DEPENDENT_KINDS and site.runs > site.no_grad_runs
    ]
    symptoms = [finding for site, finding in pairs if site.kind == "backward"]
    if not causes or not symptoms:
        return [finding for _, finding in pairs]
    cause_places = [_place(finding) for _, finding in causes]
    cause_labels = sorted({KINDS[site.kind][1] for site, _ in causes})
    linked: Dict[int, Finding] = {}
    for site, finding in pairs:
        if site.kind == "backward":
            details = dict(finding.details, caused_by=cause_places, no_stall=BACKWARD_SYMPTOM)
            message = (
                f"symptom: a sync inside backward() ({finding.count}x) is the backward of the "
                f"{' / '.join(cause_labels)} at {', '.join(cause_places)} in forward (a data-dependent "
                f"shape); change it there, not this line"
            )
            linked[id(finding)] = replace(
                finding,
                severity="info",
                rule=None,
                message=message,
                details=details,
                fix_hint=f"fix the cause at {', '.join(cause_places)}: {KINDS[causes[0][0].kind][2]}",
            )
        elif any(finding is cause for _, cause in causes):
            backward = ", ".join(_place(symptom) for symptom in symptoms)
            details = dict(finding.details, backward_site=backward)
            linked[id(finding)] = replace(
                finding, details=details, message=f"{finding.message}; its backward syncs too, at {backward}"
            )
    return [linked.get(id(finding), finding) for _, finding in pairs]


def _place(finding: Finding) -> str:
    return f"{_frames.short_path(finding.file or '<unknown>')}:{finding.line}"


def _idle_on_arrival(site: SiteRecord, steps: StepCount, cadence: Cadence) -> Optional[Tuple[int, int]]:
    """(idle, asked) when a stream query just before the read found the GPU
    already idle for (nearly) every measured read (``IDLE_SHARE``), else None.

    Said beside the finding, not instead of it: the GPU may be idle because an
    earlier read drained the queue (the read is then free), or only because the
    steps of this run are too small to keep it busy (launch-bound: the read
    waits as soon as a step has real work). The run cannot tell the two apart,
    so the site stays a finding with its rule, and its measured stall ranks it.
    Not for a host tensor moved every step (``host-slice``, ``host-built``):
    moving it once saves the transfer either way."""
    if not cadence.repeated or site.kind in _MOVE_ONCE_KINDS:
        return None
    queried = sum(n for step, n in (site.queried or {}).items() if steps.is_measured(step))
    idle = sum(n for step, n in (site.idle_arrivals or {}).items() if steps.is_measured(step))
    return (idle, queried) if queried and idle >= IDLE_SHARE * queried else None


def _no_stall(site: SiteRecord, steps: StepCount, cadence: Cadence) -> Optional[Tuple[str, str]]:
    """Why a repeated site costs nothing worth a change, with the sentence that says so; None when it costs."""
    if not cadence.repeated:
        return None
    integer = site.tensor is None or "int" in str(site.tensor.get("dtype", "int"))
    if site.host_choice and site.kind in _READ_KINDS and integer and site.runs and site.no_grad_runs == site.runs:
        return HOST_NEEDS_VALUE, (
            "the host needs the value: a sampling or decoding loop reads the token it "
            "chose to pick the next step (autograd off), not a stall to remove"
        )
    return None


def _timing_sync(site: SiteRecord, cadence: Cadence) -> Optional[Tuple[str, str]]:
    if not cadence.repeated or site.clock_line is None:
        return None
    return TIMING, (
        f"deliberate: an explicit synchronize that ends a timed region (the clock is read at line "
        f"{site.clock_line}), the wait that makes the per-step time accurate; drop both when the timing "
        "is not needed"
    )


def _after_sync(
    site: SiteRecord,
    steps: StepCount,
    cadence: Cadence,
    idle: Optional[Tuple[int, int]],
    explicit: Sequence[Tuple[str, int, str]],
    measured_runs: int,
) -> Optional[Tuple[str, str]]:
    """A read that follows an explicit synchronize in its step and finds the GPU idle: free.

    "Follows" in the code too: the synchronize is earlier in the same
    function. A read at the top of the next iteration also comes after it in
    the step's time, but the work the iteration enqueued since may be what it
    waits for (the GPU was idle only because this run's steps are small).
    """
    if not cadence.repeated or idle is None or not site.stack:
        return None
    file, line, function = site.stack[0]
    before = [f"{_frames.short_path(f)}:{n}" for f, n, name in explicit if (f, name) == (file, function) and n < line]
    if not before:
        return None
    after = sum(n for step, n in (site.after_sync or {}).items() if steps.is_measured(step))
    if not measured_runs or after < IDLE_SHARE * measured_runs:
        return None
    return AFTER_SYNC, (
        f"no wait of its own: it comes after the explicit synchronize at {', '.join(before)} in the same "
        "step and found the GPU idle; that synchronize is the step's wait"
    )


def _one_eval_pass(
    site: SiteRecord, steps: StepCount, cadence: Cadence, stall_ms: Optional[float]
) -> Optional[Tuple[str, str]]:
    """Every batch of the run's only evaluation pass, after training: a one-off cost."""
    if cadence.kind != PER_EVAL_BATCH or steps.completed == 0 or cadence.occurrences != 1:
        return None
    cost = f", {stall_ms:.1f} ms host wait in all" if stall_ms is not None else ""
    return ONE_EVAL_PASS, (
        f"once per run: every batch of the run's only evaluation pass{cost}; paid once, not per training step"
    )


def _site_finding(
    site: SiteRecord,
    steps: StepCount,
    min_count: int,
    test_id: Optional[str],
    explicit: Sequence[Tuple[str, int, str]] = (),
) -> Optional[Finding]:
    measured = {step: n for step, n in site.steps.items() if steps.is_measured(step)}
    count = sum(measured.values())
    if count == 0:
        return None
    cadence = cadence_of(site, steps, min_count)
    warmup_count = sum(site.steps.values()) - count
    run_steps = site.run_steps if site.run_steps is not None else site.steps
    measured_runs = sum(n for step, n in run_steps.items() if steps.is_measured(step))
    stall_s = sum(v for step, v in site.stall.items() if steps.is_measured(step))
    timed = sum(v for step, v in site.timed.items() if steps.is_measured(step))
    steps_seen = sorted(measured)
    _, label, _ = KINDS[site.kind]
    rule, hint = rule_for(site.kind, site.pinned), fix_for(site.kind, site.pinned)
    per_step = count / steps.measured
    stall_ms = round(stall_s * 1000.0, 3) if timed else None
    file, line, function = site.stack[0]
    details: Dict[str, Any] = {
        "sync_kind": site.kind,
        "api": site.api,
        "cadence": cadence.kind,
        "period_steps": cadence.period,
        "period_regular": cadence.regular if cadence.kind == PERIODIC else None,
        "per_step": round(per_step, 3),
        "steps": steps_seen[:100],
        "steps_truncated": len(steps_seen) > 100,
        "every_step": cadence.every_step,
        "warmup_count": warmup_count,
        "stall_ms": stall_ms,
        "timed_calls": timed,
        "per_read_ms": round(stall_ms / timed, 3) if stall_ms is not None else None,
        "via": f"{_frames.short_path(site.library[0])}:{site.library[1]} {site.library[2]}" if site.library else None,
        "in_test": site.in_test,
        "user_frame": bool(site.stack) and site.stack[0] is not None and _frames.is_user_file(file),
        "runs": site.runs,
        "eval_runs": site.no_grad_runs,
        "measured_runs": measured_runs,
        "warmup_runs": site.runs - measured_runs,
        "repeated": cadence.repeated,
    }
    if site.kind in ("copy", "pageable-copy") and site.pinned:
        details["source_pinned"] = next(iter(site.pinned)) if len(site.pinned) == 1 else None
    if site.tensor is not None:
        details["tensor"] = site.tensor
    severity = "warning" if cadence.repeated and not site.in_test else "info"
    if not cadence.repeated:
        rule = None
    message = _message(cadence, label, count, site.runs, steps, details)
    idle = _idle_on_arrival(site, steps, cadence)
    if idle is not None:
        details[IDLE_ON_ARRIVAL] = {"idle": idle[0], "asked": idle[1]}
        message += (
            f"; the GPU was already idle when it arrived ({idle[0]} of {idle[1]} reads asked): "
            f"no wait measured in this run, but a step with more GPU work would wait here"
        )
    no_stall = (
        _no_stall(site, steps, cadence)
        or _timing_sync(site, cadence)
        or _after_sync(site, steps, cadence, idle, explicit, measured_runs)
        or _one_eval_pass(site, steps, cadence, stall_ms)
    )
    if no_stall is not None:
        reason, sentence = no_stall
        details["no_stall"] = reason
        severity, rule = "info", None
        message = f"{sentence} ({label}, {cadence.kind}, {count}x)"
    return Finding(
        kind=SYNC,
        severity=severity,
        message=message,
        file=file,
        line=line,
        function=function,
        stack=[Frame(path, number, name) for path, number, name in site.stack],
        count=count,
        rule=rule,
        fix_hint=hint,
        details=details,
        test=test_id,
    )


def _message(cadence: Cadence, label: str, count: int, runs: int, steps: StepCount, details: Dict[str, Any]) -> str:
    """One sentence: what blocked the host, how often, and so what it costs."""
    stepped = steps.completed > 0
    if cadence.kind == PER_STEP:
        where = (
            "every measured step" if cadence.every_step else f"{cadence.occurrences} of {steps.measured} measured steps"
        )
        return f"{label} blocks the host until the GPU catches up, per step ({count}x, {where})"
    if cadence.kind == PER_EVAL_BATCH:
        # Reads and passes over the same measured steps as the finding's count (warm-up told apart).
        passes = f" in {cadence.occurrences} evaluation pass(es)" if stepped else ""
        warmup = details["warmup_runs"]
        earlier = f"; {warmup} more in warm-up" if warmup and stepped else ""
        return (
            f"{label} blocks the host on every evaluation or inference batch ({details['measured_runs']} reads "
            f"with autograd off{passes}{earlier})"
        )
    if cadence.kind == PER_ITERATION:
        scope = "over the whole run, no training steps seen" if not stepped else "outside the training steps"
        return f"{label} blocks the host on every iteration of a loop ({runs}x, {scope})"
    if cadence.kind == PERIODIC:
        per_read = details["per_read_ms"]
        cost = f", {per_read:.3f} ms host wait per read" if per_read is not None else ""
        if not cadence.regular and cadence.gap_range is not None:
            low, high = cadence.gap_range
            every = f"about every {cadence.period} steps (gaps of {low} to {high} steps)"
        else:
            every = f"every {cadence.period} steps"
        return f"periodic: {label} {every} ({cadence.occurrences} times{cost}); already periodic, not a per-step stall"
    if cadence.kind == COMPILE:
        return (
            f"during compilation: {label} ran {runs}x inside torch.compile's own work "
            "(counted in the compilation phase)"
        )
    times = "once" if cadence.kind == ONCE else f"{runs}x"
    return f"one-off sync: {label} ran {times} (not per step, per batch or per loop iteration)"
