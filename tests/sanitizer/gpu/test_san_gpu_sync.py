"""The sync check on a real GPU: each sync kind planted, a clean loop, the allowlist,
and the pytest plugin and the runner end to end. Needs no linter engine (no libcst)."""
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer import allow_sync, sanitize  # noqa: E402

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.gpu


def _line():
    return sys._getframe(1).f_lineno


_BUSY = {}


def _busy(ms=20):
    # Queue tens of milliseconds of GPU work so that a sync really waits.
    a = _BUSY.setdefault("a", torch.randn(4096, 4096, device="cuda"))
    for _ in range(max(1, ms // 2)):
        a = a @ _BUSY["a"] * 1e-3


def _sites(session):
    return {(f.line, f.details["sync_kind"]): f for f in session.findings if f.kind == "sync"}


def _assert_site(session, line, kind):
    sites = _sites(session)
    seen = [(f.file, f.line, f.details["sync_kind"], f.details["stall_ms"]) for f in session.findings]
    assert (line, kind) in sites, f"expected {kind} at line {line}, got {seen}"
    finding = sites[(line, kind)]
    assert finding.file == os.path.abspath(__file__) or os.path.samefile(finding.file, __file__)
    return finding


def test_item_is_attributed_classified_and_timed():
    x = torch.ones(4, device="cuda")
    # Warm the caching allocator first: a first-time cudaMalloc inside _busy() itself
    # waits for the device and would leave little for .item() to wait on.
    _busy(30)
    torch.cuda.synchronize()
    with sanitize(checks={"sync"}, sync_min_count=1) as session:
        _busy(30)
        x.sum().item(); line = _line()
    finding = _assert_site(session, line, "item")
    assert finding.rule == "TL101"
    assert finding.details["stall_ms"] is not None and finding.details["stall_ms"] > 2.0, finding.details
    assert finding.details["api"] == "Tensor.item"


@pytest.mark.parametrize("kind", ["tolist", "cpu", "numpy", "bool", "format", "print", "float"])
def test_readback_kinds(kind, capsys):
    x = torch.arange(4.0, device="cuda")
    with sanitize(checks={"sync"}) as session:
        if kind == "tolist":
            x.tolist(); line = _line()
        elif kind == "cpu":
            x.cpu(); line = _line()
        elif kind == "numpy":
            x.cpu().numpy(); line = _line()
        elif kind == "bool":
            flag = bool(x.sum() > 0); line = _line()
        elif kind == "format":
            text = f"{x.sum():.3f}"; line = _line()
        elif kind == "print":
            print(x); line = _line()
        elif kind == "float":
            float(x.sum()); line = _line()
    expected = {"print": "format", "float": "item"}.get(kind, kind)
    finding = _assert_site(session, line, expected)
    if kind == "print":
        assert finding.count == 1  # 38 syncs inside torch's formatter are one print


@pytest.mark.parametrize("kind", ["nonzero", "mask-index", "unique", "where", "masked_select"])
def test_dynamic_shape_kinds(kind):
    x = torch.randn(64, device="cuda")
    mask = x > 0
    with sanitize(checks={"sync"}, sync_min_count=1) as session:  # one sync per kind: every site is a finding
        if kind == "nonzero":
            x.nonzero(); line = _line()
        elif kind == "mask-index":
            y = x[mask]; line = _line()
        elif kind == "unique":
            torch.unique(x.round()); line = _line()
        elif kind == "where":
            torch.where(mask); line = _line()
        elif kind == "masked_select":
            torch.masked_select(x, mask); line = _line()
    expected = {"where": "nonzero", "masked_select": "nonzero"}.get(kind, kind)
    finding = _assert_site(session, line, expected)
    assert finding.rule == "TL103"


def test_mask_index_gets_timed_in_the_sampled_window():
    x = torch.randn(64, device="cuda")
    mask = x > 0
    with sanitize(checks={"sync"}) as session:
        for _ in range(3):
            _busy(10)
            y = x[mask]; line = _line()
    finding = _assert_site(session, line, "mask-index")
    assert finding.count == 3
    assert finding.details["timed_calls"] >= 1


@pytest.mark.parametrize("kind", ["synchronize", "stream-sync", "event-sync", "empty-cache", "pageable-copy", "copy",
                                  "unpinned-copy", "pinned-copy"])
def test_blind_spots(kind):
    host = torch.randn(1 << 16)
    pinned = torch.randn(1 << 16).pin_memory()
    with sanitize(checks={"sync"}, sync_min_count=1) as session:
        _busy(10)
        if kind == "synchronize":
            torch.cuda.synchronize(); line = _line()
        elif kind == "stream-sync":
            torch.cuda.current_stream().synchronize(); line = _line()
        elif kind == "event-sync":
            event = torch.cuda.Event(); event.record(); event.synchronize(); line = _line()
        elif kind == "empty-cache":
            torch.cuda.empty_cache(); line = _line()
        elif kind == "pageable-copy":
            host.to("cuda", non_blocking=True); line = _line()
        elif kind == "copy":
            torch.tensor([1.0, 2.0], device="cuda"); line = _line()
        elif kind == "unpinned-copy":
            host.to("cuda"); line = _line()
        elif kind == "pinned-copy":
            pinned.to("cuda"); line = _line()
    expected = {"stream-sync": "synchronize", "unpinned-copy": "copy", "pinned-copy": "copy"}.get(kind, kind)
    finding = _assert_site(session, line, expected)
    # A blocking copy's rule is the fix it needs, from what the run saw of its source (issue #32: 4):
    # pageable memory, TL202 (pin the loader); pinned, TL201 (non_blocking); a list, neither.
    assert finding.rule == {"synchronize": "TL102", "stream-sync": "TL102", "event-sync": "TL102",
                            "empty-cache": "TL303", "pageable-copy": "TL202", "copy": None,
                            "unpinned-copy": "TL202", "pinned-copy": "TL201"}[kind]


def test_pinned_non_blocking_copy_is_clean():
    host = torch.randn(1 << 16).pin_memory()
    with sanitize(checks={"sync"}) as session:
        host.to("cuda", non_blocking=True)
    assert _sites(session) == {}


def test_clean_training_loop_has_no_finding():
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.randn(64, 256, device="cuda")
    with sanitize(checks={"sync"}) as session:
        for _ in range(6):
            loss = model(data).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    assert session.findings == []
    assert session.step_index == 6


def test_per_step_accounting_with_warmup():
    model = torch.nn.Linear(16, 16).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8, 16, device="cuda")
    with sanitize(checks={"sync"}, warmup_steps=2) as session:
        for _ in range(6):
            loss = model(data).square().mean()
            loss.backward()
            value = loss.item(); line = _line()
            optimizer.step()
            optimizer.zero_grad()
    finding = _assert_site(session, line, "item")
    assert finding.count == 4 and finding.details["warmup_count"] == 2, finding.details
    assert finding.details["every_step"] is True and finding.details["per_step"] == 1.0, finding.details
    # Written in a test file: reported, but as the test's own sync (severity info).
    assert finding.details["in_test"] is True and finding.severity == "info"


def test_noqa_and_allow_sync_silence_sites():
    x = torch.ones(4, device="cuda")
    with sanitize(checks={"sync"}) as session:
        x.sum().item()  # noqa: TL101
        x.sum().item()  # noqa
        with allow_sync():
            x.sum().item()
        x.sum().item(); wrong_code = _line()  # noqa: TL201
    assert set(_sites(session)) == {(wrong_code, "item")}


def test_a_quiet_item_leaves_warn_mode_on_for_the_syncs_after_it():
    # .item() on a plain CUDA tensor is recorded with the debug mode off for the call (sync/check.py's docstring).
    x = torch.ones(4, device="cuda")
    with sanitize(checks={"sync"}, sync_min_count=1) as session:
        x.sum().item(); item_line = _line()
        assert torch.cuda.get_sync_debug_mode() == 1
        if x.sum() > 0:
            x.cpu(); cpu_line = _line()
    assert _assert_site(session, item_line, "item").count == 1
    assert _assert_site(session, cpu_line, "cpu").count == 1


def test_an_item_still_orders_side_stream_work_for_the_race_check_under_the_fallback(monkeypatch):
    # Without the native tap's ledger the race check hears of .item() through the sync
    # warning; the sync check must not silence it (sync/check.py's docstring).
    monkeypatch.setenv("TORCHLINT_RACE_TAP", "python")
    with sanitize(checks={"sync", "race"}, sync_min_count=1) as session:
        a = torch.rand(4, 2, device="cuda")
        a.sum().item(); line = _line()
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.mul(a, 5, out=a)
        torch.cuda.synchronize()
    assert [f for f in session.findings if f.kind == "race"] == []
    assert _assert_site(session, line, "item").count == 1


def test_grad_scaler_non_blocking_found_inf_copy_is_not_a_sync():
    model = torch.nn.Linear(64, 64).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    data = torch.randn(8, 64, device="cuda")
    with sanitize(checks={"sync"}, warmup_steps=0) as session:
        for _ in range(3):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(data).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    kinds = sorted(f.details["sync_kind"] for f in session.findings if f.kind == "sync")
    assert kinds == ["item"], [(f.file, f.line, f.details["sync_kind"]) for f in session.findings]


def test_stop_restores_every_global():
    before = (torch.cuda.get_sync_debug_mode(), torch.cuda.synchronize, torch.Tensor.__dict__.get("item"),
              warnings.showwarning, len(warnings.filters))
    with sanitize(checks={"sync"}):
        assert torch.cuda.get_sync_debug_mode() == 1
    after = (torch.cuda.get_sync_debug_mode(), torch.cuda.synchronize, torch.Tensor.__dict__.get("item"),
             warnings.showwarning, len(warnings.filters))
    assert before == after


def test_pytest_plugin_end_to_end(pytester):
    pytester.makepyfile(test_planted=textwrap.dedent("""
        import torch

        def test_syncs_every_step():
            model = torch.nn.Linear(8, 8).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(4, 8, device="cuda")
            for _ in range(5):
                loss = model(x).sum()
                loss.backward()
                print(loss.item())
                opt.step()

        def test_clean():
            x = torch.randn(4, device="cuda")
            y = x * 2
    """))
    report = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--gpu-sanitize", "--gpu-sanitize-checks=sync", "--gpu-sanitize-fail-on=sync",
        f"--gpu-sanitize-report={report}", "test_planted.py",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*gpu-sanitize: checks=sync*", "*gpu-sanitize*",
                                 "*test_planted.py:*: sync item x* in 1 test, * ms stalled*"])
    data = json.loads(report.read_text())
    assert data["tests"]["test_planted.py::test_syncs_every_step"]["failed_by_sanitizer"] is True
    assert data["tests"]["test_planted.py::test_clean"]["findings"] == 0


