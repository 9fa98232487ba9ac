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

One-off syncs (a final read, a checkpoint save, an ``assert_close`` after
the loop: a site that ran fewer than ``--gpu-sanitize-min-count`` times)
stay in the JSON report as ``info`` and are left out of the summary and of
``--gpu-sanitize-fail-on``. The summary groups findings by site across tests,
like pytest's own warnings summary: one line per site with its count of
tests, the top ``SUMMARY_SITES`` by stall time, all of them with ``-v``; the
JSON report holds every finding and the same ``sites`` table.

Under pytest-xdist on a machine with several GPUs, each worker gets one GPU
(``gw0`` the first, ``gw1`` the second, and round robin past the last),
through ``CUDA_VISIBLE_DEVICES`` set before the worker touches CUDA.

Without a CUDA device the header says "no CUDA device: GPU sanitizer
inactive" and the tests run normally. ``TORCHLINT_SANITIZER_FORCE=1`` starts
the checks anyway (the CPU test-suite uses it; syncs then come only from
simulated warnings).
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import pytest

from . import ranking
from .findings import CHECKS, Finding, is_one_off, is_periodic, parse_checks

PROPERTY = "gpu_sanitize"
MEMORY_PROPERTY = "gpu_sanitize_memory"
INACTIVE_LINE = "no CUDA device: GPU sanitizer inactive"
_MARKER_KWARGS = {"checks", "fail_on", "enabled"}
_TRUE = {"1", "true", "yes", "on"}
SUMMARY_SITES = 10  # sites in the terminal summary without -v


class _State:
    def __init__(self) -> None:
        self.enabled = False
        self.active = False
        self.checks = frozenset(CHECKS)
        self.fail_on: frozenset = frozenset()
        self.warmup_steps = 2
        self.min_count: Optional[int] = None  # None: the sync check's default
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
        "--gpu-sanitize",
        action="store_true",
        default=None,
        dest="gpu_sanitize",
        help="run every test under the torchlint GPU sanitizer (sync, memory and race checks)",
    )
    group.addoption(
        "--gpu-sanitize-checks",
        default=None,
        dest="gpu_sanitize_checks",
        metavar="CHECKS",
        help=f"comma-separated checks to run ({', '.join(CHECKS)}, or all); implies --gpu-sanitize",
    )
    group.addoption(
        "--gpu-sanitize-fail-on",
        default=None,
        dest="gpu_sanitize_fail_on",
        metavar="KINDS",
        help="finding kinds that fail a test (e.g. sync,race,oom:fragmentation; all; none). "
        "Default: oom:fragmentation,race",
    )
    group.addoption(
        "--gpu-sanitize-report",
        default=None,
        dest="gpu_sanitize_report",
        metavar="PATH",
        help="write the JSON report of the whole run to PATH",
    )
    group.addoption(
        "--gpu-sanitize-html",
        default=None,
        dest="gpu_sanitize_html",
        metavar="PATH",
        help="write a self-contained HTML report of the whole run to PATH",
    )
    group.addoption(
        "--gpu-sanitize-warmup-steps",
        default=None,
        type=int,
        dest="gpu_sanitize_warmup_steps",
        metavar="N",
        help="leave out the first N optimizer steps of each test (default 2)",
    )
    group.addoption(
        "--gpu-sanitize-min-count",
        default=None,
        type=int,
        dest="gpu_sanitize_min_count",
        metavar="N",
        help="a sync site is a finding when its line ran at least N times in a test, or every step "
        "(default 5); rarer syncs (a final read, an assert) are one-off: info in the JSON report only",
    )
    parser.addini("gpu_sanitize", type="bool", default=False, help="run tests under the torchlint GPU sanitizer")
    parser.addini("gpu_sanitize_checks", type="string", default="", help="checks for the GPU sanitizer")
    parser.addini("gpu_sanitize_fail_on", type="string", default="", help="finding kinds that fail a test")
    parser.addini("gpu_sanitize_report", type="string", default="", help="path of the GPU sanitizer's JSON report")
    parser.addini(
        "gpu_sanitize_min_count",
        type="string",
        default="",
        help="runs of a sync site that make it a finding (default 5)",
    )
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
    min_count = config.getoption("gpu_sanitize_min_count")
    if min_count is None and str(config.getini("gpu_sanitize_min_count")).strip():
        text = str(config.getini("gpu_sanitize_min_count")).strip()
        try:
            min_count = int(text)
        except ValueError:
            raise pytest.UsageError(f"gpu_sanitize_min_count: not an integer: {text!r}") from None
    if min_count is not None and min_count < 1:
        raise pytest.UsageError("--gpu-sanitize-min-count: must be >= 1")
    state.min_count = min_count
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
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        _pin_worker_to_its_gpu(str(workerinput.get("workerid", "")))
    if _cuda_device_count() > 0 or forced:
        state.active = True
        state.header = _header(state, forced)
    else:
        state.header = INACTIVE_LINE


