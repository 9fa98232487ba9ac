"""Parse a module one top-level statement at a time, reusing what did not change.

An editor lints the same file after every keystroke, and a keystroke changes
one top-level statement (a function, a class, an assignment). libcst has no
incremental parser and a whole parse is most of a lint (a third of a second
for 2,000 lines), so ``ChunkedParser`` cuts the text at the top-level
statements CPython's parser already found (``ast``, a tenth of the cost),
parses each piece once, and keeps the pieces for the next call: the text
that did not change is not parsed again.

The pieces join into one ``cst.Module`` whose code is the text, as a whole
parse gives. Where that cannot be shown cheaply, the whole text is parsed:

- text libcst's whole parse treats in a way the pieces would not see:
  ``\\r`` line ends, a byte-order mark, form feeds;
- a piece whose own indentation unit differs from the module's (libcst
  writes indentation relative to the module's unit) and whose code would
  change under the module's unit.

The comments and blank lines above a piece's first statement are, in a whole
parse, that statement's ``leading_lines``; a piece parsed alone reads them as
its module ``header``, so they are moved back.
"""

from __future__ import annotations

import ast
import threading
import warnings
from typing import Callable, Dict, List, Optional, Sequence, Union

import libcst as cst

from torchlint.positions import PlacementMemo

Parse = Callable[[str], cst.Module]
Statement = Union[cst.SimpleStatementLine, cst.BaseCompoundStatement]


class ChunkedParser:
    """A parser for one document that an editor lints again and again.

    ``parse(text, tree)`` returns the module of ``text``; ``tree`` is
    CPython's tree of the same text when the lint built one (it compiles
    most files without a tree; then ``ast.parse`` makes one, at a tenth of
    libcst's cost).
    ``whole_parse`` parses text libcst reads in one piece (the linter's
    ``parse_module``). Only the pieces of the latest text are kept.
    """

    def __init__(self, whole_parse: Parse) -> None:
        self.whole_parse = whole_parse
        self.lock = threading.Lock()  # for callers that lint the document from several threads
        self._pieces: Dict[str, _Piece] = {}
        self.parsed_pieces = 0  # pieces parsed by the latest call (the rest came from the last text)
        # The positions of the statements the pieces keep (the same objects from one text to the next).
        self.placements = PlacementMemo()

    def parse(self, text: str, tree: Optional[ast.Module]) -> cst.Module:
        if tree is None:  # the lint compiled the text without building a tree (its fast path)
            tree = _tree_of(text)
        segments = _segments(text, tree)
        joined = None
        if segments is not None:
            pieces: Dict[str, _Piece] = {}
            in_order: List[_Piece] = []
            parsed = 0
            for segment in segments:
                # A piece whose text stands twice in the module is parsed again for its second place:
                # one node object in two places would give both the first one's position.
                piece = None if segment in pieces else self._pieces.get(segment)
                if piece is None:
                    piece = _Piece(self.whole_parse(segment))
                    parsed += 1
                pieces.setdefault(segment, piece)
                in_order.append(piece)
            joined = _join(in_order, segments)
            self._pieces, self.parsed_pieces = pieces, parsed
        if joined is None:
            self._pieces, self.parsed_pieces = {}, 1
            joined = self.whole_parse(text)
        self.placements.keep(joined)
        return joined


class _Piece:
    """One piece's module, and its statements as they join a module: as its first piece, or
    after another (the lines above the first statement moved from the header into it). Built
    once, so a statement is the same object from one text to the next."""

    __slots__ = ("module", "_after_another")

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self._after_another: Optional[List[Statement]] = None

    def statements(self, first: bool) -> List[Statement]:
        if first or not self.module.header:
            return list(self.module.body)
        if self._after_another is None:
            head, *rest = self.module.body
            head = head.with_changes(leading_lines=[*self.module.header, *head.leading_lines])
            self._after_another = [head, *rest]
        return self._after_another


def _tree_of(text: str) -> Optional[ast.Module]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences and the like
            return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _segments(text: str, tree: Optional[ast.Module]) -> Optional[List[str]]:
    """The text cut after each top-level statement (statements sharing a line stay together)."""
    if tree is None or not tree.body or "\r" in text or "\f" in text or text.startswith("\ufeff"):
        return None
    lines = text.splitlines(keepends=True)
    ends: List[int] = []  # 1-based last line of each group of statements
    for statement in tree.body:
        first = min([statement.lineno, *(d.lineno for d in getattr(statement, "decorator_list", ()))])
        last = statement.end_lineno or statement.lineno
        if ends and first <= ends[-1]:
            ends[-1] = max(ends[-1], last)
        else:
            ends.append(last)
    segments: List[str] = []
    start = 0
    for index, end in enumerate(ends):
        stop = len(lines) if index == len(ends) - 1 else end
        segments.append("".join(lines[start:stop]))
        start = stop
    if "".join(segments) != text:  # lines the tree does not account for: parse the whole
        return None
    return segments


def _join(pieces: Sequence[_Piece], segments: Sequence[str]) -> Optional[cst.Module]:
    """One module of the pieces, or None when its code would not be the text."""
    modules = [piece.module for piece in pieces]
    indent = _module_indent(modules)
    body: List[Statement] = []
    for index, (piece, segment) in enumerate(zip(pieces, segments)):
        module = piece.module
        last = index == len(modules) - 1
        if not module.body or (not last and (module.footer or not module.has_trailing_newline)):
            return None
        if module.default_indent != indent and module.with_changes(default_indent=indent).code != segment:
            return None
        body.extend(piece.statements(first=index == 0))
    first, final = modules[0], modules[-1]
    return cst.Module(
        body=body,
        header=first.header,
        footer=final.footer,
        encoding=first.encoding,
        default_indent=indent,
        default_newline=first.default_newline,
        has_trailing_newline=final.has_trailing_newline,
    )


def _module_indent(modules: Sequence[cst.Module]) -> str:
    """The unit a whole parse would detect: that of the file's first indented block."""
    for module in modules:
        if _indents(module):
            return module.default_indent
    return modules[0].default_indent


def _indents(module: cst.Module) -> bool:
    """The piece holds an indented block at its top level (the first INDENT of the piece is in one)."""
    return any(
        isinstance(statement, cst.BaseCompoundStatement) and isinstance(statement.body, cst.IndentedBlock)
        for statement in module.body
    )