def test_pytest_plugin_defaults_fail_a_race_and_report_memory(pytester):
    # Plain --gpu-sanitize: every check, and the default fail-on (races and
    # fragmentation OOMs), so a racy test fails and a sync alone does not.
    pytester.makepyfile(test_planted=textwrap.dedent("""
        import torch

        def test_racy():
            side = torch.cuda.Stream()
            a = torch.rand(1 << 20, device="cuda")
            with torch.cuda.stream(side):
                torch.mul(a, 5, out=a)
            a.sum()

        def test_synchronized_with_a_sync():
            side = torch.cuda.Stream()
            a = torch.rand(1 << 20, device="cuda")
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.mul(a, 5, out=a)
            torch.cuda.current_stream().wait_stream(side)
            print(a.sum().item())
    """))
    report = pytester.path / "run.json"
    result = pytester.runpytest_subprocess(
        "--gpu-sanitize", f"--gpu-sanitize-report={report}", "-p", "no:cacheprovider", "test_planted.py",
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*cross-stream race*"])
    data = json.loads(report.read_text())
    racy = data["tests"]["test_planted.py::test_racy"]
    assert racy["failed_by_sanitizer"] is True
    assert data["tests"]["test_planted.py::test_synchronized_with_a_sync"]["failed_by_sanitizer"] is False
    assert racy["memory"]["peak_allocated_bytes"] >= 4 << 20  # the 4 MiB tensor, from the test's own session


def test_runner_end_to_end(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent("""
        import sys
        import torch

        model = torch.nn.Linear(8, 8).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(4, 8, device="cuda")
        for _ in range(int(sys.argv[1])):
            loss = model(x).sum()
            loss.backward()
            total = loss.item()
            opt.step()
    """))
    report = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, "-m", "torchlint.sanitizer", "--checks", "sync", "--report-json", str(report),
         "--strict", "--fail-on", "sync", str(script), "6"],
        capture_output=True, text=True, cwd=tmp_path,
    )
    assert done.returncode == 3, done.stderr
    assert "train.py:11: sync item x1/step" in done.stderr
    data = json.loads(report.read_text())
    [finding] = [f for f in data["findings"] if f["kind"] == "sync"]
    assert finding["count"] == 4 and finding["details"]["every_step"] is True
    assert data["steps"] == {"completed": 6, "warmup": 2, "measured": 4, "source": "optimizer"}


