from __future__ import annotations

import re
from typing import List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    FunctionInfo,
    LoopInfo,
    Site,
    dotted_name,
    iter_subtree,
    last_name,
    per_batch_evidence,
)
from torchlint.rule import Invalid, Rule, Valid

# Device-wide synchronizations, by qualified name.
_DEVICE_SYNCS = frozenset(
    {
        "torch.cuda.synchronize",
        "torch.accelerator.synchronize",
        "torch.xpu.synchronize",
        "torch.mps.synchronize",
    }
)
# Calls whose result is a stream or an event.
_STREAM_FACTORIES = frozenset(
    {
        "torch.cuda.current_stream",
        "torch.cuda.default_stream",
        "torch.cuda.Stream",
        "torch.cuda.Event",
        "torch.Stream",
        "torch.Event",
        "torch.accelerator.current_stream",
    }
)
_STREAM_NAME = re.compile(r"(?i)(stream|event)s?$|^(ev|evt)$")
# Reading a clock: the sync exists to make a measurement honest.
_CLOCKS = frozenset(
    {
        "time.time",
        "time.perf_counter",
        "time.perf_counter_ns",
        "time.monotonic",
        "time.monotonic_ns",
        "time.time_ns",
        "time.process_time",
        "timeit.default_timer",
        "datetime.datetime.now",
    }
)
# Guards that switch syncs on for debugging, profiling or benchmarking only.
_DIAGNOSTIC_GUARD = re.compile(r"(?i)(profil|debug|bench|timing|sync|measure|verbose|trace)")
_TIMING_FUNCTION = re.compile(r"(?i)(bench|profil|timing|timed|measure|latency|throughput|warmup|warm_up)")


