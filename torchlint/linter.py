"""Lint one source text: parse once, walk once for all rules, place findings."""

from __future__ import annotations

import ast
import contextlib
import gc
import io
import os
import queue
import re
import sys
import threading
import tokenize
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Set, Tuple, Type, TypeVar

import libcst as cst
from libcst._nodes.base import CSTNode
from libcst._nodes.internal import CodegenState

from torchlint import noqa
from torchlint.collector import Collector
from torchlint.crossfile import ProjectAnalysis
from torchlint.incremental import ChunkedParser
from torchlint.model import FileModel
from torchlint.positions import PlacementMemo, positions_of
from torchlint.project import (
    ProjectFacts,
    Projects,
    TorchRange,
    for_file,
    is_test_module,
    with_target,
)
from torchlint.registry import SyntaxErrorRule
from torchlint.rule import (
    CHECK_TESTS,
    Diagnostic,
    Edit,
    Evidence,
    Fix,
    ResolvedEdit,
    ResolvedEvidence,
    ResolvedFix,
    Rule,
)
from torchlint.source import split_lines
from torchlint.walker import Walker, build_dispatch

_T = TypeVar("_T")


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


def lint_text(
    text: str,
    path: str,
    options: FileOptions,
    projects: Optional[Projects] = None,
    parser: Optional[ChunkedParser] = None,
) -> LintOutput:
    """The findings of one file. ``projects`` holds the run's projects, whose
    cross-file facts the lint may consult and keep; None: a fresh set for
    this one call. ``parser``: an editor's parser of this document, which
    reuses what did not change since its last text (torchlint.incremental);
    None: a whole parse."""
    # CPython's compiler decides what is a syntax error (TL000), and it runs
    # first: libcst's native parser can crash the process on input CPython
    # rejects (~1,300 nested parentheses), and compiling costs a tenth of
    # a libcst parse.
    tree, errors = _python_tree(text, path)
    if errors:
        return LintOutput(errors, [], False)
    rules = [r for r in options.rules if r is not SyntaxErrorRule and _may_fire(r, text)]
    if not rules:
        return LintOutput([], [], False)
    try:
        with _collection_paused():
            return with_deep_stack(
                _lint_module, elide_large_literals(text, tree), path, options, rules, tree, projects, parser
            )
    except RecursionError:
        return LintOutput([], [InternalError(path, "engine", "file too deeply nested to analyse")], True)


