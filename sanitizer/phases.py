"""Where a run's time went: start-up, compilation, evaluation, checkpointing and steady-state training.

A whole-run average says little: a compiled GPT whose steps keep the GPU
busy 80% of the time averages 49% once its compilation, evaluation and
checkpoint writes are counted in. So the run is split into phases, and the
GPU's utilization is judged on the steady-state training steps alone; the
other phases are reported for what they cost.

Two halves:

- ``PhaseHooks`` (installed by the session) marks the session's timeline
  when torch.compile compiles (Dynamo's compile callbacks, registered once
  Dynamo is imported or ``torch.compile`` is first called), when a module is
  put in evaluation mode (``Module.eval``) and while ``torch.save`` writes.
  Each hook runs on a rare call, never per op or per step.
- ``split`` is a pure function of the timeline's JSON: optimizer steps are
  the backbone. Steps after the warm-up whose duration stays within
  ``STEADY_FACTOR`` times the median step, with no evaluation begun in them,
  are steady-state training; another gap between two steps holds other work:
  an evaluation if one began in it, else "other". An evaluation begun in most
  steps (a GCN epoch: a step, then a test pass) is part of the steady step.
  Everything before the end of the warm-up is start-up; after the last step,
  the tail. Time inside compilation and ``torch.save`` counts as those phases
  wherever it falls. A run without steps has no steady state, and its
  utilization is reported, not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from .patching import Patcher

STARTUP, COMPILATION, EVALUATION, CHECKPOINTING, STEADY, OTHER = (
    "start-up",
    "compilation",
    "evaluation",
    "checkpointing",
    "steady-state training",
    "other",
)
ORDER = (STARTUP, COMPILATION, STEADY, EVALUATION, CHECKPOINTING, OTHER)
# A step longer than this many median steps holds more than a training step.
STEADY_FACTOR = 3.0
# NVML's utilization is a duty cycle over the last 1/6 s to 1 s: samples this
# soon after a steady stretch begins still describe what came before it.
NVML_LAG_S = 1.0
# Utilization is judged over at least this much steady-state time and these many samples.
MIN_STEADY_SECONDS = 5.0
MIN_UTILIZATION_SAMPLES = 10
LOW_UTILIZATION_PERCENT = 50.0  # the TensorBoard profiler plugin's threshold


# -- the hooks ------------------------------------------------------------------------------------


class PhaseHooks:
    """Marks compilation, evaluation and checkpointing on a timeline while installed."""

    def __init__(self, timeline) -> None:
        self.timeline = timeline
        self._patcher: Optional["Patcher"] = None
        self._dynamo = None  # torch._dynamo's callback handler, once the callbacks are registered
        self._open_compiles: List[int] = []

    def install(self) -> None:
        try:
            import torch
        except ImportError:
            return
        import sys

        from .frames import forwards_user_call
        from .patching import Patcher

        self._patcher = Patcher()
        timeline = self.timeline
        hooks = self

        # Each wrapper forwards the user's call: a sync inside torch.save is the user's line's.
        def eval_wrapper(original: Callable) -> Callable:
            @forwards_user_call
            def eval(module):
                timeline.mark(EVALUATION)
                return original(module)

            return eval

        def save_wrapper(original: Callable) -> Callable:
            @forwards_user_call
            def save(*args, **kwargs):
                index = timeline.phase_begin(CHECKPOINTING)
                try:
                    return original(*args, **kwargs)
                finally:
                    timeline.phase_end(index)

            return save

        def compile_wrapper(original: Callable) -> Callable:
            @forwards_user_call
            def compile(*args, **kwargs):
                result = original(*args, **kwargs)
                hooks._register_dynamo()  # torch.compile has imported Dynamo by now
                return result

            return compile

        self._patcher.wrap(torch.nn.Module, "eval", eval_wrapper)
        self._patcher.wrap(torch, "save", save_wrapper)
        self._patcher.wrap(torch, "compile", compile_wrapper)
        if "torch._dynamo" in sys.modules:
            self._register_dynamo()

    def _register_dynamo(self) -> None:
        if self._dynamo is not None:
            return
        try:
            from torch._dynamo import callback_handler
        except Exception:  # a torch without the compile callbacks: compilation is not told apart
            return
        callback_handler.register_start_callback(self._compile_started)
        callback_handler.register_end_callback(self._compile_ended)
        self._dynamo = callback_handler

    def _compile_started(self, *args) -> None:
        self._open_compiles.append(self.timeline.phase_begin(COMPILATION))

    def _compile_ended(self, *args) -> None:
        if self._open_compiles:
            self.timeline.phase_end(self._open_compiles.pop())

    def remove(self) -> None:
        if self._dynamo is not None:
            for remove, callback in (
                (self._dynamo.remove_start_callback, self._compile_started),
                (self._dynamo.remove_end_callback, self._compile_ended),
            ):
                try:
                    remove(callback)
                except ValueError:
                    pass
            self._dynamo = None
        if self._patcher is not None:
            self._patcher.restore_all()
            self._patcher = None


# -- the split ------------------------------------------------------------------------------------


@dataclass
class Phases:
    """The run split into phases: seconds per phase, the steady-state spans, utilization per phase."""

    duration_s: float
    seconds: Dict[str, float] = field(default_factory=dict)
    steady_spans: List[Tuple[float, float]] = field(default_factory=list)
    steady_steps: int = 0
    utilization: Dict[str, Optional[float]] = field(default_factory=dict)  # mean percent per phase
    steady_utilization_samples: int = 0

    @property
    def steady_seconds(self) -> float:
        return self.seconds.get(STEADY, 0.0)

    def to_json(self) -> Dict[str, Any]:
        return {
            "duration_s": round(self.duration_s, 3),
            "phases": [
                {
                    "phase": name,
                    "seconds": round(self.seconds[name], 3),
                    "share": round(self.seconds[name] / self.duration_s, 4) if self.duration_s else 0.0,
                    "utilization_mean_percent": self.utilization.get(name),
                }
                for name in ORDER
                if self.seconds.get(name)
            ],
            "steady_state": {
                "steps": self.steady_steps,
                "seconds": round(self.steady_seconds, 3),
                "utilization_samples": self.steady_utilization_samples,
            },
        }


def _union_length(intervals: Sequence[Tuple[float, float]], start: float, end: float) -> float:
    """The length of [start, end] covered by the intervals."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    total, reach = 0.0, start
    for a, b in clipped:
        a = max(a, reach)
        if b > a:
            total += b - a
            reach = b
    return total


