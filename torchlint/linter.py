"""Lint one source text: parse once, walk once for all rules, place findings."""
from __future__ import annotations

import ast
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Type

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchlint import noqa
from torchlint.context import FileContext
from torchlint.project import ProjectFacts, TorchRange, for_file, with_target
from torchlint.registry import SyntaxErrorRule
from torchlint.source import split_lines
from torchlint.rule import Diagnostic, Edit, Fix, ResolvedEdit, ResolvedFix, Rule
from torchlint.walker import Walker, build_dispatch


@dataclass
class FileOptions:
    """What one file is linted with: resolved from config and the command line."""

    rules: Sequence[Type[Rule]]
    rule_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    target_torch: Optional[Tuple[int, int]] = None  # explicit: --target-torch or [tool.torchlint]
    ignore_noqa: bool = False
    # What the project's manifests and API use say (torchlint.project); None: not looked up.
    project: Optional[ProjectFacts] = None

    def torch_range(self) -> TorchRange:
        return with_target(self.project, self.target_torch).torch


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
    rules = [r for r in options.rules if r is not SyntaxErrorRule and _may_fire(r, text)]
    if not rules:
        # No rule can fire here; still report a file Python would not compile.
        return LintOutput(_ast_syntax_errors(text, path), [], False)
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        # Python's own parser places and words errors better than libcst's.
        better = _ast_syntax_errors(text, path)
        return LintOutput(better or [syntax_error(path, f"SyntaxError: {exc.message}", exc.raw_line, exc.raw_column + 1)], [], False)
    except RecursionError:
        return LintOutput([syntax_error(path, "SyntaxError: too deeply nested to parse")], [], False)

    project = with_target(options.project, options.target_torch)
    ctx = FileContext(path, text, module, project=project, torch_range=for_file(project, text))
    instances = [rule(ctx, {**rule.option_defaults(), **options.rule_options.get(rule.code, {})}) for rule in rules]
    failed: Dict[Rule, InternalError] = {}

    def on_error(method, exc: BaseException) -> None:
        rule = method.__self__
        failed.setdefault(rule, InternalError(path, rule.code, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))))

    visits, leaves = build_dispatch(instances)
    try:
        Walker(ctx, visits, leaves, on_error).walk(module)
    except RecursionError:
        return LintOutput([], [InternalError(path, "engine", "file too deeply nested to analyse")], True)
    for instance in instances:
        if instance in failed:
            continue
        try:
            instance.finish()
        except Exception:
            failed[instance] = InternalError(path, instance.code, traceback.format_exc())

    reports = [r for r in ctx.reports if r[0] not in failed]
    diagnostics = _place(reports, module, text, path) if reports else []
    if diagnostics and not options.ignore_noqa:
        suppressions = noqa.parse(text)
        diagnostics = [d for d in diagnostics if not suppressions.suppresses(d.code, d.noqa_row or d.row)]
    return LintOutput(diagnostics, list(failed.values()), True)


def _may_fire(rule: Type[Rule], text: str) -> bool:
    return not rule.requires_any or any(token in text for token in rule.requires_any)


def _ast_syntax_errors(text: str, path: str) -> List[Diagnostic]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like
            ast.parse(text, filename=path)
    except SyntaxError as exc:
        return [syntax_error(path, f"SyntaxError: {exc.msg}", exc.lineno or 1, exc.offset or 1)]
    except (ValueError, RecursionError) as exc:
        return [syntax_error(path, f"SyntaxError: {exc}")]
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
