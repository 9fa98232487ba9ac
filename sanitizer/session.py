"""The one engine behind ``pytest --gpu-sanitize``, ``torchlint-sanitize`` and ``sanitize()``.

A ``SanitizerSession`` owns the checks, the step counter and the allowlist
state; the checks own their hooks.

Checks
------
A check is a class registered in ``CHECK_REGISTRY`` as ``"module:Class"``,
constructed as ``CheckClass(session)``, and it is a ``Check`` (the protocol
below): ``start``/``stop`` install and remove its hooks (``stop`` restores
every global that ``start`` changed), ``on_step`` hears each step boundary,
``on_measurement_start`` and ``on_program_end`` mark the program's own time
and its end, ``findings`` reads what it found (deduplicated, with counts) and
``summary`` its plain data for the report. Each check is one package that
keeps the same shape: hooks that record events, state that holds them, and
findings computed by pure functions of a frozen record of what was observed
(``sync/``, ``memory/``, ``races/``).

What a check may read from its session is ``SessionView``: the step index,
the warm-up, the test id, the timeline. The allowlist is the module's
``sync_allowed()``. Checks start in the order memory, sync, race and stop in
reverse. Check modules are imported lazily, so a missing torch or check
module fails only when that check is asked for.

Steps and warm-up
-----------------
A step ends at every ``optimizer.step()`` (through the global
``register_optimizer_step_post_hook``; with several optimizers, only the
first one to step counts, so one training step is one step) or at every
explicit ``session.step()``. Once ``session.step()`` has been called, the
optimizer hook stops counting, so the two never double count.

The first ``warmup_steps`` completed steps are warm-up: syncs there are
counted apart and not reported as findings. The rule is decided when the
findings are read, not while the program runs, because only then is it known
whether the program had steps at all:

- no completed step (a script or test without an optimizer and without
  ``session.step()``): nothing is warm-up, every event is reported, and the
  whole run counts as one step;
- N completed steps: the warm-up is ``min(warmup_steps, N - 1)`` steps, so at
  least one completed step is always measured and a short program is never
  judged as all warm-up. Events after the last boundary (evaluation, a final
  print) are measured too.

``session.in_warmup`` is the live view of the same rule for checks that must
decide on the spot (it is True while ``step_index < warmup_steps``); checks
that can defer judge with ``session.step_count()`` (a frozen ``StepCount``)
when they build findings.

Failing kinds
-------------
``fail_on`` holds selectors: a finding kind (``"sync"``, ``"race"``, ...)
fails every finding of that kind; ``"oom:fragmentation"`` fails only an
``oom`` finding whose ``details["cause"]`` is ``"fragmentation"``. The
default is ``{"oom:fragmentation", "race"}``: a fragmentation OOM or a
cross-stream race fails a test, and every other finding is reported without
failing it.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Protocol, Set

from .findings import CHECKS, KINDS, Finding, is_per_step_cost

CHECK_REGISTRY: Dict[str, str] = {
    "sync": "torchlint.sanitizer.sync.check:SyncCheck",
    "memory": "torchlint.sanitizer.memory.check:MemoryCheck",
    "race": "torchlint.sanitizer.races.check:RaceCheck",
}
START_ORDER = ("memory", "sync", "race")

FRAGMENTATION_OOM = "oom:fragmentation"
# A fragmentation OOM and a cross-stream race are bugs; the other kinds are costs, reported only.
DEFAULT_FAIL_ON = frozenset({FRAGMENTATION_OOM, "race"})
DEFAULT_WARMUP_STEPS = 2


def parse_fail_on(text: str) -> frozenset:
    """``--gpu-sanitize-fail-on``: kinds and ``kind:cause`` selectors.

    ``default`` is the default set, ``none`` the empty set, ``all`` every kind.
    Raises ValueError naming the valid selectors on an unknown one.
    """
    names = {part.strip() for part in text.split(",") if part.strip()}
    selectors: Set[str] = set()
    for name in names:
        if name == "none":
            continue
        if name == "all":
            selectors.update(KINDS)
        elif name == "default":
            selectors.update(DEFAULT_FAIL_ON)
        elif name in KINDS or (":" in name and name.split(":", 1)[0] in KINDS and name.split(":", 1)[1]):
            selectors.add(name)
        else:
            raise ValueError(
                f"unknown finding kind {name!r}; valid: {', '.join(KINDS)}, {FRAGMENTATION_OOM}, default, all, none"
            )
    return frozenset(selectors)


def finding_fails(finding: Finding, fail_on: Iterable[str]) -> bool:
    if not is_per_step_cost(finding):
        return False  # a final read, an assert after the loop, periodic logging: reported, never failed on
    for selector in fail_on:
        kind, _, cause = selector.partition(":")
        if finding.kind != kind:
            continue
        if not cause or str(finding.details.get("cause", "")) == cause:
            return True
    return False


def load_check_class(name: str):
    """Import the check class registered under ``name`` (lazily: only when asked for)."""
    try:
        target = CHECK_REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown check {name!r}; valid checks: {', '.join(CHECKS)}") from None
    module_name, _, class_name = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)


# --- what a check is, and what it may read from the session -------------------


@dataclass(frozen=True)
class StepCount:
    """The run's steps as findings judge them: ``completed`` steps, of which
    ``warmup`` are left out (the module docstring says how it is decided)."""

    completed: int
    warmup: int

    @property
    def measured(self) -> int:
        """How many steps per-step rates divide by (the whole run is one step without steps)."""
        return 1 if self.completed == 0 else self.completed - self.warmup

    def is_measured(self, step: int) -> bool:
        """Whether an event seen during ``step`` (0-based) counts."""
        return step >= self.warmup


class SessionView(Protocol):
    """What a check reads from the session that runs it (tests pass smaller fakes)."""

    step_index: int  # completed steps so far
    warmup_steps: int
    test_id: Optional[str]
    timeline: Optional[Any]  # timeline.Timeline, None when a fake session has none

    @property
    def in_warmup(self) -> bool: ...

    def step_count(self) -> StepCount: ...

    def has_check(self, name: str) -> bool: ...


class Check(Protocol):
    """A sanitizer check, as the session drives it.

    Checks subclass this protocol, so the optional hooks default to doing
    nothing.
    """

    name: str

    def start(self) -> None:
        """Install the hooks; the program has not run yet."""

    def stop(self) -> None:
        """Remove every hook and restore every global ``start`` changed."""

    def on_step(self, step: int) -> None:
        """A step boundary: ``step`` is the 0-based count of completed steps."""

    def on_measurement_start(self) -> None:
        """Every check has started: the program's own time starts now."""

    def on_program_end(self) -> None:
        """The program returned or raised, its globals still alive."""

    def findings(self) -> List[Finding]:
        """What the check found, deduplicated, with counts."""
        return []

    def summary(self) -> Optional[Dict[str, Any]]:
        """Plain data for the report under the check's name, or None."""
        return None


