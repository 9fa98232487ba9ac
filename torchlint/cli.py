"""The ``torchlint`` command line, modelled on ``ruff check``.

Exit codes: 0 no findings left (or all fixed); 1 findings remain, or
``--diff`` would change something; 2 a usage, configuration or internal error.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
from collections import Counter
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

from torchlint import __version__
from torchlint.cache import CACHE_DIR_ENV, DEFAULT_DIR, ResultCache, clean_command
from torchlint.color import CHOICES as COLOR_CHOICES
from torchlint.color import Painter, use_color
from torchlint.config import OUTPUT_FORMATS, Config, ConfigError, ConfigFinder, apply_table, parse_size, parse_version
from torchlint.discovery import DiscoveryOptions, discover
from torchlint.linter import FileOptions, syntax_error
from torchlint.progress import Progress
from torchlint.project import ProjectFacts, Projects
from torchlint.registry import all_rules
from torchlint.reporters import MACHINE_FORMATS, ReportContext, printable_path, reporters
from torchlint.rule import Diagnostic
from torchlint.runner import (
    ADD_NOQA,
    CHECK,
    DIFF,
    FIX,
    FileResult,
    Job,
    default_workers,
    fix_to_fixed_point,
    fixable_summary,
    run,
    run_text,
)
from torchlint.selection import (
    Layer,
    SelectorError,
    expand,
    ignored_for,
    normalize,
    parse_cli_per_file_ignores,
    parse_per_file_ignores,
    preview_selections,
    resolve,
)
from torchlint.source import DEFAULT_MAX_BYTES, write_atomic


class UsageError(Exception):
    pass


def _codes(value: str) -> List[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlint",
        description="Find PyTorch GPU code that is slow or wrong. `torchlint rule CODE` explains a rule.",
    )
    parser.add_argument("paths", nargs="*", help="files or directories to lint (default: .); `-` reads stdin")
    sel = parser.add_argument_group("rule selection")
    sel.add_argument(
        "--select",
        type=_codes,
        help="comma-separated codes or prefixes (TL101, TL1, ALL); replaces the configured selection",
    )
    sel.add_argument(
        "--extend-select", type=_codes, action="append", default=[], help="add codes or prefixes to the selection"
    )
    sel.add_argument("--ignore", type=_codes, action="append", default=[], help="codes or prefixes to leave out")
    sel.add_argument(
        "--per-file-ignores",
        action="append",
        default=[],
        metavar="GLOB:CODES",
        help="ignore codes in files matching GLOB (repeatable; !GLOB negates)",
    )
    sel.add_argument(
        "--extend-per-file-ignores",
        action="append",
        default=[],
        metavar="GLOB:CODES",
        help="like --per-file-ignores, on top of the configured ones",
    )
    sel.add_argument(
        "--preview",
        action="store_true",
        default=None,
        help="also run preview rules (those not yet measured into the stable set)",
    )
    sel.add_argument("--no-preview", dest="preview", action="store_false")
    sel.add_argument("--target-torch", metavar="VERSION", help='the PyTorch version the code targets, e.g. "1.13"')
    fix = parser.add_argument_group("fixes")
    fix.add_argument("--fix", action="store_true", default=None, help="apply safe fixes")
    fix.add_argument("--no-fix", dest="fix", action="store_false")
    fix.add_argument("--unsafe-fixes", action="store_true", default=None, help="also apply unsafe fixes")
    fix.add_argument("--no-unsafe-fixes", dest="unsafe_fixes", action="store_false")
    fix.add_argument("--diff", action="store_true", help="print the fixes as a unified diff; write nothing")
    fix.add_argument("--fix-only", action="store_true", help="apply fixes; do not report what is left")
    fix.add_argument("--show-fixes", action="store_true", help="list what was fixed")
    fix.add_argument("--fixable", type=_codes, help="only these codes may be fixed")
    fix.add_argument("--unfixable", type=_codes, action="append", default=[], help="these codes are never fixed")
    fix.add_argument(
        "--add-noqa",
        nargs="?",
        const="",
        default=None,
        metavar="REASON",
        help="add `# noqa: CODE` to every failing line",
    )
    fix.add_argument("--ignore-noqa", action="store_true", help="report findings that noqa comments suppress")
    out = parser.add_argument_group("output")
    out.add_argument("--output-format", choices=OUTPUT_FORMATS, default=os.environ.get("TORCHLINT_OUTPUT_FORMAT"))
    out.add_argument(
        "-o", "--output-file", default=os.environ.get("TORCHLINT_OUTPUT_FILE"), help="write the report to this file"
    )
    out.add_argument("--statistics", action="store_true", help="count findings per rule instead of listing them")
    out.add_argument(
        "--runtime-report",
        action="append",
        default=[],
        metavar="PATH",
        help=(
            "a torchlint-sanitize JSON report: join what the run measured with the findings (repeatable, one per rank)"
        ),
    )
    out.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="lint again whenever a Python file or a config changes (Ctrl-C stops)",
    )
    out.add_argument(
        "-e", "--exit-zero", action="store_true", help="exit 0 even when findings remain (2 still means an error)"
    )
    out.add_argument(
        "--exit-non-zero-on-fix", action="store_true", help="exit 1 when any file was changed, even if nothing is left"
    )
    out.add_argument("-q", "--quiet", action="store_true", help="print findings only, no summary")
    out.add_argument("-s", "--silent", action="store_true", help="print nothing; only the exit code")
    out.add_argument(
        "--color",
        choices=COLOR_CHOICES,
        default="auto",
        help="colour the text formats: auto (on a terminal, unless NO_COLOR is set or FORCE_COLOR is), always, never",
    )
    files = parser.add_argument_group("files and configuration")
    files.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="PATH|KEY=VALUE",
        help="a config file, or a TOML `key = value` override",
    )
    files.add_argument("--isolated", action="store_true", help="ignore every configuration file")
    files.add_argument("--stdin-filename", help="the path to report (and configure) stdin as")
    files.add_argument("--exclude", type=_codes, help="patterns to exclude, replacing the defaults")
    files.add_argument(
        "--extend-exclude", type=_codes, action="append", default=[], help="patterns to exclude on top of the defaults"
    )
    files.add_argument(
        "--extend-include",
        type=_codes,
        action="append",
        default=[],
        help="file patterns to lint beside *.py, *.pyi and *.ipynb (e.g. '*.pyw')",
    )
    files.add_argument(
        "--force-exclude",
        action="store_true",
        default=None,
        help="apply excludes to files named on the command line too",
    )
    files.add_argument("--no-respect-gitignore", dest="respect_gitignore", action="store_false", default=None)
    files.add_argument("--show-files", action="store_true", help="list the files that would be linted, then exit")
    files.add_argument("--show-settings", action="store_true", help="show the settings for the first file, then exit")
    files.add_argument(
        "--max-file-size",
        metavar="SIZE",
        help="files larger than this are one TL000, not linted (bytes, or e.g. 2MB; default 1MiB)",
    )
    files.add_argument("-j", "--jobs", type=int, default=None, help="worker processes (default: all cores)")
    files.add_argument(
        "-n", "--no-cache", action="store_true", help="lint every file again; do not read or write the result cache"
    )
    files.add_argument(
        "--cache-dir",
        default=None,
        metavar="PATH",
        help=f"where the result cache lives (default: ${CACHE_DIR_ENV}, else ./{DEFAULT_DIR})",
    )
    parser.add_argument("--version", action="version", version=f"torchlint {__version__}")
    return parser


def _flatten(values: Sequence[Sequence[str]]) -> List[str]:
    return [item for group in values for item in group]


class Settings:
    """The command line applied on top of each file's configuration."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rules = all_rules()
        explicit, overrides = None, {}
        for entry in args.config:
            if os.path.isfile(entry) or entry.endswith(".toml"):
                if explicit is not None:
                    raise UsageError("only one --config file may be given")
                if not os.path.isfile(entry):
                    raise UsageError(f"{entry}: config file not found")
                explicit = entry
            else:
                overrides.update(_parse_override(entry))
        # The run's projects: their facts, and what the lint learns of them
        self.projects = Projects()
        self.finder = ConfigFinder(self.rules, explicit=explicit, isolated=args.isolated)
        self.overrides = overrides
        self.cli_layer = Layer(
            select=normalize(args.select, self.rules) if args.select is not None else None,
            extend_select=normalize(_flatten(args.extend_select), self.rules),
            ignore=normalize(_flatten(args.ignore), self.rules),
        )
        cli_pfi = parse_cli_per_file_ignores(args.per_file_ignores + args.extend_per_file_ignores)
        self.cli_ignores = parse_per_file_ignores(cli_pfi, os.getcwd(), self.rules)
        self.target_torch = parse_version(args.target_torch) if args.target_torch else None
        try:
            self.max_file_size = parse_size(args.max_file_size) if args.max_file_size is not None else None
        except ValueError as exc:
            raise UsageError(f"--max-file-size: {exc}") from None
        self._options: Dict[Tuple, FileOptions] = {}
        self._configs: Dict[int, Config] = {}
        self._warned: set = set()
        # Files whose selection enables rules only under --preview (for one hint at the end).
        self.enabled_only_with_preview = 0
        self.enabled_any = False

    def config_for(self, path: str) -> Config:
        config = self.finder.for_path(path)
        if not self.overrides:
            return config
        key = id(config)
        if key not in self._configs:
            merged = Config(
                **{
                    **config.__dict__,
                    "per_file_ignores": dict(config.per_file_ignores),
                    "rule_options": dict(config.rule_options),
                }
            )
            apply_table(merged, self.overrides, "--config", self.rules)
            self._configs[key] = merged
        return self._configs[key]

    def max_bytes(self, config: Config) -> int:
        return self.max_file_size or config.max_file_size or DEFAULT_MAX_BYTES

    def preview(self, config: Config) -> bool:
        return bool(self.args.preview if self.args.preview is not None else config.preview)

    def enabled(self, config: Config) -> frozenset:
        config_layer = Layer(
            select=normalize(config.select, self.rules) if config.select is not None else None,
            extend_select=normalize(config.extend_select, self.rules),
            ignore=normalize(config.ignore, self.rules),
        )
        layers = [config_layer, self.cli_layer]
        preview = self.preview(config)
        enabled = resolve(layers, self.rules, preview)
        if not preview:
            self._warn_about_preview(layers, enabled)
        return enabled

    def _warn_about_preview(self, layers: List[Layer], enabled: frozenset) -> None:
        """ruff's warning for a preview rule named without --preview, and the
        facts for the hint when nothing but preview rules was selected."""
        for code in preview_selections(layers, self.rules):
            self.warn(f"Selection `{code}` has no effect because preview is not enabled.")
        if enabled - {"TL000"}:
            self.enabled_any = True
        elif resolve(layers, self.rules, preview=True) - {"TL000"}:
            self.enabled_only_with_preview += 1

    def warn(self, message: str) -> None:
        if message not in self._warned and not (self.args.quiet or self.args.silent):
            self._warned.add(message)
            print(f"torchlint: warning: {message}", file=sys.stderr)

    def warn_if_only_preview_selected(self) -> None:
        if self.enabled_only_with_preview and not self.enabled_any:
            self.warn(
                "No rule is enabled: the selected rules are all in preview. "
                "Use `--preview` (or `preview = true` under [tool.torchlint]) to run them."
            )

    def file_options(self, path: str) -> FileOptions:
        config = self.config_for(path)
        ignores = parse_per_file_ignores(config.per_file_ignores, config.root, self.rules) + self.cli_ignores
        skipped = ignored_for(path, ignores)
        project = (
            self.projects.for_path(path).facts(read_config=not self.args.isolated)
            if path and path != "-"
            else ProjectFacts()
        )
        key = (id(config), skipped, project.root)
        cached = self._options.get(key)
        if cached is None:
            codes = self.enabled(config) - skipped
            cached = FileOptions(
                rules=[self.rules[code] for code in codes],
                rule_options=config.rule_options,
                target_torch=self.target_torch or config.target_torch,
                ignore_noqa=self.args.ignore_noqa,
                project=project,
            )
            self._options[key] = cached
        return cached

    def refreshed(self, jobs: List[Job]) -> List[Job]:
        """``jobs`` with their options computed again (fixes changed the project's facts)."""
        self._options.clear()
        return [dataclasses.replace(job, options=self.file_options(job.path)) for job in jobs]

    def unsafe_fixes(self, config: Config) -> bool:
        if self.args.unsafe_fixes is not None:
            return self.args.unsafe_fixes
        return bool(config.unsafe_fixes)

    def fixable(self, config: Config) -> Optional[frozenset]:
        fixable = self.args.fixable if self.args.fixable is not None else config.fixable
        unfixable = config.unfixable + _flatten(self.args.unfixable)
        if fixable is None and not unfixable:
            return None
        allowed = expand(normalize(fixable, self.rules), self.rules) if fixable is not None else frozenset(self.rules)
        return allowed - expand(normalize(unfixable, self.rules), self.rules)

    def discovery(self) -> DiscoveryOptions:
        config = self.config_for(os.path.join(os.getcwd(), "pyproject.toml"))
        args = self.args
        return DiscoveryOptions(
            exclude=args.exclude if args.exclude is not None else config.exclude,
            extend_exclude=config.extend_exclude + _flatten(args.extend_exclude),
            extend_include=config.extend_include + _flatten(args.extend_include),
            respect_gitignore=config.respect_gitignore if args.respect_gitignore is None else args.respect_gitignore,
            force_exclude=bool(args.force_exclude if args.force_exclude is not None else config.force_exclude),
            root=config.root if config.path else os.getcwd(),
        )


