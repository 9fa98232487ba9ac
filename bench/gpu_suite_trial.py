"""`pytest --gpu-sanitize` over a whole GPU suite: tests listed and findings per test, before and after,
and the suite's wall time with and without the sanitizer, all in one run.

Usage (on a machine with a CUDA device)::

    python bench/gpu_suite_trial.py --out DIR [--before-path SITE --before-tests DIR] [TEST_PATH ...]

The suite is ``bench/gpu_suite_trial/`` (81 tests written in the style of
torchvision's and timm's model, optimizer, loss and metric tests) plus the
project's own GPU tests (``tests/sanitizer/gpu/``). Variants, run one after
the other on the same GPU:

- ``plain``: the suite without the sanitizer (the plugin loaded, switched off);
- ``after``: ``pytest --gpu-sanitize`` with this checkout's torchlint;
- ``before``: ``pytest --gpu-sanitize`` with another torchlint (main's),
  installed with ``pip install --target SITE`` and put first on
  ``PYTHONPATH``; it runs its own copy of the project's GPU tests
  (``--before-tests``) plus the same trial tests.

Per variant: tests run and their outcomes, tests listed in the
``gpu-sanitize`` summary, findings per sanitized test (listed ones, and the
one-off syncs the after variant keeps in the JSON report only), and the wall
time of the whole pytest process, and the time pytest's ``--durations``
gives the written trial tests alone (the project's GPU tests spend most of
theirs in subprocesses that the outer sanitizer does not enter). Writes ``trial.json``, ``trial.md``, each
variant's JSON report and terminal output to ``--out``; prints the table.

"Listed" follows each version's own summary: before, every test with a
finding has its own block; after, a test is listed when it appears under a
repeated site (one-off syncs are left out).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TRIAL = HERE / "gpu_suite_trial"
OWN_GPU_TESTS = ROOT / "tests" / "sanitizer" / "gpu"


def run_variant(name: str, paths: List[str], out: Path, sanitize: bool, pythonpath: Optional[str],
                timeout: float) -> Dict[str, Any]:
    report = out / f"{name}.json"
    args = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--durations=0",
            "--durations-min=0", *paths]
    if sanitize:
        args += ["--gpu-sanitize", f"--gpu-sanitize-report={report}"]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    try:
        # Not the checkout: `python -m pytest` puts the current directory first on sys.path,
        # and the checkout's torchlint/ would shadow the --before-path install.
        done = subprocess.run(args, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)
        output, code = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        code = "timeout"
    wall = time.perf_counter() - start
    (out / f"{name}.txt").write_text(output)
    result: Dict[str, Any] = {"variant": name, "exit": code, "wall_s": round(wall, 1), "outcomes": _outcomes(output),
                              "trial_tests_s": _phase_seconds(output, "gpu_suite_trial")}
    if sanitize and report.exists():
        data = json.loads(report.read_text())
        result.update(_from_report(data))
        # The written trial suite alone: the same tests in every variant.
        result["trial_only"] = _from_report(data, lambda nodeid: "gpu_suite_trial" in nodeid)
    return result


def _outcomes(output: str) -> Dict[str, int]:
    tail = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", line)]
    counts: Dict[str, int] = {}
    if tail:
        for number, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", tail[-1]):
            counts[word.rstrip("s") if word.startswith("error") else word] = int(number)
    return counts


_DURATION = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S+)")


def _phase_seconds(output: str, marker: str) -> float:
    """Seconds pytest's ``--durations=0`` gives the tests whose node id holds ``marker`` (all phases)."""
    return round(sum(float(m.group(1)) for m in map(_DURATION.match, output.splitlines())
                     if m and marker in m.group(3)), 2)