class SynchronizeInLoop(Rule):
    """## What it does
    Flags an explicit synchronization with the GPU, `torch.cuda.synchronize()`,
    `stream.synchronize()` or `event.synchronize()`, in the body of a training
    or evaluation loop (or in a module function that such a loop calls every
    batch), where it runs once per batch.

    It complements TL101 (`host-sync-in-loop`), which reports the *implicit*
    syncs of reading a value back (`.item()`, `.cpu()`, `print(t)`); this rule
    reports the *explicit* ones.

    The rule stays silent where the code is evidently timing something (a
    clock is read in the same loop or function: `time.perf_counter()`,
    `event.elapsed_time(...)`), in functions named for
    benchmarking or profiling, under a periodic guard (`if step % N == 0:`),
    under a debugging/profiling switch (`if args.profile:`), on exception
    paths, and in loops that do not run per batch.

    Test modules (`test_*.py`, `*_test.py`, `conftest.py`, files under
    `test/`, `tests/` or `testing/`) are skipped: a test that synchronizes inside its loops
    checks a result on purpose, and its speed is not the training run's.
    Set the `check-tests` option to check them too.

    ## Why is this bad?
    A synchronization blocks the host until every kernel queued on the device
    (or stream) has finished. The host cannot queue the next step's work in
    the meantime, so each batch starts with an idle GPU. Synchronizing is only
    needed before reading results on the host (which the reading operation
    already does) or to measure time; PyTorch orders work on one stream by
    itself.

    ## Example
    ```python
    import torch

    for images, labels in loader:
        loss = criterion(model(images.cuda()), labels.cuda())
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
    ```

    Use instead:
    ```python
    import torch

    for images, labels in loader:
        loss = criterion(model(images.cuda()), labels.cuda())
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    ```

    ## Fix safety
    There is no fix: whether the synchronization can go depends on what it
    protects (a host read of a `non_blocking` copy, a measurement, a cross-
    stream handoff that should use `stream.wait_stream`/`event.wait` instead).

    ## References
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    - [`torch.cuda.synchronize`](https://pytorch.org/docs/stable/generated/torch.cuda.synchronize.html)
    - [CUDA semantics: CUDA streams](https://pytorch.org/docs/stable/notes/cuda.html#cuda-streams)
    - [Performance tuning guide: avoid unnecessary CPU-GPU synchronization](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#avoid-unnecessary-cpu-gpu-synchronization)
    """

    code = "TL102"
    name = "synchronize-in-loop"
    summary = "An explicit GPU synchronize runs on every iteration of a batch loop"
    fix_availability = "none"
    requires_any = ("synchronize",)

    VALID = [
        # Timing: a clock read next to the sync.
        Valid("""
            import time, torch
            for batch in loader:
                start = time.perf_counter()
                loss = model(batch)
                loss.backward()
                torch.cuda.synchronize()
                step_times.append(time.perf_counter() - start)
        """),
        # Timing with CUDA events.
        Valid("""
            import torch
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            for batch in loader:
                start.record()
                loss = model(batch)
                loss.backward()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        """),
        # Periodic guard.
        Valid("""
            import torch
            for step, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                optimizer.step()
                if step % 100 == 0:
                    torch.cuda.synchronize()
                    print(loss.item())
        """),
        # After the loop.
        Valid("""
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
            torch.cuda.synchronize()
        """),
        # Debug switch.
        Valid("""
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                if args.debug_sync:
                    torch.cuda.synchronize()
        """),
        # A benchmark function.
        Valid("""
            import torch
            def benchmark(model, loader):
                for batch in loader:
                    model(batch)
                    torch.cuda.synchronize()
        """),
        # A warm-up / polling loop that is not a batch loop.
        Valid("""
            import torch
            for _ in range(10):
                y = model(x)
                torch.cuda.synchronize()
        """),
        # Exception path.
        Valid("""
            import torch
            for batch in loader:
                try:
                    loss = model(batch)
                except RuntimeError:
                    torch.cuda.synchronize()
                    raise
        """),
        # Not torch's synchronize.
        Valid("""
            for batch in loader:
                loss = model(batch)
                loss.backward()
                store.synchronize()
                lock.synchronize()
        """),
        # Once per epoch, outside the batch loop.
        Valid("""
            import torch
            for epoch in range(3):
                for batch in loader:
                    loss = model(batch)
                    loss.backward()
                torch.cuda.synchronize()
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
            """,
            line=6,
            message="`torch.cuda.synchronize()`",
        ),
        Invalid(
            """
            import torch as T
            for x, y in train_loader:
                out = model(x)
                T.cuda.synchronize()
            """,
        ),
        Invalid(
            """
            from torch.cuda import synchronize
            for batch in val_loader:
                out = model(batch)
                synchronize()
            """,
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                torch.cuda.current_stream().synchronize()
            """,
            message="stream",
        ),
        Invalid(
            """
            import torch
            copy_stream = torch.cuda.Stream()
            for batch in loader:
                with torch.cuda.stream(copy_stream):
                    batch = batch.cuda(non_blocking=True)
                copy_stream.synchronize()
                loss = model(batch)
                loss.backward()
            """,
        ),
        Invalid(
            """
            import torch
            done = torch.cuda.Event()
            for batch in loader:
                out = model(batch)
                done.record()
                done.synchronize()
            """,
        ),
        Invalid(
            """
            import torch
            def train_step(batch):
                loss = model(batch)
                loss.backward()
                torch.cuda.synchronize()

            for batch in loader:
                train_step(batch)
            """,
            line=5,
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
                torch.cuda.synchronize()
            """,
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                torch.accelerator.synchronize()
                torch.cuda.synchronize(device)
            """,
            count=2,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.Call, str]] = []
        self.timing_loops: Set[int] = set()
        self.timing_functions: Set[int] = set()

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        if ctx.loop is None and ctx.function is None:
            return
        if self._reads_clock(node):
            loop: Optional[LoopInfo] = ctx.loop
            while loop is not None:
                self.timing_loops.add(id(loop))
                loop = loop.parent
            if ctx.loop is None and ctx.function is not None:
                self.timing_functions.add(id(ctx.function))
            return
        what = self._sync_kind(node)
        if what is not None:
            self.candidates.append((ctx.site(), node, what))

    def _reads_clock(self, node: cst.Call) -> bool:
        qname = self.ctx.qualified_name(node.func)
        if qname in _CLOCKS:
            return True
        return isinstance(node.func, cst.Attribute) and node.func.attr.value == "elapsed_time"

    def _sync_kind(self, node: cst.Call) -> Optional[str]:
        qname = self.ctx.qualified_name(node.func)
        if qname in _DEVICE_SYNCS:
            return f"`{qname}()`"
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "synchronize" and not node.args:
            if _is_stream_like(self.ctx, func.value):
                return "a stream/event `.synchronize()`"
        return None

    def finish(self) -> None:
        for site, node, what in self.candidates:
            if site.in_exception_path() or self._timing(site) or _under_diagnostic_guard(site):
                continue
            loop, helper = site.batch_context()
            if loop is None:
                continue
            if id(loop) in self.timing_loops:
                continue
            if site.under_periodic_guard(within=loop if helper is None else None):
                continue
            if helper is None:
                message = (
                    f"{what} blocks the host until the GPU is idle on every iteration of {loop.line_hint}; "
                    "remove it, or synchronize only every N steps or around a measurement"
                )
            else:
                message = (
                    f"{what} in `{helper.name}()` blocks the host until the GPU is idle once per batch: "
                    f"it is called from {loop.line_hint}; remove it, or synchronize only every N steps"
                )
            self.report(node, message, evidence=[per_batch_evidence(loop, helper)])

    def _timing(self, site: Site) -> bool:
        for loop in site.loops():
            if id(loop) in self.timing_loops:
                return True
        function: Optional[FunctionInfo] = site.function
        while function is not None:
            if id(function) in self.timing_functions or _TIMING_FUNCTION.search(function.name):
                return True
            function = function.parent
        return False


def _is_stream_like(ctx, expr: cst.BaseExpression) -> bool:
    """A stream or an event: made by a torch stream/event factory, or named so."""
    if isinstance(expr, cst.Call):
        return ctx.qualified_name(expr.func) in _STREAM_FACTORIES or last_name(expr.func) in (
            "current_stream",
            "default_stream",
        )
    name = dotted_name(expr)
    if name is None:
        return False
    value = ctx.value_of(name)
    if isinstance(value, cst.Call) and ctx.qualified_name(value.func) in _STREAM_FACTORIES:
        return True
    last = name.rsplit(".", 1)[-1]
    return bool(_STREAM_NAME.search(last))


def _under_diagnostic_guard(site: Site) -> bool:
    for ancestor, child in site.ancestors():
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            return False
        if isinstance(ancestor, cst.If) and child is ancestor.body:
            for sub in iter_subtree(ancestor.test):
                if isinstance(sub, (cst.Name, cst.Attribute)):
                    name = last_name(sub)
                    if name and _DIAGNOSTIC_GUARD.search(name):
                        return True
    return False
