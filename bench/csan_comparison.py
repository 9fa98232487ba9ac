"""Which of the race cases torch's CSAN and torchlint each detect.

    python bench/csan_comparison.py [--json PATH] [--jobs N]

Each case (tests/sanitizer/gpu/race_cases.py) runs in its racy form, in a
fresh process per (case, detector), because CSAN aborts at its first race and
its dispatch mode cannot be removed. CSAN counts as "detected" when it raises
``CUDASanitizerErrors``; torchlint when its race check returns at least one
finding. The synchronized twins are run as well, to show false alarms. Prints a
markdown table. ``--jobs N`` runs N children at once: detection does not
depend on timing (case 9 checks exactly that for torchlint), only the wall
time does.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CASES_DIR = os.path.join(ROOT, "tests", "sanitizer", "gpu")


def child(detector: str, case: str, synchronized: bool) -> dict:
    sys.path.insert(0, CASES_DIR)
    if detector == "csan":
        import torch.cuda._sanitizer as csan  # measured only; torchlint never imports it

        csan.enable_cuda_sanitizer()
    import torch

    import race_cases

    function = race_cases.CASES[case]
    if detector == "csan":
        try:
            function(synchronized)
            torch.cuda.synchronize()
        except Exception as error:  # CUDASanitizerErrors (or an error of the case itself)
            detected = type(error).__name__ == "CUDASanitizerErrors"
            return {"detected": detected, "error": None if detected else f"{type(error).__name__}: {error}"[:200]}
        return {"detected": False, "error": None}
    sys.path.insert(0, ROOT)
    from torchlint.sanitizer.races.check import RaceCheck

    check = RaceCheck(None)
    check.start()
    try:
        function(synchronized)
        torch.cuda.synchronize()
    finally:
        check.stop()
    findings = check.findings()
    return {"detected": bool(findings), "count": len(findings), "error": None,
            "first": findings[0].message[:300] if findings else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", nargs=3, metavar=("DETECTOR", "CASE", "SYNCHRONIZED"))
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--jobs", type=int, default=1, help="children run at once (default 1)")
    options = parser.parse_args(argv)
    if options.child:
        detector, case, synced = options.child
        print("RESULT " + json.dumps(child(detector, case, synced == "1")), flush=True)
        return 0

    sys.path.insert(0, CASES_DIR)
    import race_cases  # noqa: F401  (only the names; torch is imported in the children)

    def run_one(case: str, detector: str, synced: bool) -> dict:
        command = [sys.executable, os.path.abspath(__file__), "--child", detector, case, "1" if synced else "0"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=options.timeout)
            lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
            outcome = json.loads(lines[-1][7:]) if lines else {
                "detected": None, "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:200]}
        except subprocess.TimeoutExpired:
            outcome = {"detected": None, "error": "timed out"}
        print(f"  {case:24s} {detector:9s} {'sync ' if synced else 'racy '} {outcome}", file=sys.stderr, flush=True)
        return outcome

    from concurrent.futures import ThreadPoolExecutor

    jobs = [(case, detector, synced) for case in race_cases.CASES for detector in ("csan", "torchlint")
            for synced in (False, True)]
    with ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        outcomes = list(pool.map(lambda job: run_one(*job), jobs))
    rows = {case: {"case": case} for case in race_cases.CASES}
    for (case, detector, synced), outcome in zip(jobs, outcomes):
        rows[case][f"{detector}{'_sync' if synced else ''}"] = outcome
    results = list(rows.values())

    def cell(outcome, racy):
        if outcome.get("detected") is None:
            return f"error ({outcome.get('error')})"
        if racy:
            return "**detected**" if outcome["detected"] else "missed"
        return "false alarm" if outcome["detected"] else "clean"

    print("| case | CSAN (racy) | torchlint (racy) | CSAN (synchronized) | torchlint (synchronized) |")
    print("|---|---|---|---|---|")
    for row in results:
        print(f"| {row['case']} | {cell(row['csan'], True)} | {cell(row['torchlint'], True)} | "
              f"{cell(row['csan_sync'], False)} | {cell(row['torchlint_sync'], False)} |")
    found = {d: sum(1 for r in results if r[d].get("detected")) for d in ("csan", "torchlint")}
    print(f"\ndetected: CSAN {found['csan']}/{len(results)}, torchlint {found['torchlint']}/{len(results)}")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