# --- allowlist ---------------------------------------------------------------


class _AllowDepth(threading.local):
    # A class default, not getattr(..., 0): a missing attribute raises and
    # formats an AttributeError, ~10 µs once per step when caches are cold
    # (sync_allowed runs for every sync).
    depth = 0


_allowed = _AllowDepth()
# Open allow_sync blocks on all threads: while there are none (nearly always),
# sync_allowed answers from this one global without touching the thread-local.
_open_blocks = 0
_open_blocks_lock = threading.Lock()


@contextlib.contextmanager
def allow_sync() -> Iterator[None]:
    """Syncs made inside this block (on this thread) are expected: no finding."""
    global _open_blocks
    with _open_blocks_lock:
        _open_blocks += 1
    _allowed.depth += 1
    try:
        yield
    finally:
        _allowed.depth -= 1
        with _open_blocks_lock:
            _open_blocks -= 1


def sync_allowed() -> bool:
    return _open_blocks > 0 and _allowed.depth > 0


# --- the session -----------------------------------------------------------------


class SanitizerSession:
    """Runs a set of checks over one program, test or block."""

    def __init__(
        self,
        checks: Iterable[str] = frozenset(CHECKS),
        warmup_steps: int = DEFAULT_WARMUP_STEPS,
        fail_on: Iterable[str] = DEFAULT_FAIL_ON,
        test_id: Optional[str] = None,
        sync_min_count: Optional[int] = None,
        track_phases: bool = True,
    ) -> None:
        checks = frozenset(checks)
        unknown = sorted(checks - set(CHECK_REGISTRY))
        if unknown:
            raise ValueError(f"unknown check(s) {', '.join(unknown)}; valid checks: {', '.join(CHECKS)}")
        if warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        self.checks = checks
        self.warmup_steps = int(warmup_steps)
        self.fail_on = frozenset(fail_on)
        self.test_id = test_id
        self.sync_min_count = sync_min_count  # runs that make a sync site repeated (None: sync.DEFAULT_MIN_COUNT)
        # Mark compilation, evaluation and checkpoints (phases.py). A pytest session per test has no phases
        # to tell apart, and each install writes to torch.nn.Module, which costs CPython a type-version tag.
        self.track_phases = track_phases
        self.step_index = 0
        self.explicit_steps = False
        self.active = False
        self._checks: List[Check] = []
        self._hook_handle = None
        self._lead_optimizer: Optional[int] = None
        self._findings_cache: Optional[List[Finding]] = None
        self.timeline: Optional[Any] = None
        self._phase_hooks: Optional[Any] = None

    # -- lifecycle --
    def start(self) -> "SanitizerSession":
        if self.active:
            raise RuntimeError("sanitizer session already started")
        self._findings_cache = None
        from .phases import PhaseHooks
        from .timeline import Timeline

        self.timeline = Timeline()
        classes = [(name, load_check_class(name)) for name in START_ORDER if name in self.checks]
        started: List[Check] = []
        try:
            for _name, cls in classes:
                check = cls(self)
                check.start()
                started.append(check)
            self._install_step_hook()
            if self.track_phases:
                self._phase_hooks = PhaseHooks(self.timeline)  # compilation, evaluation, checkpoints (phases.py)
                self._phase_hooks.install()
        except BaseException:
            if self._phase_hooks is not None:
                self._phase_hooks.remove()
                self._phase_hooks = None
            for check in reversed(started):
                check.stop()
            raise
        self._checks = started
        self.active = True
        # Start-up (imports, the native tap's build, hooks) is the sanitizer's
        # time, not the program's: figures that judge the program start here.
        for check in started:
            check.on_measurement_start()
        return self

    def program_end(self) -> None:
        """The program returned or raised, its globals still alive: checks that look at live state look now."""
        for check in self._checks:
            check.on_program_end()

    def stop(self) -> None:
        if not self.active:
            return
        self.active = False
        if self.timeline is not None:
            self.timeline.stop()
        if self._phase_hooks is not None:
            self._phase_hooks.remove()
            self._phase_hooks = None
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None
        errors = []
        for check in reversed(self._checks):
            try:
                check.stop()
            except Exception as exc:  # stop every check even if one fails
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> "SanitizerSession":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def _install_step_hook(self) -> None:
        try:
            from torch.optim.optimizer import register_optimizer_step_post_hook
        except ImportError:  # no torch: steps come only from session.step()
            return
        self._hook_handle = register_optimizer_step_post_hook(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        if self.explicit_steps or not self.active:
            return
        if self._lead_optimizer is None:
            self._lead_optimizer = id(optimizer)
        if id(optimizer) == self._lead_optimizer:
            self._advance()

    # -- steps --
    def step(self) -> int:
        """Mark a step boundary explicitly; from now on optimizer steps are not counted."""
        self.explicit_steps = True
        return self._advance()

    def _advance(self) -> int:
        self.step_index += 1
        self._findings_cache = None
        if self.timeline is not None:
            self.timeline.step(self.step_index)
        for check in self._checks:
            check.on_step(self.step_index)
        return self.step_index

    @property
    def in_warmup(self) -> bool:
        return self.step_index < self.warmup_steps

    def effective_warmup(self) -> int:
        """Warm-up steps judged over the whole run (see the module docstring)."""
        if self.step_index == 0:
            return 0
        return min(self.warmup_steps, self.step_index - 1)

    def step_count(self) -> StepCount:
        """The steps so far, frozen, as findings judge them."""
        return StepCount(self.step_index, self.effective_warmup())

    def is_measured(self, step: int) -> bool:
        """Whether an event seen during ``step`` (0-based) counts, judged now."""
        return self.step_count().is_measured(step)

    def measured_steps(self) -> int:
        """How many steps the per-step rates divide by (the whole run is one step without steps)."""
        return self.step_count().measured

    def has_check(self, name: str) -> bool:
        """Whether a check of that name runs in this session now."""
        return any(check.name == name for check in self._checks)

    # -- results --
    @property
    def findings(self) -> List[Finding]:
        if self._findings_cache is None or self.active:
            collected: List[Finding] = []
            for check in self._checks:
                for finding in check.findings():
                    if finding.test is None and self.test_id is not None:
                        finding.test = self.test_id
                    collected.append(finding)
            self._findings_cache = collected
        return list(self._findings_cache)

    def failing_findings(self) -> List[Finding]:
        return [f for f in self.findings if finding_fails(f, self.fail_on)]

    def steps_summary(self) -> Dict[str, Any]:
        return {
            "completed": self.step_index,
            "warmup": self.effective_warmup(),
            "measured": self.step_index - self.effective_warmup() if self.step_index else 0,
            "source": "explicit" if self.explicit_steps else ("optimizer" if self.step_index else "none"),
        }

    def summaries(self) -> Dict[str, Any]:
        """Per-check plain-data summaries (the memory check's peaks and counters)."""
        summaries = {}
        for check in self._checks:
            summary = check.summary()
            if summary is not None:
                summaries[check.name] = summary
        return summaries

    def phases(self) -> Optional[Dict[str, Any]]:
        """Where the run's time went (``phases.py``): start-up, compilation, steady state, evaluation..."""
        if self.timeline is None:
            return None
        from .phases import split

        return split(self.timeline.to_json(), self.effective_warmup()).to_json()

    def report(self) -> Dict[str, Any]:
        from .report import build_report

        summaries = self.summaries()
        if self.timeline is not None:
            summaries["timeline"] = self.timeline.to_json()
            summaries["phases"] = self.phases()
        return build_report(
            self.findings,
            checks=sorted(self.checks),
            steps=self.steps_summary(),
            fail_on=sorted(self.fail_on),
            summaries=summaries,
        )

    def write_html(self, path: str) -> None:
        """The run's self-contained HTML report (``html_report.py``)."""
        from .html_report import write_html

        write_html(path, [self.report()])

    def write_trace(self, path: str) -> None:
        """The run as a Chrome trace-event file for Perfetto / chrome://tracing (``trace.py``)."""
        from .trace import write_trace

        write_trace(path, self.report())


@contextlib.contextmanager
def sanitize(
    checks: Iterable[str] = frozenset(CHECKS),
    warmup_steps: int = DEFAULT_WARMUP_STEPS,
    fail_on: Iterable[str] = DEFAULT_FAIL_ON,
    test_id: Optional[str] = None,
    sync_min_count: Optional[int] = None,
) -> Iterator[SanitizerSession]:
    """``with sanitize(checks={"sync"}) as session: ...``; read ``session.findings`` after."""
    if isinstance(checks, str):
        from .findings import parse_checks

        checks = parse_checks(checks)
    session = SanitizerSession(
        checks=checks, warmup_steps=warmup_steps, fail_on=fail_on, test_id=test_id, sync_min_count=sync_min_count
    )
    session.start()
    try:
        yield session
    finally:
        session.stop()
