"""Is this expression a (device) tensor? Evidence from the code, not types.

``tensor_evidence(ctx, expr)`` answers True (evidently a tensor), False
(evidently not one: a Python number, a numpy value, something already read
back to the host) or None (cannot tell). Rules flag only on True, so an
unknown value never produces a finding. It looks at assignments the walk has
already seen in the current scope, so ask it at visit time.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Optional, Set

import libcst as cst

from torchlint.names import dotted_name, last_name
from torchlint.vocabulary import DEVICE_VARIABLE, DTYPE_VARIABLE, UNKNOWN_PART

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.model import FileModel

# Methods that read a tensor back to the host.
HOST_READS = frozenset({"item", "tolist", "numpy", "cpu"})
# Tensor methods whose result is again a tensor on the same device.
_TENSOR_METHODS = frozenset(
    """
    sum mean max min amax amin argmax argmin norm std var prod abs sqrt exp log sigmoid softmax log_softmax
    detach clone float half double bfloat16 long int bool to cuda view reshape flatten squeeze unsqueeze
    permute transpose contiguous eq ne gt ge lt le any all isnan isinf isfinite logical_and logical_or
    logical_not masked_fill clamp pow mul add sub div matmul square topk sort cumsum nansum nanmean
    """.split()
)
# torch.* callables that return Python values, not tensors.
_TORCH_NON_TENSOR = re.compile(
    r"^torch\.(cuda|backends|distributed|utils|version|jit|onnx|hub|nn\.Module|get_|is_|set_|manual_seed|"
    r"compile|device|dtype|Size|no_grad|inference_mode|enable_grad|autocast|amp|optim|save|load|numel)"
)
# Callees whose result is a loss: a tensor on the model's device (a model's
# output is one too: ``names_a_module``).
_LOSS_CALLEE = re.compile(
    r"(?i)^(criterion|loss_fn|loss_func|lossfn|compute_loss|forward)$|(criterion|_loss|loss_fn|cross_entropy)$"
)
_NUMPY = ("numpy.", "np.")
# Predicates and getters named after a model return bools or modules, not tensors.
_PREDICATE_CALLEE = re.compile(r"^_*(is|has|should|can|use|get|load|build|create|make|init)_")


def tensor_evidence(ctx: "FileModel", expr: cst.BaseExpression, _seen: Optional[Set[str]] = None) -> Optional[bool]:
    seen = _seen if _seen is not None else set()
    if isinstance(
        expr, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)
    ):
        return False
    if isinstance(expr, (cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)):
        return False
    if isinstance(expr, cst.Call):
        return _call_evidence(ctx, expr, seen)
    if isinstance(expr, cst.BinaryOperation):
        return _any_tensor(ctx, (expr.left, expr.right), seen)
    if isinstance(expr, cst.UnaryOperation):
        return tensor_evidence(ctx, expr.expression, seen)
    if isinstance(expr, cst.Comparison):
        if any(isinstance(t.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for t in expr.comparisons):
            return False
        return _any_tensor(ctx, [expr.left] + [t.comparator for t in expr.comparisons], seen)
    if isinstance(expr, cst.Subscript):
        return tensor_evidence(ctx, expr.value, seen)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return _name_evidence(ctx, expr, seen)
    if isinstance(expr, cst.IfExp):
        return _ternary_evidence(ctx, expr, seen)
    return None


def _ternary_evidence(ctx: "FileModel", expr: cst.IfExp, seen) -> Optional[bool]:
    """``acc if mixup is None else None``: a tensor on one branch and ``None`` (or
    another tensor) on the other is a tensor where it matters, as for a name
    given ``None`` in an ``else`` (``Collector._none_on_other_branch``)."""
    branches = [tensor_evidence(ctx, b, seen) if not _is_none(b) else "none" for b in (expr.body, expr.orelse)]
    if True in branches and all(b in (True, "none") for b in branches):
        return True
    if all(b is False for b in branches):
        return False
    return None


def _is_none(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Name) and expr.value == "None"


def _any_tensor(ctx: "FileModel", parts, seen) -> Optional[bool]:
    answers = [tensor_evidence(ctx, part, seen) for part in parts]
    if any(a is True for a in answers):
        return True
    if all(a is False for a in answers):
        return False
    return None


def _call_evidence(ctx: "FileModel", call: cst.Call, seen) -> Optional[bool]:
    func = call.func
    qname = ctx.names.qualified_name(func)
    if qname is not None:
        if qname.startswith(_NUMPY) or qname.startswith(("math.", "time.", "random.", "builtins.")):
            return False
        if qname.startswith("torch."):
            return None if _TORCH_NON_TENSOR.match(qname) else True
    if isinstance(func, cst.Name):
        if func.value == "sum" and call.args:
            return _sum_evidence(ctx, call.args[0].value, seen)
        if func.value in ("float", "int", "bool", "len", "str", "round", "sum", "max", "min", "abs", "range", "repr"):
            return False
        if _PREDICATE_CALLEE.match(func.value):
            return False  # `_is_peft_model(m)`, `has_model(...)`: a bool, not a model output
        if names_a_module(func.value) or _LOSS_CALLEE.search(func.value):
            return True
        return None
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method in HOST_READS:
            return False
        if method in _TENSOR_METHODS:
            receiver = tensor_evidence(ctx, func.value, seen)
            return True if receiver is True else (False if receiver is False else None)
        if method == "forward" or (
            method not in ("get", "pop", "items") and _model_or_loss(method) and dotted_name(func.value) == "self"
        ):
            return True
        if isinstance(func.value, cst.Name) and func.value.value == "self" and _model_or_loss(method):
            return True
    return None


def _model_or_loss(name: str) -> bool:
    return names_a_module(name) or bool(_LOSS_CALLEE.search(name))


def _sum_evidence(ctx: "FileModel", items: cst.BaseExpression, seen) -> Optional[bool]:
    """Python's ``sum()`` of tensors is a tensor: ``sum(loss_dict.values())``,
    ``sum(l for l in losses)``, ``sum([a, b])``; of anything else, unknown."""
    if isinstance(items, cst.Call) and isinstance(items.func, cst.Attribute) and items.func.attr.value == "values":
        return True if tensor_evidence(ctx, items.func.value, seen) is True else None
    if isinstance(items, (cst.GeneratorExp, cst.ListComp)):
        return True if tensor_evidence(ctx, items.elt, seen) is True else None
    if isinstance(items, (cst.List, cst.Tuple)):
        return True if any(tensor_evidence(ctx, e.value, seen) is True for e in items.elements) else None
    return None


def _name_evidence(ctx: "FileModel", expr: cst.BaseExpression, seen) -> Optional[bool]:
    name = dotted_name(expr)
    if name is None:
        return None
    if name in seen:
        return None
    seen.add(name)
    value = ctx.value_of(name)
    if value is not None and value is not UNKNOWN_PART:
        found = tensor_evidence(ctx, value, seen)
        if found is not None:
            return found
    # ``loss.backward()`` in this scope: whatever computed it, ``loss`` is a tensor
    function = ctx.function
    if name in (function.backward_names if function is not None else ctx.facts.module_backward_names):
        return True
    # Never assigned in this scope (a parameter, a global, an attribute):
    # its name alone is no evidence (``if with_loss:`` is a bool).
    return None


def reads_host(call: cst.Call) -> Optional[str]:
    """The host-read method name if ``call`` is ``x.item()``/``.tolist()``/``.cpu()``/``.numpy()``."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value in HOST_READS and not call.args:
        return call.func.attr.value
    return None


