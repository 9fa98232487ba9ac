"""Lint (and fix) many files on all cores, with results in a stable order."""

from __future__ import annotations

import difflib
import functools
import hashlib
import os
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from torchlint import notebook
from torchlint import source as sources
from torchlint.fixer import fix_text, is_applicable
from torchlint.linter import FileOptions, InternalError, LintOutput, lint_text, syntax_error, why_unparsable
from torchlint.project import Projects
from torchlint.rule import Diagnostic
from torchlint.workers import run_isolated

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.cache import ResultCache

CHECK, FIX, DIFF, ADD_NOQA = "check", "fix", "diff", "add-noqa"


@dataclass
class Job:
    path: str
    options: FileOptions
    mode: str = CHECK
    unsafe_fixes: bool = False
    fixable: Optional[frozenset] = None  # codes allowed to fix; None = all
    noqa_reason: Optional[str] = None
    max_bytes: Optional[int] = sources.DEFAULT_MAX_BYTES  # larger files are one TL000, not linted


@dataclass
class FileResult:
    path: str
    diagnostics: List[Diagnostic] = field(default_factory=list)
    errors: List[InternalError] = field(default_factory=list)
    fixed: Counter = field(default_factory=Counter)
    diff: str = ""
    fix_error: Optional[str] = None
    noqa_added: int = 0
    text: str = ""  # the (final) source, kept when there are findings to show
    # The project roots whose other files the lint consulted (cross-file
    # facts): a cached result holds only while they are unchanged.
    depends_on: List[str] = field(default_factory=list)
    # SHA-256 of the bytes this result was computed from: the cache stores it
    # only under the key of exactly these bytes.
    content_sha256: str = ""


def run_text(text: str, job: Job, projects: Optional[Projects] = None) -> Tuple[FileResult, str]:
    """Lint or fix one already-decoded text; returns the result and the new text.
    A notebook's text is its JSON: its code cells are linted as one program.
    ``projects``: the run's projects (cross-file facts learnt so far), else a fresh set."""
    projects = projects if projects is not None else Projects()
    if notebook.is_notebook(job.path):
        return run_notebook(text, job, functools.partial(_run_program, projects=projects))
    return _run_program(text, job, projects)


def run_notebook(
    text: str, job: Job, run_program: Callable[[str, Job], Tuple[FileResult, str]]
) -> Tuple[FileResult, str]:
    """Lint, fix, diff or add noqa to a notebook: ``run_program`` does it on
    the program (the runner's own code for a Python text); the result is
    placed in cells and the edited cells written back into ``text``."""
    try:
        program = notebook.program_of(text)
    except notebook.NotebookError as exc:
        return FileResult(job.path, [syntax_error(job.path, str(exc))]), text
    # --diff fixes the program like --fix; the diff is then made per cell, and nothing is written.
    result, new_program = run_program(program.text, replace(job, mode=FIX) if job.mode == DIFF else job)
    new_text = text
    if new_program != program.text:
        try:
            changed = notebook.cells_after(program, new_program)
            new_text = notebook.write_sources(text, changed)
        except notebook.NotebookError as exc:
            result, _ = run_program(program.text, Job(job.path, job.options, CHECK))
            result.fix_error = str(exc)
            changed, new_text = {}, text
        if job.mode == DIFF:
            result.diff, new_text = notebook.cell_diff(job.path, program, changed), text
    result.diagnostics = [notebook.to_cells(d, program) for d in result.diagnostics]
    if result.diagnostics:
        result.text = program.text  # the excerpts read the program's rows (noqa_row)
    return result, new_text


def _run_program(text: str, job: Job, projects: Projects) -> Tuple[FileResult, str]:
    result = FileResult(job.path)
    new_text = text
    if job.mode in (FIX, DIFF):
        allowed = job.fixable
        fixable = (lambda code: code in allowed) if allowed is not None else (lambda code: True)
        fixed = fix_text(text, job.path, job.options, job.unsafe_fixes, fixable, projects)
        new_text, result.fixed, result.fix_error = fixed.text, fixed.applied, fixed.error
        output: LintOutput = fixed.remaining  # type: ignore[assignment]
        if job.mode == DIFF and new_text != text:
            result.diff = unified_diff(text, new_text, job.path)
            new_text = text
    else:
        projects.record_consulted()
        try:
            output = lint_text(text, job.path, job.options, projects)
        finally:
            result.depends_on = projects.consulted()
        if job.mode == ADD_NOQA and output.diagnostics:
            new_text, result.noqa_added, result.fix_error = add_noqa(text, output.diagnostics, job.noqa_reason)
            if result.fix_error is None:
                output = lint_text(new_text, job.path, job.options, projects)
    result.diagnostics, result.errors = output.diagnostics, output.errors
    if result.diagnostics:
        result.text = new_text
    return result, new_text


