"""A sync site's cadence (per step, per evaluation batch, periodic, a loop, a few times), judged from records.

``sync/verdicts.py`` is a pure function of the frozen site records, so each
case of issue #32 is a record: what the check saw, not a GPU run.
"""
import pytest

from torchlint.sanitizer.findings import Finding, is_one_off, is_per_step_cost, is_periodic
from torchlint.sanitizer.report import render_summary
from torchlint.sanitizer.session import StepCount, finding_fails
from torchlint.sanitizer.sync.verdicts import SiteRecord, cadence_of, sync_findings

MIN_COUNT = 5


def site(run_steps, kind="item", no_grad=False, stall_ms_per_read=None, compiler=False, in_test=False, pinned=()):
    """A site that ran ``run_steps[step]`` times in each step, one sync per run."""
    run_steps = dict(run_steps)
    runs = sum(run_steps.values())
    stall = {step: n * stall_ms_per_read / 1000 for step, n in run_steps.items()} if stall_ms_per_read else {}
    timed = dict(run_steps) if stall_ms_per_read else {}
    return SiteRecord(kind=kind, api="Tensor.item", stack=(("/u/train.py", 42, "main"),), library=None,
                      steps=run_steps, stall=stall, timed=timed, runs=runs, in_test=in_test, tensor=None,
                      run_steps=run_steps, no_grad_runs=runs if no_grad else 0, compiler=compiler,
                      pinned=frozenset(pinned))


def one(record, steps):
    [finding] = sync_findings([record], steps, MIN_COUNT)
    return finding


TRAIN = StepCount(completed=100, warmup=2)  # 98 measured steps


def test_a_read_in_every_step_is_a_per_step_warning_with_its_rule():
    finding = one(site({step: 1 for step in range(100)}, stall_ms_per_read=0.5), TRAIN)
    assert finding.details["cadence"] == "per-step" and finding.details["every_step"] is True
    assert (finding.severity, finding.rule) == ("warning", "TL101")
    assert is_per_step_cost(finding) and finding.details["per_read_ms"] == 0.5
    assert "per step" in finding.message and "every measured step" in finding.message


def test_a_read_in_most_steps_is_still_per_step():
    steps = [step for step in range(100) if step % 10 != 3]  # a skipped step now and then (a NaN guard)
    finding = one(site({step: 1 for step in steps}), TRAIN)
    assert finding.details["cadence"] == "per-step" and finding.details["every_step"] is False
    assert finding.severity == "warning"


def test_logging_under_iter_num_modulo_log_interval_is_periodic_info_with_its_period():
    """nanoGPT's ``if iter_num % log_interval == 0: lossf = loss.item()``: already every N steps."""
    finding = one(site({step: 1 for step in range(0, 100, 10)}, stall_ms_per_read=0.25), TRAIN)
    details = finding.details
    assert (details["cadence"], details["period_steps"], details["repeated"]) == ("periodic", 10, False)
    assert (finding.severity, finding.rule) == ("info", None)
    assert is_periodic(finding) and not is_one_off(finding) and not is_per_step_cost(finding)
    assert "every 10 steps" in finding.message and "0.250 ms host wait per read" in finding.message
    assert not finding_fails(finding, {"sync"})


def test_a_progress_meter_printed_every_print_freq_steps_and_at_each_epochs_end_is_periodic():
    """MetricLogger.log_every: ``i % print_freq == 0 or i == len(loader) - 1``, 16 batches an epoch."""
    steps = [epoch * 16 + i for epoch in range(6) for i in range(16) if i % 10 == 0 or i == 15]
    finding = one(site({step: 3 for step in steps}), StepCount(completed=96, warmup=2))  # three meters a line
    assert finding.details["cadence"] == "periodic" and finding.details["period_steps"] in (1, 5, 10)
    assert finding.severity == "info"


def test_a_read_on_every_evaluation_batch_is_a_warning_even_between_training_steps():
    """An eval loop of 20 batches every 10 steps, autograd off: per evaluation batch, not periodic."""
    finding = one(site({step: 20 for step in range(10, 100, 10)}, no_grad=True), TRAIN)
    assert finding.details["cadence"] == "per-eval-batch" and finding.details["eval_runs"] == 180
    assert (finding.severity, finding.rule) == ("warning", "TL101")
    assert "every evaluation or inference batch" in finding.message


