"""What real scripts taught the sync check (issue #32's reviewed runs): where a copy comes from, reads that
cost nothing (the GPU already idle, a value the host needs), and a sync in backward() that is a symptom.

The verdicts are pure functions of site records; the recording side is driven on CPU with fake
device tensors and a fake stream query, the way the other CPU sync tests drive it.
"""
import sys

import pytest

from torchlint.sanitizer.findings import is_no_stall, is_one_off, is_per_step_cost
from torchlint.sanitizer.report import render_summary
from torchlint.sanitizer.session import StepCount, finding_fails
from torchlint.sanitizer.sync.kinds import KINDS, builds_on_host, chooses_on_host, classify
from torchlint.sanitizer.sync.verdicts import SiteRecord, sync_findings

MIN_COUNT = 5
TRAIN = StepCount(completed=100, warmup=2)
EVERY_STEP = {step: 1 for step in range(100)}


def site(kind="item", run_steps=None, line=42, no_grad=False, queried=None, idle=None, host_choice=False,
         dtype="int64", pinned=()):
    run_steps = dict(EVERY_STEP if run_steps is None else run_steps)
    runs = sum(run_steps.values())
    return SiteRecord(kind=kind, api=None, stack=(("/u/train.py", line, "main"),), library=None,
                      steps=run_steps, stall={s: 0.001 for s in run_steps}, timed=dict(run_steps), runs=runs,
                      in_test=False, tensor={"shape": [1], "dtype": dtype, "device": "cuda:0"},
                      run_steps=run_steps, no_grad_runs=runs if no_grad else 0, pinned=frozenset(pinned),
                      host_choice=host_choice, queried=queried, idle_arrivals=idle)


def findings_by_line(records, steps=TRAIN):
    return {f.line: f for f in sync_findings(records, steps, MIN_COUNT)}


# --- classification from the user's line and the torch frame ------------------------

@pytest.mark.parametrize("line, kind", [
    # PyTorch-GAN: a numpy draw made a CUDA tensor on the spot; the shape index is not mask indexing.
    ("    z = Variable(Tensor(np.random.normal(0, 1, (imgs.shape[0], opt.latent_dim))))", "host-built"),
    ("    noise = torch.tensor(numpy.random.rand(4), device='cuda')", "host-built"),
    # PyTorch-GAN: imgs.type(torch.cuda.FloatTensor) is a copy, not "other".
    ("    real_imgs = Variable(imgs.type(Tensor))", "copy"),
    ("    loss.backward()", "backward"),
    ("    scaler.scale(loss).backward()", "backward"),
    ("    grads = torch.autograd.grad(loss, params)", "backward"),
    ("    y = x[mask]", "mask-index"),
])
def test_classify_reads_sources_and_backward_from_the_line(line, kind):
    assert classify(line) == kind


@pytest.mark.parametrize("library", [
    ("/site-packages/torch/_tensor.py", 10, "Tensor.backward"),
    ("/site-packages/torch/autograd/__init__.py", 10, "backward"),
    ("/site-packages/torch/autograd/graph.py", 10, "_engine_run_backward"),
])
def test_a_sync_under_torch_s_autograd_entry_points_is_a_backward_sync(library):
    assert classify("    run(x)", library) == "backward"


def test_the_new_kinds_name_tl204_or_no_rule():
    assert KINDS["host-slice"][0] == KINDS["host-built"][0] == "TL204"
    assert KINDS["backward"][0] is None and "forward" in KINDS["backward"][2]
    assert "once" in KINDS["host-slice"][2] and "device=" in KINDS["host-built"][2]


@pytest.mark.parametrize("line, expected", [
    ("word_id = torch.multinomial(prob, num_samples=1).item()", True),
    ("next_id = logits[:, -1].argmax(dim=-1)[0].item()", True),
    ("tokens.append(torch.argmax(probs, dim=-1).tolist())", True),
    ("correct += (out.argmax(1) == y).sum().item()", False),  # an accuracy count: a real per-batch read
    ("loss_value = loss.item()", False),
    ("idx = probs.argmax()  # then .item() later", False),
])
def test_a_read_of_a_value_just_chosen_on_the_device(line, expected):
    assert chooses_on_host(line) is expected


def test_builds_on_host_ignores_comments():
    assert builds_on_host("x = Tensor(np.zeros(3))")
    assert not builds_on_host("x = batch.to(device)  # was np.asarray")


