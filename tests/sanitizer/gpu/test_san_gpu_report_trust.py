"""Issue #32 on a real GPU: what an expert would change, and nothing else.

A top-level loop of torch.cuda.synchronize() (module-level code, no function,
no optimizer) is found with every check on; periodic logging is info with its
period while a per-step read and a per-evaluation-batch read are warnings; a
blocking copy from an unpinned loader is TL202's; a healthy training run has
no memory or utilization finding; compilation, evaluation and checkpoints are
phases of their own.
"""
import json
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


def _run(tmp_path, source, *options, timeout=600):
    (tmp_path / "script.py").write_text(textwrap.dedent(source))
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "torchlint.sanitizer", "--report-json", str(report), *options,
                           "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(report.read_text()), done.stderr


def _line(tmp_path, marker):
    for number, text in enumerate((tmp_path / "script.py").read_text().splitlines(), 1):
        if marker in text:
            return number
    raise AssertionError(marker)


def _syncs_at(report, line):
    return [f for f in report["findings"] if f["kind"] == "sync" and f["line"] == line]


def test_a_top_level_loop_of_synchronize_is_found_with_every_check_on(tmp_path):
    """The regression: module-level code, no functions, no optimizer, 40 explicit syncs."""
    report, stderr = _run(tmp_path, """
        import torch
        x = torch.randn(2048, 2048, device="cuda")
        for i in range(40):
            y = x @ x
            torch.cuda.synchronize()  # SYNC
        print("done")
    """)
    assert report["checks"] == ["memory", "race", "sync"]
    [finding] = _syncs_at(report, _line(tmp_path, "# SYNC"))
    assert (finding["rule"], finding["severity"], finding["count"]) == ("TL102", "warning", 40)
    assert finding["details"]["cadence"] == "per-iteration" and finding["details"]["stall_ms"] > 0
    assert f"script.py:{_line(tmp_path, '# SYNC')}: sync synchronize x40" in stderr


TRAINING = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    data = [(torch.randn(256, 512), torch.randint(0, 10, (256,))) for _ in range(8)]
    evaluation = [(torch.randn(256, 512), torch.randint(0, 10, (256,))) for _ in range(6)]
    for step in range(60):
        x, y = data[step % len(data)]
        x, y = x.cuda(), y.cuda()  # COPY: a blocking copy from pageable memory, every step
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        seen = loss.item()  # PER_STEP
        if step % 10 == 0:
            print(f"step {step} loss {loss:.4f}")  # PERIODIC
        if step % 20 == 19:
            model.eval()
            with torch.no_grad():
                correct = 0
                for ex, ey in evaluation:
                    correct += (model(ex.cuda()).argmax(1) == ey.cuda()).sum().item()  # EVAL
            model.train()
    torch.save(model.state_dict(), "model.pt")
"""


def test_per_step_periodic_and_evaluation_reads_are_told_apart(tmp_path):
    report, stderr = _run(tmp_path, TRAINING)
    [per_step] = [f for f in _syncs_at(report, _line(tmp_path, "# PER_STEP")) if f["details"]["sync_kind"] == "item"]
    assert per_step["details"]["cadence"] == "per-step" and per_step["severity"] == "warning"
    [periodic] = _syncs_at(report, _line(tmp_path, "# PERIODIC"))
    assert (periodic["details"]["cadence"], periodic["details"]["period_steps"]) == ("periodic", 10)
    assert periodic["severity"] == "info" and periodic["rule"] is None
    [evaluation] = [f for f in _syncs_at(report, _line(tmp_path, "# EVAL")) if f["details"]["sync_kind"] == "item"]
    assert evaluation["details"]["cadence"] == "per-eval-batch" and evaluation["severity"] == "warning"
    assert "periodic, already every N steps" in stderr
    copies = [f for f in _syncs_at(report, _line(tmp_path, "# COPY")) if f["details"]["sync_kind"] == "copy"]
    assert copies and all(f["rule"] == "TL202" and f["details"]["source_pinned"] is False for f in copies)


def test_a_healthy_training_run_has_no_memory_or_utilization_finding_and_its_phases(tmp_path):
    report, _ = _run(tmp_path, TRAINING)
    memory_kinds = {"fragmentation", "oom", "alloc-churn", "alloc-retry", "low-utilization"}
    assert [f for f in report["findings"] if f["kind"] in memory_kinds] == []
    names = {entry["phase"] for entry in report["phases"]["phases"]}
    assert {"start-up", "steady-state training", "evaluation", "checkpointing"} <= names
    assert report["phases"]["steady_state"]["steps"] >= 40


def test_compilation_is_a_phase_and_its_syncs_are_not_per_step_sites(tmp_path):
    report, stderr = _run(tmp_path, """
        import torch
        model = torch.compile(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                                  torch.nn.Linear(256, 256)).cuda())
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(128, 256, device="cuda")
        for step in range(40):
            loss = model(x).square().mean()  # MODEL
            loss.backward()
            opt.step()
            opt.zero_grad()
    """)
    phases = {entry["phase"]: entry for entry in report["phases"]["phases"]}
    assert phases["compilation"]["seconds"] > 0.5
    model_line = _line(tmp_path, "# MODEL")
    assert all(f["details"]["cadence"] in ("compile", "once", "few") for f in _syncs_at(report, model_line))
    assert "phases: " in stderr and "compilation" in stderr


def test_the_html_report_opens_with_what_to_fix_first(tmp_path):
    (tmp_path / "script.py").write_text(textwrap.dedent(TRAINING))
    done = subprocess.run([sys.executable, "-m", "torchlint.sanitizer", "--report-html", "r.html", "script.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "r.html").read_text()
    assert page.index('id="fix-first"') < page.index('id="timeline"')
    assert page.index('id="race-table"') < page.index('id="sync-table"')
