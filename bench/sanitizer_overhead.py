"""Overhead of the torchlint runtime sanitizer, per training step, on a real GPU.

    python bench/sanitizer_overhead.py [--steps 50] [--repeats 3] [--modes baseline,sync] [--workloads ...]

Every (workload, mode) pair runs in a fresh Python process (this script
re-invoked with ``--child``), because the sanitizer's hooks are process-global
and some (gpu_trace, CSAN's dispatch mode) cannot be switched off. Each child
builds the workload, runs warm-up steps under the mode, then times
``--repeats`` windows of ``--steps`` steps, each bracketed by
``torch.cuda.synchronize()`` (the original, captured before any wrapper is
installed), and reports the fastest window's ms/step (noise on a shared host
only ever adds time; the median is kept in the JSON). The parent prints one table with
the ratio of each mode to the baseline of the same workload, taken in this
run, next to the targets.

With ``--paired`` each torchlint mode is timed against the baseline window
by window in one process (``run_paired_child``), and the table adds the
median of the pairwise ratios with a distribution-free 95% interval
(``median_interval``) and a verdict against the target: ``met`` when the
whole interval is within it, ``over`` when all of it is above, otherwise
``unresolved``. ``baseline-2`` is then paired with itself (an A/A pair): its
interval is how far a ratio strays in this run with nothing to measure, the
run's resolution. On a shared host a ratio whose interval spans its target
is not a result either way; more pairs narrow it (about as 1/sqrt(pairs)):
``--cell-seconds`` runs pairs for a time instead of ``--repeats`` times,
``--tight-cell-seconds`` gives the cells with the tightest targets (1.05x
or less) longer, and ``--window-seconds`` makes a fast step's windows as
long as a slow one's. Next to the times, each arm's main-thread context
switches per step (``thread_switches``, Linux) are counted rather than
timed: a background thread's turns at the GIL show there even where the
host's noise hides their time. So is the main thread's own CPU time per
step (``time.thread_time``), with its own pairwise median: work the main
thread does itself shows there, a wait (for the GIL, for the GPU) does not.

Extending it: a workload is a function in ``WORKLOADS`` that takes the torch
module and returns a zero-argument ``step()``; a mode is an entry in ``MODES``
with the sanitizer checks to turn on and/or a ``setup`` run before the
workload is built (see ``csan``).
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple


# --- workloads ------------------------------------------------------------------

def _launch_bound_model(torch) -> Callable:
    """4x Linear(1024, 1024) + ReLU, AdamW: ``train(inputs)`` for a (256, 1024) batch."""
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(1024, 1024), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def train(inputs) -> None:
        loss = model(inputs).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return train


def _transformer_model(torch) -> Callable:
    """6-layer TransformerEncoder, d_model 512, 8 heads, AMP + GradScaler: ``train(inputs)`` for (32, 128, 512)."""
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda")

    def train(inputs) -> None:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(inputs).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    return train


def _prefetched(torch, train: Callable, shape) -> Callable[[], None]:
    """``train`` fed by a side stream that copies the next pinned batch (correct wait_stream and record_stream)."""
    copy_stream = torch.cuda.Stream()
    host = [torch.randn(*shape).pin_memory() for _ in range(2)]
    state = {"i": 0, "next": None}

    def load():
        copy_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(copy_stream):
            state["next"] = host[state["i"] % 2].to("cuda", non_blocking=True)
        state["i"] += 1

    load()

    def step() -> None:
        torch.cuda.current_stream().wait_stream(copy_stream)
        inputs = state["next"]
        inputs.record_stream(torch.cuda.current_stream())
        load()
        train(inputs)

    return step


def launch_bound(torch) -> Callable[[], None]:
    """4x Linear(1024, 1024) + ReLU, AdamW, batch 256: launch-bound, worst case for Python hooks."""
    train = _launch_bound_model(torch)
    inputs = torch.randn(256, 1024, device="cuda")
    return lambda: train(inputs)


def transformer(torch) -> Callable[[], None]:
    """6-layer TransformerEncoder, d_model 512, 8 heads, AMP + GradScaler, batch 32, seq 128."""
    train = _transformer_model(torch)
    inputs = torch.randn(32, 128, 512, device="cuda")
    return lambda: train(inputs)


def prefetch(torch) -> Callable[[], None]:
    """Two streams: the launch-bound step, its next batch copied on a side stream (worst case for per-op hooks)."""
    return _prefetched(torch, _launch_bound_model(torch), (256, 1024))


def prefetch_transformer(torch) -> Callable[[], None]:
    """Two streams: the transformer step, its next batch copied on a side stream (GPU-bound, as real training is)."""
    return _prefetched(torch, _transformer_model(torch), (32, 128, 512))


WORKLOADS: Dict[str, Callable] = {
    "launch-bound": launch_bound,
    "transformer": transformer,
    "prefetch": prefetch,
    "prefetch-transformer": prefetch_transformer,
}

# The targets (ratio to baseline) for the default check set.
TARGETS = {("launch-bound", "sync+memory"): 1.03, ("transformer", "sync+memory"): 1.03,
           # issue 13: single-stream programs pay (almost) nothing; two streams at most 1.5x
           ("launch-bound", "race"): 1.05, ("transformer", "race"): 1.05, ("prefetch", "race"): 1.5,
           ("prefetch-transformer", "race"): 1.5}


# --- modes ----------------------------------------------------------------------

def enable_csan(torch) -> None:
    import torch.cuda._sanitizer as csan  # the reference, measured only; torchlint never imports it

    csan.enable_cuda_sanitizer()


def enable_empty_dispatch_mode(torch) -> None:
    """What any checker built on a TorchDispatchMode pays before it does any work."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class EmptyMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    EmptyMode().__enter__()  # stays on for the rest of this child process