def _lint_module(
    text: str,
    path: str,
    options: FileOptions,
    rules: Sequence[Type[Rule]],
    tree: Optional[ast.Module] = None,
    projects: Optional[Projects] = None,
    parser: Optional[ChunkedParser] = None,
) -> LintOutput:
    text = text_for_libcst(text)
    try:
        module = parser.parse(text, tree) if parser is not None else parse_module(text)
    except cst.ParserSyntaxError as exc:  # CPython compiled it; libcst's grammar lags behind
        return LintOutput(
            [
                syntax_error(
                    path, f"SyntaxError: {exc.message} (libcst cannot parse this)", exc.raw_line, exc.raw_column + 1
                )
            ],
            [],
            False,
        )

    project = with_target(options.project, options.target_torch)
    projects = projects if projects is not None else Projects()
    analysis = ProjectAnalysis(projects, projects.for_path(path), parse_for_analysis)
    ctx = FileModel(path, text, module, project=project, torch_range=for_file(project, text, tree), analysis=analysis)
    in_tests = is_test_module(path)
    instances = []
    for rule in rules:
        opts = {**rule.option_defaults(), **options.rule_options.get(rule.code, {})}
        if in_tests and not opts.get(CHECK_TESTS, True):
            continue  # a test syncs, targets a device or skips no-grad on purpose
        instances.append(rule(ctx, opts))
    failed: Dict[Rule, InternalError] = {}

    def on_error(method, exc: BaseException) -> None:
        if isinstance(exc, RecursionError):
            raise exc  # the file is too deep for this stack, not a rule's fault
        rule = method.__self__
        failed.setdefault(
            rule, InternalError(path, rule.code, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        )

    visits, leaves = build_dispatch(instances)
    Walker(Collector(ctx), visits, leaves, on_error).walk(module)
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
    memo = parser.placements if parser is not None else None
    diagnostics = _place(reports, module, text, path, memo) if reports else []
    if diagnostics and not options.ignore_noqa:
        suppressions = noqa.parse(text)
        diagnostics = [d for d in diagnostics if not suppressions.suppresses(d.code, d.noqa_row or d.row)]
    _release(ctx, instances)
    return LintOutput(diagnostics, list(failed.values()), True)


def _release(ctx: FileModel, instances: Sequence[Rule]) -> None:
    """Break the reference cycles of one file's analysis (the context, its
    facts, their sites and the rules point at one another), so that reference
    counting frees the tree as soon as the lint returns. Left to the cyclic
    collector, every node of it was traversed first: 7% of a cold lint."""
    facts = ctx.facts
    for infos in facts.functions.values():
        for info in infos:
            vars(info).clear()
    for loop in facts.loops.values():
        vars(loop).clear()
    for owner in (*instances, ctx.batches, facts, ctx):
        vars(owner).clear()


def parse_for_analysis(text: str, path: str) -> Optional[Tuple[str, cst.Module]]:
    """Another file of the project, parsed as a lint parses it (CPython's
    compiler first, large literals elided, backslash-only lines blanked,
    libcst without per-node validation): the text libcst read and its tree,
    or None when the file does not parse (its own lint reports why)."""
    tree, errors = _python_tree(text, path)
    if errors:
        return None
    text = text_for_libcst(elide_large_literals(text, tree))
    try:
        return text, with_deep_stack(parse_module, text)
    except Exception:
        return None


def parse_module(text: str) -> cst.Module:
    """``libcst.parse_module`` without libcst validating each node it builds.
    Every node's ``__post_init__`` runs checks meant for trees built by hand
    (parentheses that match, whitespace where tokens need it); a tree the
    parser built from source passes them by construction, and they cost a
    sixth of the parse. (libcst's own note on ``CSTNode.__post_init__``
    suggests moving them out of parsing.) Nodes built meanwhile by any other
    thread are validated as usual."""
    parsing_thread = threading.get_ident()
    get_ident = threading.get_ident

    def __post_init__(node: cst.CSTNode) -> None:
        if get_ident() != parsing_thread:
            node._validate()

    with _PARSE_LOCK:
        CSTNode.__post_init__ = __post_init__  # type: ignore[method-assign, assignment]
        try:
            return cst.parse_module(text)
        finally:
            CSTNode.__post_init__ = _VALIDATING_POST_INIT  # type: ignore[method-assign]


_VALIDATING_POST_INIT = CSTNode.__post_init__
_PARSE_LOCK = threading.Lock()


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """The cyclic garbage collector rescans every live object on each full
    collection, and a large file's tree is millions of them: with it on,
    linting time grew faster than the file (1.6x per line from 1k to 32k
    lines). A lint makes little cyclic garbage, so collection waits until
    the file is done."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# Deep but valid code (an ``elif`` chain of 1,000 branches, a sum of 1,000
# terms) nests the tree as deep as CPython compiles, about 3,000 levels; the
# walk, the rules and libcst's metadata recurse a few frames per level. That
# needs more than the default recursion limit and stack, so the analysis runs
# on a thread of its own with room for it.
_DEEP_RECURSION_LIMIT = 60_000
_DEEP_STACK_BYTES = 512 * 1024 * 1024  # address space; only the pages used are committed


def with_deep_stack(function: Callable[..., _T], *args: Any) -> _T:
    deep = _deep_thread()
    if deep is None:  # a platform that cannot size stacks, or no address space for one
        return function(*args)
    if threading.current_thread() is deep.thread:
        return function(*args)  # already on it
    outcome: List[Any] = []
    done = threading.Event()
    previous_limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(previous_limit, _DEEP_RECURSION_LIMIT))
    try:
        deep.calls.put((function, args, outcome, done))
        done.wait()
    finally:
        sys.setrecursionlimit(previous_limit)
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


class _DeepThread:
    """The one thread with room for deep trees, started once per process and
    reused for every file (a thread per file cost 2% of a cold lint)."""

    def __init__(self) -> None:
        self.pid = os.getpid()  # a forked worker starts its own
        self.calls: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="torchlint-lint", daemon=True)

    def _serve(self) -> None:
        while True:
            function, args, outcome, done = self.calls.get()
            try:
                outcome.append((True, function(*args)))
            except BaseException as exc:  # handed to the calling thread
                outcome.append((False, exc))
            del function, args  # the file's text and tree go now, not with the next call
            done.set()


_DEEP_THREAD: Optional[_DeepThread] = None
_DEEP_STACK_LOCK = threading.Lock()


def _deep_thread() -> Optional[_DeepThread]:
    global _DEEP_THREAD
    deep = _DEEP_THREAD
    if deep is not None and deep.pid == os.getpid():
        return deep
    with _DEEP_STACK_LOCK:
        if _DEEP_THREAD is not None and _DEEP_THREAD.pid == os.getpid():
            return _DEEP_THREAD
        try:
            previous_stack = threading.stack_size(_DEEP_STACK_BYTES)
        except (ValueError, RuntimeError):  # a platform that cannot size stacks
            return None
        try:
            deep = _DeepThread()
            deep.thread.start()
        except RuntimeError:  # no address space for the stack (ulimit -v): the default one
            return None
        finally:
            threading.stack_size(previous_stack)
        _DEEP_THREAD = deep
        return deep


_BACKSLASH_ONLY_LINE = re.compile(r"^[ \t\f]*\\(?:\r\n|\r|\n)", re.MULTILINE)


def text_for_libcst(text: str) -> str:
    """``text`` with each line that holds only a backslash continuation made
    blank. libcst drops such a line from its tree (it does not round-trip
    them), so every position after it would be one line off: findings on the
    wrong line, ``# noqa`` missed, fixes refused. A blank line keeps the line
    count, and the lines joined to it keep their meaning. The line after it
    takes its indentation, which is what Python reads as the statement's."""
    if not _BACKSLASH_ONLY_LINE.search(text):
        return text
    inside_tokens: Set[int] = set()  # lines within multi-line strings: content, not code
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.start[0] != token.end[0] and token.type not in (tokenize.NL, tokenize.NEWLINE):
            inside_tokens.update(range(token.start[0] + 1, token.end[0] + 1))
    lines = split_lines(text)
    for index, line in enumerate(lines):
        if index + 1 in inside_tokens or not _BACKSLASH_ONLY_LINE.fullmatch(line):
            continue
        lines[index] = line[len(line.rstrip("\r\n")) :]
        if index + 1 < len(lines) and index + 2 not in inside_tokens:
            indent = line[: len(line) - len(line.lstrip(" \t\f"))]
            following = lines[index + 1]
            lines[index + 1] = indent + following.lstrip(" \t\f")
    return "".join(lines)


def _compile_in_pieces(text: str, path: str) -> ast.Module:
    """``compile(text)``, in time linear in the file. CPython's compiler is
    superlinear on some large modules (a 200k-line file of small functions
    took 31 s against 1.3 s for 50k lines), so the file is parsed whole and
    then the source of each top-level statement is compiled on its own: the
    same errors, since every compile-time check but one stays inside a
    statement. The one that does not, ``from __future__`` imports coming
    first, is compiled with the statements before it. (Compiling the parsed
    tree instead would reject deep expressions that CPython compiles from
    source.)"""
    tree = compile(text, path, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    assert isinstance(tree, ast.Module)  # what "exec" with PyCF_ONLY_AST returns
    body = tree.body
    if not body:
        return tree
    lines = split_lines(text)
    starts = [min([s.lineno] + [d.lineno for d in getattr(s, "decorator_list", ())]) for s in body]
    last_future = max(
        (i for i, s in enumerate(body) if isinstance(s, ast.ImportFrom) and s.module == "__future__"), default=-1
    )
    pieces = [(1, body[last_future].end_lineno)] if last_future >= 0 else []
    pieces += [(starts[i], statement.end_lineno) for i, statement in enumerate(body) if i > last_future]
    for first, last in pieces:
        try:
            compile("".join(lines[first - 1 : last]), path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            if exc.lineno is not None:
                exc.lineno += first - 1
            raise
    return tree


def why_unparsable(text: str) -> Optional[str]:
    """None when both CPython and libcst parse ``text``, else why not. The
    check fixes must pass before anything is written; CPython goes first,
    since libcst can crash on what CPython rejects."""
    tree, errors = _python_tree(text, "<fixed>")
    if errors:
        return errors[0].message
    try:
        with_deep_stack(cst.parse_module, text_for_libcst(elide_large_literals(text, tree)))
    except Exception as exc:
        return getattr(exc, "message", str(exc)).splitlines()[0]
    return None


def _may_fire(rule: Type[Rule], text: str) -> bool:
    return not rule.requires_any or any(token in text for token in rule.requires_any)


def python_syntax_errors(text: str, path: str) -> List[Diagnostic]:
    """What CPython's compiler rejects, placed and worded by CPython. Compiling
    (not just parsing) also catches ``return`` outside a function and the like."""
    return _python_tree(text, path)[1]


def _python_tree(text: str, path: str) -> Tuple[Optional[ast.Module], List[Diagnostic]]:
    """The syntax errors that stop CPython's compiler on ``text``, and its
    tree where the lint needs one: a file that may hold a literal worth
    eliding, or one so long that it is compiled in pieces; None otherwise.
    Such a file is compiled whole, without a tree: building the ``ast``
    objects costs more than compiling (on the corpus, 1.5 CPU-s for the tree
    and the pieces, 1.1 for compiling every file whole)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like
            if len(text) < LARGE_LITERAL_CHARS or (
                text.count("\n") < _WHOLE_COMPILE_LINES and not may_hold_large_literal(text)
            ):
                compile(text, path, "exec", dont_inherit=True)
                return None, []
            return _compile_in_pieces(text, path), []
    except SyntaxError as exc:  # IndentationError and TabError included
        # The running Python is the judge: newer syntax (PEP 695, 701) fails on an older one.
        message = f"{type(exc).__name__}: {exc.msg} (as Python {sys.version_info[0]}.{sys.version_info[1]} reads it)"
        return None, [syntax_error(path, message, exc.lineno or 1, exc.offset or 1)]
    except ValueError as exc:  # null bytes, before Python 3.12
        return None, [syntax_error(path, f"SyntaxError: {exc}")]
    except RecursionError:
        return None, [syntax_error(path, "SyntaxError: too deeply nested for Python's compiler")]
    except MemoryError:
        return None, [syntax_error(path, "SyntaxError: too large or too deeply nested for Python's compiler")]


# A top-level assignment of a pure literal (numbers, strings, and lists,
# tuples, sets and dicts of them) holds no call, name or attribute, so no rule
# can fire inside it; libcst's parse of a large one costs superlinear time and
# about 1 GB per MB of source. libcst sees ``NAME = ...`` in its place instead.
LARGE_LITERAL_CHARS = 20_000
_LITERAL_NODES = (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.USub, ast.UAdd, ast.Load)


# Up to this many lines CPython compiles a file in time linear in it (20k
# lines of small functions: 0.11 s whole, 0.28 s as a tree and pieces).
_WHOLE_COMPILE_LINES = 20_000
# A line that may start a top-level statement: not indented, and not the
# start of a literal's element (a number, a string, a bracket, True/False/None).
_STATEMENT_START = re.compile(r"(?:\A|(?<=[\r\n]))(?=[^\W\d]|@)(?!(?:True|False|None)\b|[bBrRuUfF]{1,2}['\"])")
_NAME_ASSIGNED = re.compile(r"[^\W\d]\w*[ \t]*[:=]")


def may_hold_large_literal(text: str) -> bool:
    """Might ``elide_large_literals`` change ``text``? Only a top-level
    ``NAME = <literal>`` of LARGE_LITERAL_CHARS or more is elided, and the
    lines of a pure literal after its first never start like a statement, so
    such a literal lies in a stretch that long between two statement-like
    line starts, the first of them an assignment to a name. (An element that
    starts a line with a name, which only a string spanning lines can have,
    hides the literal: it then reaches libcst whole, which costs time, not
    findings.)"""
    if len(text) < LARGE_LITERAL_CHARS:
        return False
    starts = [match.start() for match in _STATEMENT_START.finditer(text)] + [len(text)]
    for here, following in zip(starts, starts[1:]):
        if following - here >= LARGE_LITERAL_CHARS and _NAME_ASSIGNED.match(text, here):
            return True
    return False


def elide_large_literals(text: str, tree: Optional[ast.Module]) -> str:
    """``text`` with each large top-level pure-literal assignment reduced to
    ``NAME = ...``. Every line keeps its number and every other line its
    text, so positions, ``# noqa`` comments and fixes elsewhere are
    unchanged; comment-only lines inside the literal stay too."""
    if tree is None or len(text) < LARGE_LITERAL_CHARS:
        return text
    lines = split_lines(text)
    body = tree.body
    changed = False
    for index, statement in enumerate(body):
        if not isinstance(statement, (ast.Assign, ast.AnnAssign)) or statement.value is None or statement.col_offset:
            continue
        first, last = statement.lineno, statement.end_lineno or statement.lineno
        if sum(len(lines[row]) for row in range(first - 1, last)) < LARGE_LITERAL_CHARS:
            continue
        if (index + 1 < len(body) and body[index + 1].lineno <= last) or (
            index and (body[index - 1].end_lineno or 0) >= first
        ):
            continue  # shares a line with another statement (`;`)
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        names = [target.id for target in targets if isinstance(target, ast.Name)]
        if len(names) != len(targets):
            continue
        if not all(isinstance(node, _LITERAL_NODES) for node in ast.walk(statement.value)):
            continue
        tail = lines[last - 1].encode("utf-8")[statement.end_col_offset or 0 :].decode("utf-8", "replace").strip()
        if tail and not tail.startswith("#"):
            continue
        kept = []
        for line in lines[first - 1 : last]:
            ending = line[len(line.rstrip("\r\n")) :]
            kept.append(line if line.lstrip().startswith("#") else ending)
        kept[0] = " = ".join(names) + " = ..." + kept[0]  # kept[0]: its line ending
        lines[first - 1 : last] = kept
        changed = True
    return "".join(lines) if changed else text


def _place(reports, module: cst.Module, text: str, path: str, memo: Optional[PlacementMemo] = None) -> List[Diagnostic]:
    nodes = [node for _, node, _, _, _ in reports]
    nodes += [
        edit.node for _, _, _, fix, _ in reports if fix is not None for edit in fix.edits if edit.node is not None
    ]
    nodes += [fact.node for *_, evidence in reports for fact in evidence if fact.node is not None]
    positions = positions_of(module, nodes, memo)
    lines = split_lines(text)
    diagnostics = []
    for rule, node, message, fix, evidence in reports:
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
                fix=_resolve_fix(fix, positions, lines, module) if fix is not None else None,
                noqa_row=where.start.line,
                evidence=tuple(_resolve_evidence(fact, positions, path) for fact in evidence),
            )
        )
    diagnostics.sort(key=Diagnostic.sort_key)
    return diagnostics


def _resolve_evidence(fact: Evidence, positions, path: str) -> ResolvedEvidence:
    if fact.node is not None:
        where = positions[fact.node].start
        return ResolvedEvidence(fact.text, path, where.line, where.column + 1)
    assert fact.row is not None, "evidence needs a node or a row"
    return ResolvedEvidence(fact.text, fact.path or path, fact.row, fact.column)


def _resolve_fix(fix: Fix, positions, lines: List[str], module: cst.Module) -> ResolvedFix:
    return ResolvedFix(
        fix.applicability, fix.message, tuple(_resolve_edit(e, positions, lines, module) for e in fix.edits)
    )


def _resolve_edit(edit: Edit, positions, lines: List[str], module: cst.Module) -> ResolvedEdit:
    if edit.node is None:
        assert edit.start is not None and edit.end is not None
        return ResolvedEdit(edit.content, edit.start, edit.end)
    where = positions[edit.node]
    if edit.mode == "line-before":
        row = where.start.line
        line = lines[row - 1] if row - 1 < len(lines) else ""
        indent = line[: len(line) - len(line.lstrip(" \t"))]
        return ResolvedEdit(f"{indent}{edit.content}{module.default_newline}", (row, 0), (row, 0))
    start, end = (where.start.line, where.start.column), (where.end.line, where.end.column)
    content = edit.content
    if edit.new_node is not None:
        content = _code_in_place(
            module, edit.node, edit.new_node, _text_between(lines, start, end), lines[start[0] - 1]
        )
    return ResolvedEdit(content, start, end)


def _code_for(module: cst.Module, node: cst.CSTNode, block_indent: str) -> str:
    """``module.code_for_node`` as if the node sat in a block indented by
    ``block_indent``: libcst indents a continuation line inside brackets by
    the enclosing blocks' indentation, which a node generated on its own lacks."""
    state = CodegenState(
        default_indent=module.default_indent,
        default_newline=module.default_newline,
        indent_tokens=[block_indent] if block_indent else [],
    )
    node._codegen(state)
    return "".join(state.tokens)


def _code_in_place(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode, old_text: str, start_line: str) -> str:
    """The code of ``new`` replacing ``old`` (whose source is ``old_text``),
    with the original layout of continuation lines. The block's indentation
    is read off ``old``: each continuation line libcst indents is that
    indentation plus what the node's own code has."""
    if getattr(old, "lpar", None):
        old = old.with_changes(lpar=[], rpar=[])  # positions exclude a node's own parentheses
    plain = split_lines(_code_for(module, old, ""))
    block_indent = None
    for source_line, generated in zip(split_lines(old_text)[1:], plain[1:]):
        source_line, generated = source_line.rstrip("\r\n"), generated.rstrip("\r\n")
        if source_line != generated and generated and source_line.endswith(generated):
            block_indent = source_line[: len(source_line) - len(generated)]
            break
    if block_indent is None:  # no indented continuation line to learn from: the statement's line
        block_indent = start_line[: len(start_line) - len(start_line.lstrip(" \t"))]
    return _code_for(module, new, block_indent)


def _text_between(lines: List[str], start: Tuple[int, int], end: Tuple[int, int]) -> str:
    if start[0] == end[0]:
        return lines[start[0] - 1][start[1] : end[1]]
    return lines[start[0] - 1][start[1] :] + "".join(lines[start[0] : end[0] - 1]) + lines[end[0] - 1][: end[1]]
