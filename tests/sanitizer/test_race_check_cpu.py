"""RaceCheck's torch integration, exercised on CPU tensors.

CUDA streams cannot exist here, so the tests point the check at CPU tensors
and give it a fake "current stream"; everything else (op classification from
schemas, byte ranges of views, allocation bookkeeping, collectives through a
one-process gloo group, reports and fixes) is the real code.
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer.races import check as races, hooks as race_hooks, report as race_report  # noqa: E402
from torchlint.sanitizer.findings import RACE  # noqa: E402
from torchlint.sanitizer.races.happens_before import (  # noqa: E402
    AccessRecord,
    AllocInfo,
    CollectiveStream,
    Race,
    SyncNote,
)

SIDE = 0x5151


class FakeStreams:
    """The current stream, for the check's Python side and (when it runs) the native tap."""

    def __init__(self, check=None):
        self.current = races.DEFAULT_STREAM
        self.check = check

    def __call__(self):
        return self.current

    def _set(self, stream):
        self.current = stream
        tap = getattr(self.check, "_tap", None)
        if tap is not None:
            tap.set_stream(stream)

    def on(self, stream):
        outer = self

        class _Ctx:
            def __enter__(self):
                self.previous = outer.current
                outer._set(stream)

            def __exit__(self, *exc):
                outer._set(self.previous)

        return _Ctx()


def make_check(interception: str) -> "races.RaceCheck":
    """An active check on CPU tensors, seeing ops through ``interception`` ("python" or "native")."""
    race_check = races.RaceCheck(None)
    race_check.start()
    streams = FakeStreams(race_check)
    race_check._device_filter = "cpu"
    race_check._want_cuda = False
    race_check._current_stream = streams
    race_check._stream_names[SIDE] = "side"
    race_check._tap_choice = interception
    race_check.activate("test")
    if interception == "native" and race_check._tap is None:
        race_check.stop()
        pytest.fail(f"the native tap did not load: {race_check._tap_unavailable}")
    race_check.streams = streams
    return race_check


@pytest.fixture(params=["python", "native"])
def check(request):
    race_check = make_check(request.param)
    try:
        yield race_check
    finally:
        race_check.stop()


def synced(check):
    """The engine, once it knows every launch the tap kept (as gpu_trace's callbacks do first)."""
    check._sync_tap()
    return check._engine


def fork(check):
    """side.wait_stream(default): the side stream may use what the default stream made."""
    synced(check).wait_stream(SIDE, races.DEFAULT_STREAM)


def _line_of(marker: str) -> int:
    with open(__file__) as handle:
        for number, text in enumerate(handle, start=1):
            if marker in text and "_line_of" not in text:
                return number
    raise AssertionError(marker)


def test_nothing_is_analysed_before_activation():
    race_check = races.RaceCheck(None)
    race_check.start()
    try:
        assert not race_check.active
        x = torch.ones(8)
        x.add_(1)
        assert race_check.findings() == []
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        assert _get_current_dispatch_mode() is None
    finally:
        race_check.stop()


def test_stop_restores_every_patched_global_and_is_idempotent():
    import torch.distributed as dist

    before = {
        "set_stream": torch.cuda.set_stream,
        "new": torch.cuda.Stream.__dict__["__new__"],
        "wait_stream": torch.cuda.Stream.wait_stream,
        "record": torch.cuda.Event.record,
        "wait": torch.cuda.Event.wait,
        "replay": torch.cuda.graphs.CUDAGraph.replay,
        "all_reduce": dist.all_reduce,
        "work_wait": dist.Work.wait,
    }
    race_check = races.RaceCheck(None)
    race_check.start()
    assert torch.cuda.set_stream is not before["set_stream"]
    assert dist.all_reduce is not before["all_reduce"]
    race_check._device_filter = "cpu"
    race_check._want_cuda = False
    race_check._current_stream = FakeStreams()
    race_check.activate("test")
    race_check.stop()
    race_check.stop()
    after = {
        "set_stream": torch.cuda.set_stream,
        "new": torch.cuda.Stream.__dict__["__new__"],
        "wait_stream": torch.cuda.Stream.wait_stream,
        "record": torch.cuda.Event.record,
        "wait": torch.cuda.Event.wait,
        "replay": torch.cuda.graphs.CUDAGraph.replay,
        "all_reduce": dist.all_reduce,
        "work_wait": dist.Work.wait,
    }
    assert after == before
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None
    assert race_hooks.active() is None


