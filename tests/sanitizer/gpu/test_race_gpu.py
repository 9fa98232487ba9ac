"""The race check on a real GPU: the issue's eight cases, racy and synchronized."""
from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import race_cases  # noqa: E402  (tests/sanitizer/gpu is on sys.path under pytest's rootdir import mode)

from torchlint.sanitizer.races import check as races  # noqa: E402
from torchlint.sanitizer.findings import RACE  # noqa: E402

if importlib.util.find_spec("triton") is not None:
    import triton  # noqa: F401  (imported before the check starts, so its launcher is wrapped)


INTERCEPTIONS = ["native", "python"]  # the native tap, and the dispatch-mode fallback


def run_checked(function, *args, interception=None):
    torch.cuda.synchronize()
    check = races.RaceCheck(None)
    check._tap_choice = interception
    check.start()
    try:
        function(*args)
        torch.cuda.synchronize()
    finally:
        check.stop()
    if interception == "native" and check.active:
        assert check.summary()["interception"] == "native tap", check.summary()
    return check, check.findings()


def _describe(findings):
    return "\n".join(f"{f.location}: {f.message}\n  fix: {f.fix_hint}" for f in findings)


CASE_NAMES = list(race_cases.CASES)


def _skip_if_missing(name):
    if name == "6 triton kernel" and importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    if name == "5 async collective":
        import torch.distributed as dist

        if not dist.is_available():
            pytest.skip("torch.distributed is not available")


@pytest.mark.parametrize("interception", INTERCEPTIONS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_racy_case_is_reported(name, interception):
    _skip_if_missing(name)
    check, findings = run_checked(race_cases.CASES[name], False, interception=interception)
    assert findings, f"{name}: no race reported"
    assert all(f.kind == RACE and f.severity == "error" for f in findings)
    for finding in findings:
        details = finding.details
        assert details["first"]["stream"] != details["second"]["stream"]
        assert finding.fix_hint
        assert details["last_sync"]
        if details["tensor"] is not None:
            assert details["tensor"]["shape"] and details["tensor"]["byte_ranges"]["overlap"]
    # the site is this repository's case file, not torch
    assert any((f.file or "").endswith("race_cases.py") for f in findings), _describe(findings)


@pytest.mark.parametrize("interception", INTERCEPTIONS)
@pytest.mark.parametrize("name", CASE_NAMES)
def test_synchronized_twin_is_clean(name, interception):
    _skip_if_missing(name)
    check, findings = run_checked(race_cases.CASES[name], True, interception=interception)
    assert findings == [], _describe(findings)


def test_case2_reports_the_overlap_in_bytes():
    _, findings = run_checked(race_cases.views, False)
    (finding,) = findings
    ranges = finding.details["tensor"]["byte_ranges"]
    assert ranges["overlap"] == [1000, 2000]


def test_case3_is_reported_as_allocator_reuse_with_previous_owner():
    _, findings = run_checked(race_cases.reuse, False)
    reuse = [f for f in findings if f.details["cause"] == "reuse"]
    assert reuse, _describe(findings)
    assert "record_stream" in reuse[0].fix_hint
    assert "previous_owner" in reuse[0].details


def test_case8_points_at_the_early_event_record():
    _, findings = run_checked(race_cases.event, False)
    (finding,) = findings
    assert "early_event" in finding.details
    assert "record" in finding.fix_hint


@pytest.mark.parametrize("interception", INTERCEPTIONS)
def test_correct_multi_stream_training_loop_runs_clean(interception):
    check, findings = run_checked(race_cases.training_loop, interception=interception)
    assert check.active
    assert findings == [], _describe(findings)


def test_the_native_tap_keeps_default_stream_only_memory_to_itself():
    check, findings = run_checked(race_cases.training_loop, interception="native")
    tap = check.summary()["native_tap"]
    assert tap["internal_errors"] == 0 and tap["callback_errors"] == 0
    # The model, its gradients and optimizer state live on the default stream
    # only: their accesses never reach the Python engine.
    assert tap["accesses_local"] > 3 * tap["accesses_forwarded"] > 0, tap


def test_single_stream_program_never_switches_the_analysis_on():
    def single_stream():
        model = torch.nn.Linear(256, 256).cuda()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(32, 256, device="cuda")).sum().backward()
            optimizer.step()

    check, findings = run_checked(single_stream)
    assert not check.active and findings == []


def test_through_a_session_and_repeats_are_counted():
    from torchlint.sanitizer.session import SanitizerSession

    torch.cuda.synchronize()
    session = SanitizerSession(checks={"race"})
    session.start()
    try:
        for _ in range(3):
            race_cases.prefetcher(False)
        torch.cuda.synchronize()
    finally:
        session.stop()
    findings = [f for f in session.findings if f.kind == RACE]
    assert findings
    assert max(f.count for f in findings) >= 3 or len(findings) >= 1
