"""One walk over a libcst tree for all enabled rules.

libcst's own visitor machinery costs about as much as parsing (it rebuilds
children and dispatches by name for every node, whitespace included). This
walker descends only through the fields that can hold code, calls the
engine's bookkeeping hooks, and dispatches each node to the rules that have
a ``visit_<Type>``/``leave_<Type>`` method for its type.
"""

from __future__ import annotations

from types import MethodType
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Tuple

import libcst as cst

from torchlint.collector import Collector
from torchlint.tree import _IS_NODE, _child_fields, _is_node_type

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.model import FileModel

# node type -> the rules' bound visit_/leave_ methods for it
Dispatch = Dict[type, List[MethodType]]


def build_dispatch(rules: Sequence[object]) -> Tuple[Dispatch, Dispatch]:
    """Map node types to the bound ``visit_``/``leave_`` methods of ``rules``."""
    visits: Dispatch = {}
    leaves: Dispatch = {}
    for rule in rules:
        for is_visit, node_type, attr in _node_methods(type(rule)):
            (visits if is_visit else leaves).setdefault(node_type, []).append(getattr(rule, attr))
    return visits, leaves


_NODE_METHODS: Dict[type, List[Tuple[bool, type, str]]] = {}


def _node_methods(rule_type: type) -> List[Tuple[bool, type, str]]:
    """(is a ``visit_``, node type, attribute) for each node method of a rule
    class: read once per class, not per file (``dir()`` is slow)."""
    methods = _NODE_METHODS.get(rule_type)
    if methods is None:
        methods = _NODE_METHODS[rule_type] = []
        for attr in dir(rule_type):
            for prefix in ("visit_", "leave_"):
                if attr.startswith(prefix):
                    node_type = getattr(cst, attr[len(prefix) :], None)
                    if isinstance(node_type, type) and issubclass(node_type, cst.CSTNode):
                        methods.append((prefix == "visit_", node_type, attr))
    return methods


class Walker:
    """Walks one tree. A rule method that raises is reported to ``on_error``
    and that rule is switched off for the rest of the file; the walk goes on."""

    def __init__(
        self,
        collector: Collector,
        visits: Dispatch,
        leaves: Dispatch,
        on_error: Callable[[Callable, BaseException], None],
    ) -> None:
        self.collector = collector
        self.ctx: "FileModel" = collector.model  # the walk's position is kept on the model
        self.visits = visits
        self.leaves = leaves
        self.on_error = on_error
        # Node types the walk steps over without entering: leaves (a name, a
        # number, a string; a third of a tree) that no engine hook and no
        # rule method of this walk looks at. Nothing could see them on the stack.
        self._inert: Dict[type, bool] = {}
        self._plans: Dict[type, tuple] = {}

    def _is_inert(self, node_type: type) -> bool:
        inert = self._inert[node_type] = (
            node_type in _LEAF_TYPES
            and node_type not in self.visits
            and node_type not in self.leaves
            and node_type not in _ENGINE_HOOKS
            and node_type not in _ENGINE_LEAVE_HOOKS
        )
        if not inert:
            _is_node_type(node_type)  # _children reads that answer from _IS_NODE
        return inert

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
        plan = self._plans.get(node_type)
        if plan is None:
            plan = self._plan(node_type)
        hook, has_visits, special, fields, has_leaves, leave_hook = plan
        ctx.stack.append(node)
        if hook is not None:
            hook(self.collector, node)
        if has_visits:
            self._dispatch(self.visits, node_type, node)
        if special is not None:
            special(self, node)
        else:
            self._children(node, fields)
        if has_leaves:
            self._dispatch(self.leaves, node_type, node)
        if leave_hook is not None:
            leave_hook(self.collector, node)
        ctx.stack.pop()

    def _plan(self, node_type: type) -> tuple:
        """What visiting a node of this type involves, looked up once per walk
        and type rather than in five tables per node."""
        plan = self._plans[node_type] = (
            _ENGINE_HOOKS.get(node_type),
            node_type in self.visits,
            _SPECIAL.get(node_type),
            _child_fields(node_type),
            node_type in self.leaves,
            _ENGINE_LEAVE_HOOKS.get(node_type),
        )
        return plan

    def _children(self, node: cst.CSTNode, fields: Sequence[str]) -> None:
        visit = self._visit
        is_node = _IS_NODE
        inert = self._inert
        for name in fields:
            value = getattr(node, name)
            value_type = type(value)
            if value_type is tuple or value_type is list:
                for item in value:
                    item_type = type(item)
                    skip = inert.get(item_type)
                    if skip is None:
                        skip = self._is_inert(item_type)
                    if not skip and is_node.get(item_type):
                        visit(item)
            else:
                skip = inert.get(value_type)
                if skip is None:
                    skip = self._is_inert(value_type)
                if not skip and is_node.get(value_type):
                    visit(value)

    # -- nodes that open a scope the engine tracks ------------------------------
    def _function(self, node: cst.FunctionDef) -> None:
        ctx = self.ctx
        self._children(node, ("decorators", "params", "returns"))
        info = self.collector.enter_function(node)
        saved = ctx.function, ctx.loop, ctx.values
        ctx.function, ctx.loop, ctx.values = info, None, {}
        self._visit(node.body)
        ctx.function, ctx.loop, ctx.values = saved
        self.collector.leave_function(info)

    def _class(self, node: cst.ClassDef) -> None:
        ctx = self.ctx
        self._children(node, ("decorators", "bases", "keywords"))
        self.collector.enter_class(node)
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
        info = self.collector.enter_loop(node)
        saved = ctx.loop
        ctx.loop = info
        self._visit(node.body)  # type: ignore[attr-defined]
        ctx.loop = saved
        if node.orelse is not None:  # type: ignore[attr-defined]
            self._visit(node.orelse)  # type: ignore[attr-defined]


# Nodes without code-bearing children.
_LEAF_TYPES = frozenset(
    {cst.Name, cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.Ellipsis, cst.Pass, cst.Break, cst.Continue}
)

# Each handler takes its key's node type, which one Callable type cannot say per entry: the node is Any.
_SPECIAL: Dict[type, Callable[[Walker, Any], None]] = {
    cst.FunctionDef: Walker._function,
    cst.ClassDef: Walker._class,
    cst.For: Walker._loop,
    cst.While: Walker._loop,
}
_ENGINE_HOOKS: Dict[type, Callable[[Collector, Any], None]] = {
    cst.Import: Collector.enter_import,
    cst.ImportFrom: Collector.enter_import,
    cst.Call: Collector.enter_call,
    cst.Assign: Collector.enter_assign,
    cst.AugAssign: Collector.enter_augassign,
    cst.AnnAssign: Collector.enter_annassign,
    cst.With: Collector.enter_with,
    cst.If: Collector.enter_if,
    cst.Assert: Collector.enter_assert,
    cst.ListComp: Collector.enter_comprehension,
    cst.SetComp: Collector.enter_comprehension,
    cst.DictComp: Collector.enter_comprehension,
    cst.GeneratorExp: Collector.enter_comprehension,
    cst.Lambda: Collector.enter_lambda,
}
# After the rules' ``leave_`` methods, so they see the bindings of before the node.
_ENGINE_LEAVE_HOOKS: Dict[type, Callable[[Collector, Any], None]] = {
    cst.Assign: Collector.leave_assign,
    cst.Lambda: Collector.leave_lambda,
}