def test_a_final_evaluation_loop_is_per_eval_batch_paid_once():
    """One pass over the test set after training: its per-batch reads cost the run once, not per step."""
    finding = one(site({100: 100}, no_grad=True), TRAIN)
    assert finding.details["cadence"] == "per-eval-batch" and finding.details["no_stall"] == "one-eval-pass"
    assert finding.severity == "info" and not is_per_step_cost(finding)


def test_periodic_logging_under_no_grad_stays_periodic():
    finding = one(site({step: 1 for step in range(0, 100, 25)}, no_grad=True), TRAIN)
    assert finding.details["cadence"] == "periodic"


def test_a_top_level_loop_without_steps_is_a_per_iteration_warning():
    """The regression's script: 40 torch.cuda.synchronize() in a module-level loop, no optimizer."""
    finding = one(site({0: 40}, kind="synchronize"), StepCount(completed=0, warmup=0))
    assert finding.details["cadence"] == "per-iteration" and finding.details["every_step"] is None
    assert (finding.severity, finding.rule, finding.count) == ("warning", "TL102", 40)
    assert "no training steps seen" in finding.message


@pytest.mark.parametrize("runs, cadence", [(1, "once"), (3, "few")])
def test_a_read_that_ran_a_few_times_is_one_off(runs, cadence):
    finding = one(site({0: runs}), StepCount(completed=0, warmup=0))
    assert finding.details["cadence"] == cadence and is_one_off(finding)
    assert (finding.severity, finding.rule) == ("info", None)


def test_a_sync_made_by_torch_compile_is_counted_in_compilation_not_as_a_site():
    finding = one(site({step: 4 for step in range(2, 60)}, kind="synchronize", compiler=True), TRAIN)
    assert finding.details["cadence"] == "compile" and is_one_off(finding) and finding.rule is None
    assert "compilation" in finding.message


def test_a_per_step_read_in_a_test_file_is_info():
    finding = one(site({step: 1 for step in range(100)}, in_test=True), TRAIN)
    assert finding.details["cadence"] == "per-step" and finding.severity == "info" and finding.rule == "TL101"


@pytest.mark.parametrize("pinned, rule, hint", [
    ({False}, "TL202", "pin the source"),
    ({True}, "TL201", "pass non_blocking=True"),
    ((), None, "pin the source and pass non_blocking=True"),
])
def test_a_blocking_copy_takes_the_rule_whose_fix_removes_its_wait(pinned, rule, hint):
    """From an unpinned loader the fix is TL202's (pin it), from pinned memory TL201's (non_blocking)."""
    finding = one(site({step: 1 for step in range(100)}, kind="copy", pinned=pinned), TRAIN)
    assert finding.rule == rule and finding.fix_hint.startswith(hint)
    if pinned:
        assert finding.details["source_pinned"] is next(iter(pinned))


def test_cadence_needs_no_finding_to_be_read():
    assert cadence_of(site({step: 1 for step in range(0, 100, 20)}), TRAIN, MIN_COUNT).period == 20


def test_the_summary_lists_per_step_findings_first_and_periodic_ones_apart():
    findings = sync_findings([
        site({step: 1 for step in range(100)}, stall_ms_per_read=0.4),
        site({step: 1 for step in range(0, 100, 10)}, kind="format", stall_ms_per_read=0.2),
        site({100: 1}, kind="numpy"),
    ], TRAIN, MIN_COUNT)
    text = render_summary(findings, {"completed": 100, "warmup": 2, "measured": 98, "source": "optimizer"})
    lines = text.splitlines()
    assert lines[0].startswith("torchlint sanitizer: 1 finding (1 sync), 39.2 ms stalled over 98 measured steps")
    assert "(1 one-off sync in the JSON report)" in lines[0]
    assert "sync item x1/step, 39.2 ms stalled" in lines[1]
    assert lines[2].startswith("  periodic, already every N steps (info, not per-step stalls): 1 site")
    assert "sync format every 10 steps, 0.200 ms per read" in lines[3]


def test_a_run_with_only_periodic_logging_has_no_findings_but_says_what_it_saw():
    findings = sync_findings([site({step: 1 for step in range(0, 100, 10)})], TRAIN, MIN_COUNT)
    text = render_summary(findings, {"completed": 100, "warmup": 2, "measured": 98, "source": "optimizer"})
    assert text.splitlines()[0] == "torchlint sanitizer: no findings over 98 measured steps (2 warm-up)"
    assert "periodic, already every N steps" in text
    assert all(isinstance(f, Finding) for f in findings)