def split(timeline: Dict[str, Any], warmup_steps: int) -> Phases:
    """The phases of a run from its timeline's JSON (``timeline.py``) and its effective warm-up."""
    duration = float((timeline.get("clock") or {}).get("duration_s") or 0.0)
    steps = list(timeline.get("steps") or [])
    marked = [row for row in timeline.get("phases") or []]
    compiles = [(row[0], row[1] if row[1] is not None else duration) for row in marked if row[2] == COMPILATION]
    saves = [(row[0], row[1] if row[1] is not None else duration) for row in marked if row[2] == CHECKPOINTING]
    evals = [row[0] for row in marked if row[2] == EVALUATION]
    carved = compiles + saves
    phases = Phases(duration_s=duration, seconds={name: 0.0 for name in ORDER})
    phases.seconds[COMPILATION] = _union_length(compiles, 0.0, duration)
    phases.seconds[CHECKPOINTING] = _union_length(saves, 0.0, duration) - _union_length(
        [(max(a, c), min(b, d)) for a, b in saves for c, d in compiles if min(b, d) > max(a, c)], 0.0, duration
    )
    spans: List[Tuple[float, float, str]] = []

    def add(start: float, end: float, name: str) -> None:
        if end > start:
            spans.append((start, end, name))
            phases.seconds[name] += (end - start) - _union_length(carved, start, end)

    if not steps:
        add(0.0, duration, OTHER)
    else:
        first_measured = max(warmup_steps, 1)  # step 0's interval holds the set-up: start-up either way
        startup_end = steps[first_measured - 1] if first_measured - 1 < len(steps) else steps[-1]
        add(0.0, startup_end, STARTUP)
        intervals = [(steps[k - 1], steps[k]) for k in range(first_measured, len(steps))]
        typical = median([b - a for a, b in intervals]) if intervals else 0.0
        evaluated = [any(a < t <= b for t in evals) for a, b in intervals]
        if intervals and sum(evaluated) >= len(intervals) / 2:
            # An evaluation in most steps (a GCN epoch: one step, then a test pass) is the steady step itself.
            evals, evaluated = [], [False] * len(intervals)
        for (a, b), in_evaluation in zip(intervals, evaluated):
            busy = in_evaluation or _union_length(carved, a, b) > 0
            if not busy and b - a <= STEADY_FACTOR * typical:
                add(a, b, STEADY)
                phases.steady_steps += 1
                if phases.steady_spans and phases.steady_spans[-1][1] == a:
                    phases.steady_spans[-1] = (phases.steady_spans[-1][0], b)
                else:
                    phases.steady_spans.append((a, b))
            else:
                add(a, b, _named(a, b, evals))
        add(steps[-1], duration, _named(steps[-1], duration, evals))
    carved_named = [(a, b, COMPILATION) for a, b in compiles] + [(a, b, CHECKPOINTING) for a, b in saves]
    _utilization(phases, carved_named + spans, timeline.get("utilization") or [])
    return phases


