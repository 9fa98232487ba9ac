"""Batch provenance: which names hold data that came out of a loader.

One record for every rule (TL201, TL202, TL206 ask it): per function scope,
each name bound by iterating a data source (``for x, y in loader``), by
``next(it)`` on one, by a comprehension over a batch
(``{k: v for k, v in batch.items()}``), or derived from such a name through
views (``x.detach()``, ``x["image"]``, ``x.view(...)``), maps to an
``Origin``: where the batches came from and in which function, so the
loader can be resolved later, across calls (``FileFacts.loader_for``).

Bindings are made by the engine during the walk: loop targets before the
body, comprehension targets before the element, assignments after their
value (so ``x = x.to(device)`` still sees the batch ``x`` in its value).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional

import libcst as cst

from torchlint.names import dotted_name, last_name
from torchlint.vocabulary import KEEPS_ITEMS

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.facts import FunctionInfo
    from torchlint.model import FileModel

# Methods that hand back the same batch data, a view of it, or a cast of it
# (a view of pinned memory is pinned; a cast is a new tensor on the host, but
# its copy to the device is still a copy of batch data).
VIEW_METHODS = frozenset(
    {
        "view",
        "squeeze",
        "unsqueeze",
        "permute",
        "transpose",
        "narrow",
        "select",
        "expand",
        "t",
        "detach",
        "unflatten",
        "contiguous",
        "get",
    }
)
CAST_METHODS = frozenset({"float", "half", "long", "int", "double", "bfloat16", "bool"})
# Calls that hand back a loader whose batches the framework already moves to the device.
FRAMEWORK_PLACES = frozenset({"prepare", "prepare_data_loader", "setup_dataloaders", "DeviceDataLoader"})


@dataclass(frozen=True)
class Origin:
    """Where batch data came from: ``kind`` is "loop" (``for batch in SRC``),
    "next" (``batch = next(SRC)``) or "pinned" (a ``.pin_memory()`` result).
    ``function`` is the scope in which ``source`` is to be resolved;
    ``whole`` is True when the name is the loop's whole item (``batch``,
    which may be a dict or a ``BatchEncoding``), False for a part of it
    (``x`` in ``for x, y in loader``, ``batch["x"]``)."""

    kind: str
    source: Optional[cst.BaseExpression] = None
    loop_node: Optional[cst.CSTNode] = None
    function: Optional["FunctionInfo"] = None
    whole: bool = False
    cast: bool = False  # through ``.float()``/``.half()``…: a new host tensor, not the loader's memory


PINNED = Origin("pinned")


class BatchFlow:
    def __init__(self, ctx: "FileModel") -> None:
        self.ctx = ctx
        self.scopes: List[Dict[str, Origin]] = [{}]
        self.placed_by_framework: set = set()
        self._mapped_lambdas: set = set()

    # -- engine hooks ------------------------------------------------------------
    def enter_scope(self) -> None:
        self.scopes.append({})

    def leave_scope(self) -> None:
        self.scopes.pop()

    def bind_loop(self, node: cst.For) -> None:
        origin = self._iteration_origin(node.iter, node)
        if origin is not None:
            enumerated = isinstance(node.iter, cst.Call) and last_name(node.iter.func) == "enumerate"
            self._bind_target(node.target, origin, enumerated)

    def bind_comprehension(self, node: cst.CSTNode) -> None:
        clause = node.for_in  # type: ignore[attr-defined]
        while clause is not None:
            origin = self._items_origin(clause.iter)
            if origin is not None:
                self._bind_target(clause.target, origin)
            clause = clause.inner_for_in

    def enter_mapped_lambda(self, call: cst.Call, node: cst.Lambda) -> None:
        """``map(lambda t: t.cuda(), (text, images))``: inside the lambda, its one
        parameter is each element of the mapped batch parts."""
        if last_name(call.func) != "map" or len(call.args) != 2 or call.args[0].value is not node:
            return
        params = node.params.params
        if len(params) != 1:
            return
        mapped = call.args[1].value
        if isinstance(mapped, (cst.Tuple, cst.List)):
            origin = next((o for o in (self.origin_of(e.value) for e in mapped.elements) if o is not None), None)
        else:
            origin = self._items_origin(mapped)
        if origin is None:
            return
        scope = dict(self.scopes[-1])
        scope[params[0].name.value] = Origin(
            origin.kind, origin.source, origin.loop_node, origin.function, cast=origin.cast
        )
        self.scopes.append(scope)
        self._mapped_lambdas.add(id(node))

    def leave_mapped_lambda(self, node: cst.Lambda) -> None:
        if id(node) in self._mapped_lambdas:
            self._mapped_lambdas.discard(id(node))
            self.scopes.pop()

    def bind_assign(self, node: cst.Assign) -> None:
        value = node.value
        origin = self._assigned_origin(value)
        if isinstance(value, cst.Call) and last_name(value.func) in FRAMEWORK_PLACES:
            for target in node.targets:
                self.placed_by_framework.update(_placed_names(target.target))
        for target in node.targets:
            bound = origin
            if bound is not None and bound.whole and isinstance(target.target, (cst.Tuple, cst.List)):
                bound = Origin(bound.kind, bound.source, bound.loop_node, bound.function, whole=False)
            for name in target_names(target.target):
                if bound is not None:
                    self.scopes[-1][name] = bound
                else:
                    self.scopes[-1].pop(name, None)

    # -- queries -------------------------------------------------------------------
    def origin_of(self, expr: cst.BaseExpression) -> Optional[Origin]:
        """The batch origin of a Name/Attribute/Subscript chain, through views
        and casts; None when ``expr`` is not evidently batch data."""
        node = expr
        part = cast = False
        while True:
            if isinstance(node, cst.Subscript):
                part = True
                node = node.value
            elif isinstance(node, cst.Attribute):
                part = True
                node = node.value
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
                method = node.func.attr.value
                if method == "pin_memory" and not node.args:
                    return PINNED
                if method not in VIEW_METHODS and method not in CAST_METHODS:
                    return None
                if method == "get":
                    part = True
                cast = cast or method in CAST_METHODS
                node = node.func.value
            elif isinstance(node, cst.Name):
                origin = self.scopes[-1].get(node.value)
                if origin is not None and ((part and origin.whole) or (cast and not origin.cast)):
                    return Origin(
                        origin.kind,
                        origin.source,
                        origin.loop_node,
                        origin.function,
                        whole=origin.whole and not part,
                        cast=cast or origin.cast,
                    )
                return origin
            else:
                return None

    # -- helpers -------------------------------------------------------------------
    def _bind_target(self, target: cst.BaseExpression, origin: Origin, enumerated: bool = False) -> None:
        names = target_names(target)
        if isinstance(target, (cst.Tuple, cst.List)) and origin.whole:
            origin = Origin(origin.kind, origin.source, origin.loop_node, origin.function, whole=False)
            if enumerated and len(target.elements) == 2:
                # ``for step, batch in enumerate(loader)``: the index is not batch data
                item = target.elements[1].value
                names = target_names(item)
                origin = Origin(
                    origin.kind, origin.source, origin.loop_node, origin.function, whole=isinstance(item, cst.Name)
                )
        for name in names:
            self.scopes[-1][name] = origin

    def _iteration_origin(self, iterable: cst.BaseExpression, loop_node: cst.CSTNode) -> Optional[Origin]:
        inner = unwrap_pass_through(iterable)
        while isinstance(inner, cst.Call) and inner.args and self.ctx.facts.yields_first_argument(inner):
            inner = inner.args[0].value  # ``metric_logger.log_every(loader, 10)`` -> ``loader``
        if dotted_name(inner) in self.placed_by_framework:
            return None
        if self.ctx.facts.is_data_source(iterable):
            return Origin("loop", inner, loop_node, self.ctx.function, whole=True)
        return self._items_origin(inner)

    def _items_origin(self, iterable: cst.BaseExpression) -> Optional[Origin]:
        origin = self.origin_of(iterable)
        if origin is None and isinstance(iterable, cst.Call) and isinstance(iterable.func, cst.Attribute):
            if iterable.func.attr.value in ("items", "values"):
                origin = self.origin_of(iterable.func.value)
        if origin is not None and origin.whole:
            return Origin(origin.kind, origin.source, origin.loop_node, origin.function, whole=False)
        return origin

    def _assigned_origin(self, value: cst.BaseExpression) -> Optional[Origin]:
        if isinstance(value, cst.Call):
            func = value.func
            if isinstance(func, cst.Name) and func.value == "next" and value.args:
                source = value.args[0].value
                if self.ctx.facts.is_data_source(source):
                    return Origin("next", self._resolve_iter(source), None, self.ctx.function, whole=True)
                return None
            if isinstance(func, cst.Attribute) and func.attr.value == "pin_memory" and not value.args:
                return PINNED
        if isinstance(value, (cst.Tuple, cst.List)):
            for element in value.elements:
                origin = self.origin_of(element.value)
                if origin is not None:
                    return origin
            return None
        return self.origin_of(value)

    def _resolve_iter(self, source: cst.BaseExpression) -> cst.BaseExpression:
        """``data_iter`` assigned from ``iter(loader)`` -> ``loader``."""
        value = self.ctx.value_of(dotted_name(source))
        if isinstance(value, cst.Call) and last_name(value.func) == "iter" and value.args:
            return value.args[0].value
        return unwrap_pass_through(source)


def target_names(target: cst.BaseExpression) -> List[str]:
    """The plain names an assignment or loop target binds."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        names: List[str] = []
        for element in target.elements:
            names.extend(target_names(element.value))
        return names
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


def _placed_names(target: cst.BaseExpression) -> List[str]:
    """The dotted names a framework's ``prepare(...)`` result is stored in:
    plain names and attributes (``self.train_loader``)."""
    if isinstance(target, (cst.Tuple, cst.List)):
        return [name for element in target.elements for name in _placed_names(element.value)]
    if isinstance(target, cst.StarredElement):
        return _placed_names(target.value)
    name = dotted_name(target)
    return [name] if name is not None else []


def unwrap_pass_through(node: cst.BaseExpression) -> cst.BaseExpression:
    while isinstance(node, cst.Call) and last_name(node.func) in KEEPS_ITEMS and node.args:
        node = node.args[0].value
    return node