def enable_empty_dispatch_mode_and_gpu_trace(torch) -> None:
    """The race check's hooks with nothing behind them: the dispatch mode plus gpu_trace's Python round trips."""
    import torch.cuda._gpu_trace  # noqa: F401  (torch's C++ side looks its registries up on every event)

    torch._C._activate_gpu_trace()
    enable_empty_dispatch_mode(torch)


def use_python_dispatch_mode(torch) -> None:
    """The race check with its fallback interception, for comparison with the native tap."""
    os.environ["TORCHLINT_RACE_TAP"] = "python"


# Diagnosis: sync+memory with one of the memory check's parts switched off, to see which part costs.
def without_memory_watcher(torch) -> None:
    """The memory check's background watcher thread ends at once."""
    from torchlint.sanitizer.memory import check as memory

    memory.MemoryCheck._watch_loop = lambda self: None


def without_nvml(torch) -> None:
    """No NVML utilization sampling thread."""
    from torchlint.sanitizer.memory import nvml

    nvml.NvmlSampler.start = lambda self: False


def race_without_sites(torch) -> None:
    """The race check with no user stack captured per op (what the stacks cost)."""
    from torchlint.sanitizer.races import ops as race_ops

    race_ops.bind_tracebacks = lambda torch: None  # start() binds them; leave ``_gather`` None


def gpu_trace_floor(torch) -> None:
    """torch's own gpu_trace switched on, as the race check routes it where the tap has no filter,
    with no check behind it.

    Every CUDA event, sync, allocation and free then makes a C++-to-Python
    round trip; the two memory registries call a C builtin, as the check
    arranges while such a tap runs.
    """
    import importlib

    from torchlint.sanitizer.races.hooks import _MEMORY_REGISTRIES

    trace = importlib.import_module("torch.cuda._gpu_trace")
    for name in _MEMORY_REGISTRIES:
        getattr(trace, name).fire_callbacks = id
    torch._C._activate_gpu_trace()


def without_phase_hooks(torch) -> None:
    """No phase hooks (Module.eval, torch.save, torch.compile marks): what installing them per window costs."""
    from torchlint.sanitizer import phases

    phases.PhaseHooks.install = lambda self: None


