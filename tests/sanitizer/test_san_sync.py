"""The sync check on CPU: the warning hook, classification, counting, steps, allowlist,
and restoring every global. Syncs are simulated by raising torch's warning from
library code, which is exactly what the hook sees on a GPU."""
import sys
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer import allow_sync, frames, sanitize  # noqa: E402
from torchlint.sanitizer.findings import is_one_off  # noqa: E402
from torchlint.noqa import ALL, NO_NOQA, line_noqa, line_suppresses  # noqa: E402
from torchlint.sanitizer.sync.check import SyncCheck  # noqa: E402
from torchlint.sanitizer.sync.kinds import KINDS, classify, rule_for  # noqa: E402
from san_sync_helpers import SYNC_TEXT, install_fake_library, line_of, write_user_module  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_frames():
    frames.reset()
    yield
    frames.reset()


@pytest.fixture
def lib(tmp_path):
    return install_fake_library(tmp_path)


def _by_kind(session):
    return {f.details["sync_kind"]: f for f in session.findings}


# --- classification ---------------------------------------------------------

@pytest.mark.parametrize("line, kind", [
    ("    loss_value = loss.item()", "item"),
    ("    ids = logits.argmax(-1).tolist()", "tolist"),
    ("    host = out.cpu()", "cpu"),
    ("    host = out.to('cpu')", "cpu"),
    ("    arr = out.detach().cpu().numpy()", "numpy"),
    ("    if loss > 0:", "bool"),
    ("    assert torch.isfinite(x).all()", "bool"),
    ("    print(loss)", "format"),
    ('    logger.info(f"loss {loss:.3f}")', "format"),
    ("    idx = mask.nonzero()", "nonzero"),
    ("    rows, cols = torch.where(mask)", "nonzero"),
    ("    picked = torch.masked_select(x, mask)", "nonzero"),
    ("    y = x[mask]", "mask-index"),
    ("    x[mask] = y", "mask-index"),
    ("    vals = torch.unique(labels)", "unique"),
    ("    torch.cuda.synchronize()", "synchronize"),
    ("    done.synchronize()", "synchronize"),
    ("    event.synchronize()", "event-sync"),
    ("    torch.cuda.empty_cache()", "empty-cache"),
    ("    t = torch.tensor(values, device='cuda')", "copy"),
    ("    batch = batch.to(device)", "copy"),
    ("    n = int(count)", "item"),
    ("    run_model(x)", "other"),
])
def test_classify_from_the_user_line(line, kind):
    assert classify(line) == kind


@pytest.mark.parametrize("library, kind", [
    (("/site-packages/torch/_tensor_str.py", 10, "_tensor_str"), "format"),
    (("/site-packages/torch/_tensor.py", 10, "Tensor.__format__"), "format"),
    (("/site-packages/torch/functional.py", 10, "_return_output"), "unique"),
    (("/site-packages/torch/amp/grad_scaler.py", 10, "GradScaler._maybe_opt_step"), "item"),
    (("/site-packages/torch/cuda/streams.py", 10, "Event.synchronize"), "event-sync"),
])
def test_classify_from_the_torch_frame(library, kind):
    assert classify("    do_it(x)", library) == kind


def test_every_kind_has_a_rule_label_and_hint():
    assert set(KINDS) == {"item", "tolist", "cpu", "numpy", "bool", "format", "nonzero", "mask-index", "unique",
                          "synchronize", "event-sync", "empty-cache", "pageable-copy", "copy", "host-slice",
                          "host-built", "backward", "other"}
    rules = {kind: KINDS[kind][0] for kind in KINDS}
    assert {rules[k] for k in ("item", "tolist", "cpu", "numpy", "bool", "format")} == {"TL101"}
    # A blocking copy's rule is the fix the run saw it needs: pinned source TL201, pageable TL202.
    assert rules["copy"] is None and rules["pageable-copy"] == "TL202"
    assert (rule_for("copy", {True}), rule_for("copy", {False}), rule_for("copy", {True, False})) == ("TL201", "TL202", None)
    assert rules["synchronize"] == rules["event-sync"] == "TL102"
    assert {rules[k] for k in ("nonzero", "mask-index", "unique")} == {"TL103"}
    assert rules["empty-cache"] == "TL303" and rules["other"] is None
    assert all(KINDS[k][1] and KINDS[k][2] for k in KINDS)


