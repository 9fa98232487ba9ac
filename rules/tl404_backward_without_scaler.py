from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    Site,
    dotted_name,
    enabled,
    is_grad_scaler_call,
    scaled_backward,
    scaler_call,
    tensor_backward,
)
from torchlint.rule import UNSAFE, Evidence, Invalid, Rule, Valid

# A condition naming one of these chooses between the AMP and the plain path.
_AMP_CONDITION = re.compile(r"(?i)(scaler|amp|fp16|float16|half|mixed|precision|autocast|bf16)")


class BackwardWithoutScaler(Rule):
    """## What it does
    Flags `loss.backward()` on an unscaled loss in a function that steps its
    optimizer through a GradScaler (`scaler.step(optimizer)`), where the loss
    should have gone through `scaler.scale(loss).backward()`.

    It stays silent when the plain `backward()` and the `scaler.step` sit in
    different branches of one `if`, when the plain `backward()` is under a
    condition that chooses the AMP path (`if scaler is None:`,
    `if not args.fp16:`, `else` of `if use_amp:`), when the scaler is visibly
    created with `enabled=False`, and for framework calls such as
    `accelerator.backward(loss)`.

    ## Why is this bad?
    `scaler.step(optimizer)` unscales the gradients, dividing them by the
    current scale factor (65536 at the start), before the optimizer step, and
    skips the step when it found infs. Gradients that were never scaled come
    out of that division tiny: training silently stalls, while the float16
    gradients that the scaling was there to protect still underflow.

    ## Example
    ```python
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for inputs, targets in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(inputs), targets)
        loss.backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    ```

    Use instead:
    ```python
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for inputs, targets in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    ```

    ## Fix safety
    The fix rewrites `loss.backward()` to `scaler.scale(loss).backward()`,
    using the scaler that steps the optimizer in the same function; it is
    offered only when exactly one scaler does. It is unsafe because it
    changes the gradients (that is its purpose): review it where the code
    also divides the loss by the scale by hand.

    ## References
    - [Automatic Mixed Precision examples: typical mixed precision training](https://pytorch.org/docs/stable/notes/amp_examples.html#typical-mixed-precision-training)
    - [`torch.amp.GradScaler`](https://pytorch.org/docs/stable/amp.html#gradient-scaling)
    - [Automatic Mixed Precision recipe: adding GradScaler](https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html#adding-gradscaler)
    """

    code = "TL404"
    name = "backward-without-scaler"
    summary = "`backward()` on an unscaled loss while a GradScaler steps the optimizer"
    fix_availability = "sometimes"
    requires_any = ("step",)

    VALID = [
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
        """),
        Valid("""
            for x in loader:
                loss = model(x)
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
        """),
        Valid("""
            def train_step(self, loss):
                if self.use_amp:
                    self.scaler.scale(loss).backward()
                else:
                    loss.backward()
                if self.use_amp:
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                else:
                    self.optimizer.step()
        """),
        Valid("""
            import torch
            scaler = torch.cuda.amp.GradScaler(enabled=False)
            for x in loader:
                loss = model(x)
                loss.backward()
                scaler.step(optimizer)
        """),
        Valid("""
            for x in loader:
                loss = model(x)
                scaled = scaler.scale(loss)
                scaled.backward()
                scaler.step(optimizer)
        """),
        Valid("""
            for x in loader:
                loss = model(x)
                accelerator.backward(loss)
                optimizer.step()
        """),
        Valid("""
            def pretrain(model, loader, optimizer):
                for x in loader:
                    model(x).backward()
                    optimizer.step()

            def finetune(model, loader, optimizer, scaler):
                for x in loader:
                    scaler.scale(model(x)).backward()
                    scaler.step(optimizer)
        """),
        Valid("""
            for x in loader:
                loss = model(x)
                if not args.fp16:
                    loss.backward()
                else:
                    scaler.scale(loss).backward()
                scaler.step(optimizer)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                loss = model(x)
                loss.backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for x in loader:
                loss = model(x)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            unsafe_fixes=True,
            line=5,
            message="`scaler.step(optimizer)`",
        ),
        Invalid(
            """
            def train(model, loader, optimizer, scaler):
                for x in loader:
                    loss = model(x)
                    loss.backward()
                    scaler.step(optimizer)
                    scaler.update()
            """,
            fixed=None,
        ),
        Invalid(
            """
            class Trainer:
                def step(self, batch):
                    loss = self.model(batch)
                    loss.backward(retain_graph=True)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
            fixed="""
            class Trainer:
                def step(self, batch):
                    loss = self.model(batch)
                    self.scaler.scale(loss).backward(retain_graph=True)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            from torch.cuda.amp import GradScaler as GS
            amp = GS()
            for x in loader:
                loss = model(x)
                loss.backward()
                amp.step(opt)
            """,
        ),
        Invalid(
            """
            for x, y in loader:
                loss = criterion(model(x), y)
                aux = model.aux_loss()
                scaler.scale(loss).backward(retain_graph=True)
                aux.backward()
                scaler.step(optimizer)
                scaler.update()
            """,
            line=5,
        ),
        Invalid(
            """
            for x, y in loader:
                (criterion(model(x), y) / accum_steps).backward()
                if (step + 1) % accum_steps == 0:
                    scaler.step(optimizer)
                    scaler.update()
            """,
            fixed="""
            for x, y in loader:
                (scaler.scale(criterion(model(x), y) / accum_steps)).backward()
                if (step + 1) % accum_steps == 0:
                    scaler.step(optimizer)
                    scaler.update()
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            for x in loader:
                loss_g = gen_loss(x)
                loss_g.backward()
                scaler_g.step(opt_g)
                loss_d = disc_loss(x)
                loss_d.backward()
                scaler_d.step(opt_d)
            """,
            count=2,
            fixed=None,
            unsafe_fixes=True,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # scope -> plain backward calls / scaler steps in it
        self.backwards: Dict[Optional[cst.CSTNode], List[Tuple[Site, cst.Call]]] = {}
        self.steps: Dict[Optional[cst.CSTNode], List[Tuple[Site, str]]] = {}
        self.step_calls: Dict[object, List[cst.Call]] = {}  # the scaler.step(...) calls, per scope
        # (scope, scaler name) of scalers created with enabled=False; ``self.x``
        # scalers are keyed by class, the others by function
        self.disabled: Set[Tuple[object, str]] = set()

    def _scope(self) -> Optional[cst.CSTNode]:
        return self.ctx.function.node if self.ctx.function is not None else None

    def _scaler_key(self, name: str) -> Tuple[object, str]:
        if name.startswith("self.") and self.ctx.enclosing_class():
            return (self.ctx.enclosing_class(), name)
        return (self._scope(), name)

    def visit_Assign(self, node: cst.Assign) -> None:
        if is_grad_scaler_call(self.ctx, node.value) and enabled(self.ctx, node.value) is False:  # type: ignore[arg-type]
            for target in node.targets:
                name = dotted_name(target.target)
                if name:
                    self.disabled.add(self._scaler_key(name))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute):
            return
        if func.attr.value == "backward":
            if tensor_backward(self.ctx, node) and scaled_backward(self.ctx, node) is None:
                self.backwards.setdefault(self._scope(), []).append((self.ctx.site(), node))
        elif func.attr.value == "step":
            found = scaler_call(self.ctx, node)
            if found is not None:
                if self._scaler_key(found.scaler) not in self.disabled:
                    self.steps.setdefault(self._scope(), []).append((self.ctx.site(), found.scaler))
                    self.step_calls.setdefault(self._scope(), []).append(node)

    def finish(self) -> None:
        for scope, backwards in self.backwards.items():
            steps = self.steps.get(scope, [])
            if not steps:
                continue
            for site, node in backwards:
                if site.in_exception_path() or _under_amp_condition(site):
                    continue
                paired = [(s, name) for s, name in steps if not _exclusive(site, s)]
                if not paired:
                    continue
                names = sorted({name for _, name in paired})
                step_text = f"`{names[0]}.step(...)`" if len(names) == 1 else "a GradScaler"
                if len(names) == 1:
                    optimizer = _step_text(paired, names[0])
                    step_text = f"`{names[0]}.step({optimizer})`"
                self.report(
                    node,
                    f"`backward()` on an unscaled loss while {step_text} unscales the gradients: "
                    "they come out divided by the scale factor; use `scaler.scale(loss).backward()`",
                    self._fix(node, names[0]) if len(names) == 1 else None,
                    evidence=[
                        Evidence(
                            "a GradScaler steps the optimizer in the same scope, unscaling the gradients: "
                            f"`{self.ctx.code_line(self.step_calls[scope][0])}`",
                            node=self.step_calls[scope][0],
                        )
                    ],
                )

    def _fix(self, node: cst.Call, scaler: str):
        receiver = node.func.value  # type: ignore[attr-defined]
        new_receiver = f"{scaler}.scale({self.ctx.code_for(receiver.with_changes(lpar=[], rpar=[]))})"
        return self.ctx.fix(
            UNSAFE, f"Scale the loss with `{scaler}.scale(...)`", self.ctx.replace(receiver, new_receiver)
        )


def _step_text(paired, scaler: str) -> str:
    for site, name in paired:
        call = site.node
        if name == scaler and isinstance(call, cst.Call) and call.args:
            return dotted_name(call.args[0].value) or "..."
    return "..."


def _under_amp_condition(site: Site) -> bool:
    for ancestor, child in site.ancestors():
        if isinstance(ancestor, (cst.If, cst.IfExp)) and child is not ancestor.test:
            if _AMP_CONDITION.search(site.ctx.code_for(ancestor.test)):
                return True
        if isinstance(ancestor, cst.FunctionDef):
            return False
    return False


def _exclusive(a: Site, b: Site) -> bool:
    """Do the two sites sit in different branches of one ``if``?"""
    for index, (x, y) in enumerate(zip(a.stack, b.stack)):
        if x is not y:
            parent = a.stack[index - 1] if index else None
            return isinstance(parent, cst.If)
    return False