# Factories that build a tensor on the host unless given ``device=``.
_HOST_FACTORIES = re.compile(
    r"^torch\.(zeros|ones|empty|full|tensor|as_tensor|arange|linspace|logspace|rand|randn|randint|randperm|eye|from_numpy|"
    r"stack|cat)$"
)


def lives_on_host(ctx: "FileModel", expr: cst.BaseExpression, _depth: int = 0) -> bool:
    """Is ``expr`` evidently a tensor in host memory, so that reading it
    (``.numpy()``, ``.item()``) waits for nothing? ``torch.from_numpy(...)``,
    a factory without ``device=``, a ``.cpu()`` result, a part of a loader's
    batch not yet moved, and tensor methods and names followed back to one.
    False when unknown."""
    if _depth > 6:
        return False
    if already_on_host(expr):
        return True
    if isinstance(expr, cst.Call):
        qname = ctx.names.qualified_name(expr.func)
        if qname is not None and _HOST_FACTORIES.match(qname):
            if qname in ("torch.stack", "torch.cat"):
                first = expr.args[0].value if expr.args else None
                return (
                    isinstance(first, (cst.List, cst.Tuple))
                    and bool(first.elements)
                    and all(lives_on_host(ctx, e.value, _depth + 1) for e in first.elements)
                )
            return not any(a.keyword is not None and a.keyword.value == "device" for a in expr.args)
        if isinstance(expr.func, cst.Attribute):
            method = expr.func.attr.value
            if method in ("to", "cuda"):
                return device_move(ctx, expr) == "cpu"
            if method in _TENSOR_METHODS:
                return lives_on_host(ctx, expr.func.value, _depth + 1)
        # In an inference client (a file that never names a device and never
        # trains), a model fed only host tensors runs on the host:
        # ``model(images).numpy()``.
        inputs = [a.value for a in expr.args if a.keyword is None and not a.star]
        return (
            bool(inputs)
            and qname is None
            and ctx.host_only
            and tensor_evidence(ctx, expr) is True
            and all(lives_on_host(ctx, value, _depth + 1) for value in inputs)
        )
    if isinstance(expr, cst.Subscript):
        return lives_on_host(ctx, expr.value, _depth + 1)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        origin = ctx.batches.origin_of(expr)
        if origin is not None and origin.kind != "pinned":
            return True  # batch data straight from the loader: host memory
        value = ctx.value_of(dotted_name(expr))
        if value is not None and value is not UNKNOWN_PART:
            return lives_on_host(ctx, value, _depth + 1)
    return False


