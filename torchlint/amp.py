"""Recognising automatic mixed precision: GradScalers, their calls, autocast regions.

Shared by the TL4xx rules (and TL401). Every helper resolves names through the
module's imports (``import torch as T``, ``from torch.cuda.amp import
GradScaler as GS``) and, for local names, through ``ctx.value_of`` — so ask at
visit time, when the walk has seen the assignments before the node.

- ``is_grad_scaler_call(ctx, call)`` / ``is_autocast_call(ctx, call)``: a
  constructor call of ``torch.amp.GradScaler``, ``torch.cuda.amp.GradScaler``,
  ``torch.GradScaler`` … / ``torch.autocast``, ``torch.amp.autocast``,
  ``torch.cuda.amp.autocast`` ….
- ``scaler_call(ctx, call)``: ``scaler.scale(loss)`` / ``scaler.step(opt)`` /
  ``scaler.unscale_(opt)`` / ``scaler.update()`` as a ``ScalerCall``.
- ``scaled_backward(ctx, call)``: for ``X.backward()``, the scaler's dotted name
  when X is ``scaler.scale(loss)`` (or a name holding it).
- ``tensor_backward(ctx, call)``: is this ``loss.backward()`` on a tensor (not
  ``accelerator.backward(loss)``)?
- ``enclosing_autocast(ctx, site)``: the innermost enabled autocast region
  (``with`` item or function decorator) around a node, in its function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import libcst as cst

from torchlint.facts import keyword_value, literal_bool, positional
from torchlint.names import dotted_name, last_name
from torchlint.vocabulary import SCALER_NAME

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.analysis import Site
    from torchlint.model import FileModel

GRAD_SCALER_CLASSES = frozenset(
    {
        "torch.GradScaler",
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.cuda.amp.grad_scaler.GradScaler",
        "torch.cpu.amp.GradScaler",
        "torch.cpu.amp.grad_scaler.GradScaler",
    }
)
AUTOCAST_CLASSES = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.autocast_mode.autocast",
        "torch.cuda.amp.autocast",
        "torch.cuda.amp.autocast_mode.autocast",
        "torch.cpu.amp.autocast",
        "torch.cpu.amp.autocast_mode.autocast",
    }
)
# Device-specific constructors: their positional parameters differ from the
# generic ones (no device argument first).
_DEVICE_SPECIFIC_AUTOCAST = frozenset(
    {
        "torch.cuda.amp.autocast",
        "torch.cuda.amp.autocast_mode.autocast",
        "torch.cpu.amp.autocast",
        "torch.cpu.amp.autocast_mode.autocast",
    }
)
SCALER_METHODS = frozenset({"scale", "step", "unscale_", "update", "get_scale"})
# Objects whose ``.backward(loss)`` is a framework's, not a tensor's.
_FRAMEWORK_BACKWARD = re.compile(r"(?i)(accelerator|fabric|engine|trainer|strategy|precision|deepspeed|amp|self)$")


@dataclass(frozen=True)
class ScalerCall:
    """``<scaler>.<method>(<argument>)`` on a GradScaler."""

    scaler: str  # dotted name of the receiver, e.g. "scaler" or "self.scaler"
    method: str  # scale / step / unscale_ / update / get_scale
    argument: Optional[cst.BaseExpression]  # the loss or the optimizer, if any


def _qualified(ctx: "FileModel", func: cst.BaseExpression) -> Optional[str]:
    return ctx.names.qualified_name(func)


def is_grad_scaler_call(ctx: "FileModel", node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and _qualified(ctx, node.func) in GRAD_SCALER_CLASSES


def is_autocast_call(ctx: "FileModel", node: cst.CSTNode) -> bool:
    return isinstance(node, cst.Call) and _qualified(ctx, node.func) in AUTOCAST_CLASSES


def enabled(ctx: "FileModel", call: cst.Call) -> Optional[bool]:
    """The literal ``enabled=`` of a GradScaler or autocast call: True when
    absent (the default), False for ``enabled=False``, None when computed."""
    value = keyword_value(call, "enabled")
    if value is None:
        qname = _qualified(ctx, call.func)
        if qname in GRAD_SCALER_CLASSES:
            # GradScaler(device, init_scale, growth_factor, backoff_factor, growth_interval, enabled)
            value = positional(call, 5 if not qname.startswith(("torch.cuda.", "torch.cpu.")) else 4)
        elif qname in _DEVICE_SPECIFIC_AUTOCAST:
            value = positional(call, 0)  # autocast(enabled, dtype, cache_enabled)
        else:
            value = positional(call, 2)  # autocast(device_type, dtype, enabled, cache_enabled)
        if value is None:
            return None if any(a.star for a in call.args) else True
    return literal_bool(value)


def autocast_device(ctx: "FileModel", call: cst.Call) -> Optional[str]:
    """\"cuda" / "cpu" / … for an autocast call, None when not a literal."""
    qname = _qualified(ctx, call.func) or ""
    if qname.startswith("torch.cuda."):
        return "cuda"
    if qname.startswith("torch.cpu."):
        return "cpu"
    value = keyword_value(call, "device_type") or positional(call, 0)
    if isinstance(value, cst.SimpleString):
        return str(value.evaluated_value).split(":")[0]
    return None


def autocast_dtype(ctx: "FileModel", call: cst.Call) -> Optional[str]:
    """The dtype an autocast region computes in, as a torch attribute name
    ("bfloat16", "float16", "half"…), when it is written as a literal (or a
    local name bound to one); None when it cannot be seen. Without ``dtype=``
    CUDA autocast defaults to float16 and CPU autocast to bfloat16."""
    value = keyword_value(call, "dtype")
    if value is None:
        value = positional(call, 1)
    if value is None:
        if any(a.star for a in call.args):
            return None
        device = autocast_device(ctx, call)
        return {"cuda": "float16", "cpu": "bfloat16"}.get(device or "")
    return dtype_name(ctx, value)


def dtype_name(ctx: "FileModel", value: cst.BaseExpression, _depth: int = 0) -> Optional[str]:
    """``torch.bfloat16`` -> "bfloat16" (through imports and local names)."""
    qname = ctx.names.qualified_name(value)
    if qname is not None and qname.startswith("torch.") and qname.count(".") == 1:
        return qname.split(".", 1)[1]
    if isinstance(value, cst.Name) and _depth < 3:
        bound = ctx.value_of(value.value)
        if bound is not None and bound is not value:
            return dtype_name(ctx, bound, _depth + 1)
    return None


def is_scaler(ctx: "FileModel", expr: cst.BaseExpression) -> bool:
    """Is ``expr`` a GradScaler: a local name bound to a GradScaler(...) call,
    or a name spelled like one (``scaler``, ``self.grad_scaler``)."""
    name = dotted_name(expr)
    if name is None:
        return False
    bound = ctx.value_of(name)
    if bound is not None and is_grad_scaler_call(ctx, bound):
        return True
    last = last_name(expr)
    return bool(last and SCALER_NAME.search(last))


def scaler_call(ctx: "FileModel", call: cst.Call) -> Optional[ScalerCall]:
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in SCALER_METHODS):
        return None
    if not is_scaler(ctx, func.value):
        return None
    argument = call.args[0].value if call.args and not call.args[0].star else None
    return ScalerCall(dotted_name(func.value) or "", func.attr.value, argument)


def scaled_backward(ctx: "FileModel", call: cst.Call) -> Optional[str]:
    """For ``X.backward()``: the scaler's name when X is ``scaler.scale(loss)``
    or a local name bound to it; None otherwise."""
    if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"):
        return None
    receiver = call.func.value
    if isinstance(receiver, cst.Name):
        bound = ctx.value_of(receiver.value)
        if isinstance(bound, cst.Call):
            receiver = bound
    if isinstance(receiver, cst.Call):
        found = scaler_call(ctx, receiver)
        if found is not None and found.method == "scale":
            return found.scaler
    return None


def tensor_backward(ctx: "FileModel", call: cst.Call) -> bool:
    """``loss.backward()`` / ``loss.backward(retain_graph=True)`` on a tensor,
    not a framework's ``accelerator.backward(loss)``."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value == "backward"):
        return False
    receiver = func.value
    name = last_name(receiver) if isinstance(receiver, (cst.Name, cst.Attribute)) else None
    if name is not None and _FRAMEWORK_BACKWARD.search(name) and any(a.keyword is None for a in call.args):
        return False  # accelerator.backward(loss), self.backward(loss)
    if name is not None and _FRAMEWORK_BACKWARD.search(name) and dotted_name(receiver) == name and name != "loss":
        return False
    if ctx.names.qualified_name(receiver) is not None:
        return False  # torch.autograd.backward(...) and other module functions
    return True


