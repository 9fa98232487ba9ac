from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst

from torchlint.model import (
    UNKNOWN_PART,
    Site,
    child_nodes,
    device_move,
    device_placement,
    iter_subtree,
    keyword,
    per_batch_evidence,
    tensor_type_device,
)
from torchlint.rule import SAFE, UNSAFE, Evidence, Fix, Invalid, Rule, Valid

# Factories that take ``device=`` and return the same values wherever they run.
_DETERMINISTIC = frozenset(
    "torch." + name
    for name in (
        "zeros ones empty full arange range linspace logspace eye empty_strided scalar_tensor tril_indices triu_indices"
    ).split()
)
# Factories that compute their values: on the device, floating-point results can differ from the CPU's.
_COMPUTED = frozenset("torch." + name for name in "arange range".split())
_FLOATING = frozenset("torch." + name for name in "linspace logspace".split())  # always floating-point
# Random factories: the device's generator draws different numbers than the CPU's.
_RANDOM = frozenset("torch." + name for name in "rand randn randint randperm".split())
# Tensor methods and torch functions that compute on their input's device.
_HOST_METHODS = frozenset("float double half long int exp log sin cos sqrt pow unsqueeze view reshape t".split())
_ELEMENTWISE = frozenset("exp log sin cos sqrt pow outer cat stack".split())  # factories are found first
# Factories whose result is an index (integer positions).
_INDEX_FACTORIES = frozenset("torch." + name for name in "arange range randperm randint".split())
# NumPy factories and random draws whose array a torch factory could make on the device.
_NUMPY_FACTORIES = frozenset(
    "numpy." + name
    for name in (
        "zeros ones full empty arange linspace eye "
        "random.normal random.randn random.rand random.uniform random.randint random.random random.standard_normal"
    ).split()
)
# Wrappers that copy a NumPy array into a torch tensor on the host.
_FROM_NUMPY = frozenset(
    "torch." + name for name in "from_numpy tensor as_tensor Tensor FloatTensor LongTensor DoubleTensor".split()
)
# The ``*_like`` factories are not listed: they allocate on their input's
# device, which is usually the device already (``zeros_like(latents).to(device, dtype)``).
# Nor are ``torch.tensor``/``as_tensor``: their data is on the host either way,
# so ``device=`` still copies it over and saves nothing.


