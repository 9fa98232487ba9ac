"""The native tap's plumbing on CPU: choosing it, falling back, removing it, building it ahead."""
from __future__ import annotations

import subprocess
import sys
import types

import pytest

torch = pytest.importorskip("torch")

from test_race_check_cpu import SIDE, make_check, synced  # noqa: E402
from torchlint.sanitizer.races import check as races, native_tap  # noqa: E402


def _default_stream_writes_then_a_side_stream_read(check):
    x = torch.zeros(32)
    for _ in range(5):
        x.add_(torch.ones(32))
    with check.streams.on(SIDE):
        x.sum()


def test_the_tap_is_what_sees_the_ops_and_its_counters_reach_the_summary():
    check = make_check("native")
    try:
        _default_stream_writes_then_a_side_stream_read(check)
        summary = check.summary()
    finally:
        check.stop()
    assert summary["active"] and summary["interception"] == "native tap"
    tap = summary["native_tap"]
    assert tap["internal_errors"] == 0 and tap["callback_errors"] == 0
    # Default-stream accesses to x stay in the tap until the side stream reaches x.
    assert tap["accesses_local"] >= 10 and tap["flushes"] >= 1 and tap["accesses_forwarded"] >= 1
    assert check.summary()["interception"] == "native tap"  # still said after stop()


def test_stop_removes_the_tap():
    check = make_check("native")
    tap = check._tap
    check.stop()
    before = tap.stats()["ops_seen"]
    torch.ones(8).add_(1)
    assert tap.stats()["ops_seen"] == before
    assert check._tap is None


def test_without_the_tap_the_dispatch_mode_runs_and_a_note_says_why(monkeypatch):
    def unavailable(*args, **kwargs):
        raise native_tap.TapUnavailable("ninja is not installed (pip install ninja), needed to build it")

    monkeypatch.setattr(native_tap, "load", unavailable)
    check = make_check("auto")
    try:
        assert check._tap is None and check._hooks.dispatch_mode is not None
        summary = check.summary()
    finally:
        check.stop()
    assert summary["interception"] == "dispatch mode"
    assert "ninja is not installed" in summary["native_tap_unavailable"]
    assert any("native tap unavailable (ninja is not installed" in note for note in check.notes)


def test_the_environment_variable_chooses(monkeypatch):
    monkeypatch.setenv("TORCHLINT_RACE_TAP", "python")
    assert native_tap.choice() == "python"
    check = make_check(None)
    try:
        assert check._tap is None and check.summary()["interception"] == "dispatch mode"
        assert "native_tap_unavailable" not in check.summary()
    finally:
        check.stop()
    monkeypatch.setenv("TORCHLINT_RACE_TAP", "fast")
    with pytest.raises(native_tap.TapUnavailable, match="TORCHLINT_RACE_TAP='fast': expected one of auto, native, python"):
        native_tap.choice()


def test_a_failed_build_is_one_line_and_not_retried(monkeypatch, tmp_path):
    monkeypatch.setattr(native_tap, "_MODULE", None)
    monkeypatch.setattr(native_tap, "_FAILURE", None)
    monkeypatch.setenv("TORCHLINT_CACHE_DIR", str(tmp_path))
    from torch.utils import cpp_extension

    calls = []

    def broken_build(**kwargs):
        calls.append(kwargs)
        raise RuntimeError("Error building extension 'x'\nc++: fatal error: no input files\n")

    monkeypatch.setattr(cpp_extension, "load", broken_build)
    for _ in range(2):
        with pytest.raises(native_tap.TapUnavailable) as error:
            native_tap.load(quiet=True)
        assert str(error.value) == "build failed: Error building extension 'x'"
    # Once with the gpu_trace filter, once without it; then never again in this process.
    assert [c["extra_cflags"][-1] for c in calls] == ["-DTORCHLINT_TRACE_FILTER=1", "-DTORCHLINT_TRACE_FILTER=0"]
    assert calls[0]["build_directory"].startswith(str(tmp_path))
    assert "-DNDEBUG" in calls[0]["extra_cflags"]  # torch's RecordFunction layout depends on it
    # Both failed (no compiler, say): a new process tries both again, a compiler may be there by then.
    monkeypatch.setattr(native_tap, "_FAILURE", None)
    with pytest.raises(native_tap.TapUnavailable):
        native_tap.load(quiet=True)
    assert [c["extra_cflags"][-1] for c in calls[2:]] == ["-DTORCHLINT_TRACE_FILTER=1", "-DTORCHLINT_TRACE_FILTER=0"]


