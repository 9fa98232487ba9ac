from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Set, Tuple, Union

import libcst as cst

from torchlint.model import (
    LoopInfo,
    Site,
    device_move,
    dotted_name,
    module_evidence,
    per_batch_evidence,
)
from torchlint.rule import Invalid, Rule, Valid

if TYPE_CHECKING:
    from torchlint.analysis import ForeignLoop


class ModuleToDeviceInLoop(Rule):
    """## What it does
    Flags `model.to(device)` and `model.cuda()` on a module inside the body
    of a training or evaluation loop (or in a module function that such a
    loop calls every batch), where the move runs once per batch.

    Not flagged: a module that is created or chosen inside the loop (`for
    model in models:`, `model = build(cfg)`), deliberate offloading (the
    same module is also moved to the CPU in the loop), moves under a periodic
    guard or on exception paths, dtype-only casts (`model.to(torch.float16)`),
    and tensors (TL201/TL204 cover copies of data).

    ## Why is this bad?
    The model only needs to be moved once, before the loop. Each further
    `.to(device)` walks every parameter and buffer of the module on the host;
    if anything in the loop moved the module elsewhere, it copies all the
    weights again. It usually means the move was meant to sit above the loop,
    and an optimizer built before a real move would hold stale parameters.

    ## Example
    ```python
    for images, labels in loader:
        model.to(device)
        loss = criterion(model(images.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    model.to(device)
    for images, labels in loader:
        loss = criterion(model(images.to(device)), labels.to(device))
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    There is no fix: moving the statement out of the loop is right only if
    nothing in the loop moves the module elsewhere.

    ## References
    - [`torch.nn.Module.to`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.to)
    - [CUDA semantics: best practices, device-agnostic code](https://pytorch.org/docs/stable/notes/cuda.html#best-practices)
    - [`torch.optim`: move the model before constructing the optimizer](https://pytorch.org/docs/stable/optim.html#how-to-use-an-optimizer)
    """

    code = "TL205"
    name = "module-to-device-in-loop"
    summary = "A module is moved to the device on every iteration of a batch loop"
    fix_availability = "none"
    # No text pre-filter: a helper without loops runs per batch when a loop in
    # another file of the project calls it.

    VALID = [
        Valid("""
            model.to(device)
            for x, y in loader:
                loss = model(x.to(device))
                loss.backward()
        """),
        # A new model per iteration.
        Valid("""
            for name, model in models.items():
                model.to(device)
                for x, y in loader:
                    model(x).sum().backward()
        """),
        Valid("""
            for cfg in configs:
                model = build_model(cfg)
                model.cuda()
                for x, y in loader:
                    model(x).sum().backward()
        """),
        # Offloading: the same module goes back to the CPU in the loop.
        Valid("""
            for batch in loader:
                teacher.to(device)
                with torch.no_grad():
                    targets = teacher(batch)
                teacher.to("cpu")
                loss = student(batch, targets)
                loss.backward()
        """),
        # dtype casts are not device moves.
        Valid("""
            import torch
            for batch in loader:
                model.to(torch.bfloat16)
                loss = model(batch)
                loss.backward()
        """),
        # Periodic guard.
        Valid("""
            for step, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                if step % 1000 == 0:
                    ema_model.to(device)
        """),
        # Tensors are not modules.
        Valid("""
            for x, y in loader:
                x = x.to(device)
                loss = model(x)
                loss.backward()
        """),
        # Once per epoch, outside the batch loop.
        Valid("""
            for epoch in range(10):
                model.to(device)
                for x, y in loader:
                    model(x).sum().backward()
        """),
    ]

    INVALID = [
        Invalid(
            """
            for images, labels in loader:
                model.to(device)
                loss = criterion(model(images), labels)
                loss.backward()
            """,
            line=2,
            message="`model.to(...)`",
        ),
        Invalid(
            """
            for batch in train_loader:
                model.cuda()
                out = model(batch)
            """,
        ),
        Invalid(
            """
            class Trainer:
                def fit(self):
                    for batch in self.train_loader:
                        self.model.to(self.device)
                        loss = self.model(batch)
                        loss.backward()
                        self.optimizer.step()
            """,
            message="`self.model.to(...)`",
        ),
        Invalid(
            """
            import torch
            net = torch.nn.Linear(4, 2)
            for x, y in loader:
                net.to("cuda")
                loss = (net(x) - y).pow(2).mean()
                loss.backward()
            """,
        ),
        Invalid(
            """
            def step(model, batch, device):
                model.to(device)
                loss = model(batch)
                loss.backward()

            for batch in loader:
                step(model, batch, "cuda")
            """,
            line=2,
            message="called from",
        ),
        Invalid(
            """
            while True:
                batch = next(data_iter)
                encoder.cuda(); decoder.cuda()
                loss = decoder(encoder(batch))
                loss.backward()
            """,
            count=2,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.Call, str]] = []
        # id(loop node) -> names bound in the loop (targets and assignments so far)
        self.bound: Dict[int, Set[str]] = {}
        # id(loop node) -> modules moved to the CPU in the loop
        self.offloaded: Dict[int, Set[str]] = {}

    def visit_For(self, node: cst.For) -> None:
        self.bound.setdefault(id(node), set()).update(_names(node.target))

    def visit_Assign(self, node: cst.Assign) -> None:
        loop = self.ctx.loop
        if loop is None:
            return
        names: Set[str] = set()
        for target in node.targets:
            names.update(_names(target.target))
        while loop is not None:
            self.bound.setdefault(id(loop.node), set()).update(names)
            loop = loop.parent

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.loop is None and ctx.function is None:
            return
        kind = device_move(ctx, node)
        if kind is None:
            return
        receiver = node.func.value  # type: ignore[attr-defined]
        name = dotted_name(receiver)
        if name is None or not module_evidence(ctx, receiver) or name == "self":
            return
        if kind == "cpu":
            loop = ctx.loop
            while loop is not None:
                self.offloaded.setdefault(id(loop.node), set()).add(name)
                loop = loop.parent
            return
        self.candidates.append((ctx.site(), node, name))

    def finish(self) -> None:
        for site, node, name in self.candidates:
            loop, helper = site.per_step()
            if loop is None:
                continue
            if helper is None and self._chosen_in_loop(site, loop, name):
                continue
            what = f"`{name}.{node.func.attr.value}(...)`"  # type: ignore[attr-defined]
            if helper is None:
                message = (
                    f"{what} moves a module to the device on every iteration of {loop.line_hint}; "
                    "move it once, before the loop"
                )
            else:
                message = (
                    f"{what} in `{helper.name}()` moves a module to the device once per batch: it is called from "
                    f"{loop.line_hint}; move it once, before the loop"
                )
            self.report(node, message, evidence=[per_batch_evidence(loop, helper)])

    def _chosen_in_loop(self, site: Site, batch_loop: Union[LoopInfo, ForeignLoop], name: str) -> bool:
        root = name.split(".")[0]
        for loop in site.loops():
            if name in self.offloaded.get(id(loop.node), ()):
                return True
            bound = self.bound.get(id(loop.node), set())
            if name in bound or root in bound:
                return True
            if loop is batch_loop:
                break
        return False


def _names(target: cst.BaseExpression) -> Set[str]:
    if isinstance(target, (cst.Tuple, cst.List)):
        found: Set[str] = set()
        for element in target.elements:
            found.update(_names(element.value))
        return found
    if isinstance(target, cst.StarredElement):
        return _names(target.value)
    name = dotted_name(target)
    return {name} if name else set()
