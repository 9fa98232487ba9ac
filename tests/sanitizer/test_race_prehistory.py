"""Deterministic activation: what the race check decides about work issued before it switched on.

The ledger is plain Python; the check's use of it runs on CPU tensors with fake
streams and a fake allocator snapshot built from the tensors' real addresses,
so the decision is exercised end to end (engine, tap, reports) without a GPU.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer.races import check as races  # noqa: E402
from torchlint.sanitizer.races.prehistory import HostSyncLedger, live_blocks  # noqa: E402

from test_race_check_cpu import SIDE, FakeStreams  # noqa: E402


def _segment(tensors, stream=0, device=0):
    """A snapshot segment whose blocks are exactly these tensors' storages (contiguous or not)."""
    return [
        {
            "address": t.untyped_storage().data_ptr(),
            "device": device,
            "stream": stream,
            "blocks": [{"size": t.untyped_storage().nbytes(), "state": "active_allocated"}],
        }
        for t in tensors
    ]


def test_live_blocks_walks_each_segment_by_block_size():
    segments = [
        {
            "address": 0x1000,
            "device": 0,
            "stream": 7,
            "blocks": [
                {"size": 0x100, "state": "active_allocated"},
                {"size": 0x200, "state": "inactive"},
                {"size": 0x80, "state": "active_allocated"},
            ],
        }
    ]
    assert live_blocks(segments) == {(0, 7, 0x1000, 0x100), (0, 7, 0x1300, 0x80)}


def test_ledger_orders_what_was_live_at_the_last_sync_only():
    ledger = HostSyncLedger()
    first, second, third = (0, 0, 0x1000, 16), (0, 0, 0x2000, 16), (0, 0, 0x3000, 16)
    assert ledger.unfinished(frozenset({first})) == [first]  # no sync: nothing is known finished
    ledger.host_sync(frozenset({first}))
    ledger.host_sync(frozenset({first, second}))
    assert ledger.unfinished(frozenset({first, second, third})) == [third]
    assert ledger.syncs == 2


class _Snapshot:
    """A fake ``torch.cuda.memory_snapshot``: the live tensors, as the allocator would list them."""

    def __init__(self):
        self.tensors = []

    def __call__(self):
        return _segment(self.tensors)


def _pending_check(interception):
    """A started, not yet active check on CPU tensors, with a fake allocator snapshot."""
    check = races.RaceCheck(None)
    check.start()
    check._device_filter = "cpu"
    check._want_cuda = False
    streams = FakeStreams(check)
    check._current_stream = streams
    check._stream_names[SIDE] = "side"
    check._tap_choice = interception
    check._memory_snapshot = snapshot = _Snapshot()
    check.streams = streams
    return check, snapshot


def _activate(check):
    check.activate("a CUDA stream was created")
    if check._tap_choice == "native" and check._tap is None:
        pytest.fail(f"the native tap did not load: {check._tap_unavailable}")


@pytest.fixture(params=["python", "native"])
def interception(request):
    return request.param


def _side_stream_writes(check, *tensors):
    """Activate (a stream appeared), then write each tensor on the side stream; the findings."""
    _activate(check)
    with check.streams.on(SIDE):
        for tensor in tensors:
            torch.mul(tensor, 5, out=tensor)
    check._sync_tap()
    return check.findings()


def test_the_csan_documentation_example_is_found_whatever_the_gpu_finished(interception):
    # a = torch.rand(4, 2, device="cuda"); with torch.cuda.stream(torch.cuda.Stream()): torch.mul(a, 5, out=a)
    check, snapshot = _pending_check(interception)
    try:
        a = torch.rand(4, 2)
        snapshot.tensors.append(a)
        findings = _side_stream_writes(check, a)
        assert len(findings) == 1
        details = findings[0].details
        assert details["first"]["op"] == "work issued before the race check switched on"
        assert details["second"]["op"] == "mul"
        assert details["never_synchronized"]
    finally:
        check.stop()


