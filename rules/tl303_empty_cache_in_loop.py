from __future__ import annotations

from typing import List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import FunctionInfo, LoopInfo, Site, per_batch_evidence
from torchlint.rule import Invalid, Rule, Valid

_EMPTY_CACHE = frozenset(
    {
        "torch.cuda.empty_cache",
        "torch.cuda.memory.empty_cache",
        "torch.accelerator.empty_cache",
        "torch.accelerator.memory.empty_cache",
    }
)


class EmptyCacheInLoop(Rule):
    """## What it does
    Flags `torch.cuda.empty_cache()` (also `torch.cuda.memory.empty_cache()`
    and `torch.accelerator.empty_cache()`) that runs on every iteration of a
    batch loop: in the loop body, or in a function of the same module that
    the loop calls on every iteration.

    It stays silent under a periodic guard (`if step % 100 == 0:`), on
    exception paths (the usual `except torch.cuda.OutOfMemoryError:`
    recovery), once per epoch, and in loops that are not batch loops
    (loading several models one after another, benchmarking sizes).

    ## Why is this bad?
    The caching allocator keeps freed blocks so that the next iteration, which
    allocates the same sizes again, gets them without a `cudaMalloc`.
    `empty_cache()` synchronizes the device and returns every unused block to
    the driver, so the next iteration pays for fresh `cudaMalloc`/`cudaFree`
    calls, which synchronize too. It does not make more memory available to
    PyTorch itself; it only helps other processes, or fragmentation in rare
    cases, and there once per epoch is plenty.

    ## Example
    ```python
    import torch

    for batch in loader:
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        torch.cuda.empty_cache()
    ```

    Use instead:
    ```python
    import torch

    for epoch in range(epochs):
        for batch in loader:
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        torch.cuda.empty_cache()
    ```

    ## Fix safety
    There is no automatic fix: where (and whether) to release the cache
    depends on why it was added, for example to leave memory to another
    process.

    ## References
    - [`torch.cuda.empty_cache`](https://pytorch.org/docs/stable/generated/torch.cuda.empty_cache.html)
    - [CUDA semantics: memory management](https://pytorch.org/docs/stable/notes/cuda.html#memory-management)
    - [Performance tuning guide](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html)
    """

    code = "TL303"
    name = "empty-cache-in-loop"
    summary = "`torch.cuda.empty_cache()` runs on every iteration of a batch loop"
    fix_availability = "none"
    requires_any = ("empty_cache",)

    VALID = [
        Valid("""
            import torch
            for epoch in range(10):
                for batch in loader:
                    loss = model(batch)
                    loss.backward()
                torch.cuda.empty_cache()
        """),
        Valid("""
            import torch
            for step, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                if step % 500 == 0:
                    torch.cuda.empty_cache()
        """),
        Valid("""
            import torch
            for batch in loader:
                try:
                    loss = model(batch)
                    loss.backward()
                except torch.cuda.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    continue
        """),
        Valid("""
            import torch
            for name in ["resnet18", "resnet50"]:
                model = load(name).cuda()
                benchmark(model)
                del model
                torch.cuda.empty_cache()
        """),
        Valid("""
            import torch
            for size in (1024, 2048, 4096):
                x = torch.randn(size, size, device="cuda")
                timings.append(bench(x))
                torch.cuda.empty_cache()
        """),
        Valid("""
            import torch
            torch.cuda.empty_cache()
            for batch in loader:
                loss = model(batch)
                loss.backward()
        """),
        Valid("""
            import torch
            def cleanup():
                torch.cuda.empty_cache()

            for batch in loader:
                loss = model(batch)
                loss.backward()
            cleanup()
        """),
        Valid("""
            for batch in loader:
                loss = model(batch)
                loss.backward()
                cache.empty_cache()
        """),
        # Per epoch: the function runs a whole pass over the data, then frees the cache.
        Valid("""
            import torch
            def train_one_epoch(model, loader, optimizer):
                for batch in loader:
                    loss = model(batch)
                    loss.backward()
                    optimizer.step()
                torch.cuda.empty_cache()

            for epoch in range(10):
                train_one_epoch(model, loader, optimizer)
        """),
        Valid("""
            import torch
            def release():
                torch.cuda.empty_cache()

            def run(config):
                for batch in loader:
                    loss = model(batch)
                    loss.backward()
                release()

            for config in ("O1", "O2", "O3"):
                run(config)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                torch.cuda.empty_cache()
            """,
            line=5,
            message="every iteration",
        ),
        Invalid(
            """
            from torch.cuda import empty_cache
            for x, y in train_loader:
                out = model(x)
                empty_cache()
            """,
        ),
        Invalid(
            """
            import torch as T
            for x, y in val_loader:
                with T.no_grad():
                    preds.append(model(x))
                T.cuda.memory.empty_cache()
            """,
        ),
        Invalid(
            """
            import torch
            def free_memory():
                torch.cuda.empty_cache()

            for batch in loader:
                loss = model(batch)
                loss.backward()
                free_memory()
            """,
            line=3,
            message="called from",
        ),
        Invalid(
            """
            import torch
            while True:
                batch = next(data_iter)
                loss = model(batch)
                loss.backward()
                optimizer.step()
                torch.cuda.empty_cache()
            """,
        ),
        Invalid(
            """
            import torch
            for epoch in range(3):
                for i, batch in enumerate(loader):
                    loss = model(batch)
                    loss.backward()
                    if loss.item() > 10:
                        print("spike")
                    torch.cuda.empty_cache()
            """,
            line=8,
        ),
        Invalid(
            """
            import torch
            for batch in tqdm(loader):
                with torch.no_grad():
                    out = model(batch)
                    torch.cuda.empty_cache()
            """,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.Call]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.loop is None and self.ctx.function is None:
            return
        if self.ctx.qualified_name(node.func) in _EMPTY_CACHE:
            self.candidates.append((self.ctx.site(), node))

    def finish(self) -> None:
        epoch_functions = self._epoch_functions()
        for site, node in self.candidates:
            if site.in_exception_path():
                continue
            loop, helper = site.batch_context()
            if loop is None:
                continue
            if helper is not None:
                loop = self._per_batch_caller(helper, epoch_functions)
                if loop is None:
                    continue  # reached only through a function that runs a whole pass over the data
            if site.under_periodic_guard(within=loop if helper is None else None):
                continue
            if helper is None:
                message = (
                    f"`empty_cache()` runs on every iteration of {loop.line_hint}: it synchronizes and throws away "
                    "the cached blocks the next iteration allocates again; call it once per epoch, or not at all"
                )
            else:
                message = (
                    f"`empty_cache()` in `{helper.name}()` runs once per batch: it is called from {loop.line_hint}; "
                    "it synchronizes and throws away the cached blocks the next iteration needs"
                )
            self.report(node, message, evidence=[per_batch_evidence(loop, helper)])

    def _epoch_functions(self) -> Set[str]:
        """Module functions with a batch loop of their own (``train_one_epoch``):
        one call is a whole pass over the data, so a loop calling them is an
        epoch loop, and what they run after their loop runs once per epoch."""
        return {
            loop.function.name
            for loop in self.ctx.facts.loops.values()
            if loop.function is not None and (loop.iterates_data or loop.trains or loop.pulls_batches)
        }

    def _per_batch_caller(self, helper: FunctionInfo, epoch_functions: Set[str]) -> Optional[LoopInfo]:
        """A batch loop that calls ``helper`` on every iteration without going
        through an epoch function (see ``_epoch_functions``)."""
        if helper.name in epoch_functions:
            return None
        facts = self.ctx.facts
        callers, frontier = {helper.name}, [helper.name]
        while frontier:
            name = frontier.pop()
            for infos in facts.functions.values():
                for info in infos:
                    if name in info.calls and info.name not in callers and info.name not in epoch_functions:
                        callers.add(info.name)
                        frontier.append(info.name)

        def per_batch(loop: LoopInfo) -> bool:
            return (
                loop.iterates_data
                or loop.trains
                or loop.pulls_batches
                or any(facts.function_trains(name) and name not in epoch_functions for name in loop.calls)
            )

        return self.ctx.facts_batch_caller(helper, callers, per_batch)