def already_on_host(expr: cst.BaseExpression) -> bool:
    """Does the receiver chain already contain a host read (``x.cpu().numpy()``)?"""
    node = expr
    while True:
        if isinstance(node, cst.Call):
            if reads_host(node):
                return True
            node = node.func
        elif isinstance(node, cst.Attribute):
            node = node.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        else:
            return False


# -- device moves: ``x.to(device)``, ``x.cuda()``, ``x.to("cpu")`` ---------------


def device_kind(ctx: "FileModel", expr: cst.BaseExpression) -> Optional[str]:
    """Is ``expr`` evidently a device, and which: "cpu", "device" (an
    accelerator, or a device variable), or None when it is not evidently a
    device (a dtype, another tensor, something unknown)."""
    if isinstance(expr, cst.SimpleString):
        value = expr.evaluated_value
        if not isinstance(value, str):
            return None
        if value == "cpu" or value.startswith("cpu:"):
            return "cpu"
        if value.split(":", 1)[0] in ("cuda", "xpu", "mps", "hip", "npu", "xla", "meta"):
            return "device" if not value.startswith("meta") else None
        return None
    if isinstance(expr, cst.Integer):
        return "device"  # an int is a CUDA device index to ``.to`` and factories
    if isinstance(expr, cst.Call):
        qname = ctx.names.qualified_name(expr.func)
        if qname == "torch.device" and expr.args:
            return device_kind(ctx, expr.args[0].value)
        # ``dist_util.dev()``, ``get_device()``: a helper that hands back the device
        callee = last_name(expr.func)
        if not expr.args and callee in ("dev", "device", "get_device", "current_device", "default_device"):
            return "device"
        return None
    if isinstance(expr, cst.Attribute) and expr.attr.value == "device":
        return "device"  # ``other.device``: wherever another tensor lives
    name = last_name(expr) if isinstance(expr, (cst.Name, cst.Attribute)) else None
    if name and DEVICE_VARIABLE.search(name) and not DTYPE_VARIABLE.search(name):
        return "device"
    return None


