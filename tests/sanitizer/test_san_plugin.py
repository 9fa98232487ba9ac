"""The pytest plugin, run through pytester in subprocesses (the plugin loads via its entry point)."""
import json
import textwrap

import pytest

from torchlint.sanitizer.findings import Finding, Frame
from torchlint.sanitizer.pytest_plugin import INACTIVE_LINE, decode_findings, encode_findings
from san_sync_helpers import write_distribution

pytest_plugins = ["pytester"]


@pytest.fixture
def project(pytester):
    pytester.makepyfile(
        test_a="def test_a():\n    assert True\n",
        test_b="def test_b():\n    assert True\n",
    )
    return pytester


def _header_lines(result):
    return [line for line in result.outlines if "GPU sanitizer" in line or line.startswith("gpu-sanitize:")]


def test_flag_does_not_swallow_the_path(project):
    result = project.runpytest_subprocess("--gpu-sanitize", "test_a.py")
    result.assert_outcomes(passed=1)
    assert _header_lines(result) == [INACTIVE_LINE]


def test_without_cuda_one_header_line_and_tests_run_normally(project):
    project.makepyfile(test_gpu="import pytest\n\n@pytest.mark.gpu\ndef test_needs_gpu():\n    pass\n")
    result = project.runpytest_subprocess("--gpu-sanitize", "-rs")
    result.assert_outcomes(passed=2, skipped=1)
    assert result.outlines.count(INACTIVE_LINE) == 1
    result.stdout.fnmatch_lines(["*SKIPPED*no CUDA device*"])
    assert "gpu-sanitize ==" not in result.stdout.str()  # no section while inactive


def test_bad_checks_is_a_usage_error_naming_the_valid_checks(project):
    result = project.runpytest_subprocess("--gpu-sanitize-checks=sync,speed")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown check(s) speed; valid checks: sync, memory, race*"])


def test_bad_fail_on_is_a_usage_error(project):
    result = project.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-fail-on=slowness")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*unknown finding kind 'slowness'*"])


def test_off_by_default_and_torch_not_imported(pytester):
    pytester.makepyfile(test_c="import sys\n\ndef test_c():\n    assert 'torch' not in sys.modules\n")
    result = pytester.runpytest_subprocess("-p", "torchlint")
    result.assert_outcomes(passed=1)
    assert _header_lines(result) == []


def test_options_are_listed_in_their_group(pytester):
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["*torchlint GPU sanitizer*", "*--gpu-sanitize *", "*--gpu-sanitize-checks=CHECKS*",
                                 "*--gpu-sanitize-fail-on=KINDS*", "*--gpu-sanitize-report=PATH*",
                                 "*gpu_sanitize (bool)*", "*gpu_sanitize_checks (string)*"])


def test_ini_keys(project):
    project.makeini("[pytest]\ngpu_sanitize = true\ngpu_sanitize_checks = sync\ngpu_sanitize_report = out/run.json\n")
    result = project.runpytest_subprocess()
    result.assert_outcomes(passed=2)
    assert _header_lines(result) == [INACTIVE_LINE]
    report = json.loads((project.path / "out" / "run.json").read_text())
    assert report["version"] == 1 and report["findings"] == [] and report["tests"] == {}
    assert report["inactive"] == "no CUDA device"  # nothing was checked: not "no findings"
    project.makeini("[pytest]\ngpu_sanitize_checks = sync,bogus\n")
    assert project.runpytest_subprocess().ret == 4


def test_env_turns_it_on_and_marker_kwargs_are_validated(project, monkeypatch):
    monkeypatch.setenv("TORCHLINT_GPU_SANITIZE", "1")
    result = project.runpytest_subprocess("test_a.py")
    assert _header_lines(result) == [INACTIVE_LINE]
    project.makepyfile(test_m="import pytest\n\n@pytest.mark.gpu_sanitize(speed=1)\ndef test_m():\n    pass\n")
    result = project.runpytest_subprocess("test_m.py")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*gpu_sanitize marker takes only keyword arguments*speed*"])


@pytest.fixture
def planted(pytester, monkeypatch):
    """A project whose tests 'sync' through a fake library, with the checks forced on without CUDA."""
    monkeypatch.setenv("TORCHLINT_SANITIZER_FORCE", "1")
    write_distribution(pytester.path / "deps", "fakecuda")  # `pip install --target deps fakecuda`
    pytester.makeconftest("import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'deps'))\n")
    pytester.makepyfile(model=textwrap.dedent("""
        import fakecuda

        def train_step(x):
            return fakecuda.read_back(x)  # SYNC
    """))
    pytester.makepyfile(test_train=textwrap.dedent("""
        import pytest
        import model

        def test_syncs():
            for _ in range(6):
                model.train_step(1)

        def test_clean():
            assert model is not None

        @pytest.mark.gpu_sanitize(enabled=False)
        def test_not_sanitized():
            model.train_step(1)

        @pytest.mark.gpu_sanitize(fail_on="none")
        def test_reported_only():
            for _ in range(5):
                model.train_step(1)
    """))
    return pytester


