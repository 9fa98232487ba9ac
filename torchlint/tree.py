"""The code-bearing children of a libcst node: the one way the engine
descends a tree (the walk, local subtree questions, positions)."""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterator, List, Tuple

import libcst as cst

# Fields that hold only whitespace, punctuation, or tokens the rules read
# directly from their parent (``BinaryOperation.operator``).
_SKIPPED_FIELDS = frozenset(
    {
        "lpar",
        "rpar",
        "comma",
        "colon",
        "semicolon",
        "header",
        "footer",
        "leading_lines",
        "lines_after_decorators",
        "trailing_whitespace",
        "newline",
        "equal",
        "star",
        "operator",
        "dot",
        "lbrace",
        "rbrace",
        "lbracket",
        "rbracket",
        "first_colon",
        "second_colon",
        "empty_lines",
        "indent",
        "default_indent",
        "default_newline",
        "encoding",
        "has_trailing_newline",
        "asynchronous",
        "posonly_ind",
        "comment",
        "separator",
        "relative",
        "conversion",
        "whitespace",
        "await_",
        "trailing_comma",
    }
)
# Source order where dataclass field order differs from it.
_FIELD_ORDER: Dict[type, Tuple[str, ...]] = {
    cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
}
_CHILD_FIELDS: Dict[type, Tuple[str, ...]] = {}


def _child_fields(node_type: type) -> Tuple[str, ...]:
    fields = _CHILD_FIELDS.get(node_type)
    if fields is None:
        fields = _FIELD_ORDER.get(node_type) or tuple(
            f.name
            for f in dataclasses.fields(node_type)
            if f.name not in _SKIPPED_FIELDS and not f.name.startswith("whitespace")
        )
        _CHILD_FIELDS[node_type] = fields
    return fields


_IS_NODE: Dict[type, bool] = {}


def _is_node_type(value_type: type) -> bool:
    # CSTNode is an ABC, and isinstance() against an ABC is slow; the set of
    # types met in a tree is small, so cache the answer per type.
    answer = _IS_NODE.get(value_type)
    if answer is None:
        answer = _IS_NODE[value_type] = issubclass(value_type, cst.CSTNode)
    return answer


def child_nodes(node: cst.CSTNode) -> List[cst.CSTNode]:
    """The code-bearing children of ``node``, in source order; much cheaper
    than libcst's ``node.children``, which rebuilds the node to find them."""
    result: List[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        value_type = type(value)
        if value_type is tuple or value_type is list:
            result.extend(item for item in value if _is_node_type(type(item)))
        elif _is_node_type(value_type):
            result.append(value)
    return result


def iter_subtree(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Every code-bearing node under ``node`` (whitespace and punctuation
    skipped), pre-order; for small local questions only, never a whole file."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(child_nodes(current)))