def worker_device(worker_id: str, device_count: int) -> Optional[int]:
    """The GPU index of xdist worker ``gwN``: N modulo the device count; None with fewer than two GPUs."""
    if device_count < 2 or not worker_id.startswith("gw") or not worker_id[2:].isdigit():
        return None
    return int(worker_id[2:]) % device_count


def _pin_worker_to_its_gpu(worker_id: str) -> None:
    """One GPU per xdist worker: narrow ``CUDA_VISIBLE_DEVICES`` to the worker's device.

    Done before the worker initializes CUDA (torch does not cache the device
    count until then); if a conftest already initialized it, the worker's
    current device is set instead.
    """
    index = worker_device(worker_id, _cuda_device_count())
    if index is None:
        return
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.set_device(index)
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    names = [name.strip() for name in visible.split(",") if name.strip()] if visible else []
    os.environ["CUDA_VISIBLE_DEVICES"] = names[index] if index < len(names) else str(index)


def _header(state: _State, forced: bool) -> str:
    from .report import device_info, torch_version

    device = device_info()
    where = device["name"] if device else ("no CUDA device, forced on" if forced else "unknown device")
    return (
        f"gpu-sanitize: checks={','.join(sorted(state.checks))} "
        f"fail-on={','.join(sorted(state.fail_on)) or 'none'} torch {torch_version()} on {where}"
    )


def pytest_report_header(config: pytest.Config) -> Optional[List[str]]:
    state = config.stash.get(_STATE, None)
    if state is None or not state.enabled:
        return None
    return [state.header]


def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    state = config.stash.get(_STATE, None)
    if state is not None and state.enabled:
        from . import frames

        for path in {str(item.path) for item in items}:
            frames.add_user_file(path)  # a test's own frames are the user's, however it was laid out
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


_MEMORY_FIELDS = (
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_exact",
    "reserved_unallocated_bytes",
    "slack",
    "num_alloc_retries",
    "num_ooms",
)


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
        sync_min_count=state.min_count,
        track_phases=False,  # a test is not a training run with phases
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


def _write_page(path: str, report: Dict[str, Any]) -> None:
    from .html_report import write_html

    write_html(path, [report])


def site_key(finding: Finding) -> Tuple[Any, ...]:
    """What makes two tests' findings the same site: kind, place, and for syncs the sync kind."""
    details = finding.details if isinstance(finding.details, dict) else {}
    return (finding.kind, finding.file, finding.line, details.get("sync_kind"), finding.rule)