def test_one_off_reads_leave_no_summary_entry_and_a_per_iteration_item_does(pytester):
    # The report: the clean test's single final read was listed as a TL101 stall.
    pytester.makepyfile(test_suite=textwrap.dedent("""
        import io
        import torch

        def _train(steps, log):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(64, 16, device="cuda"), torch.randn(64, 1, device="cuda")
            total = torch.zeros((), device="cuda")
            losses = []
            for _ in range(steps):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                if log:
                    losses.append(loss.item())  # PER_ITERATION
                total += loss.detach()
            return model, total, losses

        def test_logs_every_iteration():
            model, total, losses = _train(20, log=True)
            assert len(losses) == 20

        def test_final_read():
            model, total, _ = _train(20, log=False)
            assert total.item() > 0  # FINAL_READ

        def test_checkpoint_save():
            model, _, _ = _train(20, log=False)
            buffer = io.BytesIO()
            torch.save(model.state_dict(), buffer)  # CHECKPOINT
            assert buffer.tell() > 0

        def test_assert_close():
            model, _, _ = _train(3, log=False)
            out = model(torch.ones(4, 16, device="cuda"))
            torch.testing.assert_close(out, out.clone())  # ASSERT_CLOSE
    """))
    report = pytester.path / "run.json"
    result = pytester.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync",
                                           f"--gpu-sanitize-report={report}", "test_suite.py")
    result.assert_outcomes(passed=4)
    source = (pytester.path / "test_suite.py").read_text().splitlines()
    line = {marker: source.index(next(s for s in source if f"# {marker}" in s)) + 1
            for marker in ("PER_ITERATION", "FINAL_READ", "CHECKPOINT", "ASSERT_CLOSE")}
    section = result.stdout.str().split("= gpu-sanitize =")[1]
    assert f"test_suite.py:{line['PER_ITERATION']}: sync item x" in section
    for marker in ("FINAL_READ", "CHECKPOINT", "ASSERT_CLOSE"):
        assert f"test_suite.py:{line[marker]}:" not in section, (marker, section)
    data = json.loads(report.read_text())
    one_off = {f["line"] for f in data["findings"] if f["details"]["repeated"] is False}
    assert {line["FINAL_READ"], line["CHECKPOINT"], line["ASSERT_CLOSE"]} <= one_off
    assert all(f["severity"] == "info" and f["rule"] is None
               for f in data["findings"] if f["details"]["repeated"] is False)


def test_a_target_install_attributes_a_real_item_to_the_test_line(tmp_path_factory, tmp_path):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        from target_install import install_target, run_pytest_from
    finally:
        sys.path.pop(0)
    project = tmp_path / "project"
    project.mkdir()
    target = install_target(project / "_vendor", tmp_path_factory.mktemp("wheels"))
    test_file = project / "test_target.py"
    test_file.write_text(textwrap.dedent("""
        import torch

        def test_item_in_a_loop():
            x = torch.ones(8, device="cuda")
            for _ in range(10):
                x.sum().item()  # ITEM
    """))
    done = run_pytest_from(target, project, "--gpu-sanitize", "--gpu-sanitize-checks=sync",
                           "--gpu-sanitize-report=run.json", "test_target.py")
    assert done.returncode == 0, done.stdout + done.stderr
    [finding] = json.loads((project / "run.json").read_text())["findings"]
    assert finding["file"] == str(test_file) and finding["line"] == 7 and finding["rule"] == "TL101"