def test_failing_kind_fails_the_test_and_is_summarised(planted):
    result = planted.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync", "--gpu-sanitize-fail-on=sync",
                                          "--gpu-sanitize-report=run.json")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines([
        "gpu-sanitize: checks=sync fail-on=sync torch * on no CUDA device, forced on",
        "*GPU sanitizer: 1 failing finding(s)*",
        "*= gpu-sanitize =*",
        "1 site(s) in 2 of 3 sanitized tests",
        "model.py:4: sync other x11 in 2 tests, stall not timed*",
        "FAILED by sanitizer: test_train.py::test_syncs (1 failing finding(s))",
    ])
    report = json.loads((planted.path / "run.json").read_text())
    assert report["tests"]["test_train.py::test_syncs"] == {
        "outcome": "failed", "findings": 1, "one_off": 0, "failed_by_sanitizer": True}
    assert report["tests"]["test_train.py::test_clean"]["findings"] == 0
    assert "test_train.py::test_not_sanitized" not in report["tests"]
    [first, second] = report["findings"]
    assert first["test"] == "test_train.py::test_syncs" and first["count"] == 6 and first["line"] == 4
    [site] = report["sites"]
    assert site["tests"] == 2 and site["count"] == 11 and site["failing_tests"] == 1 and site["rule"] is None


def test_default_fail_on_reports_without_failing(planted):
    result = planted.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync")
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["model.py:4: sync other x11 in 2 tests*"])
    assert "FAILED by sanitizer" not in result.stdout.str()


def test_findings_travel_through_xdist_user_properties(planted):
    pytest.importorskip("xdist")
    result = planted.runpytest_subprocess("-n", "2", "--gpu-sanitize", "--gpu-sanitize-checks=sync",
                                          "--gpu-sanitize-fail-on=sync", "--gpu-sanitize-report=run.json")
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(["FAILED by sanitizer: test_train.py::test_syncs (1 failing finding(s))"])
    report = json.loads((planted.path / "run.json").read_text())
    assert report["tests"]["test_train.py::test_syncs"]["failed_by_sanitizer"] is True
    assert len(report["findings"]) == 2


def test_user_properties_round_trip():
    finding = Finding(kind="sync", severity="warning", message="m", file="/p/a.py", line=3, function="f",
                      stack=[Frame("/p/a.py", 3, "f"), Frame("/p/b.py", 4, "g"), Frame("/p/c.py", 5, "h"),
                             Frame("/p/d.py", 6, "i")], count=2, rule="TL101", fix_hint="h",
                      details={"sync_kind": "item", "stall_ms": 1.5})
    other = Finding(kind="race", severity="error", message="r")
    text = encode_findings([finding, other], failing=[other])
    assert "\n" not in text and ", " not in text  # compact
    decoded = decode_findings(text)
    assert [d["failing"] for d in decoded] == [False, True]
    assert decoded[0]["finding"].stack == finding.stack[:3]
    assert decoded[0]["finding"].details == finding.details and decoded[1]["finding"] == other


# --- a suite's summary: one-off syncs left out, sites grouped across tests ------------

@pytest.fixture
def suite(pytester, monkeypatch):
    """Twelve repeated sites, a helper shared by three tests, and the one-off syncs every GPU test ends with."""
    monkeypatch.setenv("TORCHLINT_SANITIZER_FORCE", "1")
    write_distribution(pytester.path / "deps", "fakecuda")
    pytester.makeconftest("import os, sys\nsys.path.insert(0, os.path.join(os.path.dirname(__file__), 'deps'))\n")
    helpers = "\n".join(f"def site{i}(x):\n    return fakecuda.read_back(x)  # SITE{i}\n" for i in range(12))
    pytester.makepyfile(model="import fakecuda\n\n" + helpers + textwrap.dedent("""
        def evaluate(x):
            return fakecuda.read_back(x)  # SHARED
    """))
    pytester.makepyfile(test_suite=textwrap.dedent("""
        import fakecuda
        import model

        def test_many_sites():
            for _ in range(5):
                for i in range(12):
                    getattr(model, f"site{i}")(1)

        def test_loop_in_the_test():
            for _ in range(20):
                fakecuda.read_back(1)  # LOOP

        def test_final_read():
            total = 3
            assert fakecuda.read_back(total) > 0  # FINAL

        def test_checkpoint_save():
            fakecuda.read_back({"w": 1}, times=12)  # SAVE

        def test_assert_close():
            fakecuda.call(fakecuda.read_back, 1)  # ASSERT_CLOSE
    """) + "".join(  # one helper called by three tests
        f"\ndef test_shared_{name}():\n    for _ in range({runs}):\n        model.evaluate(1)\n"
        for name, runs in (("a", 5), ("b", 5), ("c", 6))))
    return pytester


