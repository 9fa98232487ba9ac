from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import libcst as cst

from torchlint.model import (
    Site,
    dotted_name,
    is_module_base,
    keyword,
    last_name,
    names_a_module,
    names_an_optimizer,
    per_batch_evidence,
)
from torchlint.rule import UNSAFE, Evidence, Invalid, Rule, Valid

_BACKWARD_QUALIFIED = frozenset({"torch.autograd.backward"})
_GRAD_FUNCTIONS = frozenset({"torch.autograd.grad"})


@dataclass
class _Event:
    seq: int
    kind: str  # "grad-read" or "backward"
    scope: Optional[cst.CSTNode]


@dataclass
class _ClassInfo:
    torch_like: bool
    defines_zero_grad: bool


@dataclass
class _Candidate:
    call: cst.Call
    seq: int
    scope: Optional[cst.CSTNode]
    explicit: Optional[cst.Arg]  # the `set_to_none=False` / positional `False` argument
    receiver_names: List[str]
    constructed_by: Optional[Tuple[Optional[str], Optional[str]]]  # (qualified, last name) of the value's callee
    self_class: Optional[str]
    # [[first, last]]: event numbers of the innermost enclosing loop's body (filled in on leaving it)
    loop_ref: List = field(default_factory=list)
    site: Optional[Site] = None