def sync_without_wrappers(torch) -> None:
    """The sync check with torch's sync warning and its step hook but none of its wrappers (``.item()`` among them)."""
    from torchlint.sanitizer.sync import check as sync

    sync.SyncCheck._install_wrappers = lambda self, torch: None


# Diagnosis, amplified: one periodic part of the memory check run ten times as often, the others off,
# so its cost per event stands out of the noise ((ratio - 1) / its rate gives the cost of one event).
def _only_memory_parts(watcher: bool, nvml_thread: bool) -> None:
    if not watcher:
        without_memory_watcher(None)
    if not nvml_thread:
        without_nvml(None)


def memory_samples_x10(torch) -> None:
    """A step sample (counters, mem_get_info, the look) every 5 ms; no watcher, no NVML thread."""
    from torchlint.sanitizer.memory import check as memory

    _only_memory_parts(watcher=False, nvml_thread=False)
    start = memory.MemoryCheck.start

    def fast_start(self) -> None:
        self.sample_interval_s = memory.DEFAULT_SAMPLE_INTERVAL_S / 10
        start(self)

    memory.MemoryCheck.start = fast_start


def memory_parked_wakes_x10(torch) -> None:
    """The watcher wakes every 5 ms and finds the step sample's look recent (a parked wake); no NVML thread."""
    from torchlint.sanitizer.memory import check as memory

    _only_memory_parts(watcher=True, nvml_thread=False)
    memory.MemoryCheck._watch_sleep_s = lambda self: memory.DEFAULT_SAMPLE_INTERVAL_S / 10


def memory_nvml_x10(torch) -> None:
    """An NVML sample every 20 ms; no watcher."""
    from torchlint.sanitizer.memory import nvml

    _only_memory_parts(watcher=False, nvml_thread=True)
    start = nvml.NvmlSampler.start

    def fast_start(self) -> bool:
        self.interval_s = nvml.DEFAULT_INTERVAL_S / 10
        return start(self)

    nvml.NvmlSampler.start = fast_start


def memory_quiet(torch) -> None:
    """The memory check with its step samples only: no watcher, no NVML thread."""
    _only_memory_parts(watcher=False, nvml_thread=False)


def without_timeline(torch) -> None:
    """The checks record nothing for the HTML report and the trace."""
    from torchlint.sanitizer import timeline

    timeline.of = lambda session: None


@dataclasses.dataclass(frozen=True)
class Mode:
    name: str
    checks: Optional[FrozenSet[str]] = None  # None: no torchlint session
    setup: Optional[Callable] = None  # called with torch before the workload is built
    step_fraction: float = 1.0  # slow modes time fewer steps
    # --paired: timed against itself window by window, as the torchlint modes are
    # against the baseline (an A/A pair): how far a ratio strays with nothing to measure.
    null_pair: bool = False

    def is_paired(self) -> bool:
        return self.checks is not None or self.null_pair