def step_optimizer(found: ScalerCall) -> Optional[str]:
    """The optimizer of ``scaler.step(opt)`` as source-like dotted text."""
    if found.method != "step" or found.argument is None:
        return None
    return dotted_name(found.argument)


def autocast_of(ctx: "FileModel", expr: cst.BaseExpression) -> Optional[cst.Call]:
    """``expr`` as an autocast call: itself, or the local name bound to one."""
    if isinstance(expr, cst.Call):
        return expr if is_autocast_call(ctx, expr) else None
    if isinstance(expr, cst.Name):
        bound = ctx.value_of(expr.value)
        if isinstance(bound, cst.Call) and is_autocast_call(ctx, bound):
            return bound
    return None


def enclosing_autocast(ctx: "FileModel", site: "Site") -> Optional[cst.Call]:
    """The innermost autocast region around the site's node within its
    function: a ``with autocast(...)`` body or an ``@autocast(...)``-decorated
    function. None when there is none, or the innermost one is
    ``enabled=False`` (which switches autocast off inside an outer region)."""
    for ancestor, child in site.ancestors():
        if isinstance(ancestor, (cst.With,)) and child is ancestor.body:
            for item in ancestor.items:
                found = autocast_of(ctx, item.item)
                if found is not None:
                    return found if enabled(ctx, found) is not False else None
        if isinstance(ancestor, cst.FunctionDef):
            for decorator in ancestor.decorators:
                found = autocast_of(ctx, decorator.decorator)
                if found is not None:
                    return found if enabled(ctx, found) is not False else None
            return None
        if isinstance(ancestor, (cst.Lambda, cst.ClassDef)):
            return None
    return None
