"""``torchlint-sanitize [options] script.py [args...]``: run a script under the sanitizer.

The script runs as ``__main__`` the way ``python script.py`` runs it:
``sys.argv`` is ``[script.py, args...]``, ``sys.path[0]`` is the script's
directory (so its sibling modules import), and ``if __name__ == "__main__":``
blocks run. At exit the summary goes to stderr and the JSON report to
``--report-json``.

Exit status: the script's own (``sys.exit(n)``; 1 with the traceback printed
for an uncaught exception; 130 on Ctrl-C), or 3 with ``--strict`` when the
script exited 0 but findings of a failing kind (``--fail-on``; with
``--strict`` alone, every kind) exist. 2: bad usage of the runner itself.

Under ``torchrun`` (``torchrun --nproc_per_node=N -m torchlint.sanitizer
train.py``, or ``torchrun ... $(which torchlint-sanitize) train.py``) every
rank runs its own session, prints its summary titled ``[rank r/N]`` and, with
``--report-json PATH``, writes ``PATH.rank<r>`` (before the extension); the
last rank to finish merges every rank's report into ``PATH`` and prints the
merged summary with one line per rank (``ranks.py``). ``--strict`` applies to
each rank's own findings.

Without a CUDA device it says so in one line, never "no findings", and
still runs the script; ``--report-json``, ``--report-html`` and ``--trace``
still write their files, each saying that nothing was checked (the report's
``inactive`` field). ``TORCHLINT_SANITIZER_FORCE=1`` starts the checks anyway
(used by the CPU test-suite).

Report paths are checked before the script runs (a directory, a read-only
file or a folder that cannot be written is a usage error, exit 2, before any
training starts). A report that still cannot be written after the run is a
one-line error; the exit status stays the script's.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
import traceback
from typing import Callable, List, Optional

from .findings import CHECKS, parse_checks
from .ranks import rank_info, rank_path, render_merged, write_rank_report

EXIT_STRICT = 3
INACTIVE_LINE = "no CUDA device: GPU sanitizer inactive"
_TRUE = {"1", "true", "yes", "on"}


class _BuildTap(argparse.Action):
    """``--build-tap``: build (or find) the race check's native tap, say where, and exit."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        from .races import native_tap

        try:
            module = native_tap.load()
        except native_tap.TapUnavailable as error:
            parser.exit(1, f"{parser.prog}: native tap unavailable: {error}\n")
        except ImportError as error:
            parser.exit(1, f"{parser.prog}: native tap unavailable: {error}\n")
        parser.exit(0, f"{parser.prog}: native tap ready: {module.__file__}\n")