class ZeroGradWithoutSetToNone(Rule):
    """## What it does
    Flags `optimizer.zero_grad(set_to_none=False)` and
    `model.zero_grad(set_to_none=False)` on torch optimizers and modules
    (also `self.optimizer`, `self.zero_grad()` in an `nn.Module`, and
    optimizers taken from a list). When the code supports a PyTorch below
    2.0, where `set_to_none` defaulted to `False`, a plain `zero_grad()` is
    flagged too where the code runs on PyTorch 1.x only: every supported
    version is below 2.0 (the manifests' upper bound, or an unguarded import
    of a module torch removed in 2.0, `from torch._six import inf`, in the
    file or a module it imports), or `target-torch` names a 1.x release. An
    open-ended floor such as `torch>=1.13` is not enough: installs get torch
    2.x, where `zero_grad()` sets `None`. Not flagged either where a
    supported version is known to predate `set_to_none` (1.7). See
    `target-torch` in docs/linter.md.

    Only calls that run once per training step are flagged: in a batch
    loop (under a gradient-accumulation guard too: zeroing comes with each
    optimizer step), in a function such a loop calls, or in a step method;
    a call once per epoch or at set-up zeroes the gradients once, which is
    nothing to gain.

    Not flagged: `zero_grad` methods of objects that are evidently not
    torch's (an instance of a class defined in the module that is not a
    `Module` or `Optimizer`), `super().zero_grad(...)` inside an override,
    and code that reads `.grad` after zeroing and before the next backward
    pass, because it may need the zeros.

    How far the rule looks for `.grad` reads: through the rest of the
    enclosing function (or module) in execution order: the statements after
    the call, then (inside a loop) the top of the loop body up to the call,
    then the code after the loop, up to the first backward call
    (`.backward()`, `torch.autograd.backward`, `accelerator.backward(...)`).
    Any `p.grad` read in that stretch, even `if p.grad is not None`, keeps
    the rule silent. Reads in helper functions called there are not
    followed. Reads after the backward call do not matter: a backward pass
    recreates the gradients it reaches, and parameters it does not reach had
    no gradient before the first zeroing either.

    ## Why is this bad?
    `set_to_none=False` launches a memset for every gradient and keeps the
    gradient memory allocated between steps. Setting gradients to `None`
    skips the memsets, lets the allocator reuse the memory, and lets the
    next backward pass assign gradients instead of accumulating into zeros.

    ## Example
    ```python
    for batch in loader:
        optimizer.zero_grad(set_to_none=False)
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    for batch in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    The fix passes `set_to_none=True`. For an explicit `set_to_none=False`
    the fix is unsafe: the author chose zeros, and code that reads `.grad`
    elsewhere (a helper, a hook), or an optimizer that treats a zero gradient
    differently from a missing one (it skips the step for `None`), can
    change behaviour. No fix is offered where the module updates a gradient
    in place (`p.grad += g`, `p.grad.add_(g)`, `p.grad.data`): that code
    would raise on a gradient set to `None`. For a plain `zero_grad()` under
    a target PyTorch below 2.0 the fix is unsafe too: it makes the call do
    what it does by default from PyTorch 2.0 on, but on PyTorch 1.x a
    parameter that gets no gradient in a step is then skipped by the
    optimizer instead of being moved by momentum and weight decay, so
    training results change. No fix is offered where the receiver is built
    by a class that is not torch's (an optimizer wrapper imported from
    another module, such as apex's `FP16_Optimizer`, whose `zero_grad` takes
    `set_grads_to_None`), unless the call already passes `set_to_none=`.

    ## References
    - [`torch.optim.Optimizer.zero_grad`](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html)
    - [`torch.nn.Module.zero_grad`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.zero_grad)
    - [Performance tuning guide: use `parameter.grad = None` instead of `zero_grad()`](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#use-parameter-grad-none-instead-of-model-zero-grad-or-optimizer-zero-grad)
    """

    code = "TL301"
    name = "zero-grad-without-set-to-none"
    summary = "Gradients are zeroed instead of set to `None`"
    fix_availability = "always"
    requires_any = ("zero_grad",)

    VALID = [
        Valid("""
            optimizer.zero_grad()
            loss.backward()
        """),
        # Once, before the batch loop: one memset of every gradient is nothing to gain.
        Valid("""
            def train_one_epoch(model, optimizer, loader):
                optimizer.zero_grad(set_to_none=False)
                for batch in loader:
                    model(batch).sum().backward()
                    optimizer.step()
        """),
        Valid("""
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        """),
        Valid(
            """
            optimizer.zero_grad(set_to_none=True)
        """,
            target_torch="1.13",
        ),
        # Reads the zeros before the next backward pass.
        Valid("""
            model.zero_grad(set_to_none=False)
            for p in model.parameters():
                p.grad.add_(noise(p))
            loss.backward()
        """),
        Valid("""
            for batch in loader:
                for p in model.parameters():
                    p.grad.mul_(momentum)
                loss = model(batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
        """),
        # Not torch's zero_grad.
        Valid("""
            class GradientTracker:
                def zero_grad(self, set_to_none=False):
                    self.total = 0

            tracker = GradientTracker()
            tracker.zero_grad(set_to_none=False)
        """),
        Valid("""
            class Optimizer:
                def zero_grad(self, set_to_none=False):
                    self.state.clear()

            def train(optimizer):
                optimizer.zero_grad(set_to_none=False)
        """),
        Valid("""
            import torch
            class Lookahead(torch.optim.Optimizer):
                def zero_grad(self, set_to_none=False):
                    super().zero_grad(set_to_none=False)
        """),
        # Plain call without a known old target: the default is already True.
        Valid("""
            for opt in optimizers:
                opt.zero_grad()
        """),
        Valid("""
            counter.zero_grad(set_to_none=False)
        """),
        Valid("""
            optimizer.zero_grad(set_to_none=args.set_to_none)
        """),
        Valid("""
            import pytest
            def test_remote_module_rejects_zero_grad(remote_module):
                with pytest.raises(ValueError):
                    remote_module.zero_grad(set_to_none=False)
        """),
        # torch 1.6 has no `set_to_none`: the suggested call would fail there.
        Valid(
            """
            optimizer.zero_grad()
            loss.backward()
        """,
            target_torch="1.6",
        ),
        # Manual gradient accumulation into the zeros, under old torch.
        Valid(
            """
            optimizer.zero_grad()
            for p, g in zip(model.parameters(), averaged):
                p.grad += g
            optimizer.step()
        """,
            target_torch="1.12",
        ),
    ]

    INVALID = [
        Invalid(
            """
            for batch in loader:
                optimizer.zero_grad(set_to_none=False)
                model(batch).sum().backward()
                optimizer.step()
            """,
            fixed=None,
            message="set_to_none=False",
        ),
        Invalid(
            """
            for batch in loader:
                optimizer.zero_grad(set_to_none=False)
                model(batch).sum().backward()
                optimizer.step()
            """,
            unsafe_fixes=True,
            fixed="""
            for batch in loader:
                optimizer.zero_grad(set_to_none=True)
                model(batch).sum().backward()
                optimizer.step()
            """,
        ),
        Invalid(
            """
            import torch
            model = torch.nn.Linear(4, 2)
            for x in loader:
                model.zero_grad(False)
                model(x).sum().backward()
            """,
            unsafe_fixes=True,
            fixed="""
            import torch
            model = torch.nn.Linear(4, 2)
            for x in loader:
                model.zero_grad(set_to_none=True)
                model(x).sum().backward()
            """,
        ),
        # A step method: one call per training step.
        Invalid(
            """
            class Trainer:
                def step(self, batch):
                    self.optimizer.zero_grad()
                    self.model(batch).sum().backward()
                    self.optimizer.step()
            """,
            target_torch="1.13",
            fixed="""
            class Trainer:
                def step(self, batch):
                    self.optimizer.zero_grad(set_to_none=True)
                    self.model(batch).sum().backward()
                    self.optimizer.step()
            """,
            unsafe_fixes=True,
            message="below 2.0",
        ),
        Invalid(
            """
            for batch in loader:
                for opt in optimizers:
                    opt.zero_grad(set_to_none=False)
                [o.zero_grad(set_to_none=False) for o in self.optimizers]
                optimizers[0].zero_grad(set_to_none=False)
                model(batch).sum().backward()
            """,
            count=3,
        ),
        Invalid(
            """
            import torch.nn as nn
            class Net(nn.Module):
                def reset(self):
                    self.zero_grad(set_to_none=False)

                def fit(self, loader):
                    for batch in loader:
                        self.reset()
                        self(batch).sum().backward()
            """,
        ),
        Invalid(
            """
            from torch.optim import AdamW
            sgd_like = AdamW(params, lr=1e-3)
            for batch in loader:
                sgd_like.zero_grad()
                model(batch).sum().backward()
                sgd_like.step()
            """,
            target_torch="1.13",
            fixed="""
            from torch.optim import AdamW
            sgd_like = AdamW(params, lr=1e-3)
            for batch in loader:
                sgd_like.zero_grad(set_to_none=True)
                model(batch).sum().backward()
                sgd_like.step()
            """,
            unsafe_fixes=True,
        ),
        # Under a gradient-accumulation guard: still once per optimizer step.
        Invalid(
            """
            for i, batch in enumerate(loader):
                model(batch).sum().backward()
                if (i + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            target_torch="1.12",
            fixed="""
            for i, batch in enumerate(loader):
                model(batch).sum().backward()
                if (i + 1) % accumulation == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            """,
            unsafe_fixes=True,
        ),
        # `.grad` is read only after the next backward pass: flagged.
        Invalid(
            """
            for batch in loader:
                optimizer.zero_grad(set_to_none=False)
                model(batch).sum().backward()
                norm = sum(p.grad.norm() for p in model.parameters())
                optimizer.step()
            """,
            line=2,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.seq = 0
        self.events: List[_Event] = []
        self.candidates: List[_Candidate] = []
        self.classes: Dict[str, _ClassInfo] = {}
        self.class_stack: List[str] = []
        self.loop_stack: List[List[int]] = []  # [first, last] event numbers, open loops
        self.loop_ranges: Dict[int, List[int]] = {}
        # loop/comprehension target -> the name of what it iterates (`for opt in optimizers`)
        self.element_of: Dict[str, str] = {}
        # `p.grad += g`, `p.grad.add_(g)` somewhere in the module: code that
        # crashes on a gradient set to None, so no set_to_none=True fix here
        self.grad_updated_in_place = False

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _scope(self) -> Optional[cst.CSTNode]:
        return self.ctx.function.node if self.ctx.function is not None else None

    # -- classes ---------------------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        bases = [self.ctx.qualified_name(b.value) or dotted_name(b.value) or "" for b in node.bases]
        defines = any(
            isinstance(stmt, cst.FunctionDef) and stmt.name.value == "zero_grad"
            for stmt in (node.body.body if isinstance(node.body, cst.IndentedBlock) else ())
        )
        # Modules and optimizers have torch's zero_grad.
        self.classes[node.name.value] = _ClassInfo(
            any(is_module_base(b) or b.endswith("Optimizer") for b in bases), defines
        )
        self.class_stack.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.class_stack.pop()

    # -- loops: their extent in event numbers, and what their targets iterate ---------
    def _enter_loop(self, node) -> None:
        self.loop_stack.append([self.seq + 1, self.seq])

    def _leave_loop(self, node) -> None:
        extent = self.loop_stack.pop()
        extent[1] = self.seq
        self.loop_ranges[id(node)] = extent

    def visit_For(self, node: cst.For) -> None:
        self._bind_elements(node.target, node.iter)
        self._enter_loop(node)

    leave_For = _leave_loop
    visit_While = _enter_loop
    leave_While = _leave_loop

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind_elements(node.target, node.iter)

    def _comprehension(self, node) -> None:
        clause = node.for_in  # bound before the element is visited
        while clause is not None:
            self._bind_elements(clause.target, clause.iter)
            clause = clause.inner_for_in

    visit_ListComp = _comprehension
    visit_SetComp = _comprehension
    visit_GeneratorExp = _comprehension
    visit_DictComp = _comprehension

    def _bind_elements(self, target: cst.BaseExpression, iterable: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            source = _receiver_last_names(iterable)
            if source:
                self.element_of[target.value] = source[0]

    # -- events ------------------------------------------------------------------------
    def visit_Attribute(self, node: cst.Attribute) -> None:
        if node.attr.value != "grad":
            return
        parent = self.ctx.current_parent()
        if _updates_in_place(node, parent, self.ctx.current_parent(2)):
            self.grad_updated_in_place = True
        if isinstance(parent, cst.AssignTarget):
            return  # `p.grad = None` writes, it does not read
        if self.ctx.qualified_name(node) in _GRAD_FUNCTIONS:
            return
        self.events.append(_Event(self._next(), "grad-read", self._scope()))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute):
            attr = func.attr.value
            if attr.endswith("backward") or self.ctx.qualified_name(func) in _BACKWARD_QUALIFIED:
                self.events.append(_Event(self._next(), "backward", self._scope()))
                return
            if attr == "zero_grad":
                self._zero_grad(node)

    def _zero_grad(self, call: cst.Call) -> None:
        receiver = call.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, cst.Call) and last_name(receiver.func) == "super":
            return
        if any(arg.star for arg in call.args) or self._expects_an_error():
            return
        explicit = keyword(call, "set_to_none")
        positional = [arg for arg in call.args if arg.keyword is None]
        if explicit is None and positional:
            explicit = positional[0]
        if explicit is not None:
            if not (isinstance(explicit.value, cst.Name) and explicit.value.value == "False"):
                return  # True, or a value we cannot read
        elif not self._runs_on_torch_1() or self.ctx.torch_below(1, 7):
            return  # zero_grad() sets None by default (2.0+), or `set_to_none` may not exist (before 1.7)
        constructed_by = None
        value = self.ctx.value_of(dotted_name(receiver))
        if isinstance(value, cst.Call):
            constructed_by = (self.ctx.qualified_name(value.func), last_name(value.func))
        names = _receiver_last_names(receiver)
        if names and names[0] in self.element_of:
            names.append(self.element_of[names[0]])
        loop = None
        if self.loop_stack:
            loop = self.loop_stack[-1]
        self.candidates.append(
            _Candidate(
                call=call,
                seq=self._next(),
                scope=self._scope(),
                explicit=explicit,
                receiver_names=names,
                constructed_by=constructed_by,
                self_class=self.class_stack[-1] if self.class_stack and dotted_name(receiver) == "self" else None,
                loop_ref=[loop] if loop is not None else [],
                site=self.ctx.site(),
            )
        )

    def _runs_on_torch_1(self) -> bool:
        """Does the code run on torch 1.x, where ``zero_grad()`` zeroes? Every
        supported version is below 2.0 (an upper bound, an import of a module
        2.0 removed), or the user targets one explicitly. An open-ended floor
        (``torch>=1.13``) is not enough: installs get torch 2.x."""
        return self.ctx.torch_all_below(2, 0) or (self.ctx.torch_target_explicit() and self.ctx.torch_below(2, 0))

    def _expects_an_error(self) -> bool:
        """Inside ``with pytest.raises(...)`` / ``self.assertRaises(...)``: the call is
        expected to fail (an object whose zero_grad is not supported)."""
        for node in self.ctx.ancestry():
            if isinstance(node, cst.With):
                for item in node.items:
                    if isinstance(item.item, cst.Call):
                        name = last_name(item.item.func) or ""
                        if name == "raises" or name.startswith("assertRaises"):
                            return True
        return False

    # -- deciding ---------------------------------------------------------------------
    def finish(self) -> None:
        for candidate in self.candidates:
            if not self._is_torch_zero_grad(candidate):
                continue
            if self._grad_read_before_backward(candidate):
                continue
            assert candidate.site is not None
            if candidate.site.in_exception_path():
                continue
            # Per batch, or per optimizer step under an accumulation guard
            # (``if (i + 1) % accum == 0:``): a periodic guard does not make it rare.
            loop, helper = candidate.site.batch_context()
            if loop is None:
                continue  # once per epoch or at set-up: one memset more or less is nothing to gain
            evidence = [per_batch_evidence(loop, helper)]
            if candidate.explicit is None:
                versions = self.ctx.torch_range
                evidence.insert(
                    0,
                    Evidence(
                        f"the code runs on torch {versions.describe()}, below 2.0 (from "
                        + (", ".join(versions.sources) or "target-torch")
                        + ")",
                        node=candidate.call,
                    ),
                )
            call = candidate.call
            receiver = self.ctx.code_for(call.func.value)  # type: ignore[attr-defined]
            if candidate.explicit is not None:
                message = (
                    f"`{receiver}.zero_grad(set_to_none=False)` writes zeros into every gradient; "
                    "`set_to_none=True` skips the memsets and frees the gradient memory between steps"
                )
                arg = candidate.explicit
                edit = self.ctx.replace(arg.value, "True" if arg.keyword is not None else "set_to_none=True")
                if self.grad_updated_in_place or (arg.keyword is None and self._maybe_not_torch_signature(candidate)):
                    # in-place gradient updates would crash on None; a wrapper's
                    # zero_grad(False) may name its argument differently
                    self.report(call, message, evidence=evidence)
                else:
                    self.report(call, message, self.ctx.fix(UNSAFE, "Pass `set_to_none=True`", edit), evidence=evidence)
            else:
                message = (
                    f"`{receiver}.zero_grad()` zeroes the gradients instead of setting them to `None` on the "
                    "targeted PyTorch (below 2.0, the default was `set_to_none=False`)"
                )
                new_call = call.with_changes(
                    args=[cst.Arg(keyword=cst.Name("set_to_none"), value=cst.Name("True"), equal=_TIGHT_EQUAL)]
                )
                if self.grad_updated_in_place or self._maybe_not_torch_signature(candidate):
                    self.report(call, message, evidence=evidence)
                else:
                    self.report(
                        call,
                        message,
                        self.ctx.fix(UNSAFE, "Pass `set_to_none=True`", self.ctx.replace(call, new_call)),
                        evidence=evidence,
                    )

    def _maybe_not_torch_signature(self, candidate: _Candidate) -> bool:
        """The receiver is built by something other than torch (a wrapper from
        another module, a class of this file that defines its own zero_grad)."""
        if candidate.constructed_by is None:
            return False
        qualified, last = candidate.constructed_by
        if qualified is not None and qualified.startswith("torch."):
            return False
        info = self.classes.get(last or "")
        return not (info is not None and info.torch_like and not info.defines_zero_grad)

    def _is_torch_zero_grad(self, candidate: _Candidate) -> bool:
        if candidate.self_class is not None:
            info = self.classes.get(candidate.self_class)
            return bool(info and info.torch_like)
        custom_zero_grad = any(c.defines_zero_grad and not c.torch_like for c in self.classes.values())
        if candidate.constructed_by is not None:
            qualified, last = candidate.constructed_by
            if qualified and qualified.startswith(("torch.optim.", "torch.nn.")):
                return True
            if last in self.classes:
                return self.classes[last].torch_like
        if custom_zero_grad:
            return False  # a home-made zero_grad exists here: names alone are not evidence
        return any(names_an_optimizer(name) or names_a_module(name) for name in candidate.receiver_names)

    def _grad_read_before_backward(self, candidate: _Candidate) -> bool:
        events = [e for e in self.events if e.scope is candidate.scope]
        z = candidate.seq
        if candidate.loop_ref:
            first, last = candidate.loop_ref[0]
            ordered = (
                [e for e in events if z < e.seq <= last]
                + [e for e in events if first <= e.seq < z]
                + [e for e in events if e.seq > last]
            )
        else:
            ordered = [e for e in events if e.seq > z]
        for event in ordered:
            if event.kind == "backward":
                return False
            if event.kind == "grad-read":
                return True
        return False


_TIGHT_EQUAL = cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))


_IN_PLACE_TENSOR_METHODS = frozenset(
    {"add_", "sub_", "mul_", "div_", "copy_", "zero_", "fill_", "clamp_", "addcmul_", "addcdiv_", "lerp_"}
)


def _updates_in_place(grad: cst.Attribute, parent: Optional[cst.CSTNode], grandparent: Optional[cst.CSTNode]) -> bool:
    """``x.grad += g`` or ``x.grad.add_(g)`` (``x.grad.data.add_`` too): code
    that needs the gradient to exist, and raises on ``None``."""
    if isinstance(parent, cst.AugAssign) and parent.target is grad:
        return True
    if isinstance(parent, cst.Attribute) and parent.value is grad:
        if parent.attr.value in _IN_PLACE_TENSOR_METHODS and isinstance(grandparent, cst.Call):
            return True
        return parent.attr.value == "data"  # `p.grad.data` fails on None whatever follows
    return False


def _receiver_last_names(expr: cst.BaseExpression) -> List[str]:
    """``self.optimizers()[0]`` -> ["optimizers"]; ``opt`` -> ["opt"]."""
    node = expr
    while isinstance(node, (cst.Subscript, cst.Call)):
        node = node.value if isinstance(node, cst.Subscript) else node.func
    name = last_name(node)
    return [name] if name else []