def test_classic_race_report_names_ops_streams_lines_and_fix(check):
    x = torch.zeros(64, 4)
    fork(check)
    with check.streams.on(SIDE):
        x.add_(1)  # MARK-side-write
    total = x.sum()  # MARK-default-read
    del total
    (finding,) = check.findings()
    assert finding.kind == RACE and finding.severity == "error"
    assert finding.file == __file__ and finding.line == _line_of("MARK-default-read")
    details = finding.details
    assert details["first"]["op"] == "add_" and details["first"]["mode"] == "write"
    assert details["first"]["stream"] == "stream `side`"
    assert details["first"]["line"] == _line_of("MARK-side-write")
    assert details["second"]["op"] == "sum" and details["second"]["mode"] == "read"
    assert details["second"]["stream"] == "the default stream"
    assert details["tensor"]["shape"] == [64, 4] and details["tensor"]["dtype"] == "float32"
    assert details["tensor"]["byte_ranges"]["overlap"] == [0, 64 * 4 * 4]
    assert details["tensor"]["name"] == "x"
    assert details["never_synchronized"] is True
    assert "never synchronized" in finding.message
    assert "torch.cuda.current_stream().wait_stream(side)" in finding.fix_hint
    assert details["allocation"]["file"].endswith(f"{os.path.basename(__file__)}:{_line_of('x = torch.zeros(64, 4)')}")


def test_wait_stream_makes_it_clean(check):
    x = torch.zeros(16)
    fork(check)
    with check.streams.on(SIDE):
        x.mul_(3)
    synced(check).wait_stream(races.DEFAULT_STREAM, SIDE)
    x.sum()
    assert check.findings() == []


def test_overlapping_views_at_other_offsets_race_and_disjoint_views_do_not(check):
    x = torch.zeros(1000)
    fork(check)
    with check.streams.on(SIDE):
        x[0:500].mul_(2)
    x[500:1000].sum()
    assert check.findings() == []
    x[250:750].sum()
    (finding,) = check.findings()
    ranges = finding.details["tensor"]["byte_ranges"]
    assert ranges["first"] == [0, 2000] and ranges["second"] == [1000, 3000] and ranges["overlap"] == [1000, 2000]
    assert finding.details["tensor"]["storage_offset"] == 250


def test_strided_views_use_their_bounding_box(check):
    x = torch.zeros(10, 10)
    fork(check)
    with check.streams.on(SIDE):
        x[:, 0].fill_(1)  # column: bytes 0 .. 9*40+4
    x[9, 1:].sum()  # row 9 from column 1: starts after the column's last element
    assert check.findings() == []
    x[9, 0:1].sum()
    assert len(check.findings()) == 1


def test_views_and_metadata_factories_touch_no_memory(check):
    x = torch.zeros(32)
    fork(check)
    with check.streams.on(SIDE):
        x.add_(1)
    x.view(4, 8)
    x.t() if x.dim() == 2 else x.unsqueeze(0)
    torch.empty_like(x)
    torch.zeros_like(x)  # writes its own output only
    assert check.findings() == []


def test_out_arguments_are_writes(check):
    a, b, out = torch.ones(8), torch.ones(8), torch.zeros(8)
    out.sum()
    fork(check)
    out.sum()
    with check.streams.on(SIDE):
        torch.add(a, b, out=out)
    (finding,) = check.findings()
    assert finding.details["second"]["argument"] == "out" and finding.details["second"]["mode"] == "write"


def test_repeats_are_counted_not_repeated(check):
    x = torch.zeros(8)
    fork(check)
    for _ in range(5):
        synced(check).wait_stream(SIDE, races.DEFAULT_STREAM)
        with check.streams.on(SIDE):
            x.add_(1)
        x.sum()
    (finding,) = check.findings()
    assert finding.count == 5


def test_an_alias_of_the_same_memory_is_the_same_allocation(check):
    x = torch.zeros(64)
    alias = torch.from_dlpack(x)  # another storage object over x's bytes
    assert alias.data_ptr() == x.data_ptr()
    fork(check)
    with check.streams.on(SIDE):
        x.add_(1)
    alias.sum()
    (finding,) = check.findings()
    assert finding.details["cause"] == "race"  # not "reuse": nothing was freed


