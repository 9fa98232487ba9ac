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
5. files the fixer refused (a fix that would not parse), from stderr.

Prints one table; exits 1 if anything was broken, not idempotent, or an
internal error happened.
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
        ("lint wall time, s", f"{lint_s:.1f}"),
        ("fix wall time, s", f"{fix_s:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"sweep of {', '.join(args.directories)} (copied to {work}), --jobs {args.jobs}")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    for label, paths in (("internal error", internal), ("broken", broken), ("not idempotent", not_idempotent), ("refused", refused), ("TL000 on valid code", tl000_valid)):
        for path in paths[:20]:
            print(f"  {label}: {path}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if internal or broken or not_idempotent else 0


if __name__ == "__main__":
    sys.exit(main())
