"""How fast torchlint lints a code base, against libcst's own parse of it.

    python bench/lint_speed.py DIR [--files N] [--phases] [--jobs-check] [--prefilter-check] [--cache-check [--edit RELPATH]]

One run measures, file by file and back to back, the CPU time of a pure
``libcst.parse_module`` and of a full torchlint lint (compile for TL000,
parse, one walk with every default rule, placing findings, and the project
analysis: project facts and cross-file facts, paid by the first file that
needs them), and prints files, lines, seconds and the ratio
torchlint / parse-only. ``--jobs-check`` also times the CLI with
``--jobs 1`` and ``--jobs 2`` (wall clock) on the same tree;
``--phases`` lints every file once more with timers around the engine's
steps and prints where the time goes (compile, parse, engine analysis,
rules, cross-file and project facts, placing findings);
``--prefilter-check`` lints with the text pre-filter on and off and reports
whether the findings are identical. ``--cache-check`` copies the tree to a
temporary directory and runs the CLI (``--jobs 1``) three times on the copy
with a fresh result cache: cold, warm (nothing changed) and after appending
a comment to one file; it prints the CPU time of each (the child's user +
system time), the cold / warm ratio, and how many files the third run linted
again (the cache entries it wrote or rewrote). ``--files N`` measures a copy
of the first N files of DIR only (``--files 500 --cache-check``: the warm /
cold ratio on a 500-file tree).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

import libcst as cst

from torchlint import linter
from torchlint.cache import ResultCache
from torchlint.discovery import DiscoveryOptions, discover
from torchlint.linter import FileOptions, lint_text
from torchlint.project import Projects
from torchlint.registry import all_rules
from torchlint.source import DecodeError, read


def load(root: str):
    files, _ = discover([root], DiscoveryOptions(root=os.path.abspath(root), respect_gitignore=False, exclude=[]))
    texts = []
    for path in files:
        try:
            texts.append((path, read(path).text))
        except (DecodeError, OSError):
            pass
    return texts


def default_options() -> FileOptions:
    return FileOptions(rules=[r for r in all_rules().values() if r.default_enabled])


# The projects of one pass, as a CLI run keeps them (forget_project_analysis starts afresh).
PROJECTS = Projects()


def with_project(options: FileOptions, path: str) -> FileOptions:
    """``options`` with the facts of the file's project, as the CLI passes
    them: read from the manifests and a scan of the project's sources the
    first time a project is met (kept by its ``Project`` after that)."""
    return dataclasses.replace(options, project=PROJECTS.for_path(path).facts())


def time_parse_vs_lint(texts, options):
    """CPU seconds of libcst's parse and of torchlint's lint, file by file.
    The lint's time includes the project analysis: the project facts (read
    for the first file of each project) and the cross-file index and walks
    the engine makes on demand."""
    parse_s = lint_s = 0.0
    findings = errors = 0
    for path, text in texts:
        start = time.process_time()
        try:
            cst.parse_module(text)
        except Exception:
            pass
        middle = time.process_time()
        out = lint_text(text, path, with_project(options, path), PROJECTS)
        end = time.process_time()
        parse_s += middle - start
        lint_s += end - middle
        findings += len(out.diagnostics)
        errors += len(out.errors)
    return parse_s, lint_s, findings, errors


def findings_of(texts, options):
    return sorted((d.path, d.row, d.column, d.code) for path, text in texts for d in lint_text(text, path, with_project(options, path), PROJECTS).diagnostics)


# The installed command, never ``python -m torchlint``: from a clone's root, ``-m`` would
# import the source folder, where ``rules/`` is not yet ``torchlint.rules``.
TORCHLINT = os.path.join(os.path.dirname(sys.executable), "torchlint")


def cli_wall(root: str, jobs: int) -> float:
    command = [TORCHLINT, "--jobs", str(jobs), "--preview", "--exit-zero", "-q", "--no-respect-gitignore", "--output-format", "json", "-o", os.devnull, root]
    start = time.perf_counter()
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def cli_cpu(root: str, env: dict) -> float:
    """User + system CPU seconds of one ``torchlint --jobs 1`` run on ``root``."""
    command = [TORCHLINT, "--jobs", "1", "--preview", "--exit-zero", "-q", "--no-respect-gitignore", "--output-format", "json", "-o", os.devnull, root]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(command, check=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cache_entries_written_since(directory: str, since: float) -> int:
    """Entries written (new, or rewritten for a result whose cross-file facts changed) after ``since``."""
    return sum(1 for path, _, files in os.walk(directory) if path != directory
               for name in files if os.path.getmtime(os.path.join(path, name)) > since)


def cache_check(root: str, texts, edit: Optional[str] = None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "tree")
        shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".git", ".torchlint_cache", "__pycache__"))
        cache = os.path.join(tmp, "cache")
        env = {**os.environ, "TORCHLINT_CACHE_DIR": cache}
        cold = cli_cpu(copy, env)
        warm = cli_cpu(copy, env)
        depending = ResultCache(cache).consulted_roots()
        edited = os.path.join(copy, edit or os.path.relpath(texts[len(texts) // 2][0], root))
        with open(edited, "a", encoding="utf-8") as handle:
            handle.write("\n# edited by lint_speed.py\n")
        since = time.time()
        time.sleep(0.05)  # the file system's clock ticks coarser than time.time()
        after_edit = cli_cpu(copy, env)
        relinted = cache_entries_written_since(cache, since)
    print(f"cache cold       {cold:8.2f} CPU-s  (cli --jobs 1, empty cache)")
    print(f"cache warm       {warm:8.2f} CPU-s  cold / warm {cold / warm:.1f}x")
    print(f"cache one edit   {after_edit:8.2f} CPU-s  files linted again: {relinted} ({os.path.relpath(edited, copy)})")
    total = sum(depending.values())
    where = ", ".join(f"{os.path.relpath(r, copy) or '.'}: {n}" for r, n in depending.most_common(5))
    print(f"cross-file       {total} cached results consulted other files of their project ({where}); "
          "an edit in such a project relints them too")


CROSS_FILE = "cross-file facts (index, other files' walks)"


class PhaseClock:
    """Exclusive CPU time per phase of real lints: each timed function's
    time, less that of the timed functions it calls. What the cross-file
    pass calls (its parses and walks of other files) counts as cross-file."""

    def __init__(self) -> None:
        self.seconds: dict = {}
        self._stack: list = []  # [phase, seconds spent in timed callees]

    def wrap(self, phase: str, function):
        def timed(*args, **kwargs):
            own = CROSS_FILE if any(entry[0] == CROSS_FILE for entry in self._stack) else phase
            start = time.process_time()
            self._stack.append([own, 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                spent = time.process_time() - start
                inner = self._stack.pop()[1]
                self.seconds[own] = self.seconds.get(own, 0.0) + spent - inner
                if self._stack:
                    self._stack[-1][1] += spent

        return timed


def forget_project_analysis() -> None:
    """Empty the per-process caches of project and cross-file facts, so that
    a second pass pays for them as a cold run does."""
    global PROJECTS
    PROJECTS = Projects()


def phases(texts, options) -> None:
    """Where a cold lint's time goes. Every file is linted once more with
    timers around the engine's steps; the walk is then split into the
    engine's own bookkeeping (a walk without rules, on the same trees,
    timed apart) and the rules' visits."""
    from torchlint import walker
    from torchlint.collector import Collector
    from torchlint.crossfile import ProjectAnalysis
    from torchlint.model import FileModel

    clock = PhaseClock()
    patches = [
        (linter, "_python_tree", "compile (TL000)"),
        (linter, "parse_module", "parse (libcst)"),
        (linter, "_place", "place findings"),
        (walker.Walker, "walk", "walk: engine + rule visits"),
        (sys.modules[__name__], "with_project", "project facts"),
    ]
    patches += [(ProjectAnalysis, name, CROSS_FILE) for name in ("index", "copies_in", "hot_from_elsewhere", "copied_elsewhere", "returned_loader", "class_loads_per_item")]
    patches += [(rule, "finish", "rules: finish()") for rule in options.rules if "finish" in vars(rule)]
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    forget_project_analysis()
    for owner, name, phase in patches:
        setattr(owner, name, clock.wrap(phase, getattr(owner, name)))
    total = 0.0
    try:
        for path, text in texts:
            start = time.process_time()
            lint_text(text, path, with_project(options, path), PROJECTS)
            total += time.process_time() - start
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)
    engine = 0.0
    for path, text in texts:
        tree, errors = linter._python_tree(text, path)
        if errors:
            continue
        try:
            module = linter.parse_module(linter.text_for_libcst(linter.elide_large_literals(text, tree)))
        except Exception:
            continue
        start = time.process_time()
        try:
            walker.Walker(Collector(FileModel(path, text, module)), {}, {}, lambda method, exc: None).walk(module)
        except RecursionError:
            pass
        engine += time.process_time() - start
    walk = clock.seconds.pop("walk: engine + rule visits", 0.0)
    clock.seconds["engine analysis (walk without rules)"] = min(engine, walk)
    clock.seconds["rules: visits during the walk"] = max(walk - engine, 0.0)
    clock.seconds["other (contexts, rule set-up, noqa, hand-off)"] = total - sum(clock.seconds.values())
    print(f"phases of a cold lint, {total:.2f} CPU-s in all (timers on):")
    for phase, seconds in sorted(clock.seconds.items(), key=lambda item: -item[1]):
        print(f"  {phase:46s} {seconds:7.2f} CPU-s  {100 * seconds / total:5.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root")
    parser.add_argument("--jobs-check", action="store_true")
    parser.add_argument("--prefilter-check", action="store_true")
    parser.add_argument("--cache-check", action="store_true")
    parser.add_argument("--edit", default=None, metavar="RELPATH",
                        help="with --cache-check: the file to edit (relative to DIR; default: the middle file)")
    parser.add_argument("--phases", action="store_true")
    parser.add_argument("--files", type=int, default=None, metavar="N",
                        help="measure a tree of the first N files of DIR only (copied, paths kept), e.g. 500")
    args = parser.parse_args()

    subset = None
    if args.files:
        subset = tempfile.mkdtemp(prefix="lint_speed_")
        args.root = first_files(args.root, args.files, subset)
    try:
        run_checks(args)
    finally:
        if subset is not None:
            shutil.rmtree(subset, ignore_errors=True)


