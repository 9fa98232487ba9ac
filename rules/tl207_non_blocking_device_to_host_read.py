from __future__ import annotations

from typing import Dict, List

import libcst as cst

from torchlint.model import device_move, dotted_name, keyword, literal_bool
from torchlint.rule import Evidence, Invalid, Rule, Valid

# Reading a tensor's memory on the host.
_READ_METHODS = frozenset({"numpy", "tolist", "item", "__array__"})
_READ_FUNCTIONS = frozenset({"float", "int", "bool", "print", "str", "repr", "list"})
# Reads that synchronize the host with the device (and so complete every copy queued before them).
_SYNC_METHODS = frozenset({"synchronize", "item", "tolist"})
_HOST_FACTORIES = frozenset({"torch.empty", "torch.zeros", "torch.empty_like", "torch.zeros_like", "torch.ones"})


class NonBlockingDeviceToHostRead(Rule):
    """## What it does
    Flags a tensor copied from the device to the host with
    `non_blocking=True`, `t.to("cpu", non_blocking=True)` or
    `host_buffer.copy_(t, non_blocking=True)` into a pinned or CPU buffer,
    that is then read on the host (`.numpy()`, `.tolist()`, `.item()`,
    `float()`, `print()`, numpy functions, iteration) before anything makes
    the host wait for the copy: `torch.cuda.synchronize()`,
    `stream.synchronize()`, `event.synchronize()`, or another blocking read
    from the device.

    The rule follows the statements of one function in order; a
    synchronize anywhere between the copy and the read (in any branch)
    counts.

    ## Why is this bad?
    A `non_blocking` copy to the host only *queues* the copy and returns at
    once, handing back a CPU tensor whose memory the GPU has not written yet.
    Reading it before synchronizing reads stale or partly written memory:
    zeros, values from an earlier step, or garbage, with no error. This is a
    correctness bug, not a performance one. `event.wait()` is not enough: it
    orders streams, not the host.

    ## Example
    ```python
    import torch

    preds = logits.argmax(-1).to("cpu", non_blocking=True)
    accuracy = (preds.numpy() == labels).mean()
    ```

    Use instead:
    ```python
    import torch

    preds = logits.argmax(-1).to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    accuracy = (preds.numpy() == labels).mean()
    ```

    ## Fix safety
    There is no automatic fix: where to synchronize (right before the read,
    or with an event recorded after the copy) depends on what else is in
    flight. Dropping `non_blocking=True` is the simplest correct change.

    ## References
    - [A guide on good usage of `non_blocking` and `pin_memory()`: device-to-host copies](https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html)
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    - [`torch.Tensor.to`](https://pytorch.org/docs/stable/generated/torch.Tensor.to.html)
    - [`torch.cuda.Event.synchronize`](https://pytorch.org/docs/stable/generated/torch.cuda.Event.html)
    """

    code = "TL207"
    name = "non-blocking-device-to-host-read"
    summary = "A non_blocking device-to-host copy is read on the host before a synchronize"
    fix_availability = "none"
    requires_any = ("non_blocking",)

    VALID = [
        Valid("""
            import torch
            preds = logits.to("cpu", non_blocking=True)
            torch.cuda.synchronize()
            print(preds.tolist())
        """),
        Valid("""
            import torch
            out = logits.to("cpu", non_blocking=True)
            done = torch.cuda.Event()
            done.record()
            done.synchronize()
            values = out.numpy()
        """),
        # Host-to-device copies with non_blocking are fine.
        Valid("""
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                loss = model(x)
                print(x.shape)
        """),
        # Blocking copies are fine.
        Valid("""
            preds = logits.to("cpu")
            print(preds.numpy())
            host = logits.cpu()
            values = host.tolist()
        """),
        # The copy is returned; the caller decides.
        Valid("""
            def offload(t):
                return t.to("cpu", non_blocking=True)
        """),
        # Another blocking read from the device syncs the stream first.
        Valid("""
            preds = logits.to("cpu", non_blocking=True)
            loss_value = loss.item()
            print(preds.tolist())
        """),
        # Rebound before the read.
        Valid("""
            preds = logits.to("cpu", non_blocking=True)
            preds = logits.cpu()
            print(preds.numpy())
        """),
        # Stream synchronize.
        Valid("""
            import torch
            stream = torch.cuda.current_stream()
            buf = torch.empty(10, pin_memory=True)
            buf.copy_(grad, non_blocking=True)
            stream.synchronize()
            total = buf.sum().item()
        """),
        # non_blocking=False.
        Valid("""
            preds = logits.to("cpu", non_blocking=False)
            print(preds.numpy())
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            preds = logits.argmax(-1).to("cpu", non_blocking=True)
            accuracy = (preds.numpy() == labels).mean()
            """,
            line=3,
            message="`preds`",
        ),
        Invalid(
            """
            values = scores.to("cpu", non_blocking=True).tolist()
            """,
            message="`.tolist()`",
        ),
        Invalid(
            """
            import torch
            cpu = torch.device("cpu")
            host = t.to(torch.device("cpu"), non_blocking=True)
            for v in host:
                print(v)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            buf = torch.empty(1024, pin_memory=True)
            buf.copy_(activations, non_blocking=True)
            stats = buf.numpy().mean()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            done = torch.cuda.Event()
            out = logits.to(device="cpu", non_blocking=True)
            done.record()
            done.wait()
            print(out)
            """,
            line=6,
        ),
        Invalid(
            """
            import numpy as np
            def collect(outputs):
                host = outputs.to("cpu", non_blocking=True)
                return np.asarray(host)
            """,
        ),
        Invalid(
            """
            for batch in loader:
                logits = model(batch)
                preds = logits.argmax(-1).to("cpu", non_blocking=True)
                count = int(preds.sum())
            """,
            message="`int()`",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # One scope per function: name -> the statement that queued its copy.
        self.scopes: List[Dict[str, cst.CSTNode]] = [{}]

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.append({})

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.scopes.pop()

    @property
    def pending(self) -> Dict[str, cst.CSTNode]:
        return self.scopes[-1]

    # -- copies -----------------------------------------------------------------------
    def leave_Assign(self, node: cst.Assign) -> None:
        names = [dotted_name(t.target) for t in node.targets]
        copy = _is_non_blocking_to_host(self.ctx, node.value)
        for name in names:
            if name is None:
                continue
            if copy:
                self.pending[name] = node
            else:
                self.pending.pop(name, None)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        func = node.func
        # host_buffer.copy_(src, non_blocking=True)
        if isinstance(func, cst.Attribute) and func.attr.value == "copy_" and _non_blocking(node):
            target = dotted_name(func.value)
            if target is not None and self._is_host_buffer(target):
                self.pending[target] = node
            return
        if not self.pending and not (isinstance(func, cst.Attribute) and _is_non_blocking_to_host(ctx, func.value)):
            return
        read = self._host_read(node)
        if read is not None:
            what, receiver = read
            direct = _is_non_blocking_to_host(ctx, receiver)
            name = dotted_name(_root(receiver))
            if direct or (name is not None and name in self.pending):
                label = f"`{name}`" if name is not None and not direct else "the result"
                copy = receiver if direct else self.pending[name]  # type: ignore[index]
                self.report(
                    node,
                    f"{what} reads {label} on the host, but it comes from a `non_blocking=True` copy to the CPU "
                    "with no synchronize in between, so it may not have arrived yet; call `torch.cuda.synchronize()` "
                    "(or `event.synchronize()`) first, or drop `non_blocking`",
                    evidence=[_copy_evidence(self.ctx, copy)],
                )
                if name is not None:
                    self.pending.pop(name, None)
                return
        if self._is_sync(node):
            self.pending.clear()

    def visit_For(self, node: cst.For) -> None:
        name = dotted_name(node.iter)
        if name is not None and name in self.pending:
            self.report(
                node.iter,
                f"iterating `{name}` reads it on the host, but it comes from a `non_blocking=True` copy to the CPU "
                "with no synchronize in between, so it may not have arrived yet; call `torch.cuda.synchronize()` "
                "(or `event.synchronize()`) first, or drop `non_blocking`",
                evidence=[_copy_evidence(self.ctx, self.pending[name])],
            )
            self.pending.pop(name, None)

    # -- helpers ----------------------------------------------------------------------
    def _is_host_buffer(self, name: str) -> bool:
        value = self.ctx.value_of(name)
        if not isinstance(value, cst.Call):
            return False
        if isinstance(value.func, cst.Attribute) and value.func.attr.value == "pin_memory":
            return True
        if self.ctx.qualified_name(value.func) in _HOST_FACTORIES:
            pin = keyword(value, "pin_memory")
            device = keyword(value, "device")
            if pin is not None and literal_bool(pin.value):
                return True
            if (
                device is not None
                and isinstance(device.value, cst.SimpleString)
                and device.value.evaluated_value == "cpu"
            ):
                return True
        return False

    def _host_read(self, node: cst.Call):
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in _READ_METHODS:
            return f"`.{func.attr.value}()`", func.value
        if isinstance(func, cst.Name) and func.value in _READ_FUNCTIONS and node.args:
            return f"`{func.value}()`", node.args[0].value
        qname = self.ctx.qualified_name(func) or ""
        if qname.startswith("numpy.") and node.args:
            return f"`{qname.replace('numpy.', 'np.')}()`", node.args[0].value
        return None

    def _is_sync(self, node: cst.Call) -> bool:
        func = node.func
        qname = self.ctx.qualified_name(func) or ""
        if qname.endswith(".synchronize"):
            return True
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _SYNC_METHODS:
                return True
            if method == "cpu" and not node.args:
                return True  # a blocking copy from the device waits for the stream
            if device_move(self.ctx, node) == "cpu" and not _non_blocking(node):
                return True
        return False


def _non_blocking(call: cst.Call) -> bool:
    arg = keyword(call, "non_blocking")
    if arg is None:
        return False
    return literal_bool(arg.value) is not False


def _is_non_blocking_to_host(ctx, expr: cst.BaseExpression) -> bool:
    return isinstance(expr, cst.Call) and device_move(ctx, expr) == "cpu" and _non_blocking(expr)


def _root(expr: cst.BaseExpression) -> cst.BaseExpression:
    """``preds.sum()`` / ``preds[0]`` -> ``preds``: reading a result computed on the host from it."""
    node = expr
    while True:
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and not _is_non_blocking_to_host_shape(node)
        ):
            node = node.func.value
        elif isinstance(node, cst.Subscript):
            node = node.value
        else:
            return node


def _is_non_blocking_to_host_shape(call: cst.Call) -> bool:
    return call.func.attr.value == "to" and keyword(call, "non_blocking") is not None  # type: ignore[attr-defined]


def _copy_evidence(ctx, copy: cst.CSTNode) -> Evidence:
    """The ``non_blocking=True`` copy the read may outrun, with no synchronize after it."""
    return Evidence(f"the copy to the host that may still be running: `{ctx.code_line(copy)}`", node=copy)