MODES: List[Mode] = [
    Mode("baseline"),
    Mode("sync", frozenset({"sync"})),
    Mode("memory", frozenset({"memory"})),
    Mode("sync+memory", frozenset({"sync", "memory"})),
    Mode("race", frozenset({"race"})),
    Mode("race-python", frozenset({"race"}), setup=use_python_dispatch_mode),
    Mode("all", frozenset({"sync", "memory", "race"})),
    # The baseline again, in its own process: the spread between the two is the run's noise.
    # With --paired it is paired with itself, so its interval is the noise of the paired ratios.
    Mode("baseline-2", null_pair=True),
    Mode("csan", setup=enable_csan, step_fraction=0.2),
    Mode("sync+memory-no-watcher", frozenset({"sync", "memory"}), setup=without_memory_watcher),
    Mode("sync+memory-no-nvml", frozenset({"sync", "memory"}), setup=without_nvml),
    Mode("sync+memory-no-timeline", frozenset({"sync", "memory"}), setup=without_timeline),
    Mode("sync-no-wrappers", frozenset({"sync"}), setup=sync_without_wrappers),
    Mode("sync+memory-no-phases", frozenset({"sync", "memory"}), setup=without_phase_hooks),
    Mode("race-no-phases", frozenset({"race"}), setup=without_phase_hooks),
    # A session with no check: the optimizer-step hook and the timeline's step row alone.
    Mode("session", frozenset()),
    # Diagnosis of the memory check, one part at a time, amplified (see memory_samples_x10 and its neighbours).
    Mode("memory-quiet", frozenset({"memory"}), setup=memory_quiet),
    Mode("memory-samples-x10", frozenset({"memory"}), setup=memory_samples_x10),
    Mode("memory-parked-wakes-x10", frozenset({"memory"}), setup=memory_parked_wakes_x10),
    Mode("memory-nvml-x10", frozenset({"memory"}), setup=memory_nvml_x10),
    # Diagnosis of the race check: without per-op stacks, without the timeline, and gpu_trace's floor alone.
    Mode("race-no-sites", frozenset({"race"}), setup=race_without_sites),
    Mode("race-no-timeline", frozenset({"race"}), setup=without_timeline),
    Mode("gpu-trace", setup=gpu_trace_floor),
    # Floors, for reading the race figures: hooks with no analysis behind them.
    Mode("empty-mode", setup=enable_empty_dispatch_mode),
    Mode("empty-mode+trace", setup=enable_empty_dispatch_mode_and_gpu_trace),
]


# --- child: one (workload, mode) in this process ----------------------------------------

def _allocations(torch) -> int:
    """Blocks the caching allocator has handed out so far (each one a gpu_trace round trip when it is on)."""
    return int(torch.cuda.memory_stats().get("allocation.all.allocated", 0))


