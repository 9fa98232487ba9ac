"""The native tap's gpu_trace filter on a real GPU: events reach the check, allocations skip Python.

Each case runs in a fresh process: gpu_trace's state is process-wide.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

PROGRAM = textwrap.dedent(
    """
    import json, sys
    import torch
    import torch.cuda._gpu_trace as trace
    from torchlint.sanitizer.races import check as races

    seen = {"user_allocations": 0, "fired_allocations": 0}
    if sys.argv[1] == "user-listener":
        def count(pointer):
            seen["user_allocations"] += 1
        trace.register_callback_for_memory_allocation(count)

    registry = trace.MemoryAllocationCallbacks
    fire = registry.fire_callbacks
    def counting_fire(*args):
        seen["fired_allocations"] += 1
        return fire(*args)
    registry.fire_callbacks = counting_fire

    def allocate(n):
        for _ in range(n):
            torch.empty(1024, device="cuda")

    check = races.RaceCheck(None)
    check._tap_choice = "native"
    check.start()
    a = torch.rand(1 << 20, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.mul(a, 5, out=a)  # unordered after rand: a race, seen only through the streams' order
    torch.cuda.current_stream().wait_stream(side)  # an event, through gpu_trace
    a.add_(1)  # ordered after the side stream by the wait: no second race
    allocate(100)
    during = dict(seen)
    torch.cuda.synchronize()
    check.stop()
    allocate(100)
    print("RESULT " + json.dumps({
        "summary": {k: v for k, v in check.summary().items() if k in ("interception", "gpu_trace")},
        "races": [f.message.splitlines()[0] for f in check.findings()],
        "during": during, "after": dict(seen),
    }))
    """
)


def run(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_under_the_filter_allocations_cost_no_python_and_events_still_order_streams():
    result = run("alone")
    if not result["summary"].get("gpu_trace", "").startswith("filtered"):
        pytest.skip(f"the tap was built without the gpu_trace filter here: {result['summary']}")
    assert len(result["races"]) == 1, result
    assert result["during"]["fired_allocations"] == 0, result
    # After stop() gpu_trace is as it was before the session: off.
    assert result["after"]["fired_allocations"] == 0, result


def test_another_listener_still_gets_every_allocation():
    result = run("user-listener")
    if not result["summary"].get("gpu_trace", "").startswith("filtered"):
        pytest.skip(f"the tap was built without the gpu_trace filter here: {result['summary']}")
    assert len(result["races"]) == 1, result
    assert result["during"]["user_allocations"] >= 100, result
