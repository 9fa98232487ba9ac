"""The sanitizer in Jupyter: ``%load_ext torchlint.sanitizer``.

    %%gpu_sanitize --checks sync,memory
    for x, y in loader:            # the cell runs under a sanitizer session
        ...

    %gpu_sanitize start --warmup-steps 5   # a session across cells
    ...                                    # cells run as usual
    %gpu_sanitize stop                     # the report

The options are ``torchlint-sanitize``'s (``runner.add_session_options``):
``--checks``, ``--warmup-steps``, ``--fail-on``, ``--strict`` (the cell fails
when failing findings exist), ``--limit``, and ``--report-json``,
``--report-html``, ``--trace`` to write files as well. The report renders in
the cell's output as the HTML report (in an iframe, so its styles stay its
own) with the text summary as its plain-text form, and every site in the
user's cells is named as IPython names them in tracebacks, ``Cell In[5]``,
with the line in the cell (the ``%%gpu_sanitize`` line is line 1). Without a
CUDA device the cell output says so in one line and the code runs without
the sanitizer (``TORCHLINT_SANITIZER_FORCE=1`` starts the checks anyway, as
for the runner).
"""

from __future__ import annotations

import argparse
import hashlib
import html
import linecache
import os
import shlex
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from . import frames
from .runner import _TRUE, INACTIVE_LINE, _cuda_available, _write_outputs, add_session_options

CELL_MAGIC = "gpu_sanitize"
IFRAME_HEIGHT_PX = 640


class UsageError(Exception):
    """Bad options to a magic: shown as one line in the cell's output."""


class _ArgumentParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: error: {message}")

    def exit(self, status: int = 0, message: Optional[str] = None) -> None:  # type: ignore[override]
        raise UsageError(message.strip() if message else f"{self.prog}: exit {status}")


def _parser(prog: str, with_action: bool) -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog=prog, description="Run code in this notebook under the torchlint GPU sanitizer.")
    if with_action:
        parser.add_argument("action", choices=("start", "stop", "status"))
    add_session_options(parser)
    return parser


class SanitizerReport:
    """A report as a cell shows it: the HTML page, or the text summary where
    HTML is not shown (a terminal IPython, ``text/plain`` readers)."""

    def __init__(self, report: Dict[str, Any], summary: str) -> None:
        self.report = report
        self.summary = summary

    def html_page(self) -> str:
        from .html_report import render

        return render([self.report])

    def _repr_html_(self) -> str:
        return (
            f'<iframe class="torchlint-sanitizer-report" srcdoc="{html.escape(self.html_page(), quote=True)}" '
            f'style="width:100%;height:{IFRAME_HEIGHT_PX}px;border:1px solid #ccc;resize:vertical"></iframe>'
        )

    def __repr__(self) -> str:
        return self.summary


class _Run:
    """One sanitized stretch of a notebook: a cell, or ``start`` to ``stop``."""

    def __init__(self, shell: Any, options: argparse.Namespace, prog: str) -> None:
        from .findings import KINDS, parse_checks
        from .session import SanitizerSession, parse_fail_on

        try:
            checks = parse_checks(options.checks)
            fail_on = parse_fail_on(options.fail_on) if options.fail_on else frozenset(KINDS)
        except ValueError as exc:
            raise UsageError(f"{prog}: error: {exc}") from None
        if options.warmup_steps < 0:
            raise UsageError(f"{prog}: error: --warmup-steps must be >= 0")
        from .report import unwritable

        for flag, path in (
            ("--report-json", options.report_json),
            ("--report-html", options.report_html),
            ("--trace", options.trace),
        ):
            problem = unwritable(path) if path else None
            if problem:
                raise UsageError(f"{prog}: error: {flag} {path}: {problem}")
        self.shell, self.options, self.prog = shell, options, prog
        self.checks, self.fail_on = checks, fail_on
        self.started_at = time.time()
        forced = os.environ.get("TORCHLINT_SANITIZER_FORCE", "").strip().lower() in _TRUE
        self.session: Optional[Any] = None
        if _cuda_available() or forced:
            self.session = SanitizerSession(checks=checks, warmup_steps=options.warmup_steps, fail_on=fail_on)
        else:
            print(f"{prog}: {INACTIVE_LINE}: nothing is checked; the code runs as it would without it")

    def start(self) -> None:
        frames.add_user_root(os.getcwd())  # the notebook's folder: its own modules are the user's
        if self.session is not None:
            try:
                self.session.start()
            except Exception as exc:
                raise UsageError(f"{self.prog}: error: could not start the sanitizer: {exc}") from None

    def finish(self) -> SanitizerReport:
        """Stop, and the report with its sites named by cell."""
        from .report import build_report, render_summary

        if self.session is None:
            steps = {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}
            report = build_report([], checks=(), steps=steps, fail_on=self.fail_on, inactive="no CUDA device")
            summary = f"{self.prog}: {INACTIVE_LINE}"
        else:
            try:
                self.session.program_end()
            finally:
                self.session.stop()
            report = _name_cells(self.session.report(), _cell_names(self.shell))
            from .findings import Finding

            findings = [Finding.from_json(entry) for entry in report.get("findings", [])]
            summary = render_summary(
                findings, report.get("steps"), limit=self.options.limit, title=self.prog, phases=report.get("phases")
            )
        if self.options.report_json or self.options.report_html or self.options.trace:
            _write_outputs(self.prog, self.options, report, None, self.started_at)
        return SanitizerReport(report, summary)

    def failing(self) -> bool:
        return self.session is not None and bool(self.session.failing_findings())