def unified_diff(old: str, new: str, path: str) -> str:
    """A diff that ``git apply`` and ``patch -p1`` accept: headers name the
    path normalized (``--diff .`` gives ``a/m.py``, not ``a/./m.py``), and a
    last line without a newline is followed by git's marker for it."""
    shown = os.path.normpath(path).replace(os.sep, "/")
    lines = []
    for line in difflib.unified_diff(sources.split_lines(old), sources.split_lines(new), f"a/{shown}", f"b/{shown}"):
        lines.append(line)
        if not line.endswith(("\n", "\r")):
            lines.append("\n\\ No newline at end of file\n")
    return "".join(lines)


def run_file(job: Job, projects: Optional[Projects] = None) -> FileResult:
    try:
        data = sources.read_bytes(job.path, job.max_bytes)
    except sources.NotASourceFile as exc:
        return FileResult(job.path, [syntax_error(job.path, str(exc))])
    except OSError as exc:
        return FileResult(job.path, [syntax_error(job.path, f"cannot read file: {exc.strerror or exc}")])
    digest = hashlib.sha256(data).hexdigest()
    try:
        decoded = sources.decode(data)
    except sources.DecodeError as exc:
        return FileResult(job.path, [syntax_error(job.path, f"cannot decode file: {exc}")], content_sha256=digest)
    writes = job.mode in (FIX, ADD_NOQA)
    if writes and not sources.is_writable(job.path):
        result, _ = run_text(decoded.text, Job(job.path, job.options, CHECK), projects)
        result.fix_error = "file is read-only; not fixed"
        return result
    result, new_text = run_text(decoded.text, job, projects)
    result.content_sha256 = digest
    if new_text != decoded.text and writes:
        try:
            # Written only if the file still holds the bytes that were fixed:
            # an edit saved meanwhile, or another run's fixes, are never lost.
            sources.write_in_place(job.path, decoded.encode(new_text), expected=data)
            return result
        except sources.ChangedDuringRun:
            why = "changed during the run, not fixed"
        except OSError as exc:
            why = f"cannot write fixed file: {exc.strerror or exc}"
        except UnicodeEncodeError as exc:
            why = f"fixed code cannot be encoded as {decoded.encoding}: {exc.reason}"
        # Nothing was written: report the findings of the file as it was read.
        result, _ = run_text(decoded.text, Job(job.path, job.options, CHECK), projects)
        result.fix_error = why
    return result


def crashed(job: Job, why: str) -> FileResult:
    """The result of a file whose worker process died (a crash in a native parser)."""
    return FileResult(
        job.path,
        errors=[InternalError(job.path, "engine", f"the worker process died ({why}) on this file; it was not linted")],
    )


def run(
    jobs: Sequence[Job],
    workers: int,
    cache: Optional["ResultCache"] = None,
    on_result: Optional[Callable[[int], None]] = None,
    projects: Optional[Projects] = None,
) -> List[FileResult]:
    """Results in the order of ``jobs``, whatever order the workers finish in.
    With a ``cache``, unchanged files checked before are not linted again.
    ``on_result(done)`` follows progress (cache hits count as done at once).
    ``projects``: the run's projects; each worker process starts with them
    (forked) and keeps what its lints learn about them."""
    projects = projects if projects is not None else Projects()
    if cache is None:
        return _run_all(jobs, workers, on_result, projects)
    results: List[Optional[FileResult]] = [None] * len(jobs)
    read_as: Dict[int, str] = {}  # job index -> digest of the bytes read here
    for index, job in enumerate(jobs):
        if job.mode != CHECK:
            continue
        try:
            read_as[index] = hashlib.sha256(sources.read_bytes(job.path, job.max_bytes)).hexdigest()
        except OSError:  # not a regular file, too large, unreadable: the worker says why
            continue
        results[index] = cache.get(cache.key(job.path, read_as[index], job.options))
    misses = [index for index, result in enumerate(results) if result is None]
    hits = len(jobs) - len(misses)
    if on_result is not None and hits:
        on_result(hits)
    progress = None if on_result is None else (lambda done: on_result(hits + done))
    for index, result in zip(misses, _run_all([jobs[i] for i in misses], workers, progress, projects)):
        results[index] = result
        # A file that changed between the two reads is not cached: its result
        # is stored only under the key of the very bytes the worker linted.
        if index in read_as and not result.errors and result.content_sha256 == read_as[index]:
            cache.put(cache.key(jobs[index].path, result.content_sha256, jobs[index].options), result)
    return results  # type: ignore[return-value]


MAX_FIX_ROUNDS = 5  # a fix in one file can enable one in another, which can enable one in a third...


