"""Where the reported nodes sit in the source, without placing every node.

libcst's ``PositionProvider`` regenerates the whole module's code and
records a range for every node in it (through a context manager per
syntactic node), and ``MetadataWrapper.resolve`` adds a full visit of the
tree on top: on the corpus that cost twice the time of the rules that made
the reports. A finding needs the positions of a handful of nodes, so only
the top-level statements holding them are generated with positions; every
statement before them is generated plainly to count its lines (a module's
code is its statements' code back to back, starting after the header).
A node found in no top-level statement (the module itself, a comment in the
header) falls back to positions for the whole module.
"""
from __future__ import annotations

from typing import Iterable, List, Mapping, Set

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodeRange
from libcst.metadata.position_provider import NEWLINE_RE, PositionProvider, PositionProvidingCodegenState

from torchlint.walker import child_nodes


def positions_of(module: cst.Module, nodes: Iterable[cst.CSTNode]) -> Mapping[cst.CSTNode, CodeRange]:
    """The ranges ``PositionProvider`` gives, for at least ``nodes``."""
    remaining: Set[int] = {id(node) for node in nodes}
    holders: List[int] = []  # indexes in module.body of the statements holding them
    for index, statement in enumerate(module.body):
        if not remaining:
            break
        if _take_contained(statement, remaining):
            holders.append(index)
    provider = PositionProvider()
    if remaining:
        state = PositionProvidingCodegenState(default_indent=module.default_indent, default_newline=module.default_newline, provider=provider)
        module._codegen(state)
        return provider._computed
    line = 1 + _lines(module, module.header)
    wanted = set(holders)
    for index in range(holders[-1] + 1 if holders else 0):
        statement = module.body[index]
        if index in wanted:
            state = PositionProvidingCodegenState(
                default_indent=module.default_indent, default_newline=module.default_newline, provider=provider, line=line
            )
            statement._codegen(state)
            line = state.line
        else:
            line += _lines(module, (statement,))
    return provider._computed


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

