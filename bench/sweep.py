"""Run torchlint the way a new user would, over many real files, and count
what went wrong.

    python bench/sweep.py DIR [DIR ...] [--jobs N] [--keep WORKDIR]

The *.py files under the directories (say the development corpus and a few
unpacked wheels: `pip download --no-deps -d /tmp/wheels transformers timm
...` then unzip each into a folder) are copied to a scratch directory, so the
originals are never touched. Then, all rules on (`--select ALL --isolated`):

1. lint: files, findings, TL000 files (each checked against CPython's
   `compile()`), internal errors, wall time;
2. `--fix --unsafe-fixes`: fixes applied (from `--show-fixes`), files changed;
3. files broken by fixes: changed files that compiled before and do not now;
4. idempotency: a second `--fix --unsafe-fixes` must change no file;
5. files the fixer refused (a fix that would not parse), from stderr;
6. one run, one answer: the lint's JSON with `--jobs 1` and with `--jobs N`,
   from a cold and from a warm cache, and with the files named in reverse
   order, must be identical; so must the trees (and the `--show-fixes`
   reports) that `--fix --unsafe-fixes` leaves with `--jobs 1` and
   `--jobs N`, each on its own copy.

Prints one table; exits 1 if anything was broken, not idempotent, differed
between runs, or an internal error happened.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Dict, List

TORCHLINT = os.path.join(os.path.dirname(sys.executable), "torchlint")
BASE = [TORCHLINT, "--isolated", "--preview", "--select", "ALL", "--no-respect-gitignore", "--exclude", ""]


def copy_tree(sources: List[str], destination: str) -> List[str]:
    copied = []
    for index, source in enumerate(sources):
        for directory, _, names in os.walk(source):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(directory, name)
                    target = os.path.join(destination, f"{index:02d}", os.path.relpath(path, source))
                    os.makedirs(os.path.dirname(target), exist_ok=True)
                    shutil.copyfile(path, target)
                    copied.append(target)
    return sorted(copied)


def digest(paths: List[str]) -> Dict[str, str]:
    result = {}
    for path in paths:
        with open(path, "rb") as handle:
            result[path] = hashlib.sha256(handle.read()).hexdigest()
    return result


def compiles(path: str) -> bool:
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def run(args: List[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directories", nargs="+")
    parser.add_argument("--jobs", default=str(os.cpu_count() or 1))
    parser.add_argument("--keep", help="use (and keep) this scratch directory")
    args = parser.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="torchlint-sweep-")
    if os.path.exists(work) and os.listdir(work):
        raise SystemExit(f"{work} is not empty")
    files = copy_tree(args.directories, work)
    jobs = ["--jobs", args.jobs]
    compiled_before = {path: compiles(path) for path in files}
    twin = work.rstrip("/") + "-jobs1"  # the same tree, fixed with --jobs 1
    shutil.copytree(work, twin)
    differing = one_answer(work, jobs)

    started = time.perf_counter()
    lint = run(BASE + jobs + ["--output-format", "json", "."], work)
    lint_s = time.perf_counter() - started
    findings = json.loads(lint.stdout or "[]")
    tl000 = {os.path.join(work, f["filename"]) if not os.path.isabs(f["filename"]) else f["filename"] for f in findings if f["code"] == "TL000"}
    tl000_valid = sorted(p for p in tl000 if compiled_before.get(p))
    internal = re.findall(r"^torchlint: error: (.*?): internal error", lint.stderr, re.MULTILINE)

    before = digest(files)
    started = time.perf_counter()
    fix = run(BASE + jobs + ["--fix", "--unsafe-fixes", "--show-fixes", "."], work)
    fix_s = time.perf_counter() - started
    applied = sum(int(n) for n in re.findall(r"^- .*?: (\d+) × TL\d+", fix.stdout, re.MULTILINE))
    refused = re.findall(r"^torchlint: error: (.*?): a fix produced code that does not parse", fix.stderr, re.MULTILINE)
    after = digest(files)
    changed = [p for p in files if before[p] != after[p]]
    broken = [p for p in changed if compiled_before[p] and not compiles(p)]

    again = run(BASE + jobs + ["--fix", "--unsafe-fixes", "."], work)
    final = digest(files)
    not_idempotent = [p for p in files if after[p] != final[p]]
    serial = run(BASE + ["--jobs", "1", "--fix", "--unsafe-fixes", "--show-fixes", "."], twin)
    if serial.stdout != fix.stdout:
        differing.append("--fix --show-fixes report: --jobs 1 against --jobs " + args.jobs)
    twin_digest = {os.path.relpath(p, twin): h for p, h in digest([os.path.join(twin, os.path.relpath(p, work)) for p in files]).items()}
    differing += [f"fixed tree, --jobs 1 against --jobs {args.jobs}: {os.path.relpath(p, work)}" for p in files if after[p] != twin_digest[os.path.relpath(p, work)]]
    internal += re.findall(r"^torchlint: error: (.*?): internal error", fix.stderr + again.stderr, re.MULTILINE)

    rows = [
        ("files", len(files)),
        ("findings (lint, all rules)", len(findings)),
        ("TL000 files", len(tl000)),
        ("TL000 files CPython compiles", len(tl000_valid)),
        ("internal errors (lint + 2 fix runs)", len(internal)),
        ("fixes applied (--fix --unsafe-fixes)", applied),
        ("files changed by fixes", len(changed)),
        ("files broken by fixes (compile)", len(broken)),
        ("files changed by a second --fix", len(not_idempotent)),
        ("files whose fixes were refused", len(refused)),
        ("runs that differed (jobs, cache, order)", len(differing)),
        ("lint wall time, s", f"{lint_s:.1f}"),
        ("fix wall time, s", f"{fix_s:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"sweep of {', '.join(args.directories)} (copied to {work}), --jobs {args.jobs}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for label, paths in (("differed", differing), ("internal error", internal), ("broken", broken), ("not idempotent", not_idempotent), ("refused", refused), ("TL000 on valid code", tl000_valid)):
        for path in paths[:20]:
            print(f"  {label}: {path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(twin, ignore_errors=True)
    return 1 if internal or broken or not_idempotent or differing else 0


def one_answer(work: str, jobs: List[str]) -> List[str]:
    """Lint JSON that must not depend on --jobs, the cache or the file order."""
    cache = tempfile.mkdtemp(prefix="torchlint-sweep-cache-")
    as_json = ["--output-format", "json"]
    try:
        reference = run(BASE + ["--jobs", "1", "--no-cache"] + as_json + ["."], work).stdout
        listed = run(BASE + ["--show-files", "."], work).stdout.split()
        runs = {
            "--jobs N, no cache": run(BASE + jobs + ["--no-cache"] + as_json + ["."], work).stdout,
            "cold cache": run(BASE + jobs + ["--cache-dir", cache] + as_json + ["."], work).stdout,
            "warm cache": run(BASE + jobs + ["--cache-dir", cache] + as_json + ["."], work).stdout,
            "files named in reverse order": run(BASE + jobs + ["--no-cache"] + as_json + listed[::-1], work).stdout,
        }
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return [f"lint JSON: {label} against --jobs 1" for label, output in runs.items() if output != reference]


if __name__ == "__main__":
    sys.exit(main())