def group_sites(results: Dict[str, Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Findings grouped by site across tests: most failing first, then what to fix first
    (``ranking.py``: races, OOMs, stalls, memory), then most time stalled, then most frequent.

    Each site: kind, file, line, function, rule, sync_kind, severity (the
    worst), one_off, periodic, count, runs, stall_ms (None when never timed), tests (how
    many), test_ids, failing_tests, fix_hint, message (the first test's).
    """
    sites: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    severity_rank = {"error": 0, "warning": 1, "info": 2}
    for nodeid, result in results.items():
        for entry in result["entries"]:
            finding: Finding = entry["finding"]
            details = finding.details if isinstance(finding.details, dict) else {}
            site = sites.get(site_key(finding))
            if site is None:
                site = sites[site_key(finding)] = {
                    "kind": finding.kind,
                    "file": finding.file,
                    "line": finding.line,
                    "function": finding.function,
                    "rule": finding.rule,
                    "sync_kind": details.get("sync_kind"),
                    "severity": finding.severity,
                    "one_off": is_one_off(finding),
                    "periodic": is_periodic(finding),
                    "count": 0,
                    "runs": 0,
                    "stall_ms": None,
                    "tests": 0,
                    "test_ids": [],
                    "failing_tests": 0,
                    "fix_hint": finding.fix_hint,
                    "message": finding.message,
                }
            if severity_rank.get(finding.severity, 3) < severity_rank.get(site["severity"], 3):
                site["severity"] = finding.severity
            site["count"] += finding.count
            site["runs"] += int(details.get("runs", finding.count) or 0)
            stall = details.get("stall_ms")
            if isinstance(stall, (int, float)):
                site["stall_ms"] = round((site["stall_ms"] or 0.0) + stall, 3)
            if nodeid not in site["test_ids"]:
                site["test_ids"].append(nodeid)
                site["tests"] += 1
            site["failing_tests"] += int(entry["failing"])
    return sorted(
        sites.values(),
        key=lambda s: (
            -s["failing_tests"],
            s["one_off"] or s["periodic"],
            ranking.tier(s),
            -(s["stall_ms"] or 0.0),
            -s["count"],
            s["file"] or "",
            s["line"] or 0,
        ),
    )


def site_line(site: Dict[str, Any], root: Optional[str] = None) -> str:
    """``path:line: sync item x340 in 17 tests, 120.5 ms stalled — hint [TL101]``."""
    from .report import display_path

    where = display_path(site["file"], root) + (f":{site['line']}" if site["line"] is not None else "")
    what = f"sync {site['sync_kind'] or 'other'}" if site["kind"] == "sync" else site["kind"]
    tests = f"in {site['tests']} test{'s' if site['tests'] != 1 else ''}"
    parts = [f"{where}: {what} x{site['count']} {tests}"]
    if site["kind"] == "sync":
        stall = site["stall_ms"]
        parts[0] += f", {stall:.1f} ms stalled" if stall is not None else ", stall not timed"
    else:
        parts.append(site["message"])
    if site["fix_hint"]:
        parts.append(site["fix_hint"])
    return " — ".join(parts) + (f" [{site['rule']}]" if site["rule"] else "")


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
        self.write_errors: List[str] = []

    def _write_report_lines(self, terminalreporter: Any) -> None:
        for error in self.write_errors:
            terminalreporter.write_line(f"error: {error}")
        for label, path in (("report", self.state.report_path), ("HTML report", self.state.html_path)):
            if path and not any(error.startswith(f"{path}:") for error in self.write_errors):
                terminalreporter.write_line(f"{label} written to {path}")

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
            nodeid: {
                "outcome": r["outcome"],
                "findings": len(r["entries"]),
                "one_off": sum(1 for e in r["entries"] if is_one_off(e["finding"])),
                "failed_by_sanitizer": r["failed_by_sanitizer"],
            }
            for nodeid, r in self.results.items()
        }
        for nodeid, memory in self.memory.items():
            if nodeid in tests:
                tests[nodeid]["memory"] = memory
        inactive = None if self.state.active else "no CUDA device"
        report = build_report(
            findings,
            checks=self.state.checks if self.state.active else (),
            tests=tests,
            fail_on=self.state.fail_on,
            inactive=inactive,
        )
        report["sites"] = group_sites(self.results)
        return report

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not (self.state.report_path or self.state.html_path) or hasattr(self.config, "workerinput"):
            return
        from .report import ReportWriteError, write_report

        report = self.run_report()  # without a device it says that nothing was checked
        for path, write in ((self.state.report_path, write_report), (self.state.html_path, _write_page)):
            if not path:
                continue
            try:
                write(path, report)
            except ReportWriteError as error:  # the suite's outcome stays the tests'
                self.write_errors.append(str(error))

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if hasattr(config, "workerinput"):
            return
        if not self.state.active:
            if self.state.report_path or self.state.html_path:
                terminalreporter.section("gpu-sanitize")
                terminalreporter.write_line(
                    "inactive without a CUDA device: nothing was checked, and the reports say so"
                )
                self._write_report_lines(terminalreporter)
            return
        sites = group_sites(self.results)
        listed = [site for site in sites if not (site["one_off"] or site.get("periodic"))]
        one_off = [site for site in sites if site["one_off"]]
        periodic = [site for site in sites if site.get("periodic")]
        tests_listed = {nodeid for site in listed for nodeid in site["test_ids"]}
        root = str(config.rootpath)
        terminalreporter.section("gpu-sanitize")
        sanitized = f"{len(self.results)} sanitized test{'s' if len(self.results) != 1 else ''}"
        left_out = (
            (
                f"; {sum(s['count'] for s in one_off)} one-off sync(s) at {len(one_off)} site(s) left out "
                f"(info in the JSON report)"
            )
            if one_off
            else ""
        )
        if periodic:
            left_out += f"; {len(periodic)} periodic sync site(s) (every N steps: info) left out"
        if not listed:
            terminalreporter.write_line(f"no findings in {sanitized}{left_out}")
        else:
            stalled = sum(site["stall_ms"] or 0.0 for site in listed)
            terminalreporter.write_line(
                f"{len(listed)} site(s) in {len(tests_listed)} of {sanitized}"
                + (f", {stalled:.1f} ms stalled" if stalled else "")
                + left_out
            )
        verbose = config.get_verbosity() > 0
        shown = listed if verbose else listed[:SUMMARY_SITES]
        for site in shown:
            terminalreporter.write_line(site_line(site, root))
            if verbose:
                for nodeid in site["test_ids"]:
                    terminalreporter.write_line(f"    {nodeid}")
        if len(listed) > len(shown):
            terminalreporter.write_line(
                f"... and {len(listed) - len(shown)} more site(s): -v lists them all"
                + ("" if self.state.report_path else ", --gpu-sanitize-report=PATH writes every finding")
            )
        for nodeid, result in self.results.items():
            if result["failed_by_sanitizer"]:
                failing = sum(1 for e in result["entries"] if e["failing"])
                terminalreporter.write_line(f"FAILED by sanitizer: {nodeid} ({failing} failing finding(s))")
        self._write_report_lines(terminalreporter)
        from torchlint.fix_command import closing_hint

        hint = closing_hint(
            [e["finding"].to_json() for r in self.results.values() for e in r["entries"]], str(config.rootpath)
        )
        if hint:
            terminalreporter.write_line(hint)
