"""What each part of the memory check's step sample costs, in place and in a tight loop (needs a CUDA device).

The paired overhead bench (``sanitizer_overhead.py --modes memory-samples-x10``)
gives the cost of a whole step sample; this script splits it. The
launch-bound step of ``sanitizer_overhead.py`` runs, and once every
``--every`` steps (about one step sample's spacing) one part runs, timed
with ``perf_counter`` (wall) and ``thread_time`` (the main thread's CPU),
the parts taking turns. The same parts then run back to back on an idle
GPU. A part much dearer in place than in a loop is paying for where it runs
(cold caches, a driver round trip while kernels are queued), not for its
own work.

    python bench/memory_sample_parts.py --seconds 30
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parts(torch) -> Dict[str, Callable[[], object]]:
    """The calls a step sample makes, each on its own, plus a whole sample and an empty call (the floor)."""
    from torchlint.sanitizer.memory.allocator import TorchAllocatorSource
    from torchlint.sanitizer.memory.check import MemoryCheck

    source = TorchAllocatorSource(torch)
    _, total = source.mem_get_info()

    class Session:  # what MemoryCheck reads from its session
        in_warmup = False
        step_index = 0

    check = MemoryCheck(Session(), source=source, use_nvml=False, watch_interval_s=None)
    check.start()
    found: Dict[str, Callable[[], object]] = {
        "nothing": lambda: None,
        "raw counters (_cuda_memoryStats)": lambda: torch._C._cuda_memoryStats(0),
        "stats() (counters + AllocatorStats)": source.stats,
        "mem_get_info()": source.mem_get_info,
        "cap() (memory fraction)": lambda: source.cap(total),
        "is_initialized()": source.is_initialized,
        "a whole step sample": lambda: check._sample(0),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        found["nvmlDeviceGetMemoryInfo"] = lambda: pynvml.nvmlDeviceGetMemoryInfo(handle)
        found["nvmlDeviceGetUtilizationRates"] = lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)
    except Exception as error:  # no pynvml, no permission: the torch parts still run
        print(f"NVML parts left out: {error}", file=sys.stderr)
    return found


def timed(call: Callable[[], object]) -> Tuple[float, float]:
    """(wall µs, main-thread CPU µs) of one call."""
    cpu, wall = time.thread_time(), time.perf_counter()
    call()
    return (time.perf_counter() - wall) * 1e6, (time.thread_time() - cpu) * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the in-place part runs")
    parser.add_argument("--every", type=int, default=36, help="steps between two timed calls (a 50 ms sample)")
    parser.add_argument("--loop", type=int, default=200, help="calls per part in the tight loop")
    options = parser.parse_args(argv)

    import torch

    from sanitizer_overhead import launch_bound  # the same step the overhead bench times

    step = launch_bound(torch)
    for _ in range(20):
        step()
    torch.cuda.synchronize()
    calls = parts(torch)
    names = list(calls)
    in_place: Dict[str, List[Tuple[float, float]]] = {name: [] for name in names}
    began, index = time.perf_counter(), 0
    while time.perf_counter() - began < options.seconds:
        for _ in range(options.every):
            step()
        name = names[index % len(names)]
        in_place[name].append(timed(calls[name]))
        index += 1
    torch.cuda.synchronize()
    in_loop: Dict[str, List[Tuple[float, float]]] = {}
    for name in names:
        calls[name]()
        in_loop[name] = [timed(calls[name]) for _ in range(options.loop)]

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: median µs per call"
          f" (wall / main-thread CPU), one call every {options.every} launch-bound steps")
    print(f"{'part':40s} {'in place':>17s} {'calls':>6s} {'tight loop':>17s}")
    for name in names:
        here, loop = in_place[name], in_loop[name]
        if not here:
            continue
        print(f"{name:40s} {statistics.median(w for w, _ in here):8.1f} /{statistics.median(c for _, c in here):7.1f}"
              f" {len(here):6d} {statistics.median(w for w, _ in loop):8.1f} /{statistics.median(c for _, c in loop):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
