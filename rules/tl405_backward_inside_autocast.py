from __future__ import annotations

import libcst as cst

from torchlint.model import autocast_dtype, enclosing_autocast, tensor_backward
from torchlint.rule import Evidence, Invalid, Rule, Valid


class BackwardInsideAutocast(Rule):
    """## What it does
    Flags `loss.backward()` (and `scaler.scale(loss).backward()`) that runs
    inside an autocast region: in the body of `with torch.autocast(...)`,
    `with torch.amp.autocast(...)` or `with torch.cuda.amp.autocast(...)`, or
    in a function decorated with one of them. A nested
    `autocast(enabled=False)` region around the call switches autocast off
    and keeps the rule silent.

    ## Why is this bad?
    Autocast is meant to wrap only the forward pass and the loss computation.
    The backward ops already run in the dtype that autocast chose for the
    matching forward ops, so autocast adds nothing to the backward pass; what
    it does add is casting work for any op recorded there (gradient hooks,
    `create_graph=True` double backward), and that work runs in reduced
    precision, which the PyTorch docs call "not recommended". Leaving the
    `with` block before `backward()` also makes the forward/backward split
    visible in the code.

    ## Example
    ```python
    import torch

    for inputs, targets in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(inputs), targets)
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    Use instead:
    ```python
    import torch

    for inputs, targets in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Fix safety
    There is no automatic fix: moving `backward()` out of the `with` block
    means dedenting it and possibly the statements after it, which only the
    author can judge.

    ## References
    - [`torch.autocast`: "Backward passes under autocast are not recommended"](https://pytorch.org/docs/stable/amp.html#torch.autocast)
    - [Automatic Mixed Precision examples: typical mixed precision training](https://pytorch.org/docs/stable/notes/amp_examples.html#typical-mixed-precision-training)
    - [Automatic Mixed Precision recipe](https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html)
    """

    code = "TL405"
    name = "backward-inside-autocast"
    summary = "`backward()` runs inside an autocast region"
    fix_availability = "none"
    requires_any = ("autocast",)

    VALID = [
        Valid("""
            import torch
            with torch.autocast("cuda"):
                loss = model(x)
            loss.backward()
        """),
        Valid("""
            import torch
            with torch.autocast("cuda"):
                loss = model(x)
                with torch.autocast("cuda", enabled=False):
                    loss.float().backward()
        """),
        Valid("""
            import torch
            with torch.cuda.amp.autocast(enabled=False):
                loss = model(x)
                loss.backward()
        """),
        Valid("""
            import torch
            @torch.autocast("cuda")
            def forward(model, x):
                return model(x)

            def train_step(model, x):
                loss = forward(model, x)
                loss.backward()
        """),
        Valid("""
            import torch
            def train_step(model, x, accelerator):
                with accelerator.autocast():
                    loss = model(x)
                    accelerator.backward(loss)
        """),
        Valid("""
            import torch
            with torch.autocast("cuda"):
                out = model(x)
                def closure():
                    loss = out.sum()
                    loss.backward()
                    return loss
        """),
        Valid("""
            from contextlib import nullcontext
            with nullcontext():
                loss = model(x)
                loss.backward()
        """),
        Valid("""
            import torch
            with torch.autocast("cuda"):
                loss = model(x)
            with torch.no_grad():
                loss.backward()
        """),
        Valid("""
            with autocast():
                loss = model(x)
                loss.backward()
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            with torch.autocast("cuda"):
                loss = model(x)
                loss.backward()
            """,
            line=4,
            message="inside the autocast region",
        ),
        Invalid(
            """
            import torch
            with torch.cuda.amp.autocast():
                loss = model(x)
                scaler.scale(loss).backward()
            """,
        ),
        Invalid(
            """
            from torch.cuda.amp import autocast
            for x, y in loader:
                with autocast():
                    loss = criterion(model(x), y)
                    loss.backward()
                optimizer.step()
            """,
            line=5,
        ),
        Invalid(
            """
            import torch as T
            with T.amp.autocast(device_type="cuda", dtype=T.bfloat16):
                loss = model(x)
                loss.backward(retain_graph=True)
            """,
            message="bfloat16",
        ),
        Invalid(
            """
            import torch
            @torch.autocast("cuda")
            def train_step(model, x):
                loss = model(x).mean()
                loss.backward()
            """,
            line=5,
        ),
        Invalid(
            """
            import torch
            amp_ctx = torch.autocast("cuda", dtype=torch.float16)
            with amp_ctx:
                loss = model(x)
                loss.backward()
            """,
        ),
        Invalid(
            """
            import torch
            with torch.autocast("cuda"), torch.no_grad():
                pass
            with torch.autocast("cuda", enabled=False):
                with torch.autocast("cuda"):
                    loss = model(x)
                    loss.backward()
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            with torch.autocast("cuda"):
                for chunk in chunks:
                    loss = model(chunk)
                    loss.backward()
                    if loss.isnan().any():
                        (loss * 0).backward()
            """,
            count=2,
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        if not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "backward"):
            return
        if not tensor_backward(self.ctx, node):
            return
        region = enclosing_autocast(self.ctx, self.ctx.site())
        if region is None:
            return
        dtype = autocast_dtype(self.ctx, region)
        dtype_text = f" ({dtype})" if dtype else ""
        self.report(
            node,
            f"`backward()` runs inside the autocast region{dtype_text}; "
            "autocast should wrap only the forward pass and the loss: leave the region before calling backward",
            evidence=[Evidence(f"the autocast region opens here: `{self.ctx.code_line(region)}`", node=region)],
        )