def test_a_torch_whose_vtable_differs_gets_the_tap_without_the_filter(monkeypatch, tmp_path):
    monkeypatch.setattr(native_tap, "_MODULE", None)
    monkeypatch.setattr(native_tap, "_FAILURE", None)
    monkeypatch.setenv("TORCHLINT_CACHE_DIR", str(tmp_path))
    from torch.utils import cpp_extension

    calls = []

    def build(**kwargs):
        calls.append(kwargs["extra_cflags"][-1])
        if "-DTORCHLINT_TRACE_FILTER=1" in kwargs["extra_cflags"]:
            raise RuntimeError("Error building extension: 'sym_is_contiguous' marked 'override', but does not override")
        return types.SimpleNamespace(name=kwargs["name"])

    monkeypatch.setattr(cpp_extension, "load", build)
    module = native_tap.load(quiet=True)
    assert module.name.endswith("_plain")
    # The filter alone failed: a new process on this torch goes straight to the plain build.
    monkeypatch.setattr(native_tap, "_MODULE", None)
    assert native_tap.load(quiet=True).name.endswith("_plain")
    assert calls == ["-DTORCHLINT_TRACE_FILTER=1", "-DTORCHLINT_TRACE_FILTER=0", "-DTORCHLINT_TRACE_FILTER=0"]