@pytest.mark.parametrize("line, codes", [
    ("x.item()", NO_NOQA),
    ("x.item()  # noqa", ALL),
    ("x.item()  # NOQA TL101", ALL),  # no colon: a blanket, as in ruff and flake8
    ("x.item()  # noqa: TL101", frozenset({"TL101"})),
    ("x.item()  # noqa:  TL101", frozenset({"TL101"})),  # ruff reads any whitespace after the colon
    ("x.item()  # noqa : TL101", frozenset({"TL101"})),
    ("x.item()  # noqa:TL101,TL201", frozenset({"TL101", "TL201"})),
    ("x.item()  # noqa: tl101 TL102  # type: ignore", frozenset({"TL101", "TL102"})),
])
def test_the_sanitizer_reads_noqa_with_the_linter_s_parser(line, codes):
    assert line_noqa(line) == codes


def test_noqa_silences_only_its_rule():
    assert line_suppresses("x.item()  # noqa: TL101", "TL101")
    assert line_suppresses("x.item()  # noqa:  TL101", "TL101")
    assert not line_suppresses("x.item()  # noqa:  TL201", "TL101")
    assert line_suppresses("x.item()  # noqa", None)
    assert not line_suppresses("x.item()  # noqa: TL101", None)


# --- the hook and the site table ---------------------------------------------------

def test_sync_is_attributed_to_the_user_line_and_classified(tmp_path, lib):
    model = write_user_module(tmp_path, "model_s1", """
        import fakecuda

        def forward(x, mask):
            return fakecuda.read_back(x)[mask]  # MASK
    """)
    with sanitize(checks={"sync"}) as session:
        for _ in range(5):
            model.forward(torch.ones(3), torch.ones(3, dtype=torch.bool))
    [finding] = session.findings
    assert (finding.file, finding.line) == (model.__file__, line_of(model.__file__, "# MASK"))
    assert finding.function == "forward" and finding.rule == "TL103"
    assert finding.details["sync_kind"] == "mask-index"
    assert finding.details["via"].endswith("read_back")
    assert finding.stack[1].file == __file__


def test_program_without_steps_reports_every_sync_with_counts(tmp_path, lib):
    model = write_user_module(tmp_path, "model_s2", """
        import fakecuda

        def evaluate(x):
            return fakecuda.read_back(x).item()  # ITEM
    """)
    with sanitize(checks={"sync"}, warmup_steps=2) as session:
        for _ in range(5):
            model.evaluate(torch.ones(1))
    [finding] = session.findings
    assert finding.count == 5 and finding.details["warmup_count"] == 0
    assert finding.details["every_step"] is None and finding.details["per_step"] == 5
    assert session.steps_summary() == {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}


def test_warmup_steps_are_left_out_and_every_step_is_flagged(tmp_path, lib):
    model = write_user_module(tmp_path, "model_s3", """
        import fakecuda

        def train_step(x):
            return fakecuda.read_back(x).item()  # ITEM

        def log_sometimes(step, x):
            if step % 3 == 0:
                return fakecuda.read_back(x).tolist()  # LOG
    """)
    with sanitize(checks={"sync"}, warmup_steps=2) as session:
        for step in range(8):
            model.train_step(torch.ones(1))
            model.log_sometimes(step, torch.ones(1))
            session.step()
    found = _by_kind(session)
    item, log = found["item"], found["tolist"]
    assert item.count == 6 and item.details["warmup_count"] == 2
    assert item.details["steps"] == [2, 3, 4, 5, 6, 7] and item.details["every_step"] is True
    assert item.details["per_step"] == 1.0 and item.severity == "warning"
    assert log.details["steps"] == [3, 6] and log.details["every_step"] is False and log.count == 2
    assert log.severity == "info"


def test_short_program_is_never_all_warmup(tmp_path, lib):
    model = write_user_module(tmp_path, "model_s4", """
        import fakecuda

        def train_step(x):
            return fakecuda.read_back(x).item()  # ITEM
    """)
    with sanitize(checks={"sync"}, warmup_steps=5) as session:
        for _ in range(2):
            model.train_step(torch.ones(1))
            session.step()
    [finding] = session.findings
    assert session.effective_warmup() == 1 and finding.count == 1 and finding.details["warmup_count"] == 1