def _describe_torch(options: FileOptions) -> Optional[str]:
    torch = options.torch_range()
    if not torch.known:
        return None
    return f"{torch.describe()} (from {', '.join(torch.sources)})"


def _parse_override(entry: str) -> Dict[str, object]:
    try:
        import tomllib
    except ImportError:  # pragma: no cover
        import tomli as tomllib
    try:
        return tomllib.loads(entry)
    except Exception as exc:
        raise UsageError(
            f"--config {entry!r}: neither a file nor a valid `key = value` TOML override ({exc})"
        ) from None


def settings_from(argv: Sequence[str]) -> "Settings":
    """The settings ``torchlint check ARGS`` would resolve (the language server's)."""
    return Settings(build_parser().parse_args(list(argv)))


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "rule":
        from torchlint.rule_command import main as rule_main

        return rule_main(argv[1:])
    if argv and argv[0] == "clean":
        return clean_command(argv[1:])
    if argv and argv[0] == "check":
        argv = argv[1:]
    if argv and argv[0] == "server":
        try:
            from torchlint.server import main as server_main
        except ImportError as exc:
            if exc.name not in ("pygls", "lsprotocol") and not str(exc.name).startswith(("pygls.", "lsprotocol.")):
                raise
            print(
                "torchlint: error: `torchlint server` needs the server extra: pip install 'torchlint[server]'",
                file=sys.stderr,
            )
            return 2
        return server_main(argv[1:], settings_from)
    args = build_parser().parse_args(argv)
    try:
        if args.watch:
            return _watch(args)
        return _check_reporting_errors(args)
    except KeyboardInterrupt:
        return 130