def run_child(workload: str, mode_name: str, steps: int, repeats: int, warmup: int) -> Dict[str, object]:
    import torch

    mode = {m.name: m for m in MODES}[mode_name]
    synchronize = torch.cuda.synchronize  # the original, before any wrapper
    if mode.setup is not None:
        mode.setup(torch)
    session = None
    if mode.checks is not None:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from torchlint.sanitizer import SanitizerSession

        session = SanitizerSession(checks=mode.checks)
        session.start()
    step = WORKLOADS[workload](torch)
    steps = max(3, int(steps * mode.step_fraction))
    if mode.step_fraction < 1.0:
        repeats = max(3, repeats // 4)  # a 10x mode needs no fine noise statistics
    try:
        for _ in range(warmup):
            step()
        synchronize()
        times = []
        allocations_before = _allocations(torch)
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            synchronize()
            times.append((time.perf_counter() - start) * 1000.0 / steps)
    finally:
        if session is not None:
            session.stop()
    result: Dict[str, object] = {"workload": workload, "mode": mode_name, "ms_per_step": min(times),
                                 "median_ms": statistics.median(times),
                                 "all_ms": times, "steps": steps,
                                 "allocations_per_step": (_allocations(torch) - allocations_before) / (steps * repeats),
                                 "steps_run": warmup + steps * repeats}
    if session is not None:
        result.update(_what_the_session_saw(session))
    return result


def _what_the_session_saw(session) -> Dict[str, object]:
    """Its findings, compactly, and the race check's summary (the tap's counters) if it ran."""
    seen: Dict[str, object] = {
        "findings": [f"{f.kind}:{f.details.get('sync_kind', '')}@{os.path.basename(f.file or '')}:{f.line}"
                     for f in session.findings]}
    race = session.summaries().get("race")
    if race:
        seen["race"] = race
    return seen


def run_paired_child(workload: str, mode_name: str, steps: int, repeats: int, warmup: int,
                     settle_s: float = 0.2, cell_seconds: Optional[float] = None,
                     window_seconds: Optional[float] = None) -> Dict[str, object]:
    """One torchlint mode against the baseline in the same process, window by window.

    A torchlint session can be stopped and leaves nothing behind (hooks
    removed, the tap and its gpu_trace filter off), so each repeat times a
    window without a session and a window under a fresh one, in alternating
    order. Slow drifts of the host (clocks, neighbours) then hit both alike.
    The result keeps every window of both arms; the parent takes fastest over
    fastest and the median of the pairwise ratios (``median_interval``). A
    mode with no checks (``baseline-2``) times the plain step in both arms.

    Before every window, in both arms, the step runs for ``settle_s`` seconds
    after a garbage collection: what is timed is the steady per-step cost.
    A fresh session's first moments (its watcher's first look, the first
    snapshot, the last session's garbage) are the sanitizer's own start-up,
    which a real run pays once, not once per 30 steps.

    ``cell_seconds`` runs pairs for that long instead of ``repeats`` times
    (``alternate_pairs``); ``window_seconds`` sizes a window in time instead
    of ``steps``, from the step time measured after warm-up, the same size
    in both arms.
    """
    import torch

    mode = {m.name: m for m in MODES}[mode_name]
    synchronize = torch.cuda.synchronize
    if mode.setup is not None:
        mode.setup(torch)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from torchlint.sanitizer import SanitizerSession

    step = WORKLOADS[workload](torch)
    for _ in range(warmup):
        step()
    synchronize()
    if window_seconds:
        steps = steps_for_window(step, synchronize, window_seconds)
    # What is alive after warm-up (torch's modules, the model, its optimizer) lives for the whole run. Frozen,
    # it is left out of the collection before every window, which then walks only what was made since, the
    # last session's garbage among it: a few milliseconds instead of a full walk of some 300,000 objects
    # (~120 ms, twice a pair, a fifth of a pair's time at the default sizes).
    gc.collect()
    gc.freeze()

    steps_in_session = [0]  # the tap's counters restart with each session: its figures divide by its steps

    base_switches: List[float] = []
    mode_switches: List[float] = []
    # The main thread's own CPU time per step, by arm: a cost the main thread pays itself (wrappers, the step
    # sample, cold caches) shows here; a wait for the GIL or the GPU does not.
    cpu_us: Dict[str, List[float]] = {"baseline": [], "mode": []}

    def window(counted: Optional[List[int]] = None, switches: Optional[List[float]] = None,
               arm: str = "baseline") -> float:
        gc.collect()
        settled = time.perf_counter() + settle_s
        settling = 0
        while time.perf_counter() < settled:
            step()
            settling += 1
        synchronize()
        switched = thread_switches()
        cpu_start = time.thread_time()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        elapsed = time.perf_counter() - start
        cpu_us[arm].append((time.thread_time() - cpu_start) * 1e6 / steps)
        if switches is not None and switched is not None:
            switches.append((thread_switches() - switched) / steps)
        if counted is not None:
            counted[0] += settling + steps
        return elapsed * 1000.0 / steps

    def checked_window() -> float:
        if mode.checks is None:  # the A/A pair: the same plain window in the other arm
            return window(switches=mode_switches, arm="mode")
        session = SanitizerSession(checks=mode.checks)
        session.start()
        steps_in_session[0] = 0
        try:
            return window(steps_in_session, mode_switches, arm="mode")
        finally:
            session.stop()
            last["session"] = session

    last: Dict[str, object] = {}
    base_times, mode_times = alternate_pairs(lambda: window(switches=base_switches), checked_window, repeats,
                                             cell_seconds)
    result: Dict[str, object] = {"workload": workload, "mode": mode_name, "paired": True,
                                 "ms_per_step": min(mode_times), "baseline_ms": min(base_times),
                                 "all_ms": mode_times, "all_baseline_ms": base_times, "steps": steps}
    if base_switches and mode_switches:
        # Counted, not timed: each is the main thread giving up the CPU (the GIL to another thread, a wait).
        result["switches_per_step"] = {"baseline": statistics.median(base_switches),
                                       "mode": statistics.median(mode_switches)}
    if cpu_us["baseline"] and cpu_us["mode"]:
        result["cpu_us_per_step"] = {arm: statistics.median(values) for arm, values in cpu_us.items()}
        result["cpu_pairwise"] = [m / b for m, b in zip(cpu_us["mode"], cpu_us["baseline"]) if b > 0]
    session = last.get("session")
    if session is not None:
        result.update(_what_the_session_saw(session))
        if "race" in result:
            result["steps_run"] = steps_in_session[0]
    return result


def thread_switches() -> Optional[int]:
    """Context switches of the calling thread so far (voluntary and not); None where the OS does not count them."""
    try:
        import resource

        usage = resource.getrusage(resource.RUSAGE_THREAD)
    except (ImportError, AttributeError, OSError):  # RUSAGE_THREAD is Linux's
        return None
    return usage.ru_nvcsw + usage.ru_nivcsw


def steps_for_window(step: Callable[[], None], synchronize: Callable[[], None], window_seconds: float,
                     clock: Callable[[], float] = time.perf_counter) -> int:
    """How many steps fill ``window_seconds``, from one timed run of steps at least a tenth that long."""
    count, start = 0, clock()
    while clock() - start < window_seconds / 10 or count < 3:
        step()
        count += 1
    synchronize()
    per_step = (clock() - start) / count
    return max(3, round(window_seconds / per_step))


def alternate_pairs(plain: Callable[[], float], checked: Callable[[], float], repeats: int,
                    seconds: Optional[float] = None,
                    clock: Callable[[], float] = time.perf_counter) -> Tuple[List[float], List[float]]:
    """Pairs of (plain, checked) windows, which one runs first alternating from pair to pair.

    ``repeats`` pairs, or with ``seconds`` as many as fit in that time and
    at least ``MIN_PAIRS`` (the fewest ``median_interval`` gives an interval
    for). When to stop depends on the clock only, never on the ratios seen
    so far: stopping once an interval looked decided would make it lie.
    """
    plain_times: List[float] = []
    checked_times: List[float] = []
    began = clock()
    index = 0
    while (index < repeats if seconds is None else index < MIN_PAIRS or clock() - began < seconds):
        if index % 2 == 0:
            plain_times.append(plain())
            checked_times.append(checked())
        else:
            checked_times.append(checked())
            plain_times.append(plain())
        index += 1
    return plain_times, checked_times


# --- statistics ---------------------------------------------------------------------

MIN_PAIRS = 6  # with fewer, no order statistics hold the median at 95%


def median_interval(values: List[float], confidence: float = 0.95):
    """``(median, low, high, coverage)`` of ``values``; low/high None for fewer than 6 values.

    Distribution-free: ``[x(k), x(n+1-k)]`` of the sorted values, with the
    largest ``k`` whose binomial tail ``P(Binom(n, 1/2) < k)`` is at most
    ``(1 - confidence) / 2``; ``coverage`` is that interval's exact
    confidence (at least ``confidence``). It assumes only that the pairs are
    independent draws around one median, nothing about the noise's shape,
    which on a shared host is anything but normal.
    """
    ordered = sorted(values)
    n = len(ordered)
    median = statistics.median(ordered) if ordered else float("nan")
    tail = (1.0 - confidence) / 2.0
    k, outside = 0, 0.0  # outside: P(X < k), the mass beyond each end of [x(k), x(n+1-k)]
    while k < n:
        beyond = outside + math.comb(n, k) / 2.0 ** n  # P(X < k + 1)
        if beyond > tail:
            break
        k, outside = k + 1, beyond
    if k == 0:
        return median, None, None, None
    return median, ordered[k - 1], ordered[n - k], 1.0 - 2.0 * outside


def verdict(target: Optional[float], low: Optional[float], high: Optional[float]) -> str:
    """``met`` when the whole interval is within the target, ``over`` when all of it is above, else unresolved."""
    if target is None or low is None or high is None:
        return ""
    if high <= target:
        return "met"
    if low > target:
        return "over"
    return "unresolved"


# --- parent: every pair in a fresh process, one table -----------------------------------

TIGHT_TARGET = 1.05  # cells judged against this or less need the narrowest intervals


def cell_seconds(options: argparse.Namespace, target: Optional[float]) -> Optional[float]:
    """How long a paired cell runs pairs (None: ``--repeats`` pairs)."""
    if target is not None and target <= TIGHT_TARGET and options.tight_cell_seconds:
        return options.tight_cell_seconds
    return options.cell_seconds


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--modes", default=",".join(m.name for m in MODES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every mode this many times, each in a fresh process, interleaved; "
                             "the table takes the fastest round (noise only ever adds time)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per child process")
    parser.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--settle", type=float, default=0.2, metavar="SECONDS",
                        help="--paired: seconds of steps (after a gc) before every window, in both arms")
    parser.add_argument("--cell-seconds", type=float, default=None, metavar="SECONDS",
                        help="--paired: run pairs for this long per (workload, mode) instead of --repeats times")
    parser.add_argument("--tight-cell-seconds", type=float, default=None, metavar="SECONDS",
                        help="--paired: the same for cells with a target of 1.05x or less, where the interval "
                             "must be narrowest (default: --cell-seconds)")
    parser.add_argument("--window-seconds", type=float, default=None, metavar="SECONDS",
                        help="--paired: size every window in time, not --steps (a fast step gets more steps)")
    parser.add_argument("--paired", action="store_true",
                        help="torchlint modes: time windows with and without a session alternately in one process "
                             "and take the ratio there (see run_paired_child); other modes run as usual")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--paired-child", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if options.child:
        if options.paired_child:
            result = run_paired_child(options.child[0], options.child[1], options.steps, options.repeats,
                                      options.warmup, options.settle, options.cell_seconds, options.window_seconds)
        else:
            result = run_child(options.child[0], options.child[1], options.steps, options.repeats, options.warmup)
        print("RESULT " + json.dumps(result))
        return 0

    modes = [m for m in options.modes.split(",") if m]
    workloads = [w for w in options.workloads.split(",") if w]
    unknown = sorted(set(modes) - {m.name for m in MODES}) + sorted(set(workloads) - set(WORKLOADS))
    if unknown:
        print(f"unknown mode/workload: {', '.join(unknown)}", file=sys.stderr)
        return 2
    rounds: Dict[tuple, List[Dict[str, object]]] = {}
    for workload in workloads:
        # Rounds alternate the order, so no mode always runs first after the GPU idled.
        for mode in [m for r in range(options.rounds) for m in (modes if r % 2 == 0 else modes[::-1])]:
            command = [sys.executable, os.path.abspath(__file__), "--child", workload, mode,
                       "--steps", str(options.steps), "--repeats", str(options.repeats),
                       "--warmup", str(options.warmup)]
            seconds = None  # a time-boxed cell's seconds, which its timeout allows on top
            if options.paired and {m.name: m for m in MODES}[mode].is_paired():
                command += ["--paired-child", "--settle", str(options.settle)]
                seconds = cell_seconds(options, TARGETS.get((workload, mode)))
                if seconds:
                    command += ["--cell-seconds", str(seconds)]
                if options.window_seconds:
                    command += ["--window-seconds", str(options.window_seconds)]
            began = time.perf_counter()
            timeout = options.timeout + (seconds or 0.0)
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                rounds.setdefault((workload, mode), []).append(
                    {"workload": workload, "mode": mode, "error": f"timed out after {timeout:.0f}s"})
                continue
            line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("RESULT ")), None)
            if done.returncode != 0 or line is None:
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                rounds.setdefault((workload, mode), []).append({"workload": workload, "mode": mode, "error": tail[:160]})
                continue
            result = json.loads(line[len("RESULT "):])
            rounds.setdefault((workload, mode), []).append(result)
            print(f"  {workload:20s} {mode:12s} {result['ms_per_step']:.3f} ms/step"
                  f"  ({time.perf_counter() - began:.0f} s in its process)", file=sys.stderr, flush=True)

    results: List[Dict[str, object]] = []
    for (workload, mode), runs in rounds.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            results.append(runs[-1])
            continue
        best = dict(min(good, key=lambda r: r["ms_per_step"]))
        best["rounds_ms"] = [round(r["ms_per_step"], 4) for r in good]
        results.append(best)

    baselines = {r["workload"]: r["ms_per_step"] for r in results if r["mode"] == "baseline" and "error" not in r}
    print(f"{'workload':20s} {'mode':12s} {'ms/step':>9s} {'x base':>7s} {'pairwise [95% CI]':>22s} {'target':>7s}"
          f" {'verdict':>10s}  notes{'  (fastest of ' + str(options.rounds) + ' rounds)' if options.rounds > 1 else ''}")
    for r in results:
        target = TARGETS.get((r["workload"], r["mode"]))
        target_text = f"{target:.2f}" if target else ""
        if "error" in r:
            print(f"{r['workload']:20s} {r['mode']:12s} {'-':>9s} {'-':>7s} {'':>22s} {target_text:>7s}"
                  f" {'':>10s}  error: {r['error']}")
            continue
        base = r.get("baseline_ms") if r.get("paired") else baselines.get(r["workload"])
        ratio = r["ms_per_step"] / base if base else float("nan")
        r["ratio"] = ratio
        pair_text, judged = "", ""
        if r.get("paired"):
            median, low, high, coverage = median_interval(
                [m / b for m, b in zip(r["all_ms"], r["all_baseline_ms"])])
            r["pairwise"] = {"median": median, "low": low, "high": high, "coverage": coverage}
            pair_text = f"{median:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None else " [too few]")
            judged = verdict(target, low, high)
        notes = ""
        if len(r.get("rounds_ms", [])) > 1:
            notes = "rounds " + "/".join(f"{v:.3f}" for v in r["rounds_ms"]) + "  "
        if r.get("paired"):
            notes += (f"{r['baseline_ms']:.3f} ms/step in the other arm, {len(r['all_ms'])} pairs"
                      f" of {r['steps']} steps  ")
            switches = r.get("switches_per_step")
            if switches:
                notes += f"main-thread switches/step {switches['baseline']:.2f} -> {switches['mode']:.2f}  "
            cpu = r.get("cpu_us_per_step")
            if cpu and r.get("cpu_pairwise"):
                median, low, high, _ = median_interval(r["cpu_pairwise"])
                notes += (f"main-thread CPU µs/step {cpu['baseline']:.0f} -> {cpu['mode']:.0f}, pairwise {median:.3f}"
                          + (f" [{low:.3f}, {high:.3f}]  " if low is not None else "  "))
        if r.get("allocations_per_step"):
            notes += f"{r['allocations_per_step']:.0f} allocs/step  "
        race = r.get("race") or {}
        if race.get("interception"):
            tap = race.get("native_tap") or {}
            notes += f"[{race['interception']}"
            if tap:
                notes += f": {tap.get('accesses_forwarded', 0)} of {tap.get('accesses_forwarded', 0) + tap.get('accesses_local', 0)} accesses forwarded"
                if r.get("steps_run"):
                    notes += (f", {tap.get('ops_seen', 0) / r['steps_run']:.0f} ops seen"
                              f" and {tap.get('ops_recorded', 0) / r['steps_run']:.0f} recorded per step")
            notes += "]  "
        if r.get("findings"):
            notes += f"{len(r['findings'])} finding(s): " + ", ".join(r["findings"][:3])
        print(f"{r['workload']:20s} {r['mode']:12s} {r['ms_per_step']:9.3f} {ratio:7.3f} {pair_text:>22s}"
              f" {target_text:>7s} {judged:>10s}  {notes}")
    if options.json:
        with open(options.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