def test_build_tap_flag_builds_or_finds_it_and_exits():
    done = subprocess.run(
        [sys.executable, "-m", "torchlint.sanitizer", "--build-tap"], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    assert "native tap ready:" in done.stdout + done.stderr
    assert native_tap.cache_dir() in done.stdout + done.stderr


def test_history_every_stream_is_ordered_after_is_pruned_from_the_tap(monkeypatch):
    check = make_check("native")
    try:
        keep = [torch.zeros(16) for _ in range(4)]
        for tensor in keep:
            tensor.add_(tensor)
        with check.streams.on(SIDE):
            torch.ones(4).sum()  # the side stream exists for the engine
        assert check._tap.local_records() >= 4
        monkeypatch.setattr(races, "_TAP_PRUNE_AT", 0)
        check._sync_tap()
        check._engine.device_sync()  # the host waited for everything so far
        check._sync_tap()
        assert check._tap.local_records() == 0
        with check.streams.on(SIDE):
            keep[0].sum()  # ordered after the device sync: nothing to report
        assert check.findings() == []
    finally:
        check.stop()


def test_a_prune_that_could_drop_nothing_waits_for_a_sync_or_twice_the_records(monkeypatch):
    check = make_check("native")
    tap = check._tap
    passes = []
    real_prune = tap.prune
    monkeypatch.setattr(tap, "prune", lambda floor: passes.append(dict(floor)) or real_prune(floor))
    monkeypatch.setattr(races, "_TAP_PRUNE_AT", 0)
    try:
        keep = [torch.zeros(16).add_(1) for _ in range(4)]
        with check.streams.on(SIDE):
            torch.ones(4).sum()
        check._sync_tap()  # nothing is ordered yet: the pass drops nothing
        held = tap.local_records()
        assert len(passes) == 1 and held >= 4
        for _ in range(3):
            check._sync_tap()  # same floor, no new records: no new pass
        assert len(passes) == 1
        while tap.local_records() <= 2 * held:
            keep.append(torch.zeros(16).add_(1))  # new ranges, until the records doubled
        check._sync_tap()
        assert len(passes) == 2
        check._engine.device_sync()  # a new floor: everything so far can go
        check._sync_tap()
        assert len(passes) == 3 and tap.local_records() == 0
    finally:
        check.stop()


def test_a_dead_tensors_base_goes_with_its_pruned_history_and_a_live_ones_stays(monkeypatch):
    check = make_check("native")
    tap = check._tap
    try:
        keep = torch.zeros(16).add_(1)
        gone = [torch.zeros(16).add_(1) for _ in range(8)]
        with check.streams.on(SIDE):
            torch.ones(4).sum()
        bases_before = tap.stats()["bases"]
        del gone
        monkeypatch.setattr(races, "_TAP_PRUNE_AT", 0)
        synced(check).device_sync()  # the host waited for everything so far
        check._sync_tap()
        stats = tap.stats()
        assert stats["bases_erased"] >= 8 and stats["bases"] <= bases_before - 8, stats
        with check.streams.on(SIDE):
            keep.sum()  # the live base kept its generation: ordered after the sync, no finding
        assert check.findings() == []
    finally:
        check.stop()


def test_a_second_checks_tap_counters_start_from_zero():
    def run():
        check = make_check("native")
        try:
            _default_stream_writes_then_a_side_stream_read(check)
        finally:
            check.stop()
        return check.summary()["native_tap"]

    first, second = run(), run()
    # Flushes are left out: they depend on which addresses malloc hands back.
    for counter in ("ops_seen", "ops_recorded", "accesses_local", "accesses_forwarded"):
        assert second[counter] == first[counter] > 0, (counter, first, second)


def test_the_memory_registries_the_check_quiets_exist_in_this_torch():
    import torch.cuda._gpu_trace as trace

    from torchlint.sanitizer.races import hooks as race_hooks

    for name in race_hooks._MEMORY_REGISTRIES:
        assert hasattr(getattr(trace, name), "fire_callbacks"), name


def test_the_gpu_trace_filter_installs_and_restores():
    tap = native_tap.load(quiet=True)
    if not hasattr(tap, "install_trace_filter"):
        pytest.skip("this torch's interpreter vtable differs: the tap was built without the filter")
    assert not tap.trace_filter_installed()
    tap.install_trace_filter(forward_memory=False)
    try:
        assert tap.trace_filter_installed()
    finally:
        tap.remove_trace_filter()
    assert not tap.trace_filter_installed()


def _sites_the_tap_forwards(call):
    """Run ``call`` with the tap on (CPU tensors, all on a side stream): the site of each launch it forwards."""
    from torchlint.sanitizer import frames

    tap = native_tap.load(quiet=True)
    sites = []

    def forwarded(message):
        if message.__class__ is list:
            sites.extend(launch[3] for launch in message)

    tap.enable(forwarded, frames.site_origin, True, 4)
    tap.set_stream(SIDE)
    try:
        result = call()
    finally:
        tap.set_stream(0)
        tap.disable()
    return sites, result


def test_the_taps_site_is_the_live_walks_user_frames_with_lines(tmp_path):
    from san_sync_helpers import write_user_module
    from torchlint.sanitizer import frames

    model = write_user_module(tmp_path, "tap_site_model", """
        import torch

        def inner(live):
            live.append(frames_now())
            return torch.ones(4).mul_(2)  # THE-OP

        def middle(live):
            return inner(live)

        def outer(live):
            return middle(live)
    """)
    model.frames_now = lambda: frames.raw_user_stack(limit=4, skip=1)[0]
    live = []
    sites, _ = _sites_the_tap_forwards(lambda: model.outer(live))
    op_line = next(n for n, text in enumerate(open(model.__file__), 1) if "THE-OP" in text)
    mul = [site for site in sites if site and site[0][1] == op_line]
    assert mul, sites
    site = mul[0]
    # The same frames as the live walk, innermost first, the op's own line first.
    assert [(f, name) for f, _, name in site] == [(f, name) for f, _, name in live[0]]
    assert site[0] == (model.__file__, op_line, "inner")
    assert len(site) <= 4


def test_the_taps_site_drops_test_frames_inside_the_code_under_test(tmp_path):
    from san_sync_helpers import write_user_module

    library = write_user_module(tmp_path, "tap_site_lib", """
        def run(callback):
            return callback()  # LIB-CALL
    """)
    test_module = write_user_module(tmp_path, "test_tap_site_cb", """
        import torch

        def callback():
            return torch.ones(4).mul_(3)  # TEST-OP
    """)
    sites, _ = _sites_the_tap_forwards(lambda: library.run(test_module.callback))
    lib_line = next(n for n, text in enumerate(open(library.__file__), 1) if "LIB-CALL" in text)
    assert any(site and site[0] == (library.__file__, lib_line, "run") for site in sites), sites


def test_wait_stream_reaches_the_engine_once_and_its_inner_event_is_not_counted():
    from torchlint.sanitizer.races import hooks as race_hooks

    check = make_check("native")
    try:
        with check.streams.on(SIDE):
            x = torch.zeros(64).add_(1)  # made on the side stream
        default, side = types.SimpleNamespace(cuda_stream=0), types.SimpleNamespace(cuda_stream=SIDE)
        index = check._engine._index
        race_hooks._LOCAL.in_wait_stream = True
        try:
            # What torch's wait_stream does inside: an event recorded on side, waited on by default.
            event = object()
            race_hooks._trace_event_record(event, SIDE)
            race_hooks._trace_event_wait(event, 0)
        finally:
            race_hooks._LOCAL.in_wait_stream = False
        assert check._engine._index == index  # the wrapper tells the engine, not the inner event
        check.wait_stream(default, side)
        note = check._engine.last_sync(0, SIDE)
        assert note.kind == "wait_stream" and note.site[0][0] == __file__
        x.sum()  # ordered after the side stream's writes
        assert check.findings() == []
        with check.streams.on(SIDE):
            y = torch.zeros(64)  # after the wait: unordered for the default stream
        y.sum()
        assert [f.details["second"]["op"] for f in check.findings()] == ["sum"]
    finally:
        check.stop()