def test_freed_memory_reused_without_record_stream_is_a_reuse_race(check):
    x = torch.zeros(256)
    x_base = x.data_ptr()
    fork(check)
    with check.streams.on(SIDE):
        x.sum()
    # The caching allocator would hand these bytes out again; simulate its free.
    race_hooks.set_active(check)
    check._allocs.pop(x_base, None)
    check._engine.free(x_base)
    del x
    # The next owner, y, lands where x was (what the CUDA allocator does on the
    # same stream). Fed to the engine directly: a real torch.zeros here would get
    # the bytes from malloc only sometimes, and then report the same race twice.
    alloc = check._engine.alloc(x_base, x_base + 1024, races.DEFAULT_STREAM, (("y.py", 1, "f"),), "y")
    check._engine.launch(races.DEFAULT_STREAM, [(x_base, x_base + 1024, True, "self", None, alloc, None, None)], "zero_", (("y.py", 2, "f"),))
    (finding,) = check.findings()
    assert finding.details["cause"] == "reuse"
    assert "record_stream" in finding.fix_hint
    assert "previous_owner" in finding.details


def test_record_stream_op_is_a_pledge(check):
    x = torch.zeros(256)
    base = x.data_ptr()
    fork(check)
    with check.streams.on(SIDE):
        x.sum()
    check._stream_key = lambda stream: SIDE
    # aten::record_stream has no CPU kernel: hand the op's arguments over directly.
    check._record_stream((x, object()), {})
    check._engine.free(base)
    alloc = check._engine.alloc(base, base + 1024, races.DEFAULT_STREAM, None, "y")
    check._engine.launch(races.DEFAULT_STREAM, [(base, base + 1024, True, "self", None, alloc, None, None)], "zero_")
    assert check.findings() == []


@pytest.fixture
def gloo_group(tmp_path):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("gloo not available")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist
    finally:
        dist.destroy_process_group()


def test_async_collective_used_before_wait_races(check, gloo_group):
    dist = gloo_group
    t = torch.ones(16)
    work = dist.all_reduce(t, async_op=True)
    t.mul_(2)  # MARK-before-wait
    work.wait()
    (finding,) = check.findings()
    assert finding.details["first"]["op"] == "all_reduce"
    assert finding.details["first"]["via"] == "collective"
    assert finding.line == _line_of("MARK-before-wait")
    assert "work.wait()" in finding.fix_hint


def test_async_collective_after_wait_is_clean(check, gloo_group):
    dist = gloo_group
    t = torch.ones(16)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    t.mul_(2)
    dist.all_reduce(t)  # synchronous
    t.add_(1)
    assert check.findings() == []


# -- report text for each kind of race ------------------------------------------------


def _record(stream, seq, write, op, site, alloc=None, via=None, index=0):
    return AccessRecord(stream, seq, write, 0, 64, op, "self", site, None, alloc, via, index)


SITE_A = (("/u/train.py", 10, "loop"),)
SITE_B = (("/u/train.py", 20, "loop"),)


def test_fix_for_a_collective_says_wait_on_the_work():
    race = Race(_record(CollectiveStream("default"), 3, True, "all_reduce", SITE_A, via=("collective", 1)),
                _record(0, 4, False, "mul", SITE_B), (0, 64), "race", None)
    assert "work.wait()" in race_report.fix_hint(race, {}, {})


def test_fix_for_an_early_event_says_record_after_the_write():
    early = SyncNote("event", 0, SIDE, 1, (("/u/train.py", 30, "loop"),), SIDE, (("/u/train.py", 5, "loop"),), 9)
    race = Race(_record(SIDE, 2, True, "copy_", SITE_A), _record(0, 4, False, "add", SITE_B), (0, 64), "race", early, early)
    text = race_report.fix_hint(race, {SIDE: "copy_stream"}, {})
    assert "/u/train.py:5" in text and "event.record(copy_stream)" in text and "/u/train.py:10" in text
    assert "last synchronized by an event wait at /u/train.py:30" in race_report.describe_sync(race, {SIDE: "copy_stream"})