def _from_report(report: Dict[str, Any], keep=lambda nodeid: True) -> Dict[str, Any]:
    tests = {nodeid: entry for nodeid, entry in report.get("tests", {}).items() if keep(nodeid)}
    findings = [f for f in report.get("findings", []) if f.get("test") in tests]
    one_off = [f for f in findings if f.get("kind") == "sync" and f.get("details", {}).get("repeated") is False]
    listed_findings = [f for f in findings if f not in one_off]
    if "sites" in report:  # a version that groups by site: listed = under a repeated site
        listed_tests = {t for site in report["sites"] if not site.get("one_off") for t in site["test_ids"] if t in tests}
    else:  # the old summary: a block for every test with a finding
        listed_tests = {nodeid for nodeid, entry in tests.items() if entry.get("findings")}
    per_test = [sum(1 for f in listed_findings if f.get("test") == nodeid) for nodeid in tests]
    per_listed = [n for n in per_test if n]
    sites = {(f.get("kind"), f.get("file"), f.get("line"), f.get("details", {}).get("sync_kind"))
             for f in listed_findings}
    return {
        "sanitized_tests": len(tests),
        "tests_listed": len(listed_tests),
        "findings_listed": len(listed_findings),
        "findings_one_off": len(one_off),
        "findings_per_sanitized_test": round(len(listed_findings) / max(len(tests), 1), 2),
        "findings_per_listed_test_median": statistics.median(per_listed) if per_listed else 0,
        "findings_per_listed_test_max": max(per_listed, default=0),
        "summary_lines": len(sites) if "sites" in report else len(listed_tests) + len(listed_findings),
        "distinct_sites": len(sites),
        "failed_by_sanitizer": sum(1 for entry in tests.values() if entry.get("failed_by_sanitizer")),
    }


COLUMNS = [
    ("variant", "variant"), ("tests (passed/failed/skipped)", None), ("sanitized", "sanitized_tests"),
    ("tests listed", "tests_listed"), ("findings listed", "findings_listed"),
    ("per sanitized test", "findings_per_sanitized_test"), ("median per listed test", "findings_per_listed_test_median"),
    ("max per test", "findings_per_listed_test_max"), ("one-off (JSON only)", "findings_one_off"),
    ("summary lines", "summary_lines"), ("wall s", "wall_s"), ("trial tests s", "trial_tests_s"),
]


def table(results: List[Dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    rows = list(results)
    for result in results:
        if "trial_only" in result:
            rows.append(dict(result["trial_only"], variant=f"{result['variant']} (trial tests only)",
                             outcomes={}, wall_s="—"))
    for result in rows:
        o = result["outcomes"]
        cells = []
        for title, key in COLUMNS:
            if key is None:
                cells.append(f"{sum(o.values())} ({o.get('passed', 0)}/{o.get('failed', 0) + o.get('error', 0)}"
                             f"/{o.get('skipped', 0)})")
            else:
                cells.append(str(result.get(key, "—")))
        lines.append("| " + " | ".join(cells) + " |")
    plain = next((r for r in results if r["variant"] == "plain"), None)
    if plain and plain["wall_s"]:
        for result in results:
            if result["variant"] != "plain":
                lines.append(f"\n{result['variant']}: wall time {result['wall_s'] / plain['wall_s']:.2f}x the plain run")
                if plain.get("trial_tests_s") and result.get("trial_tests_s"):
                    lines.append(f"{result['variant']}: the trial tests' own time (pytest --durations) "
                                 f"{result['trial_tests_s'] / plain['trial_tests_s']:.2f}x the plain run")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--before-path", help="a --target folder holding the torchlint to compare with")
    parser.add_argument("--before-tests", type=Path, help="the before version's own GPU tests folder")
    parser.add_argument("--timeout", type=float, default=200.0, help="seconds per variant")
    parser.add_argument("paths", nargs="*", help="test paths (default: the trial suite and tests/sanitizer/gpu)")
    options = parser.parse_args(argv)
    options.out.mkdir(parents=True, exist_ok=True)
    paths = options.paths or [str(TRIAL), str(OWN_GPU_TESTS)]
    variants = [("plain", paths, False, None), ("after", paths, True, None)]
    if options.before_path:
        before_paths = [str(TRIAL), str(options.before_tests or OWN_GPU_TESTS)] if not options.paths else paths
        variants.append(("before", before_paths, True, options.before_path))
    results: List[Dict[str, Any]] = []
    for name, variant_paths, sanitize, pythonpath in variants:
        results.append(run_variant(name, variant_paths, options.out, sanitize, pythonpath, options.timeout))
        # Written after every variant: a run cut short still leaves what it measured.
        (options.out / "trial.json").write_text(json.dumps(results, indent=2))
        (options.out / "trial.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
