"""Where the reported nodes sit in the source, without placing every node.

libcst's ``PositionProvider`` regenerates the whole module's code and
records a range for every node in it (through a context manager per
syntactic node), and ``MetadataWrapper.resolve`` adds a full visit of the
tree on top: on the corpus that cost 2.2 of a cold lint's 22 CPU-s, for
43 files with findings. A finding needs the positions of a handful of nodes, so only
the top-level statements holding them are generated with positions; every
statement before them is generated plainly to count its lines (a module's
code is its statements' code back to back, starting after the header).
A node found in no top-level statement (the module itself, a comment in the
header) falls back to positions for the whole module. The bookkeeping is
libcst's own, step for step (``_PlacingState``), so the ranges are the ones
``PositionProvider`` gives.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Set, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodePosition, CodeRange
from libcst.metadata.position_provider import NEWLINE_RE

from torchlint.tree import child_nodes


class PlacementMemo:
    """What ``positions_of`` learnt of a module's top-level statements, for the next module that
    holds the same statement objects (an editor's next text, parsed in pieces by
    ``torchlint.incremental``): each statement's line count and, once placed, the ranges of its
    nodes counted from its own first line. A statement's code does not depend on where it sits
    (it starts at column 0 of a line), only on the module's indentation unit and newline."""

    def __init__(self) -> None:
        self._style: Tuple[str, str] = ("", "")
        # id(statement) -> (the statement, kept alive so the id stays its own; its lines; its ranges or None)
        self._statements: Dict[int, Tuple[cst.CSTNode, int, Optional[Dict[cst.CSTNode, Tuple[_Point, _Point]]]]] = {}

    def keep(self, module: cst.Module) -> None:
        """Forget what belongs to statements ``module`` no longer holds, or to another style."""
        style = (module.default_indent, module.default_newline)
        if style != self._style:
            self._style, self._statements = style, {}
            return
        held = {id(statement) for statement in module.body}
        self._statements = {key: value for key, value in self._statements.items() if key in held}

    def lines(self, module: cst.Module, statement: cst.CSTNode) -> int:
        known = self._statements.get(id(statement))
        if known is not None:
            return known[1]
        count = _lines(module, (statement,))
        self._statements[id(statement)] = (statement, count, None)
        return count

    def placed(
        self, module: cst.Module, statement: cst.CSTNode
    ) -> Tuple[int, Dict[cst.CSTNode, Tuple[_Point, _Point]]]:
        """(lines, ranges from line 1) of ``statement``."""
        known = self._statements.get(id(statement))
        if known is not None and known[2] is not None:
            return known[1], known[2]
        state = _PlacingState(module, 1)
        statement._codegen(state)
        self._statements[id(statement)] = (statement, state.line - 1, state.computed)
        return state.line - 1, state.computed


def positions_of(
    module: cst.Module, nodes: Iterable[cst.CSTNode], memo: Optional[PlacementMemo] = None
) -> Mapping[cst.CSTNode, CodeRange]:
    """The ranges ``PositionProvider`` gives, for ``nodes``. ``memo``: see ``PlacementMemo``."""
    nodes = list(nodes)
    by_id = {id(node): node for node in nodes}
    remaining: Set[int] = set(by_id)
    holders: List[int] = []  # indexes in module.body of the statements holding them
    held: Dict[int, List[cst.CSTNode]] = {}  # holder index -> the nodes in it
    for index, statement in enumerate(module.body):
        if not remaining:
            break
        found: Optional[List[int]] = [] if memo is not None else None  # only the memo's shift needs them
        if _take_contained(statement, remaining, found):
            holders.append(index)
            if found is not None:
                held[index] = [by_id[key] for key in found]
    if remaining:
        state = _PlacingState(module)
        module._codegen(state)
        return state.ranges(nodes)
    line = 1 + _lines(module, module.header)
    wanted = set(holders)
    ranges: Dict[cst.CSTNode, CodeRange] = {}
    for index in range(holders[-1] + 1 if holders else 0):
        statement = module.body[index]
        if index in wanted and memo is not None:
            count, computed = memo.placed(module, statement)
            shift = line - 1
            for node in held[index]:
                where = computed.get(node)
                if where is not None:
                    (start_line, start_column), (end_line, end_column) = where
                    ranges[node] = CodeRange(
                        CodePosition(start_line + shift, start_column), CodePosition(end_line + shift, end_column)
                    )
            line += count
        elif index in wanted:
            state = _PlacingState(module, line)
            statement._codegen(state)
            ranges.update(state.ranges(nodes))
            line = state.line
        else:
            line += memo.lines(module, statement) if memo is not None else _lines(module, (statement,))
    return ranges


_Point = Tuple[int, int]


class _PlacingState(CodegenState):
    """``PositionProvidingCodegenState``'s bookkeeping, step for step, with
    plain tuples: libcst builds two frozen dataclasses per node and enters a
    generator-based context manager per syntactic node, which cost four
    times the code generation itself."""

    def __init__(self, module: cst.Module, line: int = 1) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.line = line  # one-indexed
        self.column = 0  # zero-indexed
        self._starts: List[_Point] = []
        self.computed: Dict[cst.CSTNode, Tuple[_Point, _Point]] = {}

    def add_indent_tokens(self) -> None:
        self.tokens.extend(self.indent_tokens)
        for token in self.indent_tokens:
            self._advance(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self._advance(value)

    def _advance(self, value: str) -> None:
        if "\n" not in value and "\r" not in value:
            self.column += len(value)
            return
        segments = NEWLINE_RE.split(value)
        self.line += len(segments) - 1
        self.column = len(segments[-1])

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        if node not in self.computed:  # a syntactic position is kept
            self.computed[node] = (start, (self.line, self.column))

    # libcst types the base method by @contextmanager's own class; any context manager does.
    def record_syntactic_position(  # type: ignore[override]
        self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None, end_node: Optional[cst.CSTNode] = None
    ) -> "_SyntacticRange":
        return _SyntacticRange(self, node, start_node, end_node)

    def ranges(self, nodes: Iterable[cst.CSTNode]) -> Dict[cst.CSTNode, CodeRange]:
        found = {}
        for node in nodes:
            where = self.computed.get(node)
            if where is not None:
                found[node] = CodeRange(CodePosition(*where[0]), CodePosition(*where[1]))
        return found


def _lines(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> int:
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    for node in nodes:
        node._codegen(state)
    return len(NEWLINE_RE.findall("".join(state.tokens)))


def _take_contained(root: cst.CSTNode, remaining: Set[int], taken: Optional[List[int]] = None) -> bool:
    """Removes from ``remaining`` the ids of the nodes under ``root`` (itself
    included, through code-bearing fields), adding them to ``taken``; True if
    it removed any."""
    found = False
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in remaining:
            remaining.discard(id(node))
            if taken is not None:
                taken.append(id(node))
            found = True
            if not remaining:
                break
        pending.extend(child_nodes(node))
    return found


class _SyntacticRange:
    """``with state.record_syntactic_position(node, ...)``: the node's range
    without its surrounding whitespace, or hoisted from the given children."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(
        self,
        state: _PlacingState,
        node: cst.CSTNode,
        start_node: Optional[cst.CSTNode],
        end_node: Optional[cst.CSTNode],
    ) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc_info: Any) -> None:
        state = self.state
        start, end = self.start, (state.line, state.column)
        if self.start_node is not None:
            start = state.computed[self.start_node][0]
        if self.end_node is not None:
            end = state.computed[self.end_node][1]
        state.computed[self.node] = (start, end)
