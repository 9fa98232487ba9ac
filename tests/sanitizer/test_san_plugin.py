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