def _named(start: float, end: float, evals) -> str:
    """What filled a gap between steps besides compilation and checkpoints (counted apart):
    an evaluation, or other work."""
    return EVALUATION if any(start < t <= end for t in evals) else OTHER


def _utilization(phases: Phases, spans: Sequence[Tuple[float, float, str]], samples: Sequence[Sequence[float]]) -> None:
    """Mean NVML utilization per phase (compilation and checkpoints first, wherever they fall);
    the steady state's without its spans' first ``NVML_LAG_S``."""
    sums: Dict[str, List[float]] = {}
    for t, percent in samples:
        if percent is None:
            continue
        for start, end, name in spans:
            if start < t <= end:
                if name == STEADY and not any(a + NVML_LAG_S <= t <= b for a, b in phases.steady_spans):
                    break
                sums.setdefault(name, []).append(percent)
                break
    for name, values in sums.items():
        phases.utilization[name] = round(sum(values) / len(values), 1)
    phases.steady_utilization_samples = len(sums.get(STEADY, []))


def low_utilization(phases: Phases) -> Optional[Dict[str, Any]]:
    """The low-utilization verdict's facts, or None: judged on steady-state training alone."""
    mean = phases.utilization.get(STEADY)
    if (
        mean is None
        or phases.steady_seconds < MIN_STEADY_SECONDS
        or phases.steady_utilization_samples < MIN_UTILIZATION_SAMPLES
        or mean >= LOW_UTILIZATION_PERCENT
    ):
        return None
    return {
        "utilization_mean_percent": mean,
        "samples": phases.steady_utilization_samples,
        "steady_seconds": round(phases.steady_seconds, 3),
        "steady_steps": phases.steady_steps,
        "threshold_percent": LOW_UTILIZATION_PERCENT,
    }


def describe(phases: Dict[str, Any]) -> str:
    """One line for the terminal summary: ``phases: start-up 3.1 s, compilation 41.0 s, ...`` (from ``to_json``)."""
    parts = []
    for entry in phases.get("phases", []):
        text = f"{entry['phase']} {entry['seconds']:.1f} s"
        if entry.get("utilization_mean_percent") is not None:
            text += f" (GPU busy {entry['utilization_mean_percent']:.0f}%)"
        parts.append(text)
    return "phases: " + ", ".join(parts) if parts else ""