# --- verdicts: copies by source ------------------------------------------------------

def test_a_slice_of_a_long_lived_host_tensor_copied_every_step_is_tl204_not_a_loader_pin():
    [finding] = sync_findings([site(kind="host-slice", pinned=(False,))], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("warning", "TL204")
    assert "slice" in finding.message and "once" in finding.fix_hint and "pin_memory" not in finding.fix_hint


def test_a_host_built_tensor_copied_every_step_is_tl204():
    [finding] = sync_findings([site(kind="host-built")], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("warning", "TL204") and "device=" in finding.fix_hint


def test_a_host_tensor_moved_every_step_stays_a_finding_on_an_idle_gpu():
    # The transfer itself is the cost TL204's fix removes, idle GPU or not.
    [finding] = sync_findings([site(kind="host-slice", queried=EVERY_STEP, idle=EVERY_STEP)], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("warning", "TL204") and "no_stall" not in finding.details


def test_a_plain_pageable_loader_copy_stays_tl202():
    [finding] = sync_findings([site(kind="copy", pinned=(False,))], TRAIN, MIN_COUNT)
    assert finding.rule == "TL202" and "pin_memory" in finding.fix_hint


# --- verdicts: idle on arrival ------------------------------------------------------

def test_a_read_that_always_found_the_gpu_idle_stays_a_finding_that_says_so():
    """nanoGPT: a tiny copy right after an .item() that drained the queue, a read after synchronize();
    but a launch-bound run's per-step .item() finds the GPU idle too, and waits once steps grow."""
    record = site(queried=EVERY_STEP, idle=EVERY_STEP)
    [finding] = sync_findings([record], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("warning", "TL101")
    assert finding.details["idle-on-arrival"] == {"idle": 98, "asked": 98} and "no_stall" not in finding.details
    assert "already idle when it arrived (98 of 98 reads asked)" in finding.message
    assert is_per_step_cost(finding) and finding_fails(finding, {"sync"})


def test_a_read_that_mostly_found_the_gpu_busy_stays_a_stall():
    record = site(queried=EVERY_STEP, idle={step: 1 for step in range(0, 100, 2)})
    [finding] = sync_findings([record], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("warning", "TL101") and "no_stall" not in finding.details
    assert "idle-on-arrival" not in finding.details and finding_fails(finding, {"sync"})


def test_warm_up_reads_do_not_count_toward_idle_on_arrival():
    # Idle only in the two warm-up steps: the measured reads were never asked, so nothing is known.
    record = site(queried={0: 1, 1: 1}, idle={0: 1, 1: 1})
    [finding] = sync_findings([record], TRAIN, MIN_COUNT)
    assert finding.severity == "warning" and "no_stall" not in finding.details


def test_a_one_off_read_on_an_idle_gpu_stays_a_one_off():
    record = site(run_steps={50: 1}, queried={50: 1}, idle={50: 1})
    [finding] = sync_findings([record], TRAIN, MIN_COUNT)
    assert finding.details["cadence"] == "once" and "no_stall" not in finding.details and is_one_off(finding)


# --- verdicts: the host needs the value ------------------------------------------------

NO_STEPS = StepCount(completed=0, warmup=0)


def test_a_sampling_loop_s_per_token_read_under_no_grad_is_info():
    """yunjey language model: ``word_id = torch.multinomial(prob, num_samples=1).item()`` per token."""
    record = site(run_steps={0: 200}, no_grad=True, host_choice=True)
    [finding] = sync_findings([record], NO_STEPS, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("info", None)
    assert finding.details["no_stall"] == "host-needs-value" and "host needs the value" in finding.message
    assert not finding_fails(finding, {"sync"})


@pytest.mark.parametrize("change", [{"no_grad": False}, {"host_choice": False}, {"dtype": "float32"}])
def test_a_chosen_value_read_with_autograd_on_or_a_float_or_another_line_still_costs(change):
    arguments = dict(run_steps={0: 200}, no_grad=True, host_choice=True)
    arguments.update(change)
    [finding] = sync_findings([site(**arguments)], NO_STEPS, MIN_COUNT)
    assert finding.severity == "warning" and finding.rule == "TL101" and "no_stall" not in finding.details


# --- verdicts: a sync inside backward() is a symptom -----------------------------------

def test_a_backward_sync_points_at_the_mask_indexing_in_forward_and_back():
    """pytorch_geometric gcn: ``F.nll_loss(out[data.train_mask], ...)`` then ``loss.backward()``."""
    cause = site(kind="mask-index", line=30)
    symptom = site(kind="backward", line=31)
    by_line = findings_by_line([symptom, cause])
    backward, mask = by_line[31], by_line[30]
    assert (backward.severity, backward.rule) == ("info", None)
    assert backward.details["no_stall"] == "backward-symptom" and backward.details["caused_by"] == ["/u/train.py:30"]
    assert backward.message.startswith("symptom:") and "boolean-mask indexing at /u/train.py:30" in backward.message
    assert "/u/train.py:30" in backward.fix_hint
    assert (mask.severity, mask.rule) == ("warning", "TL103") and mask.details["backward_site"] == "/u/train.py:31"
    assert "its backward syncs too, at /u/train.py:31" in mask.message


def test_an_eval_only_mask_index_is_not_the_cause_of_a_backward_sync():
    cause = site(kind="mask-index", line=30, no_grad=True)
    symptom = site(kind="backward", line=31)
    backward = findings_by_line([symptom, cause])[31]
    assert backward.severity == "warning" and backward.rule is None and "caused_by" not in backward.details
    assert "forward" in backward.fix_hint


# --- recording: the copy wrapper and the stream query, on CPU with fakes ---------------

torch = pytest.importorskip("torch")

from torchlint.sanitizer import frames, sanitize  # noqa: E402
from torchlint.sanitizer.sync.check import _host_slice, _targets_cuda  # noqa: E402
from san_sync_helpers import install_fake_library  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_frames():
    frames.reset()
    yield
    frames.reset()


@pytest.fixture
def lib(tmp_path):
    return install_fake_library(tmp_path)


class _OnDevice:
    is_cuda = True

    class device:  # noqa: N801 (the attribute torch names ``device``)
        type = "cuda"
        index = 0


def test_a_slice_is_told_from_its_storage():
    ids = torch.arange(1000).reshape(10, 100)
    assert _host_slice(ids[:, 0:10]) and not _host_slice(ids) and not _host_slice(ids[:, 0:60])
    assert not _host_slice(torch.arange(10)) and not _host_slice(object())


@pytest.mark.parametrize("args, kwargs, expected", [
    (("cuda",), {}, True), (("cuda:1",), {}, True), ((torch.device("cuda"),), {}, True),
    ((), {"device": "cuda"}, True), (("torch.cuda.FloatTensor",), {}, True), ((_OnDevice(),), {}, True),
    (("cpu",), {}, False), ((torch.float16,), {}, False), ((), {}, False), ((torch.device("cpu"), True), {}, False),
])
def test_which_to_and_type_calls_target_cuda(args, kwargs, expected):
    assert _targets_cuda(args, kwargs) is expected


def test_a_copy_of_a_host_slice_records_host_slice_and_the_stream_s_idleness(lib):
    ids = torch.arange(1000).reshape(10, 100)
    asked = []

    def copy(self_tensor, *args, **kwargs):
        lib.read_back()  # the blocking copy's sync warning
        return _OnDevice()

    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._query_stream = lambda index: asked.append(index) or False  # busy: a real stall
        to = check._copy_wrapper("Tensor.to", destination_first=False)(copy)
        for i in range(0, 60, 10):
            to(ids[:, i:i + 10], "cuda"); here = sys._getframe().f_lineno
    [finding] = session.findings
    assert finding.line == here and finding.details["sync_kind"] == "host-slice" and finding.rule == "TL204"
    assert asked == [None] * 6  # asked before every host-to-device copy


def test_a_read_of_a_device_tensor_asks_the_stream_first_and_an_explicit_wait_does_not(lib):
    asked = []
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._query_stream = lambda index: asked.append(index) or True
        read = check._timed("item", "Tensor.item", bare=True)(lambda value: lib.read_back(2.0))
        for _ in range(6):
            read(_OnDevice())
        wait = check._timed("synchronize", "torch.cuda.synchronize", explicit=True)(lambda: None)
        wait()
    assert asked == [0] * 6
    site = next(s for s in check._sites.values() if s.kind == "item")
    assert sum(site.queried.values()) == sum(site.idle_arrivals.values()) == 6


def test_each_calling_line_asks_its_first_reads_then_one_in_query_every(lib):
    from torchlint.sanitizer.sync.check import QUERY_EVERY, QUERY_FIRST

    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._query_stream = lambda index: True
        read = check._timed("item", "Tensor.item", bare=True)(lambda value: lib.read_back(2.0))
        for _ in range(QUERY_FIRST + 2 * QUERY_EVERY):
            read(_OnDevice()); first = sys._getframe().f_lineno
            read(_OnDevice()); second = sys._getframe().f_lineno
    by_line = {s.key[1]: s for s in check._sites.values()}
    for line in (first, second):  # the two lines do not share (and alias) one counter
        assert sum(by_line[line].queried.values()) == QUERY_FIRST + 2
        assert sum(by_line[line].steps.values()) == QUERY_FIRST + 2 * QUERY_EVERY


def test_a_failing_stream_query_leaves_the_read_unasked(lib):
    def broken(index):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        check._query_stream = broken
        read = check._timed("item", "Tensor.item", bare=True)(lambda value: lib.read_back(2.0))
        assert read(_OnDevice()) == 2.0
    site = next(s for s in check._sites.values() if s.kind == "item")
    assert site.queried == {} and site.idle_arrivals == {}


def test_a_numpy_built_copy_through_the_wrapper_is_host_built(lib, tmp_path):
    from san_sync_helpers import write_user_module

    module = write_user_module(tmp_path, "gan_step", """
        class np:  # numpy's spelling; the line is what the check reads
            class random:
                normal = staticmethod(lambda mean, std, shape: [float(mean)] * shape[0])

        def step(to, make):
            return to(make(np.random.normal(0, 1, (3,))), "cuda")
    """)

    def copy(self_tensor, *args, **kwargs):
        lib.read_back()
        return _OnDevice()

    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        to = check._copy_wrapper("Tensor.to", destination_first=False)(copy)
        for _ in range(6):
            module.step(to, torch.tensor)
    [finding] = session.findings
    assert finding.details["sync_kind"] == "host-built" and finding.rule == "TL204"


# --- waits that are already paid: a timer's synchronize, a read after it, one final evaluation ---------

def test_a_synchronize_followed_by_a_clock_read_is_a_deliberate_timer():
    """llm.c: ``torch.cuda.synchronize()`` then ``t1 = time.time()`` for an accurate per-step time."""
    [finding] = sync_findings([_with(site(kind="synchronize"), clock_line=45)], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule, finding.details["no_stall"]) == ("info", None, "timing")
    assert "clock is read at line 45" in finding.message and is_no_stall(finding)


def test_a_per_step_synchronize_with_no_clock_after_it_stays_a_warning():
    [finding] = sync_findings([site(kind="synchronize")], TRAIN, MIN_COUNT)
    assert (finding.severity, finding.rule) == ("warning", "TL102")


def test_a_read_after_the_steps_synchronize_that_finds_the_gpu_idle_adds_no_wait():
    """llm.c prints ``norm`` right after its timing synchronize: the format read waits for nothing."""
    wait = _with(site(kind="synchronize", line=40), clock_line=41)
    read = _with(site(kind="format", line=44, queried=EVERY_STEP, idle=EVERY_STEP), after_sync=EVERY_STEP)
    by_line = findings_by_line([wait, read])
    assert (by_line[44].severity, by_line[44].rule, by_line[44].details["no_stall"]) == ("info", None, "after-sync")
    assert "explicit synchronize at /u/train.py:40 in the same step" in by_line[44].message


@pytest.mark.parametrize("busy, after, line", [(True, True, 44), (False, False, 44), (False, True, 30)])
def test_a_read_after_a_synchronize_still_counts_when_the_gpu_was_busy_or_no_synchronize_came_first(busy, after, line):
    """Busy on arrival; no synchronize before it in its step; or after last iteration's synchronize only
    (llm.c's ``lossf.item()`` above the synchronize in the loop body: the step's forward and backward came
    in between)."""
    idle = {step: 1 for step in range(0, 100, 3)} if busy else EVERY_STEP
    read = _with(site(kind="format", line=line, queried=EVERY_STEP, idle=idle), after_sync=EVERY_STEP if after else {})
    by_line = findings_by_line([site(kind="synchronize", line=40), read])
    assert (by_line[line].severity, by_line[line].rule) == ("warning", "TL101")


def test_every_batch_of_the_one_evaluation_pass_after_training_is_paid_once():
    """A tutorial's final ``correct += (predicted == labels).sum().item()`` over the test set."""
    record = site(run_steps={99: 20}, no_grad=True)
    [finding] = sync_findings([record], TRAIN, MIN_COUNT)
    assert finding.details["cadence"] == "per-eval-batch" and finding.details["no_stall"] == "one-eval-pass"
    assert (finding.severity, finding.rule) == ("info", None) and "only evaluation pass" in finding.message


def test_an_inference_script_s_one_pass_stays_a_warning():
    """Without training steps the pass is the program: every batch's read is its cost."""
    [finding] = sync_findings([site(run_steps={0: 50}, no_grad=True)], StepCount(completed=0, warmup=0), MIN_COUNT)
    assert finding.details["cadence"] == "per-eval-batch" and (finding.severity, finding.rule) == ("warning", "TL101")


def test_an_evaluation_pass_in_warm_up_is_told_apart_from_the_measured_reads():
    """llm.c validates at steps 0, 20, 40 and 60, 8 batches each; step 0 is in warm-up."""
    record = site(run_steps={step: 8 for step in (0, 20, 40, 60)}, no_grad=True)
    [finding] = sync_findings([record], TRAIN, MIN_COUNT)
    assert finding.count == 24 and finding.severity == "warning"
    assert "(24 reads with autograd off in 3 evaluation pass(es); 8 more in warm-up)" in finding.message


def test_a_guard_on_a_per_epoch_counter_is_periodic_with_its_mean_gap_and_range():
    """``step = (i+1) // seq_length; if step % 100 == 0`` with 104 steps an epoch: at 0 and 100 of each."""
    steps = [epoch * 104 + i for epoch in range(5) for i in (0, 100)]
    [finding] = sync_findings([site(run_steps={s: 1 for s in steps})], StepCount(completed=520, warmup=2), MIN_COUNT)
    assert finding.details["cadence"] == "periodic" and finding.details["period_regular"] is False
    assert "about every 52 steps (gaps of 4 to 100 steps)" in finding.message


def test_the_clock_read_after_a_synchronize_is_found_in_the_user_s_source(lib, tmp_path):
    from san_sync_helpers import write_user_module

    module = write_user_module(tmp_path, "timed_step", """
        import time

        def step(wait, records):
            wait()
            # accurate per-iteration timings below
            t1 = time.time()
            records.append(t1)

        def untimed(wait):
            wait()
            x = 1
            y = 2
            z = 3
            return time.time()
    """)
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        wait = check._timed("synchronize", "torch.cuda.synchronize", explicit=True)(lambda: lib.read_back(None))
        for _ in range(6):
            module.step(wait, [])
            module.untimed(wait)
            session.step()
    clocks = {s.key[1]: check._clock_line(s) for s in check._sites.values()}
    assert sorted(clocks.values(), key=str) == [7, None]


def test_reads_after_a_synchronize_in_the_same_step_are_counted(lib):
    with sanitize(checks={"sync"}) as session:
        check = session._checks[0]
        wait = check._timed("synchronize", "torch.cuda.synchronize", explicit=True)(lambda: lib.read_back(None))
        read = check._timed("item", "Tensor.item", bare=True)(lambda value: lib.read_back(2.0))
        for _ in range(6):
            read(_OnDevice()); before = sys._getframe().f_lineno
            wait()
            read(_OnDevice()); after = sys._getframe().f_lineno
            session.step()
    by_line = {s.key[1]: s for s in check._sites.values() if s.kind == "item"}
    assert by_line[before].after_sync == {} and sum(by_line[after].after_sync.values()) == 6


def _with(record, **changes):
    from dataclasses import replace

    return replace(record, **changes)


@pytest.mark.parametrize("line, clock", [
    ("t1 = time.time()", True), ("t0 = time.perf_counter()", True), ("now = perf_counter_ns()", True),
    ("ms = start.elapsed_time(end)", True), ("dt = timer()", False), ("# time.time()", False),
    ("x = time_step(3)", False),
])
def test_which_lines_read_a_clock(line, clock):
    from torchlint.sanitizer.sync.kinds import reads_clock

    assert reads_clock(line) is clock
