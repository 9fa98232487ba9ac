from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import FunctionInfo, LoopInfo, dotted_name, last_name, optimizer_receiver, scaler_call
from torchlint.rule import Evidence, Invalid, Rule, Valid

_BACKWARD_METHODS = frozenset({"backward", "manual_backward"})
_AUTOGRAD_BACKWARD = frozenset({"torch.autograd.backward"})
# In-place ways of clearing gradients: p.grad.zero_(), p.grad.detach_(), torch._foreach_zero_(grads)
_GRAD_CLEARING_METHODS = frozenset({"zero_", "detach_", "fill_"})


class MissingZeroGrad(Rule):
    """## What it does
    Flags `optimizer.step()` (or `scaler.step(optimizer)`) in a loop that also
    calls `backward()` but never clears the gradients: no `zero_grad()` on
    any optimizer or module anywhere in the loop (nested blocks included),
    no `param.grad = None` or `param.grad.zero_()`, and no function of the
    same module called from the loop that does either.

    Gradient accumulation stays silent: a `zero_grad()` anywhere in the loop,
    for example under `if (step + 1) % accum_steps == 0:` next to the
    `step()`, is enough. A `zero_grad()` outside the loop, once before it or
    once per epoch, does not count: the gradients still pile up from one
    step to the next.

    ## Why is this bad?
    `backward()` adds into `.grad`; it never overwrites it. Without clearing,
    the gradient used by step *n* is the sum of the gradients of every batch
    so far, so the effective learning rate grows with every step and training
    diverges or stalls, with no error message.

    ## Example
    ```python
    optimizer.zero_grad()
    for inputs, targets in loader:
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    for step, (inputs, targets) in enumerate(loader):
        loss = criterion(model(inputs), targets) / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Fix safety
    There is no automatic fix: where the gradients should be cleared depends
    on whether the loop accumulates them on purpose.

    ## References
    - [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
    - [`torch.optim.Optimizer.zero_grad`](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html)
    - [`torch.optim`: taking an optimization step](https://pytorch.org/docs/stable/optim.html#taking-an-optimization-step)
    """

    code = "TL304"
    name = "missing-zero-grad"
    summary = "A loop calls `backward()` and `optimizer.step()` but never clears the gradients"
    fix_availability = "none"
    requires_any = ("backward",)

    VALID = [
        Valid("""
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum
                loss.backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        """),
        Valid("""
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                model.zero_grad()
        """),
        Valid("""
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                for p in model.parameters():
                    p.grad = None
        """),
        Valid("""
            def reset(model):
                for p in model.parameters():
                    if p.grad is not None:
                        p.grad.zero_()

            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                reset(model)
        """),
        Valid("""
            for x, y in loader:
                def closure():
                    optimizer.zero_grad()
                    loss = criterion(model(x), y)
                    loss.backward()
                    return loss
                optimizer.step(closure)
        """),
        Valid("""
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                scheduler.step()
        """),
        Valid("""
            for x, y in loader:
                loss = criterion(model(x), y)
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        """),
        Valid("""
            for x, y in loader:
                engine.backward(engine(x))
                engine.step()
        """),
        Valid("""
            for x, y in loader:
                loss = train_step(model, x, y)
                optimizer.step()
        """),
        Valid("""
            import torch
            for i, t in enumerate(timesteps):
                x_in = latents.detach().clone().requires_grad_()
                opt = torch.optim.SGD([x_in], lr=0.1)
                loss = guidance_loss(unet(x_in, t))
                loss.backward()
                opt.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            optimizer.zero_grad()
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            """,
            line=5,
            message="`optimizer.step()`",
        ),
        Invalid(
            """
            for epoch in range(10):
                optimizer.zero_grad()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
            """,
            line=6,
        ),
        Invalid(
            """
            for step, (x, y) in enumerate(loader):
                loss = criterion(model(x), y) / accum
                loss.backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
            """,
            line=5,
        ),
        Invalid(
            """
            class Trainer:
                def fit(self):
                    for batch in self.loader:
                        loss = self.model(batch)
                        self.scaler.scale(loss).backward()
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
            """,
            message="`self.scaler.step(self.optimizer)`",
        ),
        Invalid(
            """
            while step < max_steps:
                batch = next(it)
                loss = model(batch).mean()
                loss.backward()
                opt.step()
                step += 1
            """,
        ),
        Invalid(
            """
            for x, y in loader:
                loss = criterion(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                lr_scheduler.step()
            """,
        ),
        Invalid(
            """
            for x in loader:
                loss_d = disc_loss(x)
                loss_d.backward()
                optimizer_d.step()
                loss_g = gen_loss(x)
                loss_g.backward()
                optimizer_g.step()
            """,
            line=4,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.backward_loops: Set[int] = set()
        # id(loop node) -> the first backward() call in it
        self.backward_calls: Dict[int, cst.Call] = {}
        self.clearing_loops: Set[int] = set()
        self.clearing_functions: Set[str] = set()
        self.steps: List[Tuple[LoopInfo, cst.Call, str, str]] = []
        self.assigned_in_loops: Set[Tuple[int, str]] = set()

    def _enclosing_loops(self) -> List[LoopInfo]:
        result, loop = [], self.ctx.loop
        while loop is not None:
            result.append(loop)
            loop = loop.parent
        return result

    def _clears(self) -> None:
        for loop in self._enclosing_loops():
            self.clearing_loops.add(id(loop.node))
        function: Optional[FunctionInfo] = self.ctx.function
        while function is not None:
            self.clearing_functions.add(function.name)
            function = function.parent

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Attribute) and target.target.attr.value == "grad":
                self._clears()
            elif self.ctx.loop is not None:
                # An optimizer built inside the loop starts from fresh parameters each time.
                name = dotted_name(target.target)
                if name is not None:
                    for loop in self._enclosing_loops():
                        self.assigned_in_loops.add((id(loop.node), name))

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        name = last_name(func)
        if name is None:
            return
        if "zero_grad" in name or name in ("clear_grad", "clear_gradients"):
            self._clears()
            return
        if name in _GRAD_CLEARING_METHODS and isinstance(func, cst.Attribute) and last_name(func.value) == "grad":
            self._clears()
            return
        if name == "_foreach_zero_":
            self._clears()
            return
        if self.ctx.loop is None:
            return
        if name in _BACKWARD_METHODS or self.ctx.qualified_name(func) in _AUTOGRAD_BACKWARD:
            for loop in self._enclosing_loops():
                self.backward_loops.add(id(loop.node))
                self.backward_calls.setdefault(id(loop.node), node)
            return
        if name == "step" and isinstance(func, cst.Attribute):
            found = scaler_call(self.ctx, node)
            if found is not None:
                if found.argument is not None:
                    self.steps.append((self.ctx.loop, node, self.ctx.code_for(node), dotted_name(found.argument) or ""))
                return
            receiver = func.value
            if optimizer_receiver(receiver):
                self.steps.append((self.ctx.loop, node, self.ctx.code_for(node), dotted_name(receiver) or ""))

    def finish(self) -> None:
        reported: Set[int] = set()
        for loop, node, text, optimizer in self.steps:
            target: Optional[LoopInfo] = loop
            while target is not None and id(target.node) not in self.backward_loops:
                target = target.parent
            if target is None or id(target.node) in reported:
                continue
            if id(target.node) in self.clearing_loops:
                continue
            if target.calls & self.clearing_functions:
                continue
            if (id(target.node), optimizer) in self.assigned_in_loops:
                continue
            reported.add(id(target.node))
            self.report(
                node,
                f"`{text}` runs in {target.line_hint}, which calls `backward()` but never clears the gradients: "
                "every step applies the sum of all gradients so far; call `zero_grad()` after each step",
                evidence=[
                    Evidence("the loop calls `backward()`", node=self.backward_calls[id(target.node)]),
                    Evidence(
                        "nothing in the loop, or in a function it calls, clears the gradients",
                        node=target.node,
                    ),
                ],
            )
