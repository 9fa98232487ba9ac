"""pytest plugin: the ``gpu`` marker, and ``pytest --gpu-sanitize``.

Loaded through the ``pytest11`` entry point in every pytest run of every
project that has torchlint installed, so it never imports torch at import
time or in ``pytest_addoption``; torch is imported only once the sanitizer is
switched on.

Switching it on (lowest to highest precedence): the ini key
``gpu_sanitize = true``, the environment variable ``TORCHLINT_GPU_SANITIZE=1``,
the command line (``--gpu-sanitize``, or any ``--gpu-sanitize-checks``), and
per test the marker ``@pytest.mark.gpu_sanitize(checks=..., fail_on=...,
enabled=...)``.

Each test runs in its own ``SanitizerSession``, started and stopped around
the call phase (``pytest_runtest_call``), so every global it changes (the sync
debug mode, warning filters, wrapped functions, allocator hooks) is restored
after each test. A test fails at its end when a finding matches
``--gpu-sanitize-fail-on`` (default ``oom:fragmentation,race``: an
out-of-memory error caused by fragmentation, or a cross-stream race; every
other finding is reported). Findings
travel to the controller in ``item.user_properties`` as compact JSON, so the
summary and the run report also work under pytest-xdist.

Without a CUDA device the header says "no CUDA device: GPU sanitizer
inactive" and the tests run normally. ``TORCHLINT_SANITIZER_FORCE=1`` starts
the checks anyway (the CPU test-suite uses it; syncs then come only from
simulated warnings).
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import pytest

from .findings import CHECKS, Finding, parse_checks

PROPERTY = "gpu_sanitize"
MEMORY_PROPERTY = "gpu_sanitize_memory"
INACTIVE_LINE = "no CUDA device: GPU sanitizer inactive"
_MARKER_KWARGS = {"checks", "fail_on", "enabled"}
_TRUE = {"1", "true", "yes", "on"}


class _State:
    def __init__(self) -> None:
        self.enabled = False
        self.active = False
        self.checks = frozenset(CHECKS)
        self.fail_on: frozenset = frozenset()
        self.warmup_steps = 2
        self.report_path: Optional[str] = None
        self.html_path: Optional[str] = None
        self.header = ""
        self.results: Dict[str, Dict[str, Any]] = {}


_STATE = pytest.StashKey[_State]()


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    # device_count() avoids the fork-poisoning that is_available() can cause.
    try:
        return torch.cuda.device_count()
    except Exception:
        return 0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu-sanitize", "torchlint GPU sanitizer")
    group.addoption(
        "--gpu-sanitize", action="store_true", default=None, dest="gpu_sanitize",
        help="run every test under the torchlint GPU sanitizer (sync, memory and race checks)",
    )
    group.addoption(
        "--gpu-sanitize-checks", default=None, dest="gpu_sanitize_checks", metavar="CHECKS",
        help=f"comma-separated checks to run ({', '.join(CHECKS)}, or all); implies --gpu-sanitize",
    )
    group.addoption(
        "--gpu-sanitize-fail-on", default=None, dest="gpu_sanitize_fail_on", metavar="KINDS",
        help="finding kinds that fail a test (e.g. sync,race,oom:fragmentation; all; none). "
             "Default: oom:fragmentation,race",
    )
    group.addoption(
        "--gpu-sanitize-report", default=None, dest="gpu_sanitize_report", metavar="PATH",
        help="write the JSON report of the whole run to PATH",
    )
    group.addoption(
        "--gpu-sanitize-html", default=None, dest="gpu_sanitize_html", metavar="PATH",
        help="write a self-contained HTML report of the whole run to PATH",
    )
    group.addoption(
        "--gpu-sanitize-warmup-steps", default=None, type=int, dest="gpu_sanitize_warmup_steps", metavar="N",
        help="leave out the first N optimizer steps of each test (default 2)",
    )
    parser.addini("gpu_sanitize", type="bool", default=False, help="run tests under the torchlint GPU sanitizer")
    parser.addini("gpu_sanitize_checks", type="string", default="", help="checks for the GPU sanitizer")
    parser.addini("gpu_sanitize_fail_on", type="string", default="", help="finding kinds that fail a test")
    parser.addini("gpu_sanitize_report", type="string", default="", help="path of the GPU sanitizer's JSON report")
    parser.addini("gpu_sanitize_html", type="string", default="", help="path of the GPU sanitizer's HTML report")


def _resolve(config: pytest.Config) -> _State:
    from .session import DEFAULT_FAIL_ON, parse_fail_on

    state = _State()
    enabled = bool(config.getini("gpu_sanitize"))
    env = os.environ.get("TORCHLINT_GPU_SANITIZE")
    if env is not None and env.strip():
        enabled = env.strip().lower() in _TRUE
    cli_checks = config.getoption("gpu_sanitize_checks")
    if config.getoption("gpu_sanitize") or cli_checks:
        enabled = True
    state.enabled = enabled
    checks_text = cli_checks or config.getini("gpu_sanitize_checks") or "all"
    try:
        state.checks = parse_checks(checks_text)
    except ValueError as exc:
        raise pytest.UsageError(f"--gpu-sanitize-checks: {exc}") from None
    fail_text = config.getoption("gpu_sanitize_fail_on") or config.getini("gpu_sanitize_fail_on")
    try:
        state.fail_on = parse_fail_on(fail_text) if fail_text else DEFAULT_FAIL_ON
    except ValueError as exc:
        raise pytest.UsageError(f"--gpu-sanitize-fail-on: {exc}") from None
    warmup = config.getoption("gpu_sanitize_warmup_steps")
    if warmup is not None:
        if warmup < 0:
            raise pytest.UsageError("--gpu-sanitize-warmup-steps: must be >= 0")
        state.warmup_steps = warmup
    report = config.getoption("gpu_sanitize_report") or config.getini("gpu_sanitize_report")
    state.report_path = str(report) if report else None
    page = config.getoption("gpu_sanitize_html") or config.getini("gpu_sanitize_html")
    state.html_path = str(page) if page else None
    return state


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device; skipped when none is present")
    config.addinivalue_line(
        "markers",
        "gpu_sanitize(checks=None, fail_on=None, enabled=True): per-test torchlint GPU sanitizer settings",
    )
    state = _resolve(config)
    config.stash[_STATE] = state
    if not state.enabled:
        return
    config.pluginmanager.register(_Collector(config, state), "torchlint-gpu-sanitize-collector")
    from . import frames

    frames.add_user_root(str(config.rootpath))
    frames.set_test_file_patterns(config.getini("python_files"))
    forced = os.environ.get("TORCHLINT_SANITIZER_FORCE", "").strip().lower() in _TRUE
    if _cuda_device_count() > 0 or forced:
        state.active = True
        state.header = _header(state, forced)
    else:
        state.header = INACTIVE_LINE


def _header(state: _State, forced: bool) -> str:
    from .report import device_info, torch_version

    device = device_info()
    where = device["name"] if device else ("no CUDA device, forced on" if forced else "unknown device")
    return (f"gpu-sanitize: checks={','.join(sorted(state.checks))} "
            f"fail-on={','.join(sorted(state.fail_on)) or 'none'} torch {torch_version()} on {where}")


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    state = config.stash.get(_STATE, None)
    if state is None or not state.enabled:
        return None
    return [state.header]


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        marker = item.get_closest_marker("gpu_sanitize")
        if marker is not None:
            _marker_settings(item, marker)  # validates now, not halfway through the run
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items or _cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device")
    for item in gpu_items:
        item.add_marker(skip)


def _marker_settings(item: pytest.Item, marker: Any) -> Dict[str, Any]:
    from .session import parse_fail_on

    unknown = sorted(set(marker.kwargs) - _MARKER_KWARGS)
    if unknown or marker.args:
        raise pytest.UsageError(
            f"{item.nodeid}: gpu_sanitize marker takes only keyword arguments "
            f"{', '.join(sorted(_MARKER_KWARGS))}; got {', '.join(unknown) or 'positional arguments'}"
        )
    settings: Dict[str, Any] = {}
    try:
        if marker.kwargs.get("checks") is not None:
            checks = marker.kwargs["checks"]
            settings["checks"] = parse_checks(checks if isinstance(checks, str) else ",".join(checks))
        if marker.kwargs.get("fail_on") is not None:
            fail_on = marker.kwargs["fail_on"]
            settings["fail_on"] = parse_fail_on(fail_on if isinstance(fail_on, str) else ",".join(fail_on) or "none")
    except ValueError as exc:
        raise pytest.UsageError(f"{item.nodeid}: gpu_sanitize marker: {exc}") from None
    settings["enabled"] = bool(marker.kwargs.get("enabled", True))
    return settings


_MEMORY_FIELDS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_exact", "reserved_unallocated_bytes", "slack", "num_alloc_retries", "num_ooms")


def _compact_memory(summary: Dict[str, Any]) -> Dict[str, Any]:
    """The few memory numbers worth carrying per test (they land in JUnit XML too)."""
    return {key: summary[key] for key in _MEMORY_FIELDS if key in summary}


def encode_findings(findings: List[Finding], failing: List[Finding], stack_limit: int = 3) -> str:
    """Compact JSON for ``item.user_properties`` (it also lands in JUnit XML)."""
    entries = []
    failing_ids = {id(f) for f in failing}
    for finding in findings:
        data = finding.to_json()
        data["stack"] = data["stack"][:stack_limit]
        entries.append({"f": data, "x": id(finding) in failing_ids})
    return json.dumps(entries, separators=(",", ":"), default=str)


def decode_findings(text: str) -> List[Dict[str, Any]]:
    """``[{"finding": Finding, "failing": bool}, ...]`` from ``encode_findings``."""
    return [{"finding": Finding.from_json(entry["f"]), "failing": bool(entry["x"])} for entry in json.loads(text)]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    state = item.config.stash.get(_STATE, None)
    settings: Dict[str, Any] = {}
    marker = item.get_closest_marker("gpu_sanitize")
    if marker is not None:
        settings = _marker_settings(item, marker)
    if state is None or not state.active or not settings.get("enabled", True):
        return (yield)
    from .session import SanitizerSession

    session = SanitizerSession(
        checks=settings.get("checks", state.checks),
        warmup_steps=state.warmup_steps,
        fail_on=settings.get("fail_on", state.fail_on),
        test_id=item.nodeid,
    )
    session.start()
    try:
        result = yield
    finally:
        session.stop()
        findings = session.findings
        failing = session.failing_findings()
        item.user_properties.append((PROPERTY, encode_findings(findings, failing)))
        memory = session.summaries().get("memory")
        if memory and memory.get("available"):
            item.user_properties.append((MEMORY_PROPERTY, json.dumps(_compact_memory(memory), separators=(",", ":"))))
    if failing:
        from .report import finding_line

        lines = "\n".join("  " + finding_line(f) for f in failing)
        pytest.fail(f"GPU sanitizer: {len(failing)} failing finding(s)\n{lines}", pytrace=False)
    return result


class _Collector:
    """Gathers the findings on the controller (or the only process) and reports them.

    Registered per config, so in-process pytest runs (pytester) keep their
    results apart.
    """

    def __init__(self, config: pytest.Config, state: _State) -> None:
        self.config = config
        self.state = state
        self.results: Dict[str, Dict[str, Any]] = {}
        self.memory: Dict[str, Dict[str, Any]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for name, value in getattr(report, "user_properties", ()):
            if name == MEMORY_PROPERTY:
                self.memory[report.nodeid] = json.loads(value)
            if name != PROPERTY:
                continue
            entries = decode_findings(value)
            self.results[report.nodeid] = {
                "outcome": report.outcome,
                "entries": entries,
                "failed_by_sanitizer": any(e["failing"] for e in entries),
            }

    def run_report(self) -> Dict[str, Any]:
        from .report import build_report

        findings = [e["finding"] for r in self.results.values() for e in r["entries"]]
        tests = {
            nodeid: {"outcome": r["outcome"], "findings": len(r["entries"]),
                     "failed_by_sanitizer": r["failed_by_sanitizer"]}
            for nodeid, r in self.results.items()
        }
        for nodeid, memory in self.memory.items():
            if nodeid in tests:
                tests[nodeid]["memory"] = memory
        return build_report(findings, checks=self.state.checks, tests=tests, fail_on=self.state.fail_on)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not (self.state.report_path or self.state.html_path) or hasattr(self.config, "workerinput"):
            return
        from .report import write_report

        report = self.run_report()
        if self.state.report_path:
            write_report(self.state.report_path, report)
        if self.state.html_path:
            from .html_report import write_html

            write_html(self.state.html_path, [report])

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self.state.active or hasattr(config, "workerinput"):
            return
        from .report import finding_line, rank

        with_findings = {nodeid: r for nodeid, r in self.results.items() if r["entries"]}
        terminalreporter.section("gpu-sanitize")
        if not with_findings:
            terminalreporter.write_line(f"no findings in {len(self.results)} sanitized test(s)")
        for nodeid, result in with_findings.items():
            entries = result["entries"]
            flag = " FAILED by sanitizer" if result["failed_by_sanitizer"] else ""
            terminalreporter.write_line(f"{nodeid}: {len(entries)} finding(s){flag}")
            for finding in rank(e["finding"] for e in entries)[:10]:
                terminalreporter.write_line("  " + finding_line(finding, str(config.rootpath)))
            if len(entries) > 10:
                terminalreporter.write_line(f"  ... and {len(entries) - 10} more")
        if self.state.report_path:
            terminalreporter.write_line(f"report written to {self.state.report_path}")
        if self.state.html_path:
            terminalreporter.write_line(f"HTML report written to {self.state.html_path}")
        from torchlint.runtime_join import closing_hint

        hint = closing_hint([e["finding"].to_json() for r in with_findings.values() for e in r["entries"]],
                            str(config.rootpath))
        if hint:
            terminalreporter.write_line(hint)