# The files this module compiled cells under: file -> execution count.
_CELL_FILES: Dict[str, int] = {}


def _cell_names(shell: Any) -> Dict[str, str]:
    """Each file a cell ran from -> ``Cell In[n]``: the cells this module ran,
    and those IPython ran (its compiler maps its cell files to their numbers)."""
    known: Dict[str, int] = dict(getattr(getattr(shell, "compile", None), "_filename_map", {}) or {})
    known.update(_CELL_FILES)
    return {path: f"Cell In[{number}]" for path, number in known.items() if isinstance(number, int)}


def _name_cells(value: Any, names: Dict[str, str]) -> Any:
    """The report with every ``file`` that is a cell's file replaced by the cell's name."""
    if isinstance(value, dict):
        return {
            key: (names.get(item, item) if key == "file" and isinstance(item, str) else _name_cells(item, names))
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_name_cells(item, names) for item in value]
    return value


def _current_cell_number(shell: Any) -> int:
    """The number of the cell running this magic: IPython compiled it under a
    file it maps to that number (``execution_count`` may already count the
    next cell by now, depending on the IPython version)."""
    known = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    frame: Optional[Any] = sys._getframe(1)
    while frame is not None:
        number = known.get(frame.f_code.co_filename)
        if isinstance(number, int) and frame.f_code.co_filename not in _CELL_FILES:
            return number
        frame = frame.f_back
    return int(shell.execution_count)


def _cell_file(shell: Any, source: str, number: int) -> str:
    """A real path for the cell's code (a pseudo name such as ``<cell>`` is
    never the user's, frames.py rule 1), with its lines in ``linecache`` for
    tracebacks, and known to IPython so its tracebacks say ``Cell In[n]``."""
    digest = hashlib.sha1(source.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    folder = os.path.join(tempfile.gettempdir(), f"torchlint_cells_{os.getpid()}")
    path = os.path.join(folder, f"cell_{number}_{digest}.py")
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    filename_map = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if isinstance(filename_map, dict):
        filename_map[path] = number
    _CELL_FILES[path] = number
    frames.add_user_file(path)
    return path


class _Magics:
    """Registered on the shell by ``load_ipython_extension`` (IPython's Magics
    class is imported there, so importing this module needs no IPython)."""

    active: Optional[_Run] = None

    def __init__(self, shell: Any) -> None:
        self.shell = shell

    def line(self, line: str) -> Optional[SanitizerReport]:
        prog = f"%{CELL_MAGIC}"
        try:
            options = _parser(prog, with_action=True).parse_args(shlex.split(line))
            if options.action == "status":
                print(
                    f"{prog}: a session is running (started with `{prog} start`)"
                    if _Magics.active is not None
                    else f"{prog}: no session is running"
                )
                return None
            if options.action == "start":
                if _Magics.active is not None:
                    raise UsageError(f"{prog}: error: a session is already running; `{prog} stop` ends it")
                run = _Run(self.shell, options, prog)
                run.start()
                _Magics.active = run
                if run.session is not None:
                    print(
                        f"{prog}: sanitizer started ({', '.join(sorted(run.checks))}); "
                        f"`{prog} stop` ends the session and shows the report"
                    )
                return None
            running, _Magics.active = _Magics.active, None
            if running is None:
                raise UsageError(f"{prog}: error: no session is running; `{prog} start` begins one")
            self._display(running.finish())
            if running.options.strict and running.failing():
                raise SanitizerFindings(f"{prog} --strict: the session has failing findings")
        except UsageError as exc:
            print(str(exc), file=sys.stderr)
        return None

    def cell(self, line: str, cell: str) -> None:
        prog = f"%%{CELL_MAGIC}"
        try:
            options = _parser(prog, with_action=False).parse_args(shlex.split(line))
            if _Magics.active is not None:
                raise UsageError(
                    f"{prog}: error: a session started with `%{CELL_MAGIC} start` is running; stop it first"
                )
            run = _Run(self.shell, options, prog)
        except UsageError as exc:
            print(str(exc), file=sys.stderr)
            return
        number = _current_cell_number(self.shell)
        # One blank line stands for the magic's own line: lines count as the cell shows them.
        source = "\n" + self.shell.transform_cell(cell)
        path = _cell_file(self.shell, source, number)
        code = compile(source, path, "exec", flags=getattr(self.shell.compile, "flags", 0), dont_inherit=True)
        run.start()
        try:
            exec(code, self.shell.user_ns)
        finally:  # the report shows, then the cell's own error if it raised
            self._display(run.finish())
        if options.strict and run.failing():
            raise SanitizerFindings(f"{prog} --strict: the cell has failing findings")

    def _display(self, report: SanitizerReport) -> None:
        from IPython.display import display

        display(report)


class SanitizerFindings(Exception):
    """``--strict``: the sanitized code left failing findings."""


def load_ipython_extension(shell: Any) -> None:
    magics = _Magics(shell)
    shell.register_magic_function(magics.line, magic_kind="line", magic_name=CELL_MAGIC)
    shell.register_magic_function(magics.cell, magic_kind="cell", magic_name=CELL_MAGIC)


def unload_ipython_extension(shell: Any) -> None:
    run, _Magics.active = _Magics.active, None
    if run is not None and run.session is not None:
        run.session.stop()


__all__: List[str] = ["SanitizerReport", "load_ipython_extension", "unload_ipython_extension"]
