"""The reviewed real-script cases of issue #32 on a real GPU: a copy's source (a slice of a long-lived host
tensor, a numpy draw, ``.type(torch.cuda.FloatTensor)``), a read on an already idle GPU, a sampling loop's
per-token read, and a sync inside backward() caused by boolean-mask indexing in forward."""
import sys

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer import sanitize  # noqa: E402
from torchlint.sanitizer.findings import is_no_stall, is_per_step_cost  # noqa: E402

pytestmark = pytest.mark.gpu
STEPS = 8


def _line():
    return sys._getframe(1).f_lineno


def _busy(ms=10):
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(max(1, ms)):
        a = a @ a * 1e-3
    return a


def _training(body):
    """Run ``body(step)`` inside STEPS optimizer steps of a small model; the session's findings by line."""
    model = torch.nn.Linear(64, 64).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, 64, device="cuda")
    _busy(2)
    torch.cuda.synchronize()
    with sanitize(checks={"sync"}, warmup_steps=1, sync_min_count=3) as session:
        for step in range(STEPS):
            loss = model(data).square().mean()
            body(step)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return {(f.line, f.details["sync_kind"]): f for f in session.findings if f.kind == "sync"}, session


def _at(findings, line):
    hits = [f for (at, _), f in findings.items() if at == line]
    assert hits, f"nothing at line {line}: {[(k, f.message) for k, f in findings.items()]}"
    return hits[0]


def test_a_slice_of_one_long_host_tensor_moved_every_step_is_tl204():
    ids = torch.randint(0, 1000, (20, 4000))
    lines = {}

    def body(step):
        _busy(4)
        inputs = ids[:, step * 30:(step + 1) * 30].to("cuda"); lines["copy"] = _line()
    findings, _ = _training(body)
    finding = _at(findings, lines["copy"])
    assert finding.details["sync_kind"] == "host-slice" and finding.rule == "TL204", finding.details
    assert "pin_memory" not in finding.fix_hint


def test_a_legacy_type_copy_from_pageable_memory_is_a_copy_with_tl202():
    batch = torch.randn(32, 3, 32, 32)
    lines = {}

    def body(step):
        _busy(4)
        moved = batch.type(torch.cuda.FloatTensor); lines["copy"] = _line()
    findings, _ = _training(body)
    finding = _at(findings, lines["copy"])
    assert finding.details["sync_kind"] == "copy" and finding.rule == "TL202", finding.details


def test_a_numpy_draw_made_a_cuda_tensor_is_host_built_tl204():
    np = pytest.importorskip("numpy")
    lines = {}

    def body(step):
        _busy(4)
        z = torch.cuda.FloatTensor(np.random.normal(0, 1, (step + 4, 8))); lines["draw"] = _line()
    findings, _ = _training(body)
    finding = _at(findings, lines["draw"])
    assert finding.details["sync_kind"] == "host-built" and finding.rule == "TL204", finding.details


def test_a_read_right_after_a_read_that_drained_the_queue_is_no_stall():
    x = torch.ones(4, device="cuda")
    lines = {}

    def body(step):
        _busy(4)
        total = x.sum()
        first = total.item(); lines["first"] = _line()
        # Nothing queued since the first read: a kernel launched in between would still be
        # running when the query asks (measured on an H200: 94 of 100 right after a tiny sum).
        second = total.item(); lines["second"] = _line()
        copied = torch.tensor([first]).to("cuda"); lines["copy"] = _line()
    findings, _ = _training(body)
    first, second = _at(findings, lines["first"]), _at(findings, lines["second"])
    assert "no_stall" not in first.details and is_per_step_cost(first), first.details
    assert "idle-on-arrival" in second.details, second.details
    assert "idle-on-arrival" in _at(findings, lines["copy"]).details
    assert second.rule == "TL101" and "already idle when it arrived" in second.message


def test_a_read_right_after_an_explicit_synchronize_is_no_stall():
    lines = {}

    def body(step):
        y = _busy(4)
        torch.cuda.synchronize()
        value = y[0, 0].item(); lines["read"] = _line()
    findings, _ = _training(body)
    assert "idle-on-arrival" in _at(findings, lines["read"]).details


def test_a_sampling_loop_s_per_token_read_is_the_host_needing_the_value():
    probabilities = torch.softmax(torch.randn(1000, device="cuda"), dim=0)
    tokens = []
    with sanitize(checks={"sync"}, sync_min_count=3) as session:
        with torch.no_grad():
            for _ in range(20):
                token = torch.multinomial(probabilities, num_samples=1).item(); line = _line()
                tokens.append(token)
    [finding] = [f for f in session.findings if f.line == line]
    assert finding.details["no_stall"] == "host-needs-value", finding.details
    assert finding.rule is None and finding.severity == "info"


def test_a_sync_inside_backward_points_at_the_mask_indexing_in_forward():
    model = torch.nn.Linear(16, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    features = torch.randn(256, 16, device="cuda")
    labels = torch.randint(0, 4, (256,), device="cuda")
    train_mask = torch.rand(256, device="cuda") > 0.5
    with sanitize(checks={"sync"}, warmup_steps=1, sync_min_count=3) as session:
        for _ in range(STEPS):
            out = model(features)
            loss = torch.nn.functional.cross_entropy(out[train_mask], labels[train_mask]); mask_line = _line()
            loss.backward(); backward_line = _line()
            optimizer.step()
            optimizer.zero_grad()
    by_line = {}
    for finding in session.findings:
        by_line.setdefault(finding.line, []).append(finding)
    backward = [f for f in by_line.get(backward_line, []) if f.details["sync_kind"] == "backward"]
    if not backward:
        pytest.skip(f"this torch's mask-index backward did not sync: {[f.message for f in session.findings]}")
    [symptom] = backward
    assert symptom.details["no_stall"] == "backward-symptom" and symptom.rule is None
    assert any(place.endswith(f":{mask_line}") for place in symptom.details["caused_by"]), symptom.details
    [cause] = [f for f in by_line[mask_line] if f.details["sync_kind"] == "mask-index"]
    assert cause.details["backward_site"].endswith(f":{backward_line}")