def test_a_host_sync_before_the_side_stream_keeps_a_correct_program_clean(interception):
    check, snapshot = _pending_check(interception)
    try:
        a = torch.rand(4, 2)
        snapshot.tensors.append(a)
        check.host_synced()  # whichever sync: the wrappers and the warning hook all call this
        assert _side_stream_writes(check, a) == []
    finally:
        check.stop()


def test_a_tensor_made_after_the_last_sync_is_still_unfinished(interception):
    check, snapshot = _pending_check(interception)
    try:
        early = torch.rand(4, 2)
        snapshot.tensors.append(early)
        check.host_synced()
        late = torch.rand(4, 2)
        snapshot.tensors.append(late)
        findings = _side_stream_writes(check, early, late)
        assert len(findings) == 1
        assert findings[0].details["first"]["op"] == (
            "work issued before the race check switched on, after the last host sync"
        )
        overlap = findings[0].details["tensor"]["byte_ranges"]["overlap"]
        assert overlap == [0, late.nbytes]
        assert findings[0].details["tensor"]["storage_base"] == hex(late.data_ptr())
    finally:
        check.stop()


def test_a_side_stream_that_waits_is_clean(interception):
    check, snapshot = _pending_check(interception)
    try:
        a = torch.rand(4, 2)
        snapshot.tensors.append(a)
        _activate(check)
        check._sync_tap()
        check._engine.wait_stream(SIDE, races.DEFAULT_STREAM)
        with check.streams.on(SIDE):
            torch.mul(a, 5, out=a)
        check._sync_tap()
        assert check.findings() == []
    finally:
        check.stop()


def test_syncs_after_activation_are_left_to_the_engine():
    check, snapshot = _pending_check("python")
    try:
        _activate(check)
        check.host_synced()
        assert check._ledger.syncs == 0
    finally:
        check.stop()


def test_the_decision_is_the_same_on_every_run(interception):
    def run():
        check, snapshot = _pending_check(interception)
        try:
            kept = [torch.rand(16) for _ in range(3)]
            snapshot.tensors.extend(kept[:2])
            check.host_synced()
            snapshot.tensors.append(kept[2])
            _activate(check)
            with check.streams.on(SIDE):
                for tensor in kept:
                    tensor.add_(1)
            check._sync_tap()
            return [(f.details["first"]["op"], f.details["tensor"]["byte_ranges"]["overlap"]) for f in check.findings()]
        finally:
            check.stop()

    results = [run() for _ in range(5)]
    assert results[0] and all(result == results[0] for result in results)


def test_implicit_syncs_before_activation_are_recorded_and_not_shown_to_the_user():
    """.item() and friends reach the check as torch's sync-debug-mode warning, swallowed when only it asked."""
    import types
    import warnings

    from torchlint.sanitizer.patching import SYNC_WARNING

    modes = []
    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_sync_debug_mode=lambda: 0, set_sync_debug_mode=modes.append)
    )
    check, snapshot = _pending_check("python")
    real_torch, check._torch = check._torch, fake_torch
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("default")
            check._hooks.watch_implicit_syncs(fake_torch)
            a = torch.rand(4, 2)
            snapshot.tensors.append(a)
            for _ in range(2):  # the same line twice: the "always" filter lets both through
                warnings.warn(SYNC_WARNING + " (Triggered internally at fake.cpp:1.)", UserWarning)
            warnings.warn("an unrelated warning", UserWarning)
            check._hooks.unwatch_implicit_syncs()
        assert check._ledger.syncs == 2
        assert modes == ["warn", 0]  # switched on for the check, and back
        assert [str(w.message) for w in seen] == ["an unrelated warning"]
    finally:
        check._torch = real_torch
        check.stop()


# -- the native route: the tap's gpu_trace filter keeps the ledger in C++ ------------
#
# On CUDA torch calls the filter for every allocation, free and host sync; here
# the tests make those calls themselves (``_feed_trace_filter``), with the
# addresses of real CPU tensors, so the C++ ledger and the check's use of it run
# end to end.

def _filter_tap():
    import torch.cuda._gpu_trace  # noqa: F401  torch's interpreter forwards the syncs there, as on CUDA

    from torchlint.sanitizer.races import native_tap

    tap = native_tap.load(quiet=True)
    if not hasattr(tap, "track_allocations_since_sync"):
        pytest.skip("this torch's interpreter vtable differs: the tap was built without the filter")
    return tap


