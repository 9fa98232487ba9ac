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


def positions_of(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> Mapping[cst.CSTNode, CodeRange]:
    """The ranges ``PositionProvider`` gives, for ``nodes``."""
    nodes = list(nodes)
    remaining: Set[int] = {id(node) for node in nodes}
    holders: List[int] = []  # indexes in module.body of the statements holding them
    for index, statement in enumerate(module.body):
        if not remaining:
            break
        if _take_contained(statement, remaining):
            holders.append(index)
    if remaining:
        state = _PlacingState(module)
        module._codegen(state)
        return state.ranges(nodes)
    line = 1 + _lines(module, module.header)
    wanted = set(holders)
    ranges: Dict[cst.CSTNode, CodeRange] = {}
    for index in range(holders[-1] + 1 if holders else 0):
        statement = module.body[index]
        if index in wanted:
            state = _PlacingState(module, line)
            statement._codegen(state)
            ranges.update(state.ranges(nodes))
            line = state.line
        else:
            line += _lines(module, (statement,))
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


def _take_contained(root: cst.CSTNode, remaining: Set[int]) -> bool:
    """Removes from ``remaining`` the ids of the nodes under ``root`` (itself
    included, through code-bearing fields); True if it removed any."""
    found = False
    pending = [root]
    while pending:
        node = pending.pop()
        if id(node) in remaining:
            remaining.discard(id(node))
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