def test_fix_for_a_graph_replay_names_the_replay():
    race = Race(_record(SIDE, 2, True, "mul", SITE_A, via=("graph replay", (("/u/g.py", 7, "f"),))),
                _record(0, 4, False, "sum", SITE_B), (0, 64), "race", None)
    text = race_report.fix_hint(race, {SIDE: "graph_stream"}, {})
    assert "graph.replay()" in text and "/u/g.py:7" in text
    assert "torch.cuda.current_stream().wait_stream(graph_stream)" in text


def test_fix_for_reuse_names_record_stream_with_the_users_names():
    old = AllocInfo(0x1000, 0x2000, 0, SITE_A, "", 1)
    new = AllocInfo(0x1000, 0x1800, 0, SITE_B, "", 2)
    race = Race(_record(SIDE, 2, False, "sum", SITE_A, alloc=old), _record(0, 4, True, "zero_", SITE_B, alloc=new),
                (0, 64), "reuse", None)
    text = race_report.fix_hint(race, {SIDE: "side"}, {0x1000: "batch"})
    assert "batch.record_stream(side)" in text


def test_finding_round_trips_through_json():
    from torchlint.sanitizer.findings import Finding

    race = Race(_record(SIDE, 2, True, "copy_", SITE_A), _record(0, 4, False, "add", SITE_B), (0, 64), "race", None)
    finding = race_report.build_finding(race, {SIDE: "side"}, {}, {})
    assert Finding.from_json(finding.to_json()).to_json() == finding.to_json()
    assert finding.file == "/u/train.py" and finding.line == 20


def test_scanning_a_user_frame_for_names_does_not_keep_its_locals_alive():
    import weakref

    x = torch.zeros(4)
    ref = weakref.ref(x)
    names = [name for name, _ in race_report._scope_items(sys._getframe())]
    assert "x" in names
    del x
    assert ref() is None  # a cached f_locals would hold it (and change what the allocator reuses)


BACKEND = 0x6262  # a stream the collective backend takes from the pool (gloo copies CUDA tensors through one)


class _Work:
    def wait(self):
        return True


def test_a_collective_backends_own_stream_is_left_out_under_the_native_tap():
    check = make_check("native")
    try:
        x = torch.ones(64)

        def backend_call():
            with check.streams.on(BACKEND):
                x.add_(0)  # the backend copies the tensor in, on its own stream
            return _Work()

        check.collective("all_reduce", [x], [x], None, True, backend_call)
        with check.streams.on(BACKEND):
            x.mul_(1)  # and out again later, on its worker thread
        assert check.findings() == []
        assert BACKEND in check._internal_streams
    finally:
        check.stop()


def test_a_program_stream_used_inside_a_collective_is_still_checked():
    check = make_check("native")
    try:
        check._user_streams.add(SIDE)
        x = torch.ones(64)

        def call():
            with check.streams.on(SIDE):
                x.add_(1)  # the program's own stream: not the backend's
            return _Work()

        check.collective("all_reduce", [x], [x], None, True, call)
        check._sync_tap()
        assert check.findings(), "the side-stream write races with the modelled collective"
        assert SIDE not in check._internal_streams
    finally:
        check.stop()


def test_gpu_trace_events_order_the_streams_through_the_callbacks(check):
    # What gpu_trace hands the check for side.record(event) + default.wait(event): the
    # callbacks first bring the engine up to date with the tap's launches.
    x = torch.zeros(16)
    fork(check)
    with check.streams.on(SIDE):
        x.mul_(3)
    race_hooks._trace_event_record(0xE1, SIDE)
    race_hooks._trace_event_wait(0xE1, races.DEFAULT_STREAM)
    x.sum()
    assert check.findings() == []


def test_a_gpu_trace_device_sync_orders_everything_before_it(check):
    x = torch.zeros(16)
    fork(check)
    with check.streams.on(SIDE):
        x.mul_(3)
    race_hooks._trace_device_sync()
    x.sum()
    assert check.findings() == []


def test_a_failure_in_a_gpu_trace_callback_is_the_checks_internal_error(check, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("engine broke")

    monkeypatch.setattr(check._engine, "stream_sync", broken)
    race_hooks._trace_stream_sync(SIDE)  # never raises into torch's C++ caller
    assert "stream_sync" in str(check.summary().get("internal_errors"))
    with pytest.warns(UserWarning, match="internal error.*stream_sync: RuntimeError: engine broke"):
        check.stop()