def test_one_off_syncs_leave_no_summary_entry_and_sites_group_across_tests(suite):
    result = suite.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync", "--gpu-sanitize-fail-on=sync",
                                        "--gpu-sanitize-report=run.json")
    result.assert_outcomes(passed=3, failed=5)  # the three one-off tests pass: fail-on never counts them
    out = result.stdout.str()
    section = out[out.index("= gpu-sanitize ="):]
    for marker in ("FINAL", "SAVE", "ASSERT_CLOSE"):
        assert f"test_suite.py:{_line(suite, 'test_suite.py', marker)}" not in section, marker
    assert "test_final_read" not in section and "test_checkpoint_save" not in section
    result.stdout.fnmatch_lines([
        "14 site(s) in 5 of 8 sanitized tests; 14 one-off sync(s) at 3 site(s) left out (info in the JSON report)",
        f"model.py:{_line(suite, 'model.py', 'SHARED')}: sync other x16 in 3 tests, stall not timed*",
        "... and 4 more site(s): -v lists them all",
    ])
    report = json.loads((suite.path / "run.json").read_text())
    # The test's own loop is info (a test file's read): ranked after the code under test's sites.
    loop = [site for site in report["sites"] if site["line"] == _line(suite, "test_suite.py", "LOOP")]
    assert [(site["count"], site["tests"], site["severity"]) for site in loop] == [(20, 1, "info")]
    one_off = [f for f in report["findings"] if f["details"]["repeated"] is False]
    assert sorted(f["line"] for f in one_off) == sorted(
        _line(suite, "test_suite.py", m) for m in ("FINAL", "SAVE", "ASSERT_CLOSE"))
    assert all(f["severity"] == "info" and f["rule"] is None for f in one_off)
    assert report["tests"]["test_suite.py::test_final_read"]["one_off"] == 1
    assert len(report["sites"]) == 17 and sum(s["one_off"] for s in report["sites"]) == 3


def test_verbose_lists_every_site_with_its_tests_and_min_count_moves_the_boundary(suite):
    result = suite.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync", "-v",
                                        "--gpu-sanitize-min-count=1", "test_suite.py")
    result.assert_outcomes(passed=8)
    section = result.stdout.str()[result.stdout.str().index("= gpu-sanitize ="):]
    assert "more site(s)" not in section and "left out" not in section
    assert section.count("model.py:") == 13
    result.stdout.fnmatch_lines([
        f"model.py:{_line(suite, 'model.py', 'SHARED')}: sync other x16 in 3 tests*",
        "    test_suite.py::test_shared_a", "    test_suite.py::test_shared_b", "    test_suite.py::test_shared_c",
    ])
    assert f"test_suite.py:{_line(suite, 'test_suite.py', 'FINAL')}: sync bool x1 in 1 test" in section


def test_min_count_ini_key_and_bad_values(suite):
    suite.makeini("[pytest]\ngpu_sanitize_min_count = 25\n")
    result = suite.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-checks=sync", "-k", "loop or shared")
    result.stdout.fnmatch_lines(["no findings in 4 sanitized tests; 36 one-off sync(s) at 2 site(s) left out*"])
    suite.makeini("[pytest]\ngpu_sanitize_min_count = often\n")
    result = suite.runpytest_subprocess("--gpu-sanitize")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*gpu_sanitize_min_count: not an integer: 'often'*"])
    result = suite.runpytest_subprocess("--gpu-sanitize", "--gpu-sanitize-min-count=0")
    assert result.ret == 4


def _line(pytester, name, marker):
    for number, text in enumerate((pytester.path / name).read_text().splitlines(), 1):
        if f"# {marker}" in text:
            return number
    raise AssertionError(marker)


# --- one GPU per xdist worker -------------------------------------------------------------

def test_worker_device_is_round_robin_and_off_below_two_gpus():
    from torchlint.sanitizer.pytest_plugin import worker_device

    assert [worker_device(f"gw{i}", 4) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert worker_device("gw3", 1) is None and worker_device("gw0", 0) is None
    assert worker_device("master", 4) is None and worker_device("gwx", 4) is None


@pytest.mark.parametrize("visible, expected", [(None, {"0", "1", "2"}), ("4,5,6,7", {"4", "5", "6"})])
def test_each_xdist_worker_sees_its_own_gpu(pytester, monkeypatch, visible, expected):
    pytest.importorskip("xdist")
    monkeypatch.setenv("TORCHLINT_SANITIZER_FORCE", "1")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    # A fake 4-GPU machine: the conftest loads before the plugin's pytest_configure, in every worker.
    pytester.makeconftest("import torch\ntorch.cuda.device_count = lambda: 4\n")
    pytester.makepyfile(test_where=textwrap.dedent("""
        import os, time, pytest

        @pytest.mark.parametrize("n", range(9))
        def test_where(n):
            time.sleep(0.05)
            with open(f"seen-{os.environ['PYTEST_XDIST_WORKER']}.txt", "w") as handle:
                handle.write(os.environ.get("CUDA_VISIBLE_DEVICES", "unset"))
    """))
    result = pytester.runpytest_subprocess("-n", "3", "--gpu-sanitize", "--gpu-sanitize-checks=sync")
    result.assert_outcomes(passed=9)
    seen = {path.stem[len("seen-"):]: path.read_text() for path in pytester.path.glob("seen-*.txt")}
    assert set(seen.values()) == expected
    assert all(seen[worker] == sorted(expected)[int(worker[2:])] for worker in seen)