def first_files(root: str, count: int, destination: str) -> str:
    """Copy the first ``count`` readable files of ``root`` (discovery order)
    into ``destination/tree``, keeping their paths; returns that tree."""
    tree = os.path.join(destination, "tree")
    for path, _ in load(root)[:count]:
        target = os.path.join(tree, os.path.relpath(path, root))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
    return tree


def run_checks(args) -> None:
    texts = load(args.root)
    lines = sum(text.count("\n") for _, text in texts)
    options = default_options()
    parse_s, lint_s, findings, errors = time_parse_vs_lint(texts, options)
    print(f"files            {len(texts)}")
    print(f"lines            {lines}")
    print(f"parse only       {parse_s:8.2f} CPU-s  ({lines / parse_s:,.0f} lines/s)")
    print(f"torchlint        {lint_s:8.2f} CPU-s  ({lines / lint_s:,.0f} lines/s)")
    print(f"ratio            {lint_s / parse_s:8.3f}  torchlint / parse-only (analysis adds {100 * (lint_s / parse_s - 1):.0f}%)")
    print(f"findings         {findings}   internal errors {errors}")
    if args.phases:
        phases(texts, options)
    if args.prefilter_check:
        with_filter = findings_of(texts, options)
        original = linter._may_fire
        linter._may_fire = lambda rule, text: True
        try:
            without_filter = findings_of(texts, options)
        finally:
            linter._may_fire = original
        print(f"prefilter        {'identical findings' if with_filter == without_filter else 'FINDINGS DIFFER'} ({len(with_filter)} vs {len(without_filter)})")
    if args.jobs_check:
        one = cli_wall(args.root, 1)
        two = cli_wall(args.root, 2)
        print(f"cli --jobs 1     {one:8.2f} s wall")
        print(f"cli --jobs 2     {two:8.2f} s wall   speedup {one / two:.2f}x")
    if args.cache_check:
        cache_check(args.root, texts, args.edit)


if __name__ == "__main__":
    main()
