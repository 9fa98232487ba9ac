"""The same findings on every run: a racy and a correct program, 20 times each, on an idle and a busy GPU.

The racy program is the CSAN documentation's example; its tiny ``rand``
usually finishes before the side stream exists on an idle GPU and usually
has not on a busy one. Findings must not depend on which. The correct
programs synchronize the host (three ways) before the side stream touches a
tensor written earlier. Both interceptions (the native tap and the
dispatch-mode fallback) are checked.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

from torchlint.sanitizer.races import check as races  # noqa: E402

RUNS = 20

_HOG = """
import sys, time, torch
x = torch.randn(8192, 8192, device="cuda")
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    for _ in range(20):
        x = (x @ x).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


@pytest.fixture(params=["idle", "busy"], scope="module")
def gpu_load(request):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    if request.param == "idle":
        yield "idle"
        return
    hog = subprocess.Popen([sys.executable, "-c", _HOG, "300"], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "ready"
        time.sleep(0.5)
        yield "busy"
    finally:
        hog.kill()
        hog.wait()


def csan_example():
    a = torch.rand(4, 2, device="cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.mul(a, 5, out=a)


def synchronize_first():
    a = torch.rand(4, 2, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.mul(a, 5, out=a)


def item_first():
    a = torch.rand(4, 2, device="cuda")
    a.sum().item()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.mul(a, 5, out=a)


def event_synchronize_first():
    a = torch.rand(4, 2, device="cuda")
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.mul(a, 5, out=a)


def _signature(program, interception):
    check = races.RaceCheck(None)
    check._tap_choice = interception
    check.start()
    try:
        program()
        torch.cuda.synchronize()
    finally:
        check.stop()
    return tuple(
        (f.line, f.details["first"]["op"], f.details["second"]["op"], f.details["second"]["mode"], f.count)
        for f in check.findings()
    )


@pytest.mark.parametrize("interception", ["native", "python"])
@pytest.mark.parametrize(
    "program, racy",
    [(csan_example, True), (synchronize_first, False), (item_first, False), (event_synchronize_first, False)],
    ids=["csan-example", "synchronize", "item", "event-synchronize"],
)
def test_findings_do_not_depend_on_timing(gpu_load, program, racy, interception):
    signatures = {_signature(program, interception) for _ in range(RUNS)}
    assert len(signatures) == 1, signatures
    (signature,) = signatures
    assert bool(signature) is racy, signature


def _native_check():
    check = races.RaceCheck(None)
    check._tap_choice = "native"
    return check


def test_under_the_native_tap_host_syncs_cost_no_snapshot(monkeypatch):
    """The tap's gpu_trace filter keeps the ledger in C++: one allocator snapshot, at activation."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    snapshots = []
    real_snapshot = torch.cuda.memory_snapshot
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda *a, **k: snapshots.append(1) or real_snapshot(*a, **k))
    check = _native_check()
    check.start()
    try:
        if not check.summary().get("gpu_trace", "").startswith("filtered: allocations"):
            pytest.skip(f"the tap has no gpu_trace filter here: {check.summary()}")
        x = torch.ones(8, device="cuda")
        for _ in range(20):
            (x * 2).sum().item()
        assert snapshots == []
        csan_example()
        torch.cuda.synchronize()
        assert snapshots == [1]
    finally:
        check.stop()
    assert check.summary()["host_syncs_before_activation"] >= 21
    assert len(check.findings()) == 1


def test_under_the_native_tap_a_block_reused_after_the_last_sync_is_unfinished():
    """Freed and handed out again (same address, same size) after the sync: written by unfinished work."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    check = _native_check()
    check.start()
    try:
        if not check.summary().get("gpu_trace", "").startswith("filtered: allocations"):
            pytest.skip("the tap has no gpu_trace filter here")
        a = torch.rand(4, 2, device="cuda")
        address = a.data_ptr()
        torch.cuda.synchronize()
        del a
        b = torch.rand(4, 2, device="cuda")
        if b.data_ptr() != address:
            pytest.skip("the allocator did not hand the same block out again")
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.mul(b, 5, out=b)
        torch.cuda.synchronize()
    finally:
        check.stop()
    findings = check.findings()
    assert len(findings) == 1
    assert findings[0].details["first"]["op"] == "work issued before the race check switched on, after the last host sync"