def device_move(ctx: "FileModel", call: cst.Call) -> Optional[str]:
    """Classify a ``.to(...)``/``.cuda()``/``.cpu()`` call by where it moves the
    receiver: "device" (an accelerator or a device variable), "cpu", or None
    (not a device move: dtype-only casts, ``.to(other)``, unknown arguments).
    Says nothing about whether the receiver is a tensor or a module."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    method = func.attr.value
    if method == "cuda":
        return "device"
    if method == "type":
        return _tensor_type_move(ctx, call)
    if method == "type_as":
        # ``x.type_as(other)``: to ``other``'s device (and dtype), a GPU when ``other`` evidently is on one
        other = call.args[0].value if len(call.args) == 1 and call.args[0].keyword is None else None
        return "device" if other is not None and device_placement(ctx, other) is not None else None
    if method == "cpu":
        return "cpu" if not call.args else None
    if method != "to" or not call.args:
        return None
    device_arg = None
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "device":
            device_arg = arg.value
    first = call.args[0]
    if device_arg is None and first.keyword is None and not first.star:
        device_arg = first.value
    if device_arg is None:
        return None
    return device_kind(ctx, device_arg)


# Tensor methods whose result lives where their receiver does (views, casts, math).
_SAME_DEVICE_METHODS = (_TENSOR_METHODS - {"to", "cuda"}) | frozenset(
    "clone new_zeros new_ones new_empty new_full index_select gather expand repeat narrow select t".split()
)


def device_placement(
    ctx: "FileModel",
    expr: cst.BaseExpression,
    value_of: Optional[Callable[[str], Optional[cst.BaseExpression]]] = None,
    _depth: int = 0,
) -> Optional[cst.CSTNode]:
    """The call that evidently put ``expr`` on an accelerator: a
    ``.cuda()``/``.to(device)``/``.type(torch.cuda.FloatTensor)`` move, or a
    factory given an accelerator ``device=``, followed through the names
    assigned in this scope (``self.queue = torch.zeros(n).cuda()``), views,
    casts and math. Names are looked up with ``value_of`` (a ``Site``'s, to
    see the old value inside ``x = x[idx]``), by default the walk's current
    view. None when nothing shows it."""
    if _depth > 6:
        return None
    lookup = value_of if value_of is not None else ctx.value_of
    if isinstance(expr, cst.Subscript):
        return device_placement(ctx, expr.value, value_of, _depth + 1)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        name = dotted_name(expr)
        value = lookup(name) if name is not None else None
        if value is None or value is UNKNOWN_PART:
            return None
        return device_placement(ctx, value, value_of, _depth + 1)
    if not isinstance(expr, cst.Call):
        return None
    qname = ctx.names.qualified_name(expr.func)
    if qname is not None and qname.startswith("torch."):
        device = next((a.value for a in expr.args if a.keyword is not None and a.keyword.value == "device"), None)
        return expr if device is not None and device_kind(ctx, device) == "device" else None
    if not isinstance(expr.func, cst.Attribute):
        return None
    method = expr.func.attr.value
    if method in ("to", "cuda", "type"):
        return expr if device_move(ctx, expr) == "device" else None
    if method == "type_as" and expr.args:
        return device_placement(ctx, expr.args[0].value, value_of, _depth + 1)
    if method in _SAME_DEVICE_METHODS:
        return device_placement(ctx, expr.func.value, value_of, _depth + 1)
    return None


def _tensor_type_move(ctx: "FileModel", call: cst.Call) -> Optional[str]:
    """``x.type(torch.cuda.FloatTensor)`` (or its name as a string) copies ``x``
    to the GPU, like ``.cuda()``; ``.type(torch.FloatTensor)`` to the CPU."""
    first = call.args[0] if call.args else None
    if first is None or first.star or (first.keyword is not None and first.keyword.value != "dtype"):
        return None
    return tensor_type_device(ctx, first.value)


def tensor_type_device(ctx: "FileModel", expr: cst.BaseExpression) -> Optional[str]:
    """Where a legacy tensor type puts its tensors: "device" for
    ``torch.cuda.FloatTensor`` (or its name as a string), "cpu" for
    ``torch.FloatTensor``, None for anything else. A name bound to one
    (``Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor``, the
    old idiom for device-agnostic code) is followed; such a choice is the
    GPU's wherever CUDA is available, as ``"cuda" if available else "cpu"`` is."""
    for _ in range(3):
        if not isinstance(expr, cst.Name):
            break
        value = ctx.value_of(expr.value) or ctx.facts.module_constants.get(expr.value)
        if value is None or value is UNKNOWN_PART:
            break
        expr = value
    if isinstance(expr, cst.IfExp):
        kinds = {tensor_type_device(ctx, expr.body), tensor_type_device(ctx, expr.orelse)}
        return "device" if "device" in kinds and kinds <= {"device", "cpu"} else None
    if isinstance(expr, cst.SimpleString):
        name = expr.evaluated_value if isinstance(expr.evaluated_value, str) else None
    else:
        name = ctx.names.qualified_name(expr)
    if not name or not name.endswith("Tensor"):
        return None
    if name.startswith("torch.cuda."):
        return "device"
    return "cpu" if name.count(".") == 1 and name.startswith("torch.") else None


