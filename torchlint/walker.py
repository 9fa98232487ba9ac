"""One walk over a libcst tree for all enabled rules.

libcst's own visitor machinery costs about as much as parsing (it rebuilds
children and dispatches by name for every node, whitespace included). This
walker descends only through the fields that can hold code, calls the
engine's bookkeeping hooks, and dispatches each node to the rules that have
a ``visit_<Type>``/``leave_<Type>`` method for its type.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple

import libcst as cst

from torchlint.context import FileContext

# Fields that hold only whitespace, punctuation, or tokens the rules read
# directly from their parent (``BinaryOperation.operator``).
_SKIPPED_FIELDS = frozenset(
    {
        "lpar", "rpar", "comma", "colon", "semicolon", "header", "footer", "leading_lines",
        "lines_after_decorators", "trailing_whitespace", "newline", "equal", "star", "operator",
        "dot", "lbrace", "rbrace", "lbracket", "rbracket", "first_colon", "second_colon",
        "empty_lines", "indent", "default_indent", "default_newline", "encoding",
        "has_trailing_newline", "asynchronous", "posonly_ind", "comment", "separator",
        "relative", "conversion", "whitespace", "await_", "trailing_comma",
    }
)
# Source order where dataclass field order differs from it.
_FIELD_ORDER = {
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


Dispatch = Dict[type, List[Callable[[cst.CSTNode], None]]]


def build_dispatch(rules: Sequence[object]) -> Tuple[Dispatch, Dispatch]:
    """Map node types to the bound ``visit_``/``leave_`` methods of ``rules``."""
    visits: Dispatch = {}
    leaves: Dispatch = {}
    for rule in rules:
        for attr in dir(type(rule)):
            for prefix, table in (("visit_", visits), ("leave_", leaves)):
                if attr.startswith(prefix):
                    node_type = getattr(cst, attr[len(prefix):], None)
                    if isinstance(node_type, type) and issubclass(node_type, cst.CSTNode):
                        table.setdefault(node_type, []).append(getattr(rule, attr))
    return visits, leaves


class Walker:
    """Walks one tree. A rule method that raises is reported to ``on_error``
    and that rule is switched off for the rest of the file; the walk goes on."""

    def __init__(self, ctx: FileContext, visits: Dispatch, leaves: Dispatch, on_error: Callable[[Callable, BaseException], None]) -> None:
        self.ctx = ctx
        self.visits = visits
        self.leaves = leaves
        self.on_error = on_error

    def _dispatch(self, table: Dispatch, node_type: type, node: cst.CSTNode) -> None:
        methods = table.get(node_type)
        if not methods:
            return
        for method in tuple(methods):
            try:
                method(node)
            except Exception as exc:
                self.on_error(method, exc)
                self._disable(method.__self__)

    def _disable(self, rule: object) -> None:
        for table in (self.visits, self.leaves):
            for node_type, methods in table.items():
                table[node_type] = [m for m in methods if m.__self__ is not rule]

    def walk(self, node: cst.CSTNode) -> None:
        self._visit(node)

    def _visit(self, node: cst.CSTNode) -> None:
        ctx = self.ctx
        node_type = type(node)
        ctx.stack.append(node)
        hook = _ENGINE_HOOKS.get(node_type)
        if hook is not None:
            hook(ctx, node)
        if node_type in self.visits:
            self._dispatch(self.visits, node_type, node)
        special = _SPECIAL.get(node_type)
        if special is not None:
            special(self, node)
        else:
            self._children(node, _child_fields(node_type))
        if node_type in self.leaves:
            self._dispatch(self.leaves, node_type, node)
        leave_hook = _ENGINE_LEAVE_HOOKS.get(node_type)
        if leave_hook is not None:
            leave_hook(ctx, node)
        ctx.stack.pop()

    def _children(self, node: cst.CSTNode, fields: Sequence[str]) -> None:
        visit = self._visit
        is_node = _IS_NODE
        for name in fields:
            value = getattr(node, name)
            value_type = type(value)
            if value_type is tuple or value_type is list:
                for item in value:
                    item_type = type(item)
                    if is_node.get(item_type) or (item_type not in is_node and _is_node_type(item_type)):
                        visit(item)
            elif is_node.get(value_type) or (value_type not in is_node and _is_node_type(value_type)):
                visit(value)

    # -- nodes that open a scope the engine tracks ------------------------------
    def _function(self, node: cst.FunctionDef) -> None:
        ctx = self.ctx
        self._children(node, ("decorators", "params", "returns"))
        info = ctx.enter_function(node)
        saved = ctx.function, ctx.loop, ctx.values
        ctx.function, ctx.loop, ctx.values = info, None, {}
        self._visit(node.body)
        ctx.function, ctx.loop, ctx.values = saved
        ctx.leave_function(info)

    def _class(self, node: cst.ClassDef) -> None:
        ctx = self.ctx
        self._children(node, ("decorators", "bases", "keywords"))
        ctx.class_names.append(node.name.value)
        saved = ctx.function, ctx.loop
        ctx.function, ctx.loop = None, None
        self._visit(node.body)
        ctx.function, ctx.loop = saved
        ctx.class_names.pop()

    def _loop(self, node: cst.CSTNode) -> None:
        ctx = self.ctx
        if isinstance(node, cst.For):
            self._children(node, ("target", "iter"))
        else:
            self._visit(node.test)  # type: ignore[attr-defined]
        info = ctx.enter_loop(node)
        saved = ctx.loop
        ctx.loop = info
        self._visit(node.body)  # type: ignore[attr-defined]
        ctx.loop = saved
        if node.orelse is not None:  # type: ignore[attr-defined]
            self._visit(node.orelse)  # type: ignore[attr-defined]


_SPECIAL: Dict[type, Callable[[Walker, cst.CSTNode], None]] = {
    cst.FunctionDef: Walker._function,
    cst.ClassDef: Walker._class,
    cst.For: Walker._loop,
    cst.While: Walker._loop,
}
_ENGINE_HOOKS: Dict[type, Callable[[FileContext, cst.CSTNode], None]] = {
    cst.Import: FileContext.enter_import,
    cst.ImportFrom: FileContext.enter_import,
    cst.Call: FileContext.enter_call,
    cst.Assign: FileContext.enter_assign,
    cst.AugAssign: FileContext.enter_augassign,
    cst.AnnAssign: FileContext.enter_annassign,
    cst.With: FileContext.enter_with,
    cst.If: FileContext.enter_if,
    cst.Assert: FileContext.enter_assert,
    cst.ListComp: FileContext.enter_comprehension,
    cst.SetComp: FileContext.enter_comprehension,
    cst.DictComp: FileContext.enter_comprehension,
    cst.GeneratorExp: FileContext.enter_comprehension,
    cst.Lambda: FileContext.enter_lambda,
}
# After the rules' ``leave_`` methods, so they see the bindings of before the node.
_ENGINE_LEAVE_HOOKS: Dict[type, Callable[[FileContext, cst.CSTNode], None]] = {
    cst.Assign: FileContext.leave_assign,
    cst.Lambda: FileContext.leave_lambda,
}
