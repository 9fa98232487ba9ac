"""What the timeline's recording costs per event, next to a sanitizer session without it. CPU only.

    python bench/timeline_overhead.py [--events 200000]

Times, in one run, the hook calls the checks make per event (``step``,
``sync``, ``launches``; ``memory``, which the memory check's watcher thread
calls once per 20 ms look, with a changed and an unchanged allocator state)
and a session's step boundary with and without the timeline, and prints the
cost per call and its share of a 1 ms training step (the launch-bound
workload of bench/sanitizer_overhead.py runs at about 2 ms/step on an H100).
The GPU
ratios (sync+memory against no sanitizer) come from
``bench/sanitizer_overhead.py``.
"""
from __future__ import annotations

import argparse
import time

from torchlint.sanitizer.session import SanitizerSession
from torchlint.sanitizer.timeline import Timeline


def per_call_ns(function, events: int) -> float:
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        function(events)
        best = min(best, (time.perf_counter_ns() - start) / events)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200000)
    events = parser.parse_args().events

    def steps(n):
        timeline = Timeline(max_events=n)
        for index in range(n):
            timeline.step(index)

    def syncs(n):
        timeline = Timeline(max_events=n)
        for index in range(n):
            timeline.sync("item", "train.py", 12, 0.0001, "TL101", index)

    def memory_changed(n):
        timeline = Timeline()  # the default bound: rows merge in pairs every time it fills
        for index in range(n):
            timeline.memory(index, 2 << 30, 10, 0)

    def memory_unchanged(n):
        timeline = Timeline()
        for _ in range(n):
            timeline.memory(1 << 30, 2 << 30, 10, 0)

    def launches(n):
        timeline = Timeline(max_events=n)
        for _ in range(n // 4):
            timeline.launches(((7, "mul"), (7, "add"), (9, "sum"), (9, "copy_")))

    def session_steps(with_timeline):
        def run(n):
            session = SanitizerSession(checks=set())
            session.start()
            if not with_timeline:
                session.timeline = None
            for _ in range(n):
                session.step()
            session.stop()
        return run

    rows = [("Timeline.step", per_call_ns(steps, events)),
            ("Timeline.sync", per_call_ns(syncs, events)),
            ("Timeline.memory (changed)", per_call_ns(memory_changed, events)),
            ("Timeline.memory (unchanged)", per_call_ns(memory_unchanged, events)),
            ("Timeline.launches (per launch)", per_call_ns(launches, events))]
    without = per_call_ns(session_steps(False), events)
    with_timeline = per_call_ns(session_steps(True), events)
    print(f"{'hook':34} {'ns/call':>9} {'share of a 1 ms step':>22}")
    for name, ns in rows:
        print(f"{name:34} {ns:9.0f} {ns / 1e6:22.4%}")
    print(f"session step boundary: {without:.0f} ns without the timeline, {with_timeline:.0f} ns with it "
          f"(x{with_timeline / without:.2f}; +{(with_timeline - without) / 1e6:.4%} of a 1 ms step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