def test_optimizer_steps_are_found_automatically(tmp_path, lib):
    model = write_user_module(tmp_path, "model_s5", """
        import fakecuda

        def train_step(x):
            return fakecuda.read_back(x).item()  # ITEM
    """)
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    with sanitize(checks={"sync"}, warmup_steps=1) as session:
        for _ in range(4):
            model.train_step(torch.ones(1))
            optimizer.step()
    [finding] = session.findings
    assert session.step_index == 4 and session.steps_summary()["source"] == "optimizer"
    assert finding.count == 3 and finding.details["every_step"] is True


def test_noqa_and_allow_sync_silence_sites(tmp_path, lib):
    model = write_user_module(tmp_path, "model_s6", """
        import fakecuda

        def step(x):
            fakecuda.read_back(x).item()  # noqa: TL101
            fakecuda.read_back(x).item()  # noqa
            fakecuda.read_back(x).item()  # noqa: TL201 (wrong code: still reported)
    """)
    with sanitize(checks={"sync"}) as session:
        model.step(torch.ones(1))
        with allow_sync():
            model.step(torch.ones(1))
    [finding] = session.findings
    assert finding.line == line_of(model.__file__, "wrong code") and finding.count == 1
    silenced = {s["line"]: s["count"] for s in session._checks[0].silenced_sites()}
    assert silenced == {line_of(model.__file__, "# noqa: TL101"): 1, line_of(model.__file__, "# noqa") + 1: 1}
    assert session._checks[0].allowed_count == 3


def test_allow_sync_is_per_thread(tmp_path, lib):
    with sanitize(checks={"sync"}) as session:
        with allow_sync():
            worker = threading.Thread(target=lib.read_back)
            worker.start()
            worker.join()
    assert len(session.findings) == 1


def test_allow_sync_blocks_are_counted_back_to_none_after_an_error():
    from torchlint.sanitizer import session as session_module

    with pytest.raises(RuntimeError):
        with allow_sync():
            with allow_sync():
                assert session_module.sync_allowed()
                raise RuntimeError("inside")
    assert session_module._open_blocks == 0 and not session_module.sync_allowed()


def test_a_wrapper_counts_its_inner_syncs_once_and_times_the_call(lib):
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        formatted = check._timed("format", "Tensor.__repr__")(lambda: lib.read_back("t", times=38))
        formatted(); here = __import__("sys")._getframe().f_lineno
    [finding] = session.findings
    assert finding.count == 1 and finding.line == here
    assert finding.details["sync_kind"] == "format" and finding.details["api"] == "Tensor.__repr__"
    assert finding.details["timed_calls"] == 1 and finding.details["stall_ms"] is not None


def test_a_tensor_method_wrapper_times_a_device_tensor_and_lets_a_host_tensor_through(lib):
    class OnDevice:
        is_cuda = True

    class OnHost:
        is_cuda = False

    host_calls = []
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        read = check._timed("item", "Tensor.item", bare=True)(lambda value: lib.read_back(2.0))
        assert read(OnDevice()) == 2.0; here = __import__("sys")._getframe().f_lineno
        host_read = check._timed("item", "Tensor.item", bare=True)(lambda value: host_calls.append(value))
        host_read(OnHost())
        assert check._tls.depth == 0
    [finding] = session.findings
    assert finding.line == here and finding.details["api"] == "Tensor.item" and finding.details["timed_calls"] == 1
    assert len(host_calls) == 1


class _PlainOnDevice:
    is_cuda = True


def test_a_call_known_to_sync_is_recorded_with_the_debug_mode_off():
    modes, seen_inside = [], []
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._set_debug_mode = modes.append  # what torch._C._cuda_set_sync_debug_mode is on a GPU
        check._plain_tensor_types = (_PlainOnDevice,)
        read = check._timed("item", "Tensor.item", bare=True, syncs_on_device=True)(
            lambda value: seen_inside.append(list(modes)) or 2.0)
        assert read(_PlainOnDevice()) == 2.0; here = __import__("sys")._getframe().f_lineno
        assert modes == [0, 1] and seen_inside == [[0]]
    [finding] = session.findings
    assert finding.line == here and finding.details["sync_kind"] == "item" and finding.details["timed_calls"] == 1