def add_session_options(parser: argparse.ArgumentParser) -> None:
    """The options of a sanitized run: the runner's, and the Jupyter magics' (jupyter.py)."""
    parser.add_argument(
        "--checks",
        default="all",
        metavar="CHECKS",
        help=f"comma-separated checks ({', '.join(CHECKS)}, or all; default all)",
    )
    parser.add_argument("--report-json", default=None, metavar="PATH", help="write the JSON report to PATH")
    parser.add_argument(
        "--report-html",
        default=None,
        metavar="PATH",
        help="write a self-contained HTML report (timeline, memory chart, sites) to PATH",
    )
    parser.add_argument(
        "--trace",
        default=None,
        metavar="PATH",
        help="write a Chrome trace-event file (ui.perfetto.dev, chrome://tracing) to PATH",
    )
    parser.add_argument(
        "--warmup-steps", type=int, default=2, metavar="N", help="leave out the first N training steps (default 2)"
    )
    parser.add_argument(
        "--fail-on",
        default=None,
        metavar="KINDS",
        help="finding kinds that count as failing for --strict (default: all kinds)",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="exit 3 when the script exits 0 but failing findings exist (in Jupyter: the cell fails)",
    )
    parser.add_argument("--limit", type=int, default=10, metavar="N", help="sites shown in the summary (default 10)")


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a Python script under the torchlint GPU sanitizer.",
    )
    add_session_options(parser)
    parser.add_argument(
        "--build-tap", action=_BuildTap, help="build the race check's native tap now (else on first use) and exit"
    )
    parser.add_argument("script", help="the Python script to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return parser


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_script(path: str, args: List[str], at_end: Optional[Callable[[], None]] = None) -> int:
    """Run ``path`` as ``__main__`` with ``args``; return its exit status.

    ``at_end`` runs when the script has returned or raised, while its globals
    (and so its tensors) are still alive: the returned namespace, or the
    traceback's frames, hold them until this function returns.
    """
    script = os.path.abspath(path)
    saved_argv, saved_path0 = sys.argv[:], sys.path[0] if sys.path else None
    sys.argv = [path] + list(args)
    if sys.path:
        sys.path[0] = os.path.dirname(script)
    else:
        sys.path.insert(0, os.path.dirname(script))
    try:
        namespace = runpy.run_path(path, run_name="__main__")  # argv[0] stays as typed
        _call(at_end)
        del namespace
        return 0
    except SystemExit as exc:
        _call(at_end)
        return _exit_code(exc)
    except KeyboardInterrupt:
        _call(at_end)
        traceback.print_exc()
        return 130
    except BaseException:
        _call(at_end)
        # The traceback without the runner's own frames, as python script.py prints it.
        etype, value, tb = sys.exc_info()
        while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != script:
            tb = tb.tb_next
        if tb is None and value is not None:
            tb = value.__traceback__
        traceback.print_exception(etype, value, tb)
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _call(hook: Optional[Callable[[], None]]) -> None:
    if hook is not None:
        try:
            hook()
        except Exception as error:  # the sanitizer's failure never replaces the script's outcome
            print(f"torchlint-sanitize: internal error at the program's end: {error}", file=sys.stderr)


def _write_outputs(prog: str, options: argparse.Namespace, report: dict, ranked, started_at: float) -> None:
    """Every report asked for; one that cannot be written is one line on stderr, never a traceback."""
    from .report import ReportWriteError

    writers = []
    if options.report_json:
        writers.append(lambda: _write(prog, options.report_json, report, ranked, started_at, options.limit))
    if options.report_html:
        writers.append(lambda: _write_html(prog, options.report_html, report))
    if options.trace:
        writers.append(lambda: _write_trace(prog, options.trace, report))
    for write in writers:
        try:
            write()
        except ReportWriteError as error:
            print(f"{prog}: error: {error}", file=sys.stderr)


def _write_html(prog: str, path: str, report: dict) -> None:
    from .html_report import write_html

    write_html(path, [report])
    print(f"{prog}: HTML report written to {path}", file=sys.stderr)


def _write_trace(prog: str, path: str, report: dict) -> None:
    from .trace import write_trace

    write_trace(path, report)
    print(f"{prog}: trace written to {path} (open it in ui.perfetto.dev)", file=sys.stderr)


def _write(prog: str, path: str, report: dict, ranked, started_at: float, limit: int) -> None:
    """The report at ``path``; under torchrun this rank's own, and the merged one once every rank's is there."""
    from .report import write_report

    if ranked is None:
        write_report(path, report)
        print(f"{prog}: report written to {path}", file=sys.stderr)
        return
    merged = write_rank_report(path, report, ranked, started_at)
    print(f"{prog}: report written to {rank_path(path, ranked.rank)}", file=sys.stderr)
    if merged is not None:
        title = f"{prog.split(' [')[0]} (all {merged['world_size']} ranks)"
        print(render_merged(merged, title, limit), file=sys.stderr)
        print(f"{title}: merged report written to {path}", file=sys.stderr)


def main(argv: Optional[List[str]] = None, prog: str = "torchlint-sanitize") -> int:
    options = _parser(prog).parse_args(argv)
    try:
        checks = parse_checks(options.checks)
    except ValueError as exc:
        print(f"{prog}: error: --checks: {exc}", file=sys.stderr)
        return 2
    if options.warmup_steps < 0:
        print(f"{prog}: error: --warmup-steps must be >= 0", file=sys.stderr)
        return 2
    from .findings import KINDS
    from .session import SanitizerSession, parse_fail_on

    try:
        fail_on = parse_fail_on(options.fail_on) if options.fail_on else frozenset(KINDS)
    except ValueError as exc:
        print(f"{prog}: error: --fail-on: {exc}", file=sys.stderr)
        return 2
    if not os.path.isfile(options.script):
        print(f"{prog}: error: {options.script}: no such file", file=sys.stderr)
        return 2
    from .report import unwritable

    for flag, path in (
        ("--report-json", options.report_json),
        ("--report-html", options.report_html),
        ("--trace", options.trace),
    ):
        problem = unwritable(path) if path else None
        if problem:
            print(f"{prog}: error: {flag} {path}: {problem}", file=sys.stderr)
            return 2

    from . import frames

    # The script's folder and the working directory hold the user's code.
    frames.add_user_root(os.path.dirname(os.path.abspath(options.script)))
    frames.add_user_root(os.getcwd())
    forced = os.environ.get("TORCHLINT_SANITIZER_FORCE", "").strip().lower() in _TRUE
    ranked = rank_info()  # under torchrun: this process's rank, its own report, then the merge
    if ranked is not None:
        prog = f"{prog} [rank {ranked.rank}/{ranked.world_size}]"
    started_at = time.time()
    if not (_cuda_available() or forced):
        print(f"{prog}: {INACTIVE_LINE}: nothing is checked; the script runs as it would without it", file=sys.stderr)
        code = run_script(options.script, options.args)
        from .report import build_report

        steps = {"completed": 0, "warmup": 0, "measured": 0, "source": "none"}
        report = build_report([], checks=(), steps=steps, fail_on=fail_on, inactive="no CUDA device")
        _write_outputs(prog, options, report, ranked, started_at)
        return code

    session = SanitizerSession(checks=checks, warmup_steps=options.warmup_steps, fail_on=fail_on)
    try:
        session.start()
    except Exception as exc:
        print(f"{prog}: error: could not start the sanitizer: {exc}", file=sys.stderr)
        return 2
    try:
        code = run_script(options.script, options.args, at_end=session.program_end)
    finally:
        session.stop()
    from .report import render_summary

    findings = session.findings
    steps = session.steps_summary()
    print(render_summary(findings, steps, limit=options.limit, title=prog, phases=session.phases()), file=sys.stderr)
    from torchlint.fix_command import closing_hint

    hint = closing_hint([finding.to_json() for finding in findings])
    if hint:
        print(f"{prog}: {hint}", file=sys.stderr)
    if options.report_json or options.report_html or options.trace:
        _write_outputs(prog, options, session.report(), ranked, started_at)
    if options.strict and code == 0 and session.failing_findings():
        return EXIT_STRICT
    return code