class CpuTensorThenMove(Rule):
    """## What it does
    Flags a tensor made by a factory function on the CPU and then copied to
    a device where it runs once per batch: `torch.zeros(n).cuda()`,
    `torch.randn(n).to(device)`, `torch.arange(n).to(x.device)` and the like,
    for the factories that accept `device=` (`zeros`, `ones`, `empty`, `full`,
    `arange`, `linspace`, `eye`, `rand`, `randn`, `randint`, `randperm`, …).
    "Once per batch" means in the body of a batch loop, in a helper such a
    loop calls, in a method a training framework calls per batch (a
    `LightningModule`'s `training_step`, a basicsr model's `feed_data`), or
    in a module's `forward()` and the helpers it calls, in its own file or
    another one (`timestep_embedding` called by `UNet.forward`); one-off
    set-up code is left alone, since one extra copy at start-up costs
    nothing worth a finding.

    Two more shapes of the same copy are flagged, without a fix: a value
    computed on the host from such a factory and then moved
    (`torch.exp(-scale * torch.arange(half) / half).to(t.device)`, where
    every other operand is evidently a Python number), and an index made on
    the host that indexes a tensor on the device (`idx = torch.randperm(n)`,
    then `queue[idx]` with `queue` placed on the GPU in the same scope): each
    use copies the index to the device and waits for the copy. A lazy
    initialization (`if not hasattr(self, "queue"):`) runs once and is left
    alone.

    A move can be written `.type_as(x)` with `x` evidently on the device
    (`torch.zeros(b, c, h, w).type_as(image)` after `image = image.to(device)`):
    it is flagged the same way, without a fix.

    NumPy arrays made by a factory or a random draw (`np.ones(shape)`,
    `np.random.normal(0, 1, shape)`) and copied per step are the same waste,
    in the older idiom: handed to a CUDA tensor type
    (`Tensor(np.ones(shape))` with `Tensor = torch.cuda.FloatTensor if cuda
    else torch.FloatTensor`) or moved with
    `torch.from_numpy(np.random.uniform(...)).to(device)`. A CUDA tensor type
    given only sizes (`Tensor(n, 1).fill_(1.0)`) allocates on the device and
    is not flagged, nor is a NumPy array of the batch's own data.

    Not flagged: a line that runs only on some steps (under a periodic
    guard such as `if step % log_every == 0:`) or on an exception path;
    factories that already pass `device=`, random factories
    that draw from an explicit `generator=` (a CPU generator is a common way
    to get the same numbers on every device), moves to the CPU, dtype casts,
    `torch.from_numpy(...)` of data (it cannot allocate on a device),
    `torch.tensor(data)`/`torch.as_tensor(data)`, whose data is on the host
    anyway (passing `device=` still copies it), and the `*_like` factories,
    which allocate on their input's device.

    ## Why is this bad?
    The tensor is allocated and filled on the host, then copied to the device
    through a blocking host-to-device transfer, then the host copy is thrown
    away. Passing `device=` allocates and fills it on the device directly: no
    host allocation, no transfer, no synchronization with the host.

    ## Example
    ```python
    import torch

    for tokens in loader:
        positions = torch.arange(seq_len).to(device)
        mask = torch.ones(batch_size, seq_len).cuda()
    ```

    Use instead:
    ```python
    import torch

    for tokens in loader:
        positions = torch.arange(seq_len, device=device)
        mask = torch.ones(batch_size, seq_len, device="cuda")
    ```

    ## Fix safety
    The fix moves the device into the factory call. It is safe for the
    factories whose values do not depend on where they are computed
    (`zeros`, `ones`, `empty`, `full`, `eye`, and `arange`/`range` over
    evident integers, such as literals, `len(x)` or `x.size(1)`, without a
    `dtype=`): the result has the same values,
    dtype and device. It is unsafe for `arange`/`range` over anything else
    and for `linspace`/`logspace`, which compute floating-point values on
    the device: `torch.arange(0, 1, 0.1, device="cuda")` differs from the
    CPU's result in the last bits. It is unsafe for random factories, whose values come from the
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
        Valid("""
            import torch

            Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
            for imgs, labels in loader:
                valid = Tensor(imgs.size(0), 1).fill_(1.0)
                targets = Tensor(labels.numpy())
                loss = criterion(model(imgs.type(Tensor)), valid) + targets.sum()
                loss.backward()
        """),
        # Lazy initialization: the first call builds the buffer, later calls reuse it.
        Valid("""
            import torch
            for batch in loader:
                if not hasattr(pool, "queue"):
                    pool.queue = torch.zeros(64, 3).cuda()
        """),
        # A host tensor indexed on the host: nothing crosses to the device.
        Valid("""
            import torch
            for batch in loader:
                weights = torch.ones(64)
                picked = weights[torch.randperm(64)]
        """),
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
        # Periodic: only on logging steps, so not once per batch.
        Valid("""
            import torch
            for step, (x, y) in enumerate(loader):
                loss = model(x.cuda()).sum()
                loss.backward()
                if step % log_every == 0:
                    mask = torch.ones(8).cuda()
                    log(loss, mask)
        """),
        # On an exception path: runs when something failed, not every batch.
        Valid("""
            import torch
            for x, y in loader:
                try:
                    loss = model(x.cuda()).sum()
                except RuntimeError:
                    loss = torch.zeros(1).cuda()
                loss.backward()
        """),
        # A cast on the host, not a move.
        Valid("""
            import torch
            for batch in loader:
                mask = torch.ones(4, 8).type(torch.FloatTensor)
                half = torch.ones(4, 8).type(torch.float16)
        """),
        # numpy's zeros.
        Valid("""
            import numpy as np
            x = np.zeros(3)
        """),
        # One-off set-up, outside any batch loop: one copy at start-up.
        Valid("""
            import torch
            def build(device):
                mask = torch.ones(4, 8).cuda()
                return torch.arange(16).to(device)
            for batch in loader:
                train_step(batch)
        """),
        # Host data: `device=` would copy it over just the same.
        Valid("""
            import torch
            for batch in loader:
                lengths = torch.tensor(batch_lengths).cuda()
                ids = torch.as_tensor(token_ids).to(device)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import numpy as np
            import torch

            Tensor = torch.cuda.FloatTensor if torch.cuda.is_available() else torch.FloatTensor
            for imgs in loader:
                valid = Tensor(np.ones((imgs.size(0), 1)))
                loss = criterion(model(imgs.type(Tensor)), valid)
                loss.backward()
            """,
            fixed=None,
            message="`np.ones(...)` makes the array on the host",
        ),
        Invalid(
            """
            import torch

            for low in loader:
                low = low.to(device)
                canvas = torch.zeros(low.size(0), 3, 256, 256).type_as(low)
                loss = (model(low) - canvas).abs().mean()
                loss.backward()
            """,
            fixed=None,
            message="`.type_as(...)` then copies it to the device",
        ),
        # A host index into a device tensor: copied, and waited for, on every use.
        Invalid(
            """
            import torch
            for batch in loader:
                queue = torch.zeros(64, 3, device="cuda")
                order = torch.randperm(64)
                queue = queue[order]
            """,
            fixed=None,
            line=4,
            message="creates an index on the CPU",
        ),
        # Host math from a factory, then one copy: the factory should take the device.
        Invalid(
            """
            import math
            import torch
            from torch import nn
            class Embedding(nn.Module):
                def forward(self, t, half=64):
                    freqs = torch.exp(-math.log(10000) * torch.arange(half) / half).to(t.device)
                    return t[:, None] * freqs
            """,
            fixed=None,
            message="the expression around it is computed on the CPU",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                positions = torch.arange(seq_len).to(device)
            """,
            fixed="""
            import torch
            for batch in loader:
                positions = torch.arange(seq_len, device=device)
            """,
            unsafe_fixes=True,  # `seq_len` may be a float: arange's values would be computed on the device
            message="`torch.arange(...)`",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                mask = torch.ones(4, 8).cuda()
            """,
            fixed="""
            import torch
            for batch in loader:
                mask = torch.ones(4, 8, device="cuda")
            """,
        ),
        Invalid(
            """
            import torch as T
            for batch in loader:
                labels = T.ones(3).to(device=dev, non_blocking=True)
            """,
            fixed="""
            import torch as T
            for batch in loader:
                labels = T.ones(3, device=dev)
            """,
        ),
        Invalid(
            """
            from torch import zeros
            for batch in loader:
                buf = zeros(16, dtype=torch.long).cuda(rank)
            """,
            fixed="""
            from torch import zeros
            for batch in loader:
                buf = zeros(16, dtype=torch.long, device=rank)
            """,
        ),
        # The legacy tensor-type move: reported, no fix.
        Invalid(
            """
            import torch
            for batch in loader:
                mask = torch.ones(4, 8).type(torch.cuda.FloatTensor)
            """,
            fixed=None,
            message="`.type(...)`",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                ids = torch.arange(n).to(x.device)
            """,
            fixed="""
            import torch
            for batch in loader:
                ids = torch.arange(n, device=x.device)
            """,
            unsafe_fixes=True,
        ),
        # Random factory: unsafe fix only.
        Invalid(
            """
            import torch
            for batch in loader:
                noise = torch.randn(2, 3).to(device)
            """,
            fixed=None,
            message="random",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                noise = torch.randn(2, 3).to(device)
            """,
            fixed="""
            import torch
            for batch in loader:
                noise = torch.randn(2, 3, device=device)
            """,
            unsafe_fixes=True,
        ),
        # requires_grad: the fix makes a leaf tensor, unsafe.
        Invalid(
            """
            import torch
            for batch in loader:
                w = torch.zeros(3, requires_grad=True).cuda()
            """,
            fixed=None,
        ),
        # dtype and device at once: reported, no fix.
        Invalid(
            """
            import torch
            for batch in loader:
                t = torch.ones(n).to(device, torch.float16)
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
            for batch in loader: eye = torch.eye(
                n,
                dtype=torch.float32,
            ).to(device)
            """,
            fixed="""
            import torch
            for batch in loader: eye = torch.eye(
                n,
                dtype=torch.float32,
                device=device,
            )
            """,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # (site, the copying call, message, fix, evidence besides "runs every step")
        self.candidates: List[Tuple[Site, cst.Call, str, Optional[Fix], List[Evidence]]] = []
        # id(factory) -> (site of the indexing, factory, the device tensor, the call that placed it)
        self.indexing: Dict[int, Tuple[Site, cst.Call, cst.BaseExpression, cst.CSTNode]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if tensor_type_device(self.ctx, func) == "device":
            self._numpy_into_device_type(node)
            return
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda", "type", "type_as"):
            return
        if self._numpy_then_moved(node):
            return
        factory = func.value
        if not isinstance(factory, cst.Call) or not self._bare_factory(factory):
            self._computed_on_host(node)
            return
        qname = self.ctx.qualified_name(factory.func)
        random = qname in _RANDOM
        if any(keyword(factory, k) is not None for k in ("device", "pin_memory", "out")):
            return
        if random and keyword(factory, "generator") is not None:
            return
        if any(arg.star for arg in factory.args):
            return  # **kwargs may already hold a device
        if device_move(self.ctx, node) != "device":
            return
        short = qname.rsplit(".", 1)[-1]  # type: ignore[union-attr]
        requires_grad = keyword(factory, "requires_grad")
        message = (
            f"`torch.{short}(...)` creates the tensor on the CPU "
            f"and `.{func.attr.value}(...)` then copies it to the device; "
            "pass `device=` to the factory instead"
        )
        if random:
            message += " (the device's random generator draws different numbers than the CPU's)"
        fix = None
        device = self._device_argument(node) if func.attr.value not in ("type", "type_as") else None
        if device is not None:
            unsafe = (
                random
                or (
                    requires_grad is not None
                    and not (isinstance(requires_grad.value, cst.Name) and requires_grad.value.value == "False")
                )
                or qname in _FLOATING
                or (qname in _COMPUTED and not _integer_literals_only(factory))
            )
            if self._inside_fstring_quoted('"'):
                device = _requoted(device)  # before Python 3.12, an f-string cannot hold its own quote
            new_arg = cst.Arg(
                keyword=cst.Name("device"),
                value=device,
                equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                ),
            )
            args = list(factory.args)
            if args and isinstance(args[-1].comma, cst.Comma):
                # A trailing comma: the new argument takes over the layout before
                # the closing parenthesis, the old last one the layout between arguments.
                new_arg = new_arg.with_changes(comma=args[-1].comma)
                between = (
                    args[-2].comma
                    if len(args) > 1 and isinstance(args[-2].comma, cst.Comma)
                    else cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
                )
                args[-1] = args[-1].with_changes(comma=between)
            new_call = factory.with_changes(args=args + [new_arg])
            fix = self.ctx.fix(
                UNSAFE if unsafe else SAFE, "Pass `device=` to the factory", self.ctx.replace(node, new_call)
            )
        self.candidates.append((self.ctx.site(), node, message, fix, []))

    def _numpy_array(self, expr: cst.BaseExpression) -> Optional[cst.Call]:
        """The NumPy factory or random draw an expression is (``np.ones(shape)``,
        ``np.random.normal(0, 1, shape).astype(np.float32)``), else None."""
        while isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "astype":
            expr = expr.func.value
        if isinstance(expr, cst.Call) and self.ctx.qualified_name(expr.func) in _NUMPY_FACTORIES:
            return expr
        return None

    def _numpy_into_device_type(self, call: cst.Call) -> None:
        """``Tensor(np.ones(shape))`` with ``Tensor = torch.cuda.FloatTensor if
        cuda else torch.FloatTensor``: the array is made on the host and the
        CUDA tensor type copies it over."""
        if len(call.args) != 1 or call.args[0].keyword is not None or call.args[0].star:
            return
        array = self._numpy_array(call.args[0].value)
        if array is None:
            return
        evidence = []
        if isinstance(call.func, cst.Name):
            bound = self.ctx.value_of(call.func.value) or self.ctx.facts.module_constants.get(call.func.value)
            if bound is not None and bound is not UNKNOWN_PART:
                evidence.append(
                    Evidence(
                        f"`{call.func.value}` is a CUDA tensor type: `{self.ctx.code_line(bound, width=60)}`",
                        node=bound,
                    )
                )
        self._report_numpy(call, array, f"`{self.ctx.code_for(call.func)}(...)` (a CUDA tensor type)", evidence)

    def _numpy_then_moved(self, move: cst.Call) -> bool:
        """``torch.from_numpy(np.random.normal(0, 1, shape)).to(device)``: the same, written with a move."""
        receiver = move.func.value  # type: ignore[attr-defined]
        if not isinstance(receiver, cst.Call) or self.ctx.qualified_name(receiver.func) not in _FROM_NUMPY:
            return False
        if len(receiver.args) != 1 or receiver.args[0].keyword is not None or device_move(self.ctx, move) != "device":
            return False
        array = self._numpy_array(receiver.args[0].value)
        if array is None:
            return False
        self._report_numpy(move, array, f"`.{move.func.attr.value}(...)`")  # type: ignore[attr-defined]
        return True

    def _report_numpy(self, node: cst.Call, array: cst.Call, copier: str, evidence: Sequence[Evidence] = ()) -> None:
        made = self.ctx.qualified_name(array.func).replace("numpy.", "np.", 1)  # type: ignore[union-attr]
        message = (
            f"`{made}(...)` makes the array on the host and {copier} copies it to the device; "
            "make it on the device with the torch factory and `device=` (`torch.zeros`, `torch.randn`, …)"
        )
        self.candidates.append((self.ctx.site(), node, message, None, list(evidence)))

    def _bare_factory(self, call: cst.Call) -> bool:
        qname = self.ctx.qualified_name(call.func)
        return qname in _RANDOM or qname in _DETERMINISTIC

    def _computed_on_host(self, move: cst.Call) -> None:
        """``torch.exp(-scale * torch.arange(half) / half).to(t.device)``: a value
        computed on the host from a factory without ``device=`` (the other
        operands are Python numbers or host tensors: a CPU tensor cannot meet a
        device tensor in one operation), then copied. No fix: the factory
        needs ``device=`` and the copy goes."""
        receiver = move.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, (cst.Name, cst.Attribute)) or device_move(self.ctx, move) != "device":
            return
        factory = self._host_core(receiver, 0)
        if factory is None or not self._scalars_only(receiver, factory):
            return
        short = self.ctx.qualified_name(factory.func).rsplit(".", 1)[-1]  # type: ignore[union-attr]
        message = (
            f"`torch.{short}(...)` creates a tensor on the CPU, the expression around it is computed on the "
            f"CPU, and `.{move.func.attr.value}(...)` then copies the result to the device; "  # type: ignore[attr-defined]
            "pass `device=` to the factory and drop the copy"
        )
        self.candidates.append((self.ctx.site(), move, message, None, []))

    def _host_core(self, expr: cst.BaseExpression, depth: int) -> Optional[cst.Call]:
        """The factory without ``device=`` that an expression of torch math,
        arithmetic, indexing and tensor methods is computed from, when every
        part of it stays on the host; None when a part may be anything else
        (a model's output, a function of the project, a device tensor)."""
        if depth > 8:
            return None
        if isinstance(expr, (cst.Integer, cst.Float)):
            return None
        if isinstance(expr, cst.BinaryOperation):
            left, right = self._host_core(expr.left, depth + 1), self._host_core(expr.right, depth + 1)
            if not (self._host_or_scalar(expr.left, left) and self._host_or_scalar(expr.right, right)):
                return None
            return left or right
        if isinstance(expr, cst.UnaryOperation):
            return self._host_core(expr.expression, depth + 1)
        if isinstance(expr, cst.Subscript):
            return self._host_core(expr.value, depth + 1)
        if not isinstance(expr, cst.Call):
            return None
        if self._bare_factory(expr):
            if any(keyword(expr, k) is not None for k in ("device", "out")) or any(a.star for a in expr.args):
                return None
            return expr
        qname = self.ctx.qualified_name(expr.func) or ""
        if qname.startswith("torch."):
            if qname.rsplit(".", 1)[-1] not in _ELEMENTWISE:
                return None
            cores = [(arg.value, self._host_core(arg.value, depth + 1)) for arg in expr.args if arg.keyword is None]
            if cores and all(self._host_or_scalar(value, core) for value, core in cores):
                return next((core for _, core in cores if core is not None), None)
            return None
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _HOST_METHODS:
            return self._host_core(expr.func.value, depth + 1)
        return None

    def _host_or_scalar(self, expr: cst.BaseExpression, core: Optional[cst.Call]) -> bool:
        """A host computation (its core found), a number, or a plain name or a
        ``math.*`` call (Python numbers: a device tensor there would be an error)."""
        if core is not None or isinstance(expr, (cst.Integer, cst.Float)):
            return True
        if isinstance(expr, cst.UnaryOperation):
            return self._host_or_scalar(expr.expression, None)
        if isinstance(expr, cst.Name):
            return True  # checked by ``_scalars_only`` once the factory is known
        if isinstance(expr, cst.Call):
            return (self.ctx.qualified_name(expr.func) or "").startswith("math.")
        return False

    def _scalars_only(self, receiver: cst.BaseExpression, factory: cst.Call) -> bool:
        """Is every plain name the computation uses evidently a Python number: a
        size the factory itself takes (``torch.arange(half) / half``), a
        parameter with a numeric default, or a name given a number, ``len()``,
        ``int()``/``float()`` or ``math.*``? A name that may hold a device
        tensor would make the result a device tensor already."""
        sizes = {sub.value for sub in iter_subtree(factory) if isinstance(sub, cst.Name)}
        function = self.ctx.function
        for sub in iter_subtree(receiver):
            if not isinstance(sub, cst.Name) or sub.value in sizes or sub is factory.func:
                continue
            parent = self._parent_in(receiver, sub)
            if isinstance(parent, cst.Attribute) or (isinstance(parent, cst.Call) and parent.func is sub):
                continue  # ``torch``/``math`` of a dotted call, a method name
            if isinstance(parent, cst.Arg) and parent.keyword is sub:
                continue
            if not self._numeric_name(sub.value, function):
                return False
        return True

    def _numeric_name(self, name: str, function) -> bool:
        value = self.ctx.value_of(name)
        if value is None and function is not None:
            default = _parameter_default(function.node, name)
            return isinstance(default, (cst.Integer, cst.Float))
        if isinstance(value, (cst.Integer, cst.Float)):
            return True
        return isinstance(value, cst.Call) and (
            (isinstance(value.func, cst.Name) and value.func.value in ("len", "int", "float"))
            or (self.ctx.qualified_name(value.func) or "").startswith("math.")
        )

    @staticmethod
    def _parent_in(root: cst.CSTNode, child: cst.CSTNode) -> Optional[cst.CSTNode]:
        for node in iter_subtree(root):
            if any(grand is child for grand in child_nodes(node)):
                return node
        return None

    def visit_Subscript(self, node: cst.Subscript) -> None:
        """``queue[idx]`` with ``idx = torch.randperm(n)``: a host index into a device tensor."""
        if self.ctx.function is None and self.ctx.loop is None:
            return
        parts: List[cst.BaseExpression] = []
        for element in node.slice:
            if isinstance(element.slice, cst.Index):
                index = element.slice.value
                if isinstance(index, cst.Name):
                    assigned = self.ctx.value_of(index.value)
                    index = assigned if isinstance(assigned, cst.Tuple) else index
                parts.extend(e.value for e in index.elements) if isinstance(index, cst.Tuple) else parts.append(index)
        factories = [(part, self._host_factory(part)) for part in parts]
        if not any(factory for _, factory in factories):
            return
        site = self.ctx.site()
        placed = device_placement(self.ctx, node.value, site.value_of)
        on_device = node.value
        if placed is None:  # ``x[torch.arange(n), labels]`` with ``labels`` on the device
            for part, factory in factories:
                if factory is None:
                    placed = device_placement(self.ctx, part, site.value_of)
                    if placed is not None:
                        on_device = part
                        break
        if placed is None:
            return
        for _, factory in factories:
            if factory is None or id(factory) in self.indexing:
                continue
            self.indexing[id(factory)] = (site, factory, on_device, placed)

    def finish(self) -> None:
        for site, node, message, fix, facts in self.candidates:
            evidence = self._every_step_evidence(site)
            if evidence is not None:
                self.report(node, message, fix, evidence=[*facts, evidence])
        for site, factory, on_device, placed in self.indexing.values():
            evidence = self._every_step_evidence(site)
            if evidence is None:
                continue
            short = self.ctx.qualified_name(factory.func).rsplit(".", 1)[-1]  # type: ignore[union-attr]
            indexed = self.ctx.code_line(on_device, width=40)
            self.report(
                factory,
                f"`torch.{short}(...)` creates an index on the CPU that then indexes `{indexed}` on the device: "
                "each use copies the index to the device and waits for the copy; pass `device=` to the factory",
                None,
                evidence=[
                    Evidence(
                        f"`{indexed}` is on the device: `{self.ctx.code_line(placed, width=50)}`",
                        node=placed,
                    ),
                    evidence,
                ],
            )

    def _every_step_evidence(self, site: Site) -> Optional[Evidence]:
        """Why the node runs on every step: a module's forward pass (or a
        helper it calls), or a batch loop; None for one-off code, periodic
        and exception paths."""
        forward, helper = site.forward_context()
        if forward is not None:
            text = (
                "in a module's `forward()`: runs on every batch the module sees"
                if helper is None
                else f"`{helper.name}()` runs on every forward pass, called from `{forward.class_name}.forward()`"
            )
            return Evidence(text, node=forward.node)
        loop, helper = site.per_step()  # not under a periodic guard, nor on an exception path
        if loop is not None:
            return per_batch_evidence(loop, helper)
        where, function = site.forward_elsewhere()
        if where is not None and function is not None:
            return Evidence(f"`{function.name}()` runs on every forward pass: {where} calls it", node=function.node)
        return None

    def _host_factory(self, index: cst.BaseExpression) -> Optional[cst.Call]:
        """The factory call without ``device=`` that made ``index`` on the host:
        ``torch.randperm(n)`` itself, or the value of a name assigned from one."""
        if isinstance(index, cst.Name):
            value = self.ctx.value_of(index.value)
            index = value if isinstance(value, cst.Call) else index
        if not isinstance(index, cst.Call):
            return None
        qname = self.ctx.qualified_name(index.func)
        if qname not in _INDEX_FACTORIES:
            return None
        if any(keyword(index, k) is not None for k in ("device", "out")) or any(a.star for a in index.args):
            return None
        return index

    def _inside_fstring_quoted(self, quote: str) -> bool:
        return any(isinstance(node, cst.FormattedString) and quote in node.start for node in self.ctx.ancestry())

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
        if (
            len(others) == 1
            and not others[0].star
            and (others[0].keyword is None or others[0].keyword.value == "device")
        ):
            return others[0].value
        return None


def _parameter_default(function: cst.FunctionDef, name: str) -> Optional[cst.BaseExpression]:
    params = function.params
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        if param.name.value == name:
            return param.default
    return None


def _integer_literals_only(factory: cst.Call) -> bool:
    """``torch.arange(0, 10, 2)``, ``torch.arange(x.size(1))``: integer values, exact on any device."""
    for arg in factory.args:
        if arg.keyword is not None and arg.keyword.value in ("requires_grad", "layout"):
            continue
        if arg.keyword is not None and arg.keyword.value not in ("start", "end", "step"):
            return False  # dtype=... among them
        if not _evidently_integer(arg.value):
            return False
    return True


def _evidently_integer(value: cst.BaseExpression) -> bool:
    """``3``, ``len(x)``, ``x.size(1)``, ``x.shape[0]``, ``x.numel()`` and their
    ``+ - * //`` combinations: Python ints, whatever the names hold."""
    if isinstance(value, cst.Integer):
        return True
    if isinstance(value, cst.UnaryOperation) and isinstance(value.operator, cst.Minus):
        return _evidently_integer(value.expression)
    if isinstance(value, cst.BinaryOperation) and isinstance(
        value.operator, (cst.Add, cst.Subtract, cst.Multiply, cst.FloorDivide)
    ):
        return _evidently_integer(value.left) and _evidently_integer(value.right)
    if isinstance(value, cst.Call):
        if isinstance(value.func, cst.Name) and value.func.value == "len":
            return True
        return (
            isinstance(value.func, cst.Attribute)
            and value.func.attr.value in ("size", "numel", "dim")
            and bool(value.args or value.func.attr.value != "size")
        )
    if isinstance(value, cst.Subscript):
        return isinstance(value.value, cst.Attribute) and value.value.attr.value == "shape"
    return False


def _requoted(device: cst.BaseExpression) -> cst.BaseExpression:
    if isinstance(device, cst.SimpleString) and device.value.startswith('"') and "'" not in device.value:
        return device.with_changes(value="'" + device.value[1:-1] + "'")
    return device
