"""Lint one source text: parse once, walk once for all rules, place findings."""
from __future__ import annotations

import sys
import threading
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Type, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchlint import noqa
from torchlint.context import FileContext
from torchlint.registry import SyntaxErrorRule
from torchlint.source import split_lines
from torchlint.rule import Diagnostic, Edit, Fix, ResolvedEdit, ResolvedFix, Rule
from torchlint.walker import Walker, build_dispatch


_T = TypeVar("_T")


@dataclass
class FileOptions:
    """What one file is linted with: resolved from config and the command line."""

    rules: Sequence[Type[Rule]]
    rule_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    target_torch: Optional[Tuple[int, int]] = None
    ignore_noqa: bool = False


@dataclass
class InternalError:
    path: str
    rule: str
    traceback: str

    def __str__(self) -> str:
        return f"{self.path}: internal error in {self.rule}:\n{self.traceback}"


@dataclass
class LintOutput:
    diagnostics: List[Diagnostic]
    errors: List[InternalError]
    parsed: bool


def syntax_error(path: str, message: str, row: int = 1, column: int = 1) -> Diagnostic:
    return Diagnostic(
        code=SyntaxErrorRule.code,
        name=SyntaxErrorRule.name,
        message=message,
        path=path,
        row=row,
        column=column,
        end_row=row,
        end_column=column,
        noqa_row=row,
    )


def lint_text(text: str, path: str, options: FileOptions) -> LintOutput:
    # CPython's compiler decides what is a syntax error (TL000), and it runs
    # first: libcst's native parser can crash the process on input CPython
    # rejects (~1,300 nested parentheses), and compiling costs a seventh of
    # a libcst parse.
    errors = python_syntax_errors(text, path)
    if errors:
        return LintOutput(errors, [], False)
    rules = [r for r in options.rules if r is not SyntaxErrorRule and _may_fire(r, text)]
    if not rules:
        return LintOutput([], [], False)
    try:
        return with_deep_stack(_lint_module, text, path, options, rules)
    except RecursionError:
        return LintOutput([], [InternalError(path, "engine", "file too deeply nested to analyse")], True)


def _lint_module(text: str, path: str, options: FileOptions, rules: Sequence[Type[Rule]]) -> LintOutput:
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:  # CPython compiled it; libcst's grammar lags behind
        return LintOutput([syntax_error(path, f"SyntaxError: {exc.message} (libcst cannot parse this)", exc.raw_line, exc.raw_column + 1)], [], False)

    ctx = FileContext(path, text, module, options.target_torch)
    instances = [rule(ctx, {**rule.option_defaults(), **options.rule_options.get(rule.code, {})}) for rule in rules]
    failed: Dict[Rule, InternalError] = {}

    def on_error(method, exc: BaseException) -> None:
        if isinstance(exc, RecursionError):
            raise exc  # the file is too deep for this stack, not a rule's fault
        rule = method.__self__
        failed.setdefault(rule, InternalError(path, rule.code, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))

    visits, leaves = build_dispatch(instances)
    Walker(ctx, visits, leaves, on_error).walk(module)
    for instance in instances:
        if instance in failed:
            continue
        try:
            instance.finish()
        except RecursionError:
            raise
        except Exception:
            failed[instance] = InternalError(path, instance.code, traceback.format_exc())

    reports = [r for r in ctx.reports if r[0] not in failed]
    diagnostics = _place(reports, module, text, path) if reports else []
    if diagnostics and not options.ignore_noqa:
        suppressions = noqa.parse(text)
        diagnostics = [d for d in diagnostics if not suppressions.suppresses(d.code, d.noqa_row or d.row)]
    return LintOutput(diagnostics, list(failed.values()), True)


# Deep but valid code (an ``elif`` chain of 1,000 branches, a sum of 1,000
# terms) nests the tree as deep as CPython compiles, about 3,000 levels; the
# walk, the rules and libcst's metadata recurse a few frames per level. That
# needs more than the default recursion limit and stack, so the analysis runs
# on a thread of its own with room for it.
_DEEP_RECURSION_LIMIT = 60_000
_DEEP_STACK_BYTES = 512 * 1024 * 1024  # address space; only the pages used are committed


def with_deep_stack(function: Callable[..., _T], *args: Any) -> _T:
    outcome: List[Any] = []

    def target() -> None:
        try:
            outcome.append((True, function(*args)))
        except BaseException as exc:  # handed to the calling thread
            outcome.append((False, exc))

    with _DEEP_STACK_LOCK:
        previous_stack = threading.stack_size(_DEEP_STACK_BYTES)
        try:
            thread = threading.Thread(target=target, name="torchlint-lint")
            thread.start()
        finally:
            threading.stack_size(previous_stack)
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, _DEEP_RECURSION_LIMIT))
    try:
        thread.join()
    finally:
        sys.setrecursionlimit(previous_limit)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


_DEEP_STACK_LOCK = threading.Lock()


def _may_fire(rule: Type[Rule], text: str) -> bool:
    return not rule.requires_any or any(token in text for token in rule.requires_any)


def python_syntax_errors(text: str, path: str) -> List[Diagnostic]:
    """What CPython's compiler rejects, placed and worded by CPython. Compiling
    (not just parsing) also catches ``return`` outside a function and the like."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like
            compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError included
        return [syntax_error(path, f"{type(exc).__name__}: {exc.msg}", exc.lineno or 1, exc.offset or 1)]
    except ValueError as exc:  # null bytes, before Python 3.12
        return [syntax_error(path, f"SyntaxError: {exc}")]
    except RecursionError:
        return [syntax_error(path, "SyntaxError: too deeply nested for Python's compiler")]
    except MemoryError:
        return [syntax_error(path, "SyntaxError: too large or too deeply nested for Python's compiler")]
    return []


def _place(reports, module: cst.Module, text: str, path: str) -> List[Diagnostic]:
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    lines = split_lines(text)
    newline = module.default_newline
    diagnostics = []
    for rule, node, message, fix in reports:
        where = positions[node]
        diagnostics.append(
            Diagnostic(
                code=rule.code,
                name=rule.name,
                message=message,
                path=path,
                row=where.start.line,
                column=where.start.column + 1,
                end_row=where.end.line,
                end_column=where.end.column + 1,
                fix=_resolve_fix(fix, positions, lines, newline) if fix is not None else None,
                noqa_row=where.start.line,
            )
        )
    diagnostics.sort(key=Diagnostic.sort_key)
    return diagnostics


def _resolve_fix(fix: Fix, positions, lines: List[str], newline: str) -> ResolvedFix:
    return ResolvedFix(fix.applicability, fix.message, tuple(_resolve_edit(e, positions, lines, newline) for e in fix.edits))


def _resolve_edit(edit: Edit, positions, lines: List[str], newline: str) -> ResolvedEdit:
    if edit.node is None:
        assert edit.start is not None and edit.end is not None
        return ResolvedEdit(edit.content, edit.start, edit.end)
    where = positions[edit.node]
    if edit.mode == "line-before":
        row = where.start.line
        line = lines[row - 1] if row - 1 < len(lines) else ""
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        return ResolvedEdit(f"{indent}{edit.content}{newline}", (row, 0), (row, 0))
    return ResolvedEdit(edit.content, (where.start.line, where.start.column), (where.end.line, where.end.column))