def fix_to_fixed_point(
    jobs: Sequence[Job],
    workers: int,
    on_result: Optional[Callable[[int], None]] = None,
    refresh: Callable[[List[Job]], List[Job]] = lambda jobs: jobs,
    projects: Optional[Projects] = None,
) -> List[FileResult]:
    """``--fix`` in rounds, so that a second ``--fix`` changes nothing.

    Every round reads other files' facts from the contents the round started
    from (``Projects.freeze``), so what a round fixes does not depend on the
    number of workers or on the order files are done in. A fix can change a
    fact another file's lint used (a loader made pinned in ``main.py`` makes
    the copies of ``engine.py`` candidates): after a round that changed files,
    the files of the projects those belong to are fixed again, with project
    facts recomputed (``refresh`` rebuilds the jobs' options from ``projects``,
    which freezing emptied), until a round changes nothing or ``MAX_FIX_ROUNDS``
    rounds have run."""
    projects = projects if projects is not None else Projects()
    results: List[FileResult] = [FileResult(job.path) for job in jobs]
    pending = list(range(len(jobs)))
    current = list(jobs)
    for round_number in range(MAX_FIX_ROUNDS):
        projects.freeze(_contents(job.path for job in current))
        try:
            done = _run_all([current[i] for i in pending], workers, on_result if round_number == 0 else None, projects)
        finally:
            projects.freeze({})
        changed_roots = set()
        for index, result in zip(pending, done):
            earlier = results[index]
            result.fixed = earlier.fixed + result.fixed
            result.fix_error = result.fix_error or earlier.fix_error
            results[index] = result
            if sum(result.fixed.values()) > sum(earlier.fixed.values()):
                changed_roots.add(projects.for_path(current[index].path).root)
        if not changed_roots:
            break
        # project facts (the torch floor from API use) may have moved: freezing
        # forgot every project, so the refreshed options read them again
        current = refresh(current)
        pending = [i for i, job in enumerate(current) if projects.for_path(job.path).root in changed_roots]
    return results


def _contents(paths: Iterable[str]) -> Dict[str, bytes]:
    contents: Dict[str, bytes] = {}
    for path in paths:
        if not os.path.isfile(path):
            continue  # a FIFO or a device is not read here (nor are its facts)
        try:
            with open(path, "rb") as handle:
                contents[path] = handle.read()
        except OSError:
            continue  # its own lint reports it
    return contents


def _run_all(
    jobs: Sequence[Job], workers: int, on_result: Optional[Callable[[int], None]], projects: Projects
) -> List[FileResult]:
    """Files are linted in child processes where the platform can fork, so
    that a crash costs only the file it happened on."""
    if hasattr(os, "fork"):
        return run_isolated(functools.partial(run_file, projects=projects), jobs, max(1, workers), crashed, on_result)
    results = []  # pragma: no cover - Windows: in process, one at a time
    for job in jobs:
        results.append(run_file(job, projects))
        if on_result is not None:
            on_result(len(results))
    return results


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


_NOQA_CODES = re.compile(r"#\s*noqa:\s?(?P<codes>[A-Z]+[0-9]+(?:(?:\s*,\s*|\s+)[A-Z]+[0-9]+)*)", re.IGNORECASE)
_BARE_NOQA = re.compile(r"#\s*noqa(?!:)", re.IGNORECASE)


def with_noqa(body: str, codes: Iterable[str], reason: Optional[str] = None) -> Optional[str]:
    """The line ``body`` (without its line ending) with ``# noqa: CODES`` added or
    merged into its noqa comment; None when a bare ``# noqa`` covers it already."""
    if _BARE_NOQA.search(body):
        return None
    existing = _NOQA_CODES.search(body)
    if existing:
        merged = sorted(set(re.split(r"[\s,]+", existing.group("codes").upper())) | set(codes))
        return body[: existing.start()] + "# noqa: " + ", ".join(merged) + body[existing.end() :]
    suffix = f" {reason}" if reason else ""
    return f"{body}  # noqa: {', '.join(sorted(codes))}{suffix}"


def add_noqa(text: str, diagnostics: Iterable[Diagnostic], reason: Optional[str]) -> Tuple[str, int, Optional[str]]:
    """Append ``# noqa: CODE`` to each failing line (merging existing codes)."""
    by_row: Dict[int, set] = {}
    for d in diagnostics:
        if d.code != "TL000":
            by_row.setdefault(d.noqa_row or d.row, set()).add(d.code)
    lines = sources.split_lines(text)
    added = 0
    for row, codes in sorted(by_row.items()):
        line = lines[row - 1]
        body = line.rstrip("\r\n")
        new_body = with_noqa(body, codes, reason)
        if new_body is None:
            continue
        lines[row - 1] = new_body + line[len(body) :]
        added += len(codes)
    new_text = "".join(lines)
    if added and why_unparsable(new_text) is not None:
        return (
            text,
            0,
            "adding noqa comments would break the file (a finding inside a multi-line string?); left unchanged",
        )
    return new_text, added, None


def fixable_summary(results: Sequence[FileResult], unsafe_fixes: bool) -> Tuple[int, int]:
    """(findings fixable at the current level, additional unsafe fixes available)."""
    fixable = unsafe_only = 0
    for result in results:
        for d in result.diagnostics:
            if is_applicable(d.fix, unsafe_fixes):
                fixable += 1
            elif not unsafe_fixes and is_applicable(d.fix, True):
                unsafe_only += 1
    return fixable, unsafe_only
