from __future__ import annotations

from typing import Optional

import libcst as cst

from torchlint.facts import keyword
from torchlint.rule import SAFE, UNSAFE, Invalid, Rule, Valid
from torchlint.tensors import device_move

# Factories that take ``device=`` and return the same values wherever they run.
_DETERMINISTIC = frozenset(
    "torch." + name
    for name in (
        "zeros ones empty full arange range linspace logspace eye tensor as_tensor "
        "empty_strided scalar_tensor tril_indices triu_indices"
    ).split()
)
# Random factories: the device's generator draws different numbers than the CPU's.
_RANDOM = frozenset("torch." + name for name in "rand randn randint randperm".split())
# The ``*_like`` factories are not listed: they allocate on their input's
# device, which is usually the device already (``zeros_like(latents).to(device, dtype)``).


class CpuTensorThenMove(Rule):
    """## What it does
    Flags a tensor made by a factory function on the CPU and then copied to
    a device: `torch.zeros(n).cuda()`, `torch.randn(n).to(device)`,
    `torch.tensor(data).to(device)`, `torch.arange(n).to(x.device)` and the
    like, for the factories that accept `device=` (`zeros`, `ones`, `empty`,
    `full`, `arange`, `linspace`, `eye`, `tensor`, `as_tensor`, `rand`,
    `randn`, `randint`, `randperm`, …).

    Not flagged: factories that already pass `device=`, random factories
    that draw from an explicit `generator=` (a CPU generator is a common way
    to get the same numbers on every device), moves to the CPU, dtype casts,
    `torch.from_numpy(...)` (which cannot allocate on a device), and the
    `*_like` factories, which allocate on their input's device.

    ## Why is this bad?
    The tensor is allocated and filled on the host, then copied to the device
    through a blocking host-to-device transfer, then the host copy is thrown
    away. Passing `device=` allocates and fills it on the device directly: no
    host allocation, no transfer, no synchronization with the host.

    ## Example
    ```python
    import torch

    positions = torch.arange(seq_len).to(device)
    mask = torch.ones(batch_size, seq_len).cuda()
    ```

    Use instead:
    ```python
    import torch

    positions = torch.arange(seq_len, device=device)
    mask = torch.ones(batch_size, seq_len, device="cuda")
    ```

    ## Fix safety
    The fix moves the device into the factory call. It is safe for the
    deterministic factories: the result has the same values, dtype and
    device. It is unsafe for random factories, whose values come from the
    device's generator instead of the CPU's (seeded runs draw different
    numbers), and for factories with `requires_grad=True`, where the result
    becomes a leaf tensor (with its own `.grad`) instead of a copy. When the
    `.to(...)` call also changes the dtype or passes other arguments, there
    is no fix.

    ## References
    - [CUDA semantics: best practices, device-agnostic code](https://pytorch.org/docs/stable/notes/cuda.html#best-practices)
    - [Performance tuning guide: create tensors directly on the target device](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#create-tensors-directly-on-the-target-device)
    - [Tensor creation ops](https://pytorch.org/docs/stable/torch.html#creation-ops)
    """

    code = "TL204"
    name = "cpu-tensor-then-move"
    summary = "A tensor is created on the CPU and then copied to the device"
    fix_availability = "sometimes"
    requires_any = ("torch",)

    VALID = [
        # *_like factories allocate where their input lives.
        Valid("""
            import torch
            mask = torch.zeros_like(latents).to(device, dtype)
            noise = torch.randn_like(latents).to(device)
        """),
        Valid("""
            import torch
            x = torch.zeros(3, device=device)
            y = torch.arange(10, device=x.device)
        """),
        # A CPU generator for reproducible numbers.
        Valid("""
            import torch
            g = torch.Generator().manual_seed(0)
            noise = torch.randn(4, 4, generator=g).to(device)
        """),
        # from_numpy cannot allocate on the device.
        Valid("""
            import torch
            x = torch.from_numpy(array).to(device)
        """),
        # dtype casts and moves to the CPU.
        Valid("""
            import torch
            a = torch.zeros(3).to(torch.float16)
            b = torch.ones(3).to("cpu")
            c = torch.ones(3).cpu()
        """),
        # The factory already has a device: .to() changes the dtype.
        Valid("""
            import torch
            x = torch.zeros(3, device="cuda").to(dtype)
        """),
        # Not a factory: a model's output, or a tensor made by other code.
        Valid("""
            import torch
            y = model(x).to(device)
            z = torch.from_numpy(arr).float().cuda()
            w = helper.zeros(3).cuda()
        """),
        # Moved to another tensor's dtype and device at once.
        Valid("""
            import torch
            t = torch.ones(3).to(other)
        """),
        # numpy's zeros.
        Valid("""
            import numpy as np
            x = np.zeros(3)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            positions = torch.arange(seq_len).to(device)
            """,
            fixed="""
            import torch
            positions = torch.arange(seq_len, device=device)
            """,
            message="`torch.arange(...)`",
        ),
        Invalid(
            """
            import torch
            mask = torch.ones(4, 8).cuda()
            """,
            fixed="""
            import torch
            mask = torch.ones(4, 8, device="cuda")
            """,
        ),
        Invalid(
            """
            import torch as T
            labels = T.tensor([1, 2, 3]).to(device=dev, non_blocking=True)
            """,
            fixed="""
            import torch as T
            labels = T.tensor([1, 2, 3], device=dev)
            """,
        ),
        Invalid(
            """
            from torch import zeros
            buf = zeros(16, dtype=torch.long).cuda(rank)
            """,
            fixed="""
            from torch import zeros
            buf = zeros(16, dtype=torch.long, device=rank)
            """,
        ),
        Invalid(
            """
            import torch
            ids = torch.arange(n).to(x.device)
            """,
            fixed="""
            import torch
            ids = torch.arange(n, device=x.device)
            """,
        ),
        # Random factory: unsafe fix only.
        Invalid(
            """
            import torch
            noise = torch.randn(2, 3).to(device)
            """,
            fixed=None,
            message="random",
        ),
        Invalid(
            """
            import torch
            noise = torch.randn(2, 3).to(device)
            """,
            fixed="""
            import torch
            noise = torch.randn(2, 3, device=device)
            """,
            unsafe_fixes=True,
        ),
        # requires_grad: the fix makes a leaf tensor, unsafe.
        Invalid(
            """
            import torch
            w = torch.zeros(3, requires_grad=True).cuda()
            """,
            fixed=None,
        ),
        # dtype and device at once: reported, no fix.
        Invalid(
            """
            import torch
            t = torch.tensor(values).to(device, torch.float16)
            """,
            fixed=None,
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                weights = torch.ones(len(batch), dtype=torch.float).to("cuda:0")
            """,
            fixed="""
            import torch
            for batch in loader:
                weights = torch.ones(len(batch), dtype=torch.float, device="cuda:0")
            """,
        ),
        Invalid(
            """
            import torch
            eye = torch.eye(
                n,
                dtype=torch.float32,
            ).to(device)
            """,
            fixed="""
            import torch
            eye = torch.eye(
                n,
                dtype=torch.float32,
                device=device,
            )
            """,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda"):
            return
        factory = func.value
        if not isinstance(factory, cst.Call):
            return
        qname = self.ctx.qualified_name(factory.func)
        random = qname in _RANDOM
        if not (random or qname in _DETERMINISTIC):
            return
        if any(keyword(factory, k) is not None for k in ("device", "pin_memory", "out")):
            return
        if random and keyword(factory, "generator") is not None:
            return
        if any(arg.star for arg in factory.args) and qname not in ("torch.tensor", "torch.as_tensor"):
            return  # **kwargs may already hold a device
        if device_move(self.ctx, node) != "device":
            return
        short = qname.rsplit(".", 1)[-1]  # type: ignore[union-attr]
        requires_grad = keyword(factory, "requires_grad")
        message = (
            f"`torch.{short}(...)` creates the tensor on the CPU and `.{func.attr.value}(...)` then copies it to the device; "
            "pass `device=` to the factory instead"
        )
        if random:
            message += " (the device's random generator draws different numbers than the CPU's)"
        fix = None
        device = self._device_argument(node)
        if device is not None:
            unsafe = random or (requires_grad is not None and not (isinstance(requires_grad.value, cst.Name) and requires_grad.value.value == "False"))
            new_arg = cst.Arg(
                keyword=cst.Name("device"),
                value=device,
                equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")),
            )
            args = list(factory.args)
            if args and isinstance(args[-1].comma, cst.Comma):
                # A trailing comma: the new argument takes over the layout before
                # the closing parenthesis, the old last one the layout between arguments.
                new_arg = new_arg.with_changes(comma=args[-1].comma)
                between = args[-2].comma if len(args) > 1 and isinstance(args[-2].comma, cst.Comma) else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                args[-1] = args[-1].with_changes(comma=between)
            new_call = factory.with_changes(args=args + [new_arg])
            fix = self.ctx.fix(UNSAFE if unsafe else SAFE, "Pass `device=` to the factory", self.ctx.replace(node, new_call))
        self.report(node, message, fix)

    def _device_argument(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The device of a ``.to(device[, non_blocking=…])``/``.cuda([device])`` call
        with no other effect, else None (no fix)."""
        method = call.func.attr.value  # type: ignore[attr-defined]
        others = [a for a in call.args if not (a.keyword is not None and a.keyword.value == "non_blocking")]
        if method == "cuda":
            if not others:
                return cst.SimpleString('"cuda"')
            if len(others) == 1 and (others[0].keyword is None or others[0].keyword.value == "device"):
                return others[0].value
            return None
        if len(others) == 1 and not others[0].star and (others[0].keyword is None or others[0].keyword.value == "device"):
            return others[0].value
        return None
