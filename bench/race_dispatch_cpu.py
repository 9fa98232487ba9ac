"""CPU micro-benchmark of the race check's per-op cost on the two-stream prefetch workload.

    python bench/race_dispatch_cpu.py [--steps 40] [--repeats 5] [--width 64] [--batch 8]
                                      [--compare REV] [--workloads prefetch,launch-bound]

The GPU workload of ``bench/sanitizer_overhead.py`` (``prefetch``: 4x Linear +
ReLU, AdamW foreach, the next batch copied on a side stream, ``wait_stream``
both ways, ``record_stream``) is rebuilt on CPU tensors with the small sizes
given here, so the step is dominated by dispatch and by the check's Python
work rather than by arithmetic. The check runs as the CPU tests run it
(``tests/sanitizer/test_race_check_cpu.py``): pointed at CPU tensors, with a
fake current stream. What the GPU would feed it through other paths is fed
explicitly, with the same code the GPU path runs:

* the two ``wait_stream`` calls: the wrapper's stream naming and site, then
  gpu_trace's event-record and event-wait callbacks;
* ``torch.cuda.stream(side)``: ``set_stream``'s naming on enter and exit;
* ``inputs.record_stream(...)``: the check's ``record_stream`` handler
  (``aten::record_stream`` has no CPU kernel);
* frees: after each step, gpu_trace's deallocation callback for every block
  the check saw that is not held across steps (parameters, optimizer state,
  batches), as the caching allocator reports them on the GPU.

Modes, each in a fresh process: ``baseline`` (no check), ``noop-mode`` (an
empty ``TorchDispatchMode``: the floor any dispatch-mode checker pays),
``race`` (the check, active, seeing ops through its dispatch mode),
``race-native`` (the same through the native tap), and ``race-idle`` on the single-stream
``launch-bound`` workload (the check started, never activated).

``--compare REV`` also runs the ``race`` modes with the ``sanitizer/`` folder
of git revision REV (extracted to a temporary folder), so one run prints the
before/after figures side by side: microseconds per step, per dispatched op
and per tensor argument, and the check's own cost (race minus noop-mode).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIDE = 0x5151  # the fake side stream's handle
EVENT = 0xE0E0


def _load_sanitizer(folder: Optional[str]):
    """Import torchlint.sanitizer, from ``folder`` instead of the checkout when given."""
    if folder:
        import torchlint  # noqa: F401  (the parent package, from the checkout)

        spec = importlib.util.spec_from_file_location(
            "torchlint.sanitizer", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["torchlint.sanitizer"] = module
        spec.loader.exec_module(module)
    try:  # the sync/ memory/ races/ packages
        return importlib.import_module("torchlint.sanitizer.races.check")
    except ImportError:  # a revision before them: races.py
        return importlib.import_module("torchlint.sanitizer.races")


def _hooks_of(races):
    """The module holding the gpu_trace callbacks, and the long-site capture, in this revision or an older one."""
    package = races.__name__.rsplit(".", 1)[0]
    for hooks_name, ops_name in ((".hooks", ".ops"), (".race_hooks", ".race_ops")):
        try:
            hooks = importlib.import_module(package + hooks_name)
            ops = importlib.import_module(package + ops_name)
            return hooks, ops.capture_long_site
        except ImportError:
            continue
    return races, races._long_site  # before races.py was split


def _call(check, new: str, old: str, *args):
    """A RaceCheck method by its sink name, or by its name in a revision before the sink."""
    method = getattr(check, new, None) or getattr(check, old)
    return method(*args)


class FakeStream:
    """Stands in for a torch.cuda.Stream: what the check reads of one is ``cuda_stream``."""

    def __init__(self, handle: int):
        self.cuda_stream = handle


class Current:
    def __init__(self):
        self.stream = 0

    def __call__(self):
        return self.stream


def build(torch, races, check, workload: str, width: int, batch: int):
    """The step function and the tensors held across steps (their blocks are never freed)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    host = [torch.randn(batch, width) for _ in range(2)]
    state: Dict[str, object] = {"i": 0, "next": None}
    current = check._current_stream if check is not None else None
    default_stream, side_stream = FakeStream(0), FakeStream(SIDE)
    hooks, long_site = _hooks_of(races)

    def wait_stream(waiter, waitee):
        # What Stream.wait_stream's wrapper and gpu_trace's callbacks do on the GPU.
        if check is None:
            return
        _call(check, "name_stream", "_name_stream", waiter)
        _call(check, "name_stream", "_name_stream", waitee)
        hooks._LOCAL.hint = ("wait_stream", long_site())
        try:
            hooks._trace_event_record(EVENT, waitee.cuda_stream)
            hooks._trace_event_wait(EVENT, waiter.cuda_stream)
        finally:
            hooks._LOCAL.hint = None

    def on_side(function):
        if check is None:
            return function()
        _call(check, "name_stream", "_name_stream", side_stream)  # set_stream(side) on entering torch.cuda.stream(side)
        current.stream = SIDE
        tap = getattr(check, "_tap", None)
        if tap is not None:
            tap.set_stream(SIDE)
        try:
            return function()
        finally:
            _call(check, "name_stream", "_name_stream", default_stream)  # set_stream(previous) on exit
            current.stream = 0
            if tap is not None:
                tap.set_stream(0)

    def load():
        wait_stream(side_stream, default_stream)
        state["next"] = on_side(lambda: host[state["i"] % 2].clone())
        state["i"] += 1

    def persistent() -> set:
        held = [p for p in model.parameters()] + host
        for per_param in optimizer.state.values():
            held += [v for v in per_param.values() if isinstance(v, torch.Tensor)]
        if state["next"] is not None:
            held.append(state["next"])
        return {t.data_ptr() - t.storage_offset() * t.element_size() for t in held}

    held: Dict[str, set] = {}

    def free_temporaries():
        if check is None or check._engine is None:
            return
        # Parameters and optimizer state keep their storage: computed once (the
        # optimizer's state exists after the first step), the batch each step.
        if not held and optimizer.state:
            held["bases"] = persistent()
        nxt = state["next"]
        keep = held.get("bases") or persistent()
        keep = keep | {nxt.data_ptr() - nxt.storage_offset() * nxt.element_size()}
        for base in [b for b in check._allocs if b not in keep]:
            hooks._trace_free(base)

    inputs_fixed = host[0]

    if workload == "prefetch":
        load()

        def step() -> None:
            wait_stream(default_stream, side_stream)
            inputs = state["next"]
            if check is not None:
                check._record_stream((inputs, default_stream), {})
            load()
            loss = model(inputs).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            free_temporaries()

    else:  # launch-bound: one stream

        def step() -> None:
            loss = model(inputs_fixed).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def run_child(mode: str, workload: str, folder: Optional[str], steps: int, repeats: int, warmup: int,
              width: int, batch: int) -> Dict[str, object]:
    import torch

    torch.set_num_threads(1)
    races = _load_sanitizer(folder)
    check = None
    counter = {"ops": 0, "tensors": 0}

    def count(func, args, kwargs):
        counter["ops"] += 1
        for value in list(args) + list((kwargs or {}).values()):
            if isinstance(value, torch.Tensor):
                counter["tensors"] += 1
            elif isinstance(value, (list, tuple)):
                counter["tensors"] += sum(isinstance(v, torch.Tensor) for v in value)

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountingMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            count(func, args, kwargs)
            return func(*args, **(kwargs or {}))

    class NoopMode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    mode_object = None
    if mode in ("race", "race-idle", "race-native"):
        check = races.RaceCheck(None)
        check._tap_choice = "native" if mode == "race-native" else "python"
        check.start()
        check._device_filter = "cpu"
        check._want_cuda = False
        check._current_stream = Current()
        check._stream_names[SIDE] = "copy_stream"
        if mode in ("race", "race-native"):
            _call(check, "activate", "_activate", "a CUDA stream was created")
    elif mode == "noop-mode":
        mode_object = NoopMode()
        mode_object.__enter__()
    step = build(torch, races, check, workload, width, batch)
    try:
        for _ in range(warmup):
            step()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(steps):
                step()
            times.append((time.perf_counter() - start) * 1e6 / steps)
    finally:
        if mode_object is not None:
            mode_object.__exit__(None, None, None)
    races_found = len(check.findings()) if check is not None else 0
    errors = (list(check.errors.messages) if hasattr(check, "errors") else list(check._errors)) if check is not None else []
    if check is not None:
        check.stop()
    # Ops and tensor arguments per step, counted in a separate pass (not timed).
    with CountingMode():
        step()
    counter = {"ops": 0, "tensors": 0}
    with CountingMode():
        step()
    return {"mode": mode, "workload": workload, "us_per_step": statistics.median(times), "all_us": times,
            "ops": counter["ops"], "tensors": counter["tensors"], "races": races_found, "errors": errors}


