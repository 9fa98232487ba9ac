from __future__ import annotations

from typing import List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import LoopInfo, Site, dotted_name, last_name, optimizer_receiver
from torchlint.rule import Evidence, Invalid, Rule, Valid

DATA_PARALLEL_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel")
# Any of these in the training function means gradient sync is already managed.
_SYNC_CONTROL = (
    "no_sync",
    "require_backward_grad_sync",
    "set_requires_gradient_sync",
    "accumulate(",
    "skip_data_parallel_grad_sync",
)


def is_data_parallel_wrapper(ctx, call: cst.Call) -> bool:
    qualified = ctx.qualified_name(call.func) or ""
    return qualified.startswith("torch.") and qualified.rsplit(".", 1)[-1] in DATA_PARALLEL_WRAPPERS


class DdpAccumulationWithoutNoSync(Rule):
    """## What it does
    Flags `loss.backward()` in a gradient-accumulation loop of a module that
    wraps its model in `DistributedDataParallel` (or FSDP) when the backward
    passes of the non-stepping micro-batches do not run under
    `model.no_sync()`.

    Gradient accumulation is recognised in its two common shapes: the
    optimizer step sits under a periodic guard in the batch loop
    (`if (step + 1) % accum_steps == 0: optimizer.step()`) while backward
    runs on every iteration, or backward runs in an inner loop over
    micro-batches and the step follows it in the outer loop. The rule stays
    silent when the function already manages synchronisation in any way it
    can see: `no_sync`, `require_backward_grad_sync`,
    `set_requires_gradient_sync` (FSDP2), or `accelerator.accumulate(...)`.

    ## Why is this bad?
    DDP all-reduces gradients during every backward pass. With accumulation,
    only the gradients of the last micro-batch before `optimizer.step()`
    need to be synchronised; every other all-reduce moves the whole gradient
    across the network for nothing. With 8 accumulation steps that is 7
    wasted all-reduces per optimizer step, often the largest cost of a
    multi-node step. `no_sync()` accumulates locally and the next backward
    outside it reduces the sum once.

    ## Example
    ```python
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(net, device_ids=[rank])
    for step, batch in enumerate(loader):
        loss = model(batch).mean() / accum_steps
        loss.backward()
        if (step + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    ```

    Use instead:
    ```python
    import contextlib
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(net, device_ids=[rank])
    for step, batch in enumerate(loader):
        stepping = (step + 1) % accum_steps == 0
        with contextlib.nullcontext() if stepping else model.no_sync():
            loss = model(batch).mean() / accum_steps
            loss.backward()
        if stepping:
            optimizer.step()
            optimizer.zero_grad()
    ```

    ## Known problems
    The module must construct the wrapper itself; a model handed in already
    wrapped, or wrapped by a framework (Lightning, Accelerate, DeepSpeed,
    which manage synchronisation themselves), is not recognised.

    ## Fix safety
    There is no automatic fix: which context manager wraps the forward and
    backward of the non-stepping micro-batches depends on how the loop is
    written. Note that the forward pass must be inside `no_sync()` too.

    ## References
    - [`DistributedDataParallel.no_sync`](https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync)
    - [Distributed Data Parallel notes: internal design](https://pytorch.org/docs/stable/notes/ddp.html)
    - [`FullyShardedDataParallel.no_sync`](https://pytorch.org/docs/stable/fsdp.html#torch.distributed.fsdp.FullyShardedDataParallel.no_sync)
    """

    code = "TL701"
    name = "ddp-accumulation-without-no-sync"
    summary = "Gradient accumulation under DDP all-reduces on every micro-batch instead of using `no_sync()`"
    requires_any = DATA_PARALLEL_WRAPPERS

    VALID = [
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                model(batch).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                if (step + 1) % accum != 0:
                    with model.no_sync():
                        model(batch).mean().backward()
                else:
                    model(batch).mean().backward()
                    optimizer.step()
        """),
        Valid("""
            for step, batch in enumerate(loader):
                model(batch).mean().backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
        """),
        Valid("""
            import contextlib
            from torch.nn.parallel import DistributedDataParallel
            model = DistributedDataParallel(net)
            for step, batch in enumerate(loader):
                ctx = model.no_sync() if (step + 1) % accum else contextlib.nullcontext()
                with ctx:
                    model(batch).mean().backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                model.require_backward_grad_sync = (step + 1) % accum == 0
                model(batch).mean().backward()
                if (step + 1) % accum == 0:
                    optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                model(batch).mean().backward()
                optimizer.step()
                if step % 100 == 0:
                    scheduler.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for batch in loader:
                for _ in range(n_critic):
                    critic(batch).mean().backward()
                    critic_opt.step()
                model(batch).mean().backward()
                optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                with accelerator.accumulate(model):
                    model(batch).mean().backward()
                    if (step + 1) % accum == 0:
                        optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                model(batch).mean().backward()
                if (step + 1) % accum == 0:
                    clip(model)
                optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                try:
                    model(batch).mean().backward()
                except RuntimeError:
                    optimizer.zero_grad()
                    raise
                optimizer.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(net)
            for step, batch in enumerate(loader):
                loss = model(batch).mean()
                loss.backward()
                if (step + 1) % accum_steps == 0:
                    optimizer.step()
                    optimizer.zero_grad()
            """,
            line=5,
            message="`model.no_sync()`",
        ),
        Invalid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(net)
            for batch in loader:
                for micro in batch.chunk(4):
                    loss = model(micro).mean() / 4
                    loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            """,
            line=6,
            message="micro-batch",
        ),
        Invalid(
            """
            import torch
            from torch.nn.parallel import DistributedDataParallel as DDP
            def train(net, loader, optimizer, scaler, accum):
                ddp_model = DDP(net)
                for i, (x, y) in enumerate(loader):
                    with torch.autocast("cuda"):
                        loss = ddp_model(x).mean()
                    scaler.scale(loss / accum).backward()
                    if (i + 1) % accum == 0:
                        scaler.step(optimizer)
                        scaler.update()
            """,
            line=8,
            message="`ddp_model.no_sync()`",
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            model = FSDP(net)
            step = 0
            while True:
                batch = next(data_iter)
                model(batch).mean().backward()
                step += 1
                if step % args.gradient_accumulation_steps == 0:
                    optimizer.step()
            """,
            line=6,
        ),
        Invalid(
            """
            import torch.nn.parallel as par
            class Trainer:
                def __init__(self, net):
                    self.model = par.DistributedDataParallel(net)
                def fit(self, loader):
                    for step, batch in enumerate(loader):
                        self.model(batch).mean().backward()
                        if step % self.accum == 0:
                            self.optimizer.step()
            """,
            line=7,
            message="`self.model.no_sync()`",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.wrapped: List[str] = []  # names the DDP/FSDP model is stored under
        self.has_wrapper = False
        self.wrapper: Optional[cst.Call] = None  # the first DDP/FSDP wrap
        self.backwards: List[Tuple[Site, cst.Call]] = []
        self.steps: List[Site] = []

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if is_data_parallel_wrapper(ctx, node):
            self.has_wrapper = True
            self.wrapper = self.wrapper or node
            parent = ctx.current_parent()
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = dotted_name(parent.targets[0].target)
                if target is not None:
                    self.wrapped.append(target)
            return
        if ctx.loop is None or not isinstance(node.func, cst.Attribute):
            return
        attr = node.func.attr.value
        if attr == "backward":
            self.backwards.append((ctx.site(), node))
        elif attr == "step" and not node.args and optimizer_receiver(node.func.value):
            self.steps.append(ctx.site())
        elif attr == "step" and last_name(node.func.value) and "scaler" in (last_name(node.func.value) or "").lower():
            self.steps.append(ctx.site())

    def finish(self) -> None:
        if not self.has_wrapper or not self.backwards:
            return
        steps_by_loop: dict = {}
        for site in self.steps:
            steps_by_loop.setdefault(id(site.loop), []).append(site)
        managed: Set[int] = set()
        for site, call in self.backwards:
            loop = site.loop
            if loop is None or site.in_exception_path():
                continue
            shape = self._accumulation(site, loop, steps_by_loop)
            if shape is None:
                continue
            scope = site.function.node if site.function is not None else self.ctx.module
            if id(scope) not in managed and any(token in self.ctx.code_for(scope) for token in _SYNC_CONTROL):
                managed.add(id(scope))
            if id(scope) in managed:
                continue
            model = self._model_name(site)
            assert self.wrapper is not None  # has_wrapper
            self.report(
                call,
                f"backward runs on every {shape} but the optimizer steps only once per accumulation cycle: "
                f"under DistributedDataParallel each of these backward passes all-reduces the gradients; "
                f"run the non-stepping micro-batches under `{model}.no_sync()`",
                evidence=[
                    Evidence(f"the model is wrapped: `{self.ctx.code_line(self.wrapper)}`", node=self.wrapper),
                    Evidence(f"backward runs on every {shape}; the optimizer steps less often", node=loop.node),
                ],
            )

    def _accumulation(self, site: Site, loop: LoopInfo, steps_by_loop: dict) -> Optional[str]:
        here = steps_by_loop.get(id(loop), [])
        if here:
            if site.under_periodic_guard(within=loop, accumulation_is_periodic=True):
                return None
            if all(step.under_periodic_guard(within=loop, accumulation_is_periodic=True) for step in here):
                return f"iteration of {loop.line_hint}"
            return None
        parent = loop.parent
        if parent is not None and steps_by_loop.get(id(parent)):
            if any(
                not step.under_periodic_guard(within=parent, accumulation_is_periodic=True)
                for step in steps_by_loop[id(parent)]
            ):
                return f"micro-batch of {loop.line_hint}"
        return None

    def _model_name(self, site: Site) -> str:
        if len(set(self.wrapped)) == 1:
            return self.wrapped[0]
        return "model"