def test_the_debug_mode_stays_on_while_another_hook_needs_the_warning(lib):
    # The race check, before it activates without the native tap's ledger, learns of
    # .item() syncs from this warning: silencing it at the source would hide them.
    from torchlint.sanitizer.patching import WarningHook
    from torchlint.sanitizer.patching import SYNC_WARNING

    heard = []
    modes = []
    with sanitize(checks={"sync"}) as session:
        other = WarningHook(SYNC_WARNING, lambda: heard.append(1) or False)
        other.install()
        try:
            check = session._checks[0]
            check._set_debug_mode = modes.append
            check._plain_tensor_types = (_PlainOnDevice,)
            read = check._timed("item", "Tensor.item", bare=True, syncs_on_device=True)(
                lambda value: lib.read_back(2.0))
            read(_PlainOnDevice()); here = __import__("sys")._getframe().f_lineno
        finally:
            other.remove()
    assert modes == [] and heard == [1]
    [finding] = session.findings
    assert finding.line == here and finding.count == 1 and finding.details["timed_calls"] == 1


def test_a_tensor_subclass_is_left_to_the_warning(lib):
    # A FakeTensor under torch.compile's tracing is a subclass whose .item() does not sync.
    class Traced(_PlainOnDevice):
        pass

    modes = []
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._set_debug_mode = modes.append
        check._plain_tensor_types = (_PlainOnDevice,)
        read = check._timed("item", "Tensor.item", bare=True, syncs_on_device=True)(lambda value: 2.0)
        read(Traced())
        assert modes == [] and check._sites == {}
        warned = check._timed("item", "Tensor.item", bare=True, syncs_on_device=True)(lambda value: lib.read_back(3.0))
        warned(Traced()); here = __import__("sys")._getframe().f_lineno
    [finding] = session.findings
    assert finding.line == here and modes == []


def test_the_debug_mode_comes_back_when_the_last_quiet_call_ends_and_never_after_stop():
    modes = []
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._set_debug_mode = modes.append
        check._quiet_begin(); check._quiet_begin()  # two threads in calls known to sync
        check._quiet_end()
        assert modes == [0]
        check._quiet_end()
        assert modes == [0, 1]
        check._quiet_begin()
    check._quiet_end()  # a call that outlived the session
    assert modes == [0, 1, 0]


@pytest.mark.parametrize("call", ["to", "copy_ positional", "copy_ keyword"])
def test_a_non_blocking_copy_from_device_memory_is_let_through_untimed(call):
    depth_inside = []
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]

        def original(self_tensor, *args, **kwargs):
            depth_inside.append(check._tls.depth)
            return self_tensor

        if call == "to":
            check._copy_wrapper("Tensor.to", destination_first=False)(original)(_PlainOnDevice(), "cuda:1", non_blocking=True)
        elif call == "copy_ positional":
            check._copy_wrapper("Tensor.copy_", destination_first=True)(original)(object(), _PlainOnDevice(), True)
        else:
            check._copy_wrapper("Tensor.copy_", destination_first=True)(original)(object(), src=_PlainOnDevice(),
                                                                                   non_blocking=True)
    assert depth_inside == [0] and session.findings == []


def test_a_wrapped_method_still_rejects_arguments_it_does_not_take():
    with pytest.raises(TypeError):
        torch.ones(1).item(1)
    with sanitize(checks={"sync"}):
        with pytest.raises(TypeError):
            torch.ones(1).item(1)
        assert torch.ones(2).tolist() == [1.0, 1.0] and int(torch.ones(())) == 1 and float(torch.ones(())) == 1.0


def test_a_wrapped_call_that_does_not_sync_is_not_a_finding():
    with sanitize(checks={"sync"}) as session:
        value = torch.ones(1).item()
        text = repr(torch.ones(2))
        flag = bool(torch.ones(1))
        moved = torch.ones(2).to(torch.float64)
    assert session.findings == [] and value == 1.0 and "tensor" in text and flag and moved.dtype == torch.float64


def test_warnings_as_errors_do_not_turn_a_sync_into_an_exception(lib):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with sanitize(checks={"sync"}) as session:
            lib.read_back()
        with pytest.raises(UserWarning):
            lib.read_back()
    assert len(session.findings) == 1


def test_other_warnings_still_reach_the_previous_handler(lib):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with sanitize(checks={"sync"}):
            warnings.warn("something else", DeprecationWarning)
            lib.read_back()
    assert [str(w.message) for w in caught] == ["something else"]


def test_stop_restores_every_global():
    def snapshot():
        return (
            dict(vars(torch.Tensor)), torch.cuda.synchronize, torch.cuda.empty_cache, torch.nonzero, torch.unique,
            torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize, warnings.showwarning, list(warnings.filters),
        )

    before = snapshot()
    with sanitize(checks={"sync"}):
        assert torch.Tensor.item is not before[0].get("item")
        assert torch.cuda.synchronize is not before[1]
    assert snapshot() == before