def test_the_filter_notes_blocks_handed_out_since_the_last_host_sync():
    tap = _filter_tap()
    tap.install_trace_filter(forward_memory=False)
    try:
        tap.track_allocations_since_sync()
        for address in (0x1000, 0x2000):
            tap._feed_trace_filter("allocation", address)
        tap._feed_trace_filter("stream_sync", 7)
        tap._feed_trace_filter("free", 0x2000)  # freed after the sync: nothing to forget
        for address in (0x3000, 0x4000):
            tap._feed_trace_filter("allocation", address)
        tap._feed_trace_filter("free", 0x4000)
        syncs, addresses = tap.take_allocations_since_sync()
        assert (syncs, sorted(addresses)) == (1, [0x3000])
        tap._feed_trace_filter("allocation", 0x5000)  # taken: tracking has stopped
        assert tap.take_allocations_since_sync() == (0, [])
    finally:
        tap.remove_trace_filter()


def _pending_check_with_native_ledger():
    check, snapshot = _pending_check("native")
    tap = _filter_tap()
    assert check._hooks.install_sync_ledger(tap)
    check._native_ledger = tap
    return check, snapshot, tap


def _allocated(tap, snapshot, tensor):
    snapshot.tensors.append(tensor)
    tap._feed_trace_filter("allocation", tensor.untyped_storage().data_ptr())
    return tensor


def test_native_ledger_finds_the_csan_documentation_example():
    check, snapshot, tap = _pending_check_with_native_ledger()
    try:
        a = _allocated(tap, snapshot, torch.rand(4, 2))
        findings = _side_stream_writes(check, a)
        assert len(findings) == 1
        assert findings[0].details["first"]["op"] == "work issued before the race check switched on"
    finally:
        check.stop()
    assert not tap.trace_filter_installed()


@pytest.mark.parametrize("sync", ["device_sync", "stream_sync", "event_sync"])
def test_native_ledger_a_host_sync_keeps_a_correct_program_clean(sync):
    check, snapshot, tap = _pending_check_with_native_ledger()
    try:
        a = _allocated(tap, snapshot, torch.rand(4, 2))
        tap._feed_trace_filter(sync, 1)
        assert _side_stream_writes(check, a) == []
        assert check.summary()["host_syncs_before_activation"] == 1
    finally:
        check.stop()


def test_native_ledger_a_host_sync_costs_no_snapshot():
    check, snapshot, tap = _pending_check_with_native_ledger()
    calls = []
    check._memory_snapshot = lambda: calls.append(1) or snapshot()
    try:
        for _ in range(3):
            check.host_synced()
        assert calls == []
        _activate(check)
        assert calls == [1]  # one, at activation
    finally:
        check.stop()


def test_native_ledger_a_block_reallocated_after_the_sync_is_unfinished():
    # The snapshot route cannot tell this block from the one live at the sync.
    check, snapshot, tap = _pending_check_with_native_ledger()
    try:
        a = _allocated(tap, snapshot, torch.rand(4, 2))
        tap._feed_trace_filter("device_sync")
        tap._feed_trace_filter("free", a.untyped_storage().data_ptr())
        tap._feed_trace_filter("allocation", a.untyped_storage().data_ptr())  # same address, same size
        findings = _side_stream_writes(check, a)
        assert len(findings) == 1
        assert findings[0].details["first"]["op"] == (
            "work issued before the race check switched on, after the last host sync"
        )
    finally:
        check.stop()


def test_native_ledger_replaced_gpu_trace_checks_nothing_from_before_and_says_so(monkeypatch):
    check, snapshot, tap = _pending_check_with_native_ledger()
    monkeypatch.setattr(tap, "trace_filter_intact", lambda: False)
    try:
        a = _allocated(tap, snapshot, torch.rand(4, 2))
        assert _side_stream_writes(check, a) == []
        assert any("gpu_trace was replaced" in note for note in check.notes)
    finally:
        check.notes.clear()
        check.stop()
