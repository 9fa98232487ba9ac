"""The session engine: the check protocol, start/stop order, steps and warm-up, failing kinds."""
import sys
import threading
import types

import pytest

from torchlint.sanitizer import session as session_module
from torchlint.sanitizer.findings import Finding
from torchlint.sanitizer.session import (
    CHECK_REGISTRY, DEFAULT_FAIL_ON, Check, SanitizerSession, allow_sync, finding_fails, parse_fail_on, sanitize,
)

EVENTS = []


class _Recorder(Check):
    def __init__(self, session):
        self.session = session
        self.steps = []

    def start(self):
        EVENTS.append(("start", self.name))

    def stop(self):
        EVENTS.append(("stop", self.name))

    def on_step(self, step):
        self.steps.append((step, self.session.in_warmup))

    def findings(self):
        return [Finding(kind="sync", severity="info", message=f"{self.name} saw {len(self.steps)} steps")]


def _make(name):
    return type(f"{name.title()}Check", (_Recorder,), {"name": name})


@pytest.fixture
def fake_checks(monkeypatch):
    module = types.ModuleType("fake_checks_mod")
    for name in ("sync", "memory", "race"):
        setattr(module, f"{name.title()}Check", _make(name))
    monkeypatch.setitem(sys.modules, "fake_checks_mod", module)
    for name in ("sync", "memory", "race"):
        monkeypatch.setitem(CHECK_REGISTRY, name, f"fake_checks_mod:{name.title()}Check")
    EVENTS.clear()
    return module


def test_checks_start_memory_sync_race_and_stop_in_reverse(fake_checks):
    with sanitize(checks={"race", "sync", "memory"}):
        pass
    assert EVENTS == [("start", "memory"), ("start", "sync"), ("start", "race"),
                      ("stop", "race"), ("stop", "sync"), ("stop", "memory")]


def test_only_the_asked_checks_are_imported(monkeypatch, fake_checks):
    monkeypatch.setitem(CHECK_REGISTRY, "race", "no_such_module_xyz:RaceCheck")
    with sanitize(checks={"sync"}) as session:
        pass
    assert len(session.findings) == 1
    with pytest.raises(ModuleNotFoundError):
        SanitizerSession(checks={"race"}).start()


def test_a_failing_start_stops_the_checks_already_started(monkeypatch, fake_checks):
    class Broken(_Recorder):
        name = "race"

        def start(self):
            raise RuntimeError("boom")

    fake_checks.RaceCheck = Broken
    with pytest.raises(RuntimeError):
        SanitizerSession(checks={"sync", "memory", "race"}).start()
    assert EVENTS == [("start", "memory"), ("start", "sync"), ("stop", "sync"), ("stop", "memory")]


def test_unknown_check_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="valid checks: sync, memory, race"):
        SanitizerSession(checks={"speed"})


def test_sanitize_accepts_a_comma_string(fake_checks):
    with sanitize(checks="sync,memory") as session:
        assert session.checks == {"sync", "memory"}


def test_explicit_steps_reach_every_check_with_the_new_index(fake_checks):
    with sanitize(checks={"sync", "memory"}, warmup_steps=2) as session:
        assert session.in_warmup
        for _ in range(3):
            session.step()
    checks = {c.name: c for c in session._checks}
    assert checks["sync"].steps == [(1, True), (2, False), (3, False)]
    assert session.step_index == 3


@pytest.mark.parametrize("completed, warmup, expected_warmup, measured", [
    (0, 2, 0, 1), (1, 2, 0, 1), (2, 2, 1, 1), (3, 2, 2, 1), (10, 2, 2, 8), (10, 0, 0, 10),
])
def test_warmup_is_judged_over_the_whole_run(fake_checks, completed, warmup, expected_warmup, measured):
    with sanitize(checks={"sync"}, warmup_steps=warmup) as session:
        for _ in range(completed):
            session.step()
    assert session.effective_warmup() == expected_warmup
    assert session.measured_steps() == measured
    assert session.is_measured(expected_warmup) and (expected_warmup == 0 or not session.is_measured(expected_warmup - 1))


def test_optimizer_hook_counts_the_lead_optimizer_only_and_is_removed(fake_checks):
    torch = pytest.importorskip("torch")
    a, b = torch.nn.Parameter(torch.ones(1)), torch.nn.Parameter(torch.ones(1))
    first, second = torch.optim.SGD([a], lr=0.1), torch.optim.SGD([b], lr=0.1)
    with sanitize(checks={"sync"}) as session:
        for _ in range(3):
            first.step()
            second.step()
    assert session.step_index == 3 and session.steps_summary()["source"] == "optimizer"
    first.step()
    assert session.step_index == 3  # the hook went away with the session


def test_explicit_step_turns_the_optimizer_hook_off(fake_checks):
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    with sanitize(checks={"sync"}) as session:
        optimizer.step()
        session.step()
        optimizer.step()
        session.step()
    assert session.step_index == 3 and session.steps_summary()["source"] == "explicit"


def test_allow_sync_nests_and_is_thread_local():
    seen = []
    with allow_sync():
        with allow_sync():
            assert session_module.sync_allowed()
        assert session_module.sync_allowed()
        worker = threading.Thread(target=lambda: seen.append(session_module.sync_allowed()))
        worker.start()
        worker.join()
    assert not session_module.sync_allowed() and seen == [False]


def test_fail_on_selectors():
    oom_frag = Finding(kind="oom", severity="error", message="m", details={"cause": "fragmentation"})
    oom_true = Finding(kind="oom", severity="error", message="m", details={"cause": "exhaustion"})
    sync = Finding(kind="sync", severity="warning", message="m")
    race = Finding(kind="race", severity="error", message="m")
    assert DEFAULT_FAIL_ON == {"oom:fragmentation", "race"}
    assert finding_fails(oom_frag, DEFAULT_FAIL_ON) and not finding_fails(oom_true, DEFAULT_FAIL_ON)
    assert finding_fails(race, DEFAULT_FAIL_ON)
    assert not finding_fails(sync, DEFAULT_FAIL_ON)
    assert finding_fails(oom_true, parse_fail_on("oom")) and finding_fails(sync, parse_fail_on("sync,race"))
    assert parse_fail_on("none") == frozenset() and "race" in parse_fail_on("all")
    assert parse_fail_on("default,sync") == {"oom:fragmentation", "race", "sync"}
    with pytest.raises(ValueError, match="valid:.*oom:fragmentation"):
        parse_fail_on("slow")


def test_failing_findings_and_report(fake_checks):
    with sanitize(checks={"sync"}, fail_on={"sync"}) as session:
        session.step()
    assert len(session.failing_findings()) == 1
    report = session.report()
    assert report["steps"] == {"completed": 1, "warmup": 0, "measured": 1, "source": "explicit"}
    assert report["fail_on"] == ["sync"] and report["checks"] == ["sync"]


def test_test_id_is_stamped_on_findings(fake_checks):
    with sanitize(checks={"sync"}, test_id="tests/test_x.py::test_y") as session:
        pass
    assert session.findings[0].test == "tests/test_x.py::test_y"


def test_package_import_does_not_import_torch():
    import subprocess

    code = "import sys, torchlint.sanitizer as s; s.sanitize; s.allow_sync; s.Finding; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
