from __future__ import annotations

import libcst as cst

from torchlint.model import module_evidence, tensor_evidence
from torchlint.rule import UNSAFE, Evidence, Invalid, Rule, Valid

# Methods that return a converted copy of a tensor but change a module in place.
_COPY_METHODS = frozenset({"to", "cuda", "half", "float", "double", "bfloat16"})


class DiscardedTensorCopy(Rule):
    """## What it does
    Flags `x.to(device)`, `x.cuda()` and dtype conversions such as
    `x.half()` written as a statement on their own, on a tensor: the
    converted tensor is returned and immediately thrown away, and `x` stays
    where it was.

    The receiver must evidently be a tensor: the result of a torch function
    or a model call, or a part of a loader's batch (`x` in `for x, y in
    loader`, `batch["x"]`). A whole batch (`batch.to(device)`) is not: it is
    often a dict-like `BatchEncoding`, whose `.to()` works in place. A name
    alone (`inputs`, a parameter) is not evidence. Modules
    (`model.to(device)`, `model[0].to(dtype)`) change in place and are never
    flagged, and neither is `torch.zeros(1).cuda()`, an idiom that only
    initialises CUDA.

    ## Why is this bad?
    `nn.Module.to()` moves a module's parameters in place, so
    `model.to(device)` on its own line is right. `Tensor.to()` is different:
    it returns a new tensor and leaves the original untouched. The code reads
    as if `x` were now on the GPU, but it is not: the next operation runs on
    the CPU, or fails with a device-mismatch error, after a wasted copy.

    ## Example
    ```python
    for images, labels in loader:
        images.to(device)
        labels.to(device)
        loss = criterion(model(images), labels)
    ```

    Use instead:
    ```python
    for images, labels in loader:
        images = images.to(device)
        labels = labels.to(device)
        loss = criterion(model(images), labels)
    ```

    ## Fix safety
    The fix assigns the result back (`x = x.to(device)`). It is unsafe: it
    changes what the following code computes with (which is the point), and
    if the receiver was in fact a module-like object with an in-place `.to`,
    rebinding the name could change behaviour.

    ## References
    - [`torch.Tensor.to`: returns a new tensor](https://pytorch.org/docs/stable/generated/torch.Tensor.to.html)
    - [`torch.nn.Module.to`: modifies the module in place](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.to)
    - [CUDA semantics](https://pytorch.org/docs/stable/notes/cuda.html)
    """

    code = "TL206"
    name = "discarded-tensor-copy"
    summary = "A tensor's `.to()`/`.cuda()` result is discarded, so the tensor is not moved"
    fix_availability = "sometimes"
    requires_any = ("to(", "cuda(", "half(", "float(", "double(", "bfloat16(")

    VALID = [
        # The loop binds modules (``Module.half()`` converts in place), not tensors.
        Valid("""
            import torch
            from torch import nn
            class Net(nn.Module):
                def half_precision(self):
                    for mod in self.modules():
                        if isinstance(mod, nn.BatchNorm2d):
                            mod.float()
                        else:
                            mod.half()
        """),
        Valid("""
            model.to(device)
            model.cuda()
            self.encoder.half()
        """),
        Valid("""
            for x, y in loader:
                x = x.to(device)
                y = y.cuda()
        """),
        # CUDA initialisation idiom.
        Valid("""
            import torch
            torch.zeros(1).cuda()
        """),
        # Unknown receiver: a parameter that may be a module.
        Valid("""
            def prepare(thing, device):
                thing.to(device)
        """),
        Valid("""
            import torch
            net = torch.nn.Linear(3, 3)
            net.to("cuda")
        """),
        # The result is used.
        Valid("""
            for batch in loader:
                out = model(batch["x"].to(device))
                print(batch["y"].to(device).sum())
        """),
        # A module list element.
        Valid("""
            for layer in self.layers:
                layer.to(device)
        """),
        # Iterating something that is not batches (modules in a list).
        Valid("""
            for m in modules:
                m.cuda()
        """),
        # A whole batch: a tokenizer's BatchEncoding moves itself in place.
        Valid("""
            for step, batch in enumerate(train_dataloader):
                batch.to(accelerator.device)
                outputs = model(**batch)
        """),
        # Parameters known only by their names are not evidence of a tensor.
        Valid("""
            def forward_step(model, inputs, labels, device):
                inputs.to(device)
                return model(inputs)
        """),
        # A submodule of a container module.
        Valid("""
            model = torch.nn.Sequential(torch.nn.Linear(2, 2))
            model[0].to(torch.bfloat16)
        """),
    ]

    INVALID = [
        Invalid(
            """
            for images, labels in loader:
                images.to(device)
                loss = model(images)
            """,
            fixed=None,
            line=2,
            message="`images.to(...)`",
        ),
        Invalid(
            """
            for images, labels in loader:
                images.to(device)
                loss = model(images)
            """,
            fixed="""
            for images, labels in loader:
                images = images.to(device)
                loss = model(images)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            import torch
            x = torch.randn(8, 3)
            x.cuda()
            """,
            fixed="""
            import torch
            x = torch.randn(8, 3)
            x = x.cuda()
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            for batch in loader:
                batch["input_ids"].to(device)
                out = model(**batch)
            """,
            fixed="""
            for batch in loader:
                batch["input_ids"] = batch["input_ids"].to(device)
                out = model(**batch)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            logits = model(x)
            logits.half()
            """,
            message="`logits.half()`",
        ),
        Invalid(
            """
            import torch as T
            mask = T.ones(4, 4)
            mask.to(device, non_blocking=True)
            """,
        ),
        Invalid(
            """
            for step, (x, y) in enumerate(train_loader):
                x.cuda(); y.cuda()
            """,
            count=2,
        ),
    ]

    def visit_Expr(self, node: cst.Expr) -> None:
        call = node.value
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            return
        method = call.func.attr.value
        if method not in _COPY_METHODS or any(a.star for a in call.args):
            return
        if method in ("half", "float", "double", "bfloat16") and call.args:
            return
        receiver = call.func.value
        if isinstance(receiver, cst.Call) or module_evidence(self.ctx, receiver):
            return
        if not self._is_tensor(receiver):
            return
        text = self.ctx.code_for(receiver)
        what = f"`{text}.{method}()`" if method != "to" else f"`{text}.to(...)`"
        message = (
            f"{what} returns a new tensor that is discarded, so `{text}` is unchanged "
            "(unlike `nn.Module.to`, `Tensor.to` is not in place); assign the result"
        )
        fix = None
        if isinstance(receiver, (cst.Name, cst.Attribute, cst.Subscript)):
            fix = self.ctx.fix(
                UNSAFE,
                f"Assign the result back to `{text}`",
                self.ctx.replace(node, f"{text} = {self.ctx.code_for(call)}"),
            )
        self.report(
            node,
            message,
            fix,
            evidence=[Evidence(f"`{text}` is a tensor, and the statement drops what `.{method}()` returns", node=node)],
        )

    def _is_tensor(self, receiver: cst.BaseExpression) -> bool:
        """Evidently a tensor: a part of a loader's batch (``x`` of ``for x, y
        in loader``, ``batch["x"]``), or a value the engine follows to a
        tensor. A whole batch is not: it may be a dict or a ``BatchEncoding``,
        whose ``.to()`` works in place. A name alone is never enough."""
        ctx = self.ctx
        base = receiver
        while isinstance(base, cst.Subscript):
            base = base.value
        if base is not receiver and module_evidence(ctx, base):
            return False  # ``model[0].to(dtype)``: a submodule, moved in place
        origin = ctx.batches.origin_of(receiver)
        if origin is not None:
            return not origin.whole
        return tensor_evidence(ctx, receiver) is True