# -- "does this tensor require grad?" (TL302) -------------------------------------
# Results that carry no autograd history, whatever their input.
_NO_GRAD_RESULTS = frozenset(
    """
    detach item tolist numpy argmax argmin long int bool short byte eq ne gt ge lt le isnan isinf isfinite
    logical_and logical_or logical_not logical_xor size dim numel nonzero sign count_nonzero
    """.split()
)
_TORCH_FACTORY = re.compile(
    r"^torch\.(zeros|ones|empty|full|tensor|as_tensor|arange|linspace|logspace|rand|randn|randint|randperm|eye|"
    r"zeros_like|ones_like|empty_like|full_like|rand_like|randn_like|randint_like|from_numpy)$"
)


def requires_grad_evidence(
    ctx: "FileModel", expr: cst.BaseExpression, _seen: Optional[Set[str]] = None
) -> Optional[bool]:
    """Does ``expr`` evidently carry autograd history? True for model and loss
    outputs and arithmetic on them; False for detached values, host reads,
    integer/boolean results and factory tensors; None when unknown. Whether
    autograd is on at the site (``no_grad``, training) is the caller's
    question. Ask at visit time, like ``tensor_evidence``."""
    seen = _seen if _seen is not None else set()
    if isinstance(
        expr, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.FormattedString, cst.ConcatenatedString)
    ):
        return False
    if isinstance(
        expr, (cst.List, cst.Tuple, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp, cst.Comparison)
    ):
        return False
    if isinstance(expr, cst.UnaryOperation):
        return False if isinstance(expr.operator, cst.Not) else requires_grad_evidence(ctx, expr.expression, seen)
    if isinstance(expr, cst.BinaryOperation):
        answers = [requires_grad_evidence(ctx, part, seen) for part in (expr.left, expr.right)]
        if any(a is True for a in answers):
            return True
        return False if all(a is False for a in answers) else None
    if isinstance(expr, cst.Subscript):
        return requires_grad_evidence(ctx, expr.value, seen)
    if isinstance(expr, cst.Attribute) and expr.attr.value in (
        "data",
        "grad",
        "shape",
        "dtype",
        "device",
        "requires_grad",
    ):
        return False
    if isinstance(expr, cst.Call):
        return _call_grad_evidence(ctx, expr, seen)
    if isinstance(expr, (cst.Name, cst.Attribute)):
        name = dotted_name(expr)
        if name is None or name in seen:
            return None
        seen.add(name)
        value = ctx.value_of(name)
        if value is not None:
            if value is UNKNOWN_PART:
                return None
            return requires_grad_evidence(ctx, value, seen)
        return True if tensor_evidence(ctx, expr) is True else None
    return None


def _call_grad_evidence(ctx: "FileModel", call: cst.Call, seen: Set[str]) -> Optional[bool]:
    func = call.func
    if isinstance(func, cst.Name) and func.value in ("float", "int", "bool", "len", "str", "round", "repr", "format"):
        return False
    qname = ctx.names.qualified_name(func)
    if qname is not None:
        if _TORCH_FACTORY.match(qname):
            flag = next(
                (a.value for a in call.args if a.keyword is not None and a.keyword.value == "requires_grad"), None
            )
            return True if isinstance(flag, cst.Name) and flag.value == "True" else False
        if qname.startswith(_NUMPY) or qname.startswith(("math.", "time.", "random.", "builtins.", "statistics.")):
            return False
        if qname.startswith("torch."):
            if _TORCH_NON_TENSOR.match(qname):
                return None
            answers = [
                requires_grad_evidence(ctx, a.value, seen) for a in call.args if a.keyword is None and not a.star
            ]
            if any(a is True for a in answers):
                return True
            return None
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        if method in _NO_GRAD_RESULTS or method in HOST_READS and method != "cpu":
            return False
        if method in _TENSOR_METHODS:
            return requires_grad_evidence(ctx, func.value, seen)
    return True if tensor_evidence(ctx, call) is True else None