def test_sessions_nest(lib):
    with sanitize(checks={"sync"}) as outer:
        lib.read_back()
        with sanitize(checks={"sync"}) as inner:
            lib.read_back()
        lib.read_back()
    assert sum(f.count for f in outer.findings) == 2
    assert sum(f.count for f in inner.findings) == 1


def test_syncs_caused_by_torchlint_itself_are_ignored(lib):
    # A function whose code lives in a torchlint file, as the memory check's read-backs do.
    namespace = {}
    exec(compile("def sample(lib):\n    lib.read_back()\n", frames.__file__, "exec"), namespace)
    with sanitize(checks={"sync"}) as session:
        namespace["sample"](lib)
    assert session.findings == [] and session._checks[0].internal_count == 1


def test_a_torchlint_wrapper_that_forwards_the_users_call_is_not_torchlints_own_sync(lib):
    """The race check wraps torch.cuda.synchronize after the sync check does; the sync is still the user's."""
    namespace = {}
    exec(compile("def wrapper(lib):\n    lib.read_back()\n", frames.__file__, "exec"), namespace)
    frames.forwards_user_call(namespace["wrapper"])
    with sanitize(checks={"sync"}, sync_min_count=1) as session:
        namespace["wrapper"](lib); line = sys._getframe().f_lineno
    [finding] = session.findings
    assert finding.line == line and finding.file == __file__
    assert session._checks[0].internal_count == 0


def test_sync_check_is_constructed_by_the_protocol():
    from torchlint.sanitizer.session import SanitizerSession, load_check_class

    assert load_check_class("sync") is SyncCheck
    session = SanitizerSession(checks={"sync"})
    check = SyncCheck(session)
    assert check.name == "sync" and check.findings() == []


# --- one-off and repeated sites --------------------------------------------------------

def _check_module(tmp_path, name):
    return write_user_module(tmp_path, name, """
        import fakecuda

        def final_read(x):
            return fakecuda.read_back(x).item()  # FINAL

        def save_checkpoint(state):
            return fakecuda.read_back(state, times=12)  # SAVE: one call, a blocking copy per tensor

        def compare(actual):
            return fakecuda.call(fakecuda.read_back, actual)  # ASSERT_CLOSE

        def per_iteration(x):
            return fakecuda.read_back(x).item()  # LOOP

        def from_a_generator(n):
            for batch in fakecuda.batches(n):  # GENERATOR: the library syncs per batch
                pass
    """)


def test_one_off_syncs_are_info_without_a_rule_and_a_loop_is_a_finding(tmp_path, lib):
    model = _check_module(tmp_path, "model_oneoff")
    with sanitize(checks={"sync"}) as session:
        for _ in range(20):
            model.per_iteration(torch.ones(1))
        model.final_read(torch.ones(1))
        model.save_checkpoint({"w": torch.ones(1)})
        model.compare(torch.ones(1))
    by_line = {f.line: f for f in session.findings}
    loop = by_line[line_of(model.__file__, "# LOOP")]
    assert loop.rule == "TL101" and loop.details["repeated"] is True and loop.details["runs"] == 20
    assert loop.count == 20
    for marker, count in (("# FINAL", 1), ("# SAVE", 12), ("# ASSERT_CLOSE", 1)):
        finding = by_line[line_of(model.__file__, marker)]
        assert finding.rule is None and finding.severity == "info", marker
        assert finding.details["repeated"] is False and finding.details["runs"] == 1
        assert finding.count == count and finding.message.startswith("one-off sync")
        assert is_one_off(finding)
    assert not is_one_off(loop)


def test_min_count_is_the_boundary(tmp_path, lib):
    model = _check_module(tmp_path, "model_mincount")
    for runs, min_count, repeated in ((4, None, False), (5, None, True), (2, 2, True), (2, 3, False)):
        with sanitize(checks={"sync"}, sync_min_count=min_count) as session:
            for _ in range(runs):
                model.per_iteration(torch.ones(1))
        [finding] = session.findings
        assert finding.details["repeated"] is repeated, (runs, min_count)
        assert (finding.rule == "TL101") is repeated