def _check_reporting_errors(args: argparse.Namespace) -> int:
    try:
        return _check(args)
    except (ConfigError, SelectorError, UsageError, ValueError) as exc:
        print(f"torchlint: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `torchlint . | head`: the reader has what it wanted. End quietly with
        # ruff's exit code for a closed pipe (0), and keep Python's own flush
        # at exit from raising again.
        _silence_stdout()
        return 0
    except ReportWriteError as exc:
        print(f"torchlint: error: {exc}", file=sys.stderr)
        return 2


class ReportWriteError(Exception):
    """The report could not be written (a full disk, a vanished folder)."""


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # pragma: no cover - stdout is not a real file
        pass


def _watch(args: argparse.Namespace) -> int:
    from torchlint.watch import watch

    paths = args.paths or ["."]
    if "-" in paths or _mode(args) != CHECK:
        print(
            "torchlint: error: --watch lints files: "
            "it cannot read stdin or be combined with --fix, --diff or --add-noqa",
            file=sys.stderr,
        )
        return 2
    missing = [path for path in paths if not os.path.exists(path)]
    if missing:
        print(f"torchlint: error: {missing[0]}: no such file or directory to watch", file=sys.stderr)
        return 2
    # A config broken mid-edit is reported, and the watch goes on.
    return watch(lambda: _check_reporting_errors(args), paths)


def _mode(args: argparse.Namespace) -> str:
    if args.add_noqa is not None:
        return ADD_NOQA
    if args.diff:
        return DIFF
    if args.fix or args.fix_only:
        return FIX
    return CHECK


def _check(args: argparse.Namespace) -> int:
    settings = Settings(args)
    mode = _mode(args)
    paths = args.paths or ["."]
    if paths == ["-"]:
        return _check_stdin(args, settings, mode)
    if "-" in paths:
        raise UsageError("`-` (stdin) cannot be combined with other paths")
    files, missing = discover(paths, settings.discovery())
    if args.show_files:
        for path in files:
            print(path)
        return 0
    if args.show_settings:
        target = files[0] if files else "."
        config = settings.config_for(target)
        options = settings.file_options(target)
        print(
            json.dumps(
                {
                    "file": target,
                    "config": config.path,
                    "preview": settings.preview(config),
                    "target-torch": _describe_torch(options),
                    "enabled": sorted(r.code for r in options.rules),
                    "rule-options": options.rule_options,
                },
                indent=2,
            )
        )
        return 0
    _refuse_source_as_output(args, files)
    jobs = []
    broken_configs: Dict[str, int] = {}  # a nested config that does not load -> files it left unlinted
    for path in files:
        try:
            config = settings.config_for(path)
            options = settings.file_options(path)
        except ConfigError as exc:
            # A broken pyproject.toml below the root (a test fixture, a vendored
            # project) costs its own subtree, not the run.
            broken_configs[str(exc)] = broken_configs.get(str(exc), 0) + 1
            continue
        jobs.append(
            Job(
                path,
                options,
                mode,
                settings.unsafe_fixes(config),
                settings.fixable(config),
                args.add_noqa or None,
                settings.max_bytes(config),
            )
        )
    settings.warn_if_only_preview_selected()
    workers = args.jobs if args.jobs is not None else default_workers()
    cache = ResultCache(args.cache_dir) if mode == CHECK and not args.no_cache else None
    report_to = _open_output_file(args)  # before any file is fixed: a bad path must not fail after
    with Progress.for_run(args, len(jobs)) as progress:
        if mode == FIX:
            results = fix_to_fixed_point(jobs, max(1, workers), progress.update, settings.refreshed, settings.projects)
        else:
            results = run(jobs, max(1, workers), cache, progress.update, settings.projects)
    results.extend(FileResult(path, [syntax_error(path, reason)]) for path, reason in missing)
    unsafe = settings.unsafe_fixes(settings.config_for(os.path.join(os.getcwd(), "x.py")))
    code = _finish(args, results, mode, unsafe, sys.stdout, report_to)
    for message, count in broken_configs.items():
        print(
            f"torchlint: error: {message} ({count} file{'s' if count != 1 else ''} under it not linted)",
            file=sys.stderr,
        )
    return 2 if broken_configs else code


_SOURCE_SUFFIXES = (".py", ".pyi", ".pyw", ".ipynb")


def _refuse_source_as_output(args: argparse.Namespace, files: Sequence[str]) -> None:
    """``-o train.py`` (the report name forgotten) must not replace a source:
    the report may not go to a linted file, nor over an existing Python file."""
    if not args.output_file:
        return
    target = os.path.realpath(args.output_file)
    if any(os.path.realpath(path) == target for path in files):
        raise UsageError(f"{args.output_file}: the output file is one of the linted files; refusing to overwrite it")
    if os.path.isfile(target) and target.endswith(_SOURCE_SUFFIXES):
        raise UsageError(f"{args.output_file}: the output file is a Python source; refusing to overwrite it")


class _OutputFile(io.StringIO):
    """``-o PATH``: the report is collected, then written all at once when
    closed, so a full disk leaves the previous report (or none), never half."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue().encode("utf-8", "backslashreplace")
            super().close()
            try:
                if os.path.exists(self.path) and not os.path.isfile(self.path):
                    # /dev/stdout, a FIFO, a device: written into, never renamed over.
                    with open(self.path, "wb") as handle:
                        handle.write(data)
                else:
                    write_atomic(os.path.realpath(self.path), data)
            except OSError as exc:
                raise ReportWriteError(f"{self.path}: cannot write the report: {exc.strerror or exc}") from None


def _open_output_file(args: argparse.Namespace) -> Optional[TextIO]:
    if not args.output_file:
        return None
    path = args.output_file
    # Checked now (a missing folder, a directory, no permission) so that it
    # fails before any file is fixed; written at the end.
    if os.path.isdir(path):
        raise UsageError(f"{path}: cannot write the output file: Is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"{path}: cannot write the output file: No such file or directory")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise UsageError(f"{path}: cannot write the output file: Permission denied")
    return _OutputFile(path)


def _check_stdin(args: argparse.Namespace, settings: Settings, mode: str) -> int:
    from torchlint import source as sources

    path = args.stdin_filename or "-"
    config = settings.config_for(path if path != "-" else os.path.join(os.getcwd(), "stdin.py"))
    data = sys.stdin.buffer.read()
    report_to = _open_output_file(args)
    # With --fix, stdout carries exactly the (fixed) source in its own
    # encoding, BOM included, and the report goes to stderr: editors replace
    # the buffer with what we print.
    source_out = mode in (FIX, ADD_NOQA)
    stream = sys.stderr if source_out else sys.stdout
    try:
        decoded = sources.decode(data)
    except sources.DecodeError as exc:
        if source_out:
            _write_source(data)
        return _finish(
            args,
            [FileResult(path, [syntax_error(path, f"cannot decode stdin: {exc}")])],
            CHECK,
            False,
            stream,
            report_to,
        )
    options = settings.file_options(path if path != "-" else "stdin.py")
    settings.warn_if_only_preview_selected()
    job = Job(path, options, mode, settings.unsafe_fixes(config), settings.fixable(config), args.add_noqa or None)
    result, new_text = run_text(decoded.text, job)
    if source_out:
        try:
            fixed = decoded.encode(new_text)
        except UnicodeEncodeError as exc:
            fixed = data
            result, _ = run_text(decoded.text, Job(path, options, CHECK))
            result.fix_error = f"fixed code cannot be encoded as {decoded.encoding}: {exc.reason}"
        _write_source(fixed)
    return _finish(args, [result], mode, settings.unsafe_fixes(config), stream, report_to)


def _write_source(data: bytes) -> None:
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


def _finish(
    args: argparse.Namespace,
    results: List[FileResult],
    mode: str,
    unsafe: bool,
    stream: TextIO,
    report_to: Optional[TextIO] = None,
) -> int:
    diagnostics: List[Diagnostic] = sorted((d for r in results for d in r.diagnostics), key=Diagnostic.sort_key)
    internal = [e for r in results for e in r.errors]
    fix_errors = [(r.path, r.fix_error) for r in results if r.fix_error]
    fixed_total = sum(sum(r.fixed.values()) for r in results)
    output_format = args.output_format or "concise"
    ctx = ReportContext(unsafe_fixes=unsafe, texts={r.path: r.text for r in results if r.text})
    if args.runtime_report:
        from torchlint import runtime_join

        ctx.runtime = runtime_join.join(
            diagnostics, runtime_join.load_reports(args.runtime_report), linted=[r.path for r in results]
        )
        diagnostics = runtime_join.sort_measured_first(diagnostics, ctx.runtime)
    handle = report_to
    out: TextIO = handle if handle is not None else stream
    if output_format not in MACHINE_FORMATS:
        ctx.paint = Painter(use_color(args.color, out))
    try:
        if not args.silent:
            _report(args, results, diagnostics, ctx, out, mode, unsafe, output_format, fixed_total)
        if handle is None:
            out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:  # a full disk or a closed terminal under the report
        raise ReportWriteError(f"cannot write the report: {exc.strerror or exc}") from None
    finally:
        if handle is not None:
            handle.close()
    for error in internal:
        print(
            f"torchlint: error: {printable_path(error.path)}: internal error in rule {error.rule}; "
            f"please report it:\n{error.traceback}",
            file=sys.stderr,
        )
    for path, reason in fix_errors:
        print(f"torchlint: error: {printable_path(path)}: {reason}", file=sys.stderr)
    if internal:
        return 2
    if mode == DIFF:
        return 1 if any(r.diff for r in results) else 0
    if mode == ADD_NOQA:
        return 0
    if args.exit_non_zero_on_fix and fixed_total:
        return 1
    if fix_errors and not args.exit_zero:
        return 1
    if args.fix_only or args.exit_zero:
        return 0
    # What a run found (a race, an OOM, a measured stall) fails like a finding, whatever --select chose.
    return 1 if diagnostics or (ctx.runtime is not None and ctx.runtime.blocking) else 0


def _report(args, results, diagnostics, ctx, out, mode, unsafe, output_format, fixed_total) -> None:
    quiet = args.quiet
    if mode == DIFF:
        for r in results:
            out.write(r.diff)
        would = sum(sum(r.fixed.values()) for r in results if r.diff)
        _, unsafe_only = fixable_summary(results, unsafe)
        if not quiet:
            extra = f" ({unsafe_only} additional fixes available with `--unsafe-fixes`)" if unsafe_only else ""
            print(
                f"Would fix {would} error{'s' if would != 1 else ''}{extra}." if would else "No errors would be fixed.",
                file=sys.stderr,
            )
        return
    if mode == ADD_NOQA:
        added = sum(r.noqa_added for r in results)
        if not quiet:
            print(f"Added {added} noqa directive{'s' if added != 1 else ''}.", file=sys.stderr)
        return
    if args.show_fixes and fixed_total:
        out.write(f"Fixed {fixed_total} error{'s' if fixed_total != 1 else ''}:\n")
        for r in results:
            for code, count in sorted(r.fixed.items()):
                out.write(f"- {ctx.display_path(r.path)}: {count} × {code} ({all_rules()[code].name})\n")
        out.write("\n")
    if args.fix_only:
        if not quiet and output_format not in MACHINE_FORMATS:
            out.write(f"Fixed {fixed_total} error{'s' if fixed_total != 1 else ''}.\n")
        return
    if args.statistics:
        _statistics(diagnostics, unsafe, output_format, out)
        return
    reporters()[output_format](diagnostics, ctx, out)
    if quiet or output_format in MACHINE_FORMATS:
        return
    fixable, unsafe_only = fixable_summary(results, unsafe)
    if diagnostics:
        remaining = f" ({fixed_total} fixed, {len(diagnostics)} remaining)" if fixed_total else ""
        total = len(diagnostics) + fixed_total
        out.write(f"Found {total} error{'s' if total != 1 else ''}{remaining}.\n")
        hint = (
            f" ({unsafe_only} unsafe fix{'es' if unsafe_only != 1 else ''} available with `--fix --unsafe-fixes`)"
            if unsafe_only
            else ""
        )
        if fixable:
            out.write(f"[*] {fixable} fixable with `--fix`{hint}.\n")
        elif unsafe_only:
            out.write(f"No fixes available{hint}.\n")
    elif fixed_total:
        out.write(f"Found {fixed_total} error{'s' if fixed_total != 1 else ''} ({fixed_total} fixed, 0 remaining).\n")
    elif ctx.runtime is not None and ctx.runtime.blocking:
        out.write("No lint findings, but the run found the problems listed above.\n")
    elif any(r.errors for r in results):
        unchecked = sum(1 for r in results if r.errors)
        out.write(
            f"No findings, but {unchecked} file{'s' if unchecked != 1 else ''} "
            "could not be fully checked (see the errors).\n"
        )
    else:
        out.write("All checks passed!\n")


def _statistics(diagnostics: Sequence[Diagnostic], unsafe: bool, output_format: str, out: TextIO) -> None:
    from torchlint.fixer import is_applicable

    counts: Counter = Counter(d.code for d in diagnostics)
    fixable: Counter = Counter(d.code for d in diagnostics if is_applicable(d.fix, unsafe))
    names = {d.code: d.name for d in diagnostics}
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if output_format in ("json", "json-lines"):
        json.dump(
            [
                {"code": c, "name": names[c], "count": n, "fixable": fixable[c] > 0, "fixable_count": fixable[c]}
                for c, n in rows
            ],
            out,
            indent=2,
        )
        out.write("\n")
        return
    width = max((len(str(n)) for _, n in rows), default=1)
    for code, count in rows:
        marker = "[*]" if fixable[code] else "[ ]"
        out.write(f"{count:>{width}}\t{code}\t{marker} {names[code]}\n")