# -- modules (``nn.Module`` objects), as opposed to tensors ----------------------
# The one list of names that say "a network" (a receiver no construction
# tells about): ``module_evidence`` here and the rules that ask whether a
# receiver is a module (TL301, TL603) all use ``names_a_module``.
_MODULE_NAME = re.compile(
    # long words, as a suffix too: ``autoencoder``, ``text_encoder``, ``ema_model``
    r"(?i)(model|module|network|encoder|decoder|backbone|classifier|generator|discriminator|transformer)s?\d*$"
    # short words, whole: ``head``, ``self.layer1``, ``conv2``, not ``overhead`` or ``schema``
    r"|(^|_)(net|head|layer|block|teacher|student|critic|unet|vae|embedding|embeddings|embedder|ema|policy|actor|"
    r"lm|mlp|lstm|rnn|gru|conv|stem|neck)s?\d*$"
    r"|net$|model"
)


# Base classes (qualified or as written) whose subclasses are torch modules.
_MODULE_BASE = re.compile(r"(^torch\.nn\.|Module$|PreTrainedModel$|ModelMixin$|Sequential$|ModuleList$|ModuleDict$)")


def is_module_base(base: str) -> bool:
    """Does a class deriving from ``base`` (``torch.nn.Module``, ``nn.Sequential``,
    ``pl.LightningModule``, ``PreTrainedModel``) have torch's module API?"""
    return bool(_MODULE_BASE.search(base))


# ``nn.Module`` methods that yield modules: a loop over one binds a module.
_MODULE_ITERATORS = frozenset({"modules", "children"})


def module_evidence(ctx: "FileModel", expr: cst.BaseExpression) -> bool:
    """Is ``expr`` evidently an ``nn.Module`` (``model``, ``self.encoder``,
    something built by ``torch.nn.Linear(...)``)? Moving a module is in place."""
    name = dotted_name(expr)
    if name is None:
        return False
    if name == "self":
        return True
    value = ctx.value_of(name)
    if value is None and name.startswith("self.") and name.count(".") == 1:
        value = ctx.init_value(ctx.enclosing_class(), name)  # ``self.melspec = MelSpectrogram(...)`` in ``__init__``
    if (
        isinstance(value, cst.Subscript)
        and isinstance(value.value, cst.Call)
        and last_name(value.value.func) in _MODULE_ITERATORS
    ):
        return True  # ``for m in model.modules()``: each element the loop binds is a module
    if isinstance(value, cst.Call):
        qname = ctx.names.qualified_name(value.func) or ""
        # ``nn.Linear(...)``, ``nn.SyncBatchNorm.convert_sync_batchnorm(...)``, ``DistributedDataParallel(...)``
        if qname.startswith("torch.nn.") and any(part[:1].isupper() for part in qname.split(".")[2:]):
            return True
        # ``Qwen2Model(config)``, ``ResNet(...)``: a class instance, not a tensor
        callee = last_name(value.func) or ""
        if callee[:1].isupper() and not callee.endswith("Tensor") and not qname.startswith("torch."):
            return True
    return names_a_module(name.rsplit(".", 1)[-1])


def names_a_module(name: Optional[str]) -> bool:
    """Does the name (its last part) say "a network": ``model``, ``self.encoder``, ``ema_model``?"""
    return bool(name and _MODULE_NAME.search(name))


# Calls that make the host wait for every queued kernel.
SYNCHRONIZE_CALLS = frozenset({"torch.cuda.synchronize", "torch.accelerator.synchronize", "torch.xpu.synchronize"})
# Calls that queue a step's worth of GPU work: backward, optimizer steps, forward.
_DEVICE_WORK_METHODS = frozenset(
    {"backward", "step", "forward", "all_reduce", "reduce_scatter", "all_gather", "generate"}
)


def launches_device_work(ctx: "FileModel", statement: cst.CSTNode) -> bool:
    """Does ``statement`` queue substantial GPU work: a model or loss call, a
    backward or optimizer step, a collective, or a module function that
    trains? After a host read drained the GPU, a later read waits only for the
    work queued in between; small tensor arithmetic does not count."""
    from torchlint.analysis import iter_subtree

    for sub in iter_subtree(statement):
        if not isinstance(sub, cst.Call):
            continue
        name = last_name(sub.func)
        if name is None:
            return True  # a call of a call's result (``model.module(x)`` aside): unknown
        if name in _DEVICE_WORK_METHODS or names_a_module(name) or _LOSS_CALLEE.search(name):
            return True
        if isinstance(sub.func, cst.Name) and ctx.facts.function_trains(name):
            return True
    return False
