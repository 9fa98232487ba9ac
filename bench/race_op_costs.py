"""What the race check adds to one op on a real GPU, by kind of op.

    python bench/race_op_costs.py [--ops 20000]

Each mode runs in a fresh process (gpu_trace and the tap are process-wide):
``base`` (no sanitizer), ``gpu-trace`` (torch's own gpu_trace switched on,
its memory registries calling a C builtin: what every allocation and free
costs when gpu_trace is routed through torch), ``race`` (a race session,
switched on by a second stream: the native tap and its gpu_trace filter) and
``race-no-sites`` (the same without the user's stack per op). Each times
three loops of ``--ops`` ops under 15 Python frames, best of 3, in µs per op:
an in-place op into an existing tensor (``torch.add(x, 1, out=y)``), an
allocation and free with no op recorded (``torch.empty``), and an
out-of-place op that allocates its result (``x + 1``). The parent prints the
table and each mode's extra cost over ``base``.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODES = ("base", "gpu-trace", "race", "race-no-sites")
LOOPS = ("in-place op", "alloc+free", "out-of-place op")


def child(mode: str, ops: int) -> dict:
    import importlib

    import torch

    x = torch.randn(256, device="cuda")
    y = torch.empty_like(x)
    session = None
    if mode in ("race", "race-no-sites"):
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        if mode == "race-no-sites":
            from torchlint.sanitizer.races import ops as race_ops

            race_ops.bind_tracebacks = lambda torch: None
        from torchlint.sanitizer import SanitizerSession

        session = SanitizerSession(checks={"race"})
        session.start()
        torch.cuda.Stream()  # a second stream switches the analysis on
    elif mode == "gpu-trace":
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from torchlint.sanitizer.races.hooks import _MEMORY_REGISTRIES

        trace = importlib.import_module("torch.cuda._gpu_trace")
        for name in _MEMORY_REGISTRIES:
            getattr(trace, name).fire_callbacks = id
        torch._C._activate_gpu_trace()

    def deep(n, function):
        return function() if n == 0 else deep(n - 1, function)

    def in_place():
        for _ in range(ops):
            torch.add(x, 1, out=y)

    def alloc_free():
        for _ in range(ops):
            torch.empty(256, device="cuda")

    def out_of_place():
        for _ in range(ops):
            x + 1

    result = {}
    for name, loop in zip(LOOPS, (in_place, alloc_free, out_of_place)):
        best = float("inf")
        for _ in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            deep(15, loop)
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / ops * 1e6)
        result[name] = best
    if session is not None:
        result["gpu_trace"] = (session.summaries().get("race") or {}).get("gpu_trace")
        session.stop()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=20000)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print("RESULT " + json.dumps(child(options.child, options.ops)))
        return 0
    results = {}
    for mode in MODES:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--ops", str(options.ops)],
                              capture_output=True, text=True, timeout=300)
        line = next((l for l in reversed(done.stdout.splitlines()) if l.startswith("RESULT ")), None)
        if line is None:
            print(f"{mode}: failed: {(done.stderr.strip().splitlines() or ['no output'])[-1]}", file=sys.stderr)
            continue
        results[mode] = json.loads(line[len("RESULT "):])
    base = results.get("base", {})
    print(f"{'mode':14s} " + " ".join(f"{loop:>24s}" for loop in LOOPS) + "  (µs per op; + over base)")
    for mode, row in results.items():
        cells = []
        for loop in LOOPS:
            extra = f" ({row[loop] - base[loop]:+.2f})" if base and mode != "base" else ""
            cells.append(f"{row[loop]:.3f}{extra}".rjust(24))
        note = f"  gpu_trace: {row['gpu_trace']}" if row.get("gpu_trace") else ""
        print(f"{mode:14s} " + " ".join(cells) + note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