def test_a_site_in_every_step_is_repeated_even_with_few_runs(tmp_path, lib):
    model = _check_module(tmp_path, "model_everystep")
    with sanitize(checks={"sync"}, warmup_steps=1) as session:
        for _ in range(3):
            model.per_iteration(torch.ones(1))
            session.step()
        model.final_read(torch.ones(1))  # after the last step: one run
    by_line = {f.line: f for f in session.findings}
    assert by_line[line_of(model.__file__, "# LOOP")].details["repeated"] is True
    assert by_line[line_of(model.__file__, "# FINAL")].details["repeated"] is False


def test_one_step_is_not_every_step(tmp_path, lib):
    model = _check_module(tmp_path, "model_onestep")
    with sanitize(checks={"sync"}) as session:
        model.per_iteration(torch.ones(1))
        session.step()
    [finding] = session.findings
    assert finding.details["every_step"] is True and finding.details["repeated"] is False


def test_each_resumption_of_a_library_generator_is_a_run(tmp_path, lib):
    model = _check_module(tmp_path, "model_generator")
    with sanitize(checks={"sync"}) as session:
        model.from_a_generator(6)
    [finding] = session.findings
    assert finding.details["runs"] == 6 and finding.details["repeated"] is True


def test_a_step_boundary_ends_a_run_and_lets_go_of_the_held_callee(tmp_path):
    from san_sync_helpers import write_distribution

    source = (
        "import warnings\n\n"
        "def across_a_step(session):\n"
        f"    warnings.warn({SYNC_TEXT!r}, UserWarning)\n"
        "    session.step()\n"
        f"    warnings.warn({SYNC_TEXT!r}, UserWarning)\n"
    )
    sys_path = __import__("sys").path
    sys_path.append(str(write_distribution(tmp_path / "libs", "fakeloop", source)))
    looper = __import__("fakeloop")
    with sanitize(checks={"sync"}) as session:
        looper.across_a_step(session)  # one call of the library, a step inside it
        [check] = session._checks
        held = [site.callee for site in check._sites.values()]
        session.step()
        released = [site.callee for site in check._sites.values()]
    [finding] = session.findings
    assert finding.details["runs"] == 2
    assert held[0] is not None and released == [None]  # held for the call, let go at the step


def test_stop_lets_go_of_the_held_callee_frames(tmp_path, lib):
    model = _check_module(tmp_path, "model_release")
    with sanitize(checks={"sync"}) as session:
        model.save_checkpoint({"w": torch.ones(1)})
    [check] = session._checks
    assert all(site.callee is None for site in check._sites.values())


def test_a_script_summary_counts_one_off_syncs_without_listing_them(tmp_path, lib):
    from torchlint.sanitizer.report import render_summary

    model = _check_module(tmp_path, "model_script_summary")
    with sanitize(checks={"sync"}) as session:
        for _ in range(6):
            model.per_iteration(torch.ones(1))
        model.save_checkpoint({"w": torch.ones(1)})
    text = render_summary(session.findings, steps=session.steps_summary())
    assert "(1 one-off sync in the JSON report)" in text.splitlines()[0]
    assert f":{line_of(model.__file__, '# LOOP')}: sync item" in text
    assert f":{line_of(model.__file__, '# SAVE')}:" not in text


def test_wrappers_look_every_attribute_up_before_writing_any(monkeypatch):
    # CPython 3.13+ gives a class ~1,000 type-version tags, and a lookup between
    # two writes to torch.Tensor spends one: a session must write in one burst.
    from torchlint.sanitizer.sync import check as sync_module

    events = []
    real = sync_module._Patch

    class RecordingPatch(real):
        __slots__ = ()

        def __init__(self, owner, name, make):
            events.append("lookup")
            super().__init__(owner, name, make)

        def apply(self):
            events.append("write")
            super().apply()

    monkeypatch.setattr(sync_module, "_Patch", RecordingPatch)
    with sanitize(checks={"sync"}):
        pass
    assert events.count("write") >= 14
    assert events == sorted(events)  # every "lookup" before the first "write"


@pytest.mark.skipif(__import__("sys").version_info < (3, 13), reason="type-version tags are capped from CPython 3.13")
def test_a_hundred_sessions_leave_torch_tensor_its_version_tags():
    testcapi = pytest.importorskip("_testcapi")
    tensor = torch.ones(2)
    for _ in range(100):  # writing and looking up in turn ran out after ~67
        with sanitize(checks={"sync"}):
            tensor.add(1).sum()
        tensor.shape
    assert testcapi.type_get_version(torch.Tensor) != 0
