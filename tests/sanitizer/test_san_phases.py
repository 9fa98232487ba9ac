"""A run's phases (start-up, compilation, steady-state training, evaluation, checkpointing) and the
utilization judged on the steady state alone (issue #32: 3)."""
import io

import pytest

from torchlint.sanitizer import phases as ph
from torchlint.sanitizer.memory.verdicts import _utilization_finding
from torchlint.sanitizer.timeline import Timeline

torch = pytest.importorskip("torch")


def timeline(steps, duration, marked=(), utilization=()):
    return {"clock": {"duration_s": duration}, "steps": list(steps), "phases": [list(row) for row in marked],
            "utilization": [list(row) for row in utilization]}


def compiled_gpt(step_util=80, other_util=10):
    """A compiled GPT: 30 s of compilation in its first step, 100 steps of 0.1 s, an evaluation every
    50 steps (4 s), a checkpoint write at the end (3 s). NVML every 0.2 s."""
    steps, t = [], 30.0
    marked = [(0.5, 30.0, ph.COMPILATION)]
    busy = [(0.0, 30.0)]
    for index in range(100):
        if index in (50,):
            marked.append((t, None, ph.EVALUATION))
            busy.append((t, t + 4.0))
            t += 4.0
        t += 0.1
        steps.append(round(t, 3))
    marked.append((t + 0.5, t + 3.5, ph.CHECKPOINTING))
    busy.append((t, t + 4.0))
    duration = t + 4.0
    samples = [(round(0.2 * i, 3), other_util if any(a <= 0.2 * i <= b for a, b in busy) else step_util)
               for i in range(1, int(duration / 0.2))]
    return timeline(steps, duration, marked, samples)


def test_a_compiled_gpt_is_split_into_its_phases():
    phases = ph.split(compiled_gpt(), warmup_steps=2)
    assert phases.seconds[ph.COMPILATION] == pytest.approx(29.5)
    assert phases.seconds[ph.EVALUATION] == pytest.approx(4.1)  # the gap that held it (with its step)
    assert phases.seconds[ph.CHECKPOINTING] == pytest.approx(3.0)
    assert phases.seconds[ph.STEADY] == pytest.approx(9.7, abs=0.05)  # 97 steps of 0.1 s
    assert phases.steady_steps == 97
    assert len(phases.steady_spans) == 2  # before and after the evaluation


def test_utilization_is_judged_on_the_steady_state_steps_not_the_whole_run():
    """80% in its steps, 49% or less over the run once compilation, evaluation and checkpoints count."""
    data = compiled_gpt(step_util=80, other_util=10)
    whole = [percent for _, percent in data["utilization"]]
    assert sum(whole) / len(whole) < 50  # the whole-run mean the run was judged on
    phases = ph.split(data, warmup_steps=2)
    assert phases.utilization[ph.STEADY] == pytest.approx(80.0)
    assert phases.utilization[ph.COMPILATION] == pytest.approx(10.0)
    assert ph.low_utilization(phases) is None


def test_a_starved_steady_state_is_a_low_utilization_finding_naming_the_other_phases():
    phases = ph.split(compiled_gpt(step_util=20, other_util=90), warmup_steps=2)
    facts = ph.low_utilization(phases)
    assert facts["utilization_mean_percent"] == pytest.approx(20.0) and facts["steady_steps"] == 97
    record = type("Record", (), {"phases": phases})()
    finding = _utilization_finding(record)
    assert finding.kind == "low-utilization" and finding.severity == "warning"
    assert "20% of the steady-state training time (97 steps" in finding.message
    assert "not counted: start-up" in finding.message and "compilation 29.5 s" in finding.message


def test_too_little_steady_state_is_reported_not_judged():
    data = timeline([1.0 + 0.1 * i for i in range(20)], 3.5, utilization=[(0.2 * i, 5) for i in range(1, 17)])
    phases = ph.split(data, warmup_steps=2)
    assert phases.steady_seconds < ph.MIN_STEADY_SECONDS and ph.low_utilization(phases) is None


def test_a_run_without_steps_has_no_steady_state():
    phases = ph.split(timeline([], 12.0, utilization=[(0.2 * i, 3) for i in range(1, 60)]), warmup_steps=0)
    assert phases.seconds[ph.OTHER] == pytest.approx(12.0) and phases.steady_steps == 0
    assert ph.low_utilization(phases) is None


def test_the_summary_line_says_where_the_time_went():
    line = ph.describe(ph.split(compiled_gpt(), warmup_steps=2).to_json())
    assert line.startswith("phases: start-up ")
    assert "compilation 29.5 s (GPU busy 10%)" in line and "steady-state training 9.7 s (GPU busy 80%)" in line


def test_the_hooks_mark_evaluation_and_checkpoints_and_forward_the_users_calls():
    clock = iter(range(1000)).__next__
    line = Timeline(clock=lambda: float(clock()))
    hooks = ph.PhaseHooks(line)
    eval_before, save_before = torch.nn.Module.eval, torch.save
    hooks.install()
    try:
        model = torch.nn.Linear(2, 2)
        assert model.eval() is model and not model.training
        torch.save({"w": model.weight}, io.BytesIO())
        hooks._compile_started()  # what Dynamo's compile callbacks call
        hooks._compile_ended()
    finally:
        hooks.remove()
    assert torch.nn.Module.eval is eval_before and torch.save is save_before
    names = [row[2] for row in line.to_json()["phases"]]
    assert names == [ph.EVALUATION, ph.CHECKPOINTING, ph.COMPILATION]
    [_, save, compile_] = line.to_json()["phases"]
    assert save[1] > save[0] and compile_[1] > compile_[0]


def test_dynamos_callbacks_are_registered_once_dynamo_is_there_and_removed_after():
    pytest.importorskip("torch._dynamo")
    from torch._dynamo import callback_handler

    hooks = ph.PhaseHooks(Timeline())
    hooks.install()  # torch._dynamo is imported by now: registered at once
    try:
        assert hooks._compile_started in callback_handler.start_callbacks
    finally:
        hooks.remove()
    assert hooks._compile_started not in callback_handler.start_callbacks


def test_an_evaluation_in_every_step_is_part_of_the_steady_step():
    """A GCN epoch: one optimizer step, then a test pass under model.eval(), every epoch."""
    steps = [1.0 + 0.05 * index for index in range(120)]
    evals = [(t - 0.02, None, ph.EVALUATION) for t in steps]
    phases = ph.split(timeline(steps, 7.1, evals), warmup_steps=2)
    assert phases.steady_steps == 118 and phases.seconds[ph.EVALUATION] == 0.0
