from __future__ import annotations

import re
from typing import List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    FunctionInfo,
    LoopInfo,
    Site,
    child_nodes,
    dotted_name,
    is_periodic_test,
    iter_subtree,
    last_name,
    per_batch_evidence,
)
from torchlint.rule import Evidence, Invalid, Rule, Valid

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

    One timing case is reported: a training loop that synchronizes on every
    step to time it (`batch_time.update(time.time() - end)`) but uses the
    measured time only under a periodic guard (`if idx % print_freq == 0:`).
    The stall is paid on every step for a figure shown on a few; synchronize
    and read the clock on those steps only.

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
            import time
            import torch
            end = time.time()
            for idx, (x, y) in enumerate(loader):
                loss = criterion(model(x.cuda()), y.cuda())
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                batch_time.update(time.time() - end)
                end = time.time()
                if idx % print_freq == 0:
                    print(batch_time.avg)
            """,
            message="to time the step",
        ),
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
            if site.in_exception_path() or self._named_for_timing(site) or _under_diagnostic_guard(site):
                continue
            loop, helper = site.batch_context()
            if loop is None:
                continue
            if site.under_periodic_guard(within=loop if helper is None else None):
                continue
            if self._timing(site) or id(loop) in self.timing_loops:
                self._report_step_timer(site, node, what, loop, helper)
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

    def _report_step_timer(self, site: Site, node: cst.CSTNode, what: str, loop, helper) -> None:
        """A training loop that synchronizes on every step to time it, while it
        shows what it measures only every N steps (``if step % N == 0:``
        below): the stall is paid on every step for a figure read on a few.
        Synchronize and read the clock on the logging steps only. A loop that
        does not train (a benchmark, an evaluation pass) times on purpose."""
        if helper is not None or not isinstance(loop, LoopInfo) or not loop.trains:
            return
        guard = _timing_shown_periodically(self.ctx, loop)
        if guard is None:
            return
        self.report(
            node,
            f"{what} blocks the host until the GPU is idle on every iteration of {loop.line_hint} "
            "to time the step, but the loop shows its figures only every N steps; "
            "synchronize and read the clock on those steps only",
            evidence=[
                per_batch_evidence(loop, helper),
                Evidence("the measured time is shown only under this periodic guard", node=guard),
            ],
        )

    def _named_for_timing(self, site: Site) -> bool:
        """In a function named for benchmarking or profiling: timing is its purpose."""
        function: Optional[FunctionInfo] = site.function
        while function is not None:
            if _TIMING_FUNCTION.search(function.name):
                return True
            function = function.parent
        return False

    def _timing(self, site: Site) -> bool:
        """A clock is read in a loop or function that holds the synchronize."""
        if any(id(loop) in self.timing_loops for loop in site.loops()):
            return True
        function: Optional[FunctionInfo] = site.function
        while function is not None:
            if id(function) in self.timing_functions:
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


def _timing_shown_periodically(ctx, loop: LoopInfo) -> Optional[cst.If]:
    """The periodic ``if`` (``if step % print_freq == 0:``) under which the
    loop uses what its clock measured, when every such use in the loop's own
    body is under one: the names a clock reading is assigned to (``dt = t1 -
    t0``) and the meters it is given to (``batch_time.update(time.time() -
    end)``). None when the measurement is used every step, or not at all."""
    body: cst.BaseSuite = loop.node.body  # type: ignore[attr-defined]
    timed: Set[str] = set()
    for statement in _own_statements(body):
        if _clock_in(ctx, statement):
            timed.update(_defined_names(statement))
    for statement in _own_statements(body):  # ``elapsed = t1 - t0`` after ``t1 = time.time()``
        if isinstance(statement, cst.Assign) and _names_in(statement.value) & timed:
            timed.update(_defined_names(statement))
    if not timed:
        return None
    guards: List[cst.If] = []
    unguarded = False

    def visit(node: cst.CSTNode, guard: Optional[cst.If]) -> None:
        nonlocal unguarded
        if isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return
        if (
            isinstance(node, cst.SimpleStatementLine)
            and _defined_names(node)
            and not _uses_beyond_definition(node, timed)
        ):
            return  # where the measurement is taken or stored
        if isinstance(node, cst.If) and is_periodic_test(node.test):
            guard = node
        if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) in timed:
            if guard is None:
                unguarded = True
            else:
                guards.append(guard)
            return
        for child in child_nodes(node):
            visit(child, guard)

    visit(body, None)
    return guards[0] if guards and not unguarded else None


def _own_statements(body: cst.CSTNode):
    """The simple statements of a loop's body, not those of nested loops or functions."""
    if isinstance(body, (cst.For, cst.While, cst.FunctionDef, cst.ClassDef)):
        return
    if isinstance(body, cst.SimpleStatementLine):
        for statement in body.body:
            yield statement
        return
    for child in child_nodes(body):
        yield from _own_statements(child)


def _clock_in(ctx, node: cst.CSTNode) -> bool:
    return any(
        isinstance(sub, cst.Call)
        and (
            ctx.qualified_name(sub.func) in _CLOCKS
            or (isinstance(sub.func, cst.Attribute) and sub.func.attr.value == "elapsed_time")
        )
        for sub in iter_subtree(node)
    )


def _defined_names(node: cst.CSTNode) -> Set[str]:
    """Names a statement stores into: assignment targets, and the receiver of
    an ``update``/``append``/``add`` call (a meter or a list)."""
    statements = node.body if isinstance(node, cst.SimpleStatementLine) else [node]
    found: Set[str] = set()
    for statement in statements:
        if isinstance(statement, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in statement.targets] if isinstance(statement, cst.Assign) else [statement.target]
            for target in targets:
                for sub in iter_subtree(target):
                    name = dotted_name(sub) if isinstance(sub, (cst.Name, cst.Attribute)) else None
                    if name:
                        found.add(name)
        elif isinstance(statement, cst.Expr) and isinstance(statement.value, cst.Call):
            func = statement.value.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("update", "append", "add", "add_"):
                name = dotted_name(func.value)
                if name:
                    found.add(name)
    return found


def _uses_beyond_definition(node: cst.SimpleStatementLine, timed: Set[str]) -> bool:
    """Does a statement that stores a measurement also read one for another
    purpose (``print(dt)`` on the same line)? Plain stores do not."""
    return any(isinstance(s, cst.Expr) and not _defined_names(s) for s in node.body) and bool(_names_in(node) & timed)


def _names_in(node: cst.CSTNode) -> Set[str]:
    return {
        name
        for sub in iter_subtree(node)
        if isinstance(sub, (cst.Name, cst.Attribute))
        for name in (dotted_name(sub),)
        if name
    }


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