def _extract(rev: str) -> str:
    folder = tempfile.mkdtemp(prefix="race_bench_")
    archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "sanitizer"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    return folder


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--compare", default=None, metavar="REV", help="also run the race modes with REV's sanitizer/")
    parser.add_argument("--rounds", type=int, default=1, help="fresh processes per configuration; fastest kept")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "WORKLOAD", "FOLDER"), help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if options.child:
        mode, workload, folder = options.child
        result = run_child(mode, workload, folder if folder != "-" else None, options.steps, options.repeats,
                           options.warmup, options.width, options.batch)
        print("RESULT " + json.dumps(result))
        return 0

    implementations = [("now", "-")]
    extracted = None
    if options.compare:
        extracted = _extract(options.compare)
        implementations.insert(0, (options.compare, os.path.join(extracted, "sanitizer")))
    plan = [("prefetch", "baseline", None), ("prefetch", "noop-mode", None)]
    plan += [("prefetch", "race", impl) for impl in implementations]
    plan += [("prefetch", "race-native", ("now", "-"))]
    plan += [("launch-bound", "baseline", None)]
    plan += [("launch-bound", "race-idle", impl) for impl in implementations]
    results: Dict[tuple, Dict[str, object]] = {}
    try:
        for _ in range(options.rounds):
            for workload, mode, impl in plan:
                folder = impl[1] if impl else "-"
                command = [sys.executable, os.path.abspath(__file__), "--child", mode, workload, folder,
                           "--steps", str(options.steps), "--repeats", str(options.repeats),
                           "--warmup", str(options.warmup), "--width", str(options.width),
                           "--batch", str(options.batch)]
                done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
                line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("RESULT ")), None)
                if done.returncode != 0 or line is None:
                    print(f"{workload} {mode} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                    return 1
                result = json.loads(line[len("RESULT "):])
                key = (workload, mode, impl[0] if impl else "")
                if key not in results or result["us_per_step"] < results[key]["us_per_step"]:
                    results[key] = result
    finally:
        if extracted:
            shutil.rmtree(extracted, ignore_errors=True)

    base = {w: results[(w, "baseline", "")]["us_per_step"] for w in ("prefetch", "launch-bound")}
    noop = results[("prefetch", "noop-mode", "")]["us_per_step"]
    print(f"CPU, width {options.width}, batch {options.batch}, {options.steps} steps x {options.repeats} "
          f"(median), fastest of {options.rounds} round(s)")
    print(f"{'workload':13s} {'mode':10s} {'impl':8s} {'us/step':>9s} {'x base':>7s} {'ops':>5s} {'tensors':>7s} "
          f"{'check us/step':>13s} {'us/op':>6s} {'us/tensor':>9s}  notes")
    overhead: Dict[str, float] = {}
    for (workload, mode, impl), r in results.items():
        us = r["us_per_step"]
        extra = ""
        own = per_op = per_tensor = ""
        if mode == "race":
            cost = us - noop
            overhead[impl] = cost
            own = f"{cost:13.1f}"
            per_op = f"{cost / r['ops']:6.2f}"
            per_tensor = f"{cost / max(1, r['tensors']):9.2f}"
        elif mode in ("race-idle", "race-native"):
            own = f"{us - base[workload]:13.1f}"
        else:
            own = f"{'':13s}"
        if r["races"]:
            extra += f"{r['races']} race finding(s)! "
        if r["errors"]:
            extra += "internal errors: " + "; ".join(r["errors"][:2])
        print(f"{workload:13s} {mode:10s} {impl or '-':8s} {us:9.1f} {us / base[workload]:7.3f} {r['ops']:5d} "
              f"{r['tensors']:7d} {own:>13s} {per_op:>6s} {per_tensor:>9s}  {extra}")
    print(f"noop dispatch mode alone: {noop - base['prefetch']:.1f} us/step "
          f"({noop / base['prefetch']:.3f}x baseline)")
    if options.compare and options.compare in overhead and "now" in overhead:
        before, after = overhead[options.compare], overhead["now"]
        print(f"check's own cost (race - noop-mode): {options.compare} {before:.1f} us/step -> now {after:.1f} "
              f"us/step: {before / after:.2f}x less")
    return 0


if __name__ == "__main__":
    sys.exit(main())
