from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from torchlint.model import autocast_dtype, enabled, is_autocast_call, is_grad_scaler_call
from torchlint.rule import Evidence, Invalid, Rule, Valid

_BFLOAT16 = "bfloat16"


class GradScalerWithBfloat16(Rule):
    """## What it does
    Flags a `GradScaler` that is always enabled where every autocast region
    of the same scope computes in `torch.bfloat16`. The scope is the
    function, the class (a scaler created in `__init__` and autocast used in
    another method) or the module's top level; a scaler whose scope has no
    autocast region (created in `main()` and passed to the training
    function) is judged by every autocast region of the module.

    The rule stays silent when the scaler's `enabled=` is computed (the usual
    `GradScaler(enabled=(dtype == torch.float16))`), when any autocast region
    of the scope uses float16 or a dtype it cannot see, and when no autocast
    region is visible at all.

    ## Why is this bad?
    Gradient scaling exists because float16 has a narrow exponent range:
    small gradients underflow to zero unless the loss is multiplied up
    first. bfloat16 has the same 8-bit exponent as float32, so its gradients
    do not underflow and the scaler has nothing to protect. It still costs
    work on every step: scaling the loss, unscaling every gradient, an
    inf/NaN check over all of them and, with the usual `scaler.step`, a
    device-to-host read of the check's result. A scaler that starts at 65536
    can also skip the first optimizer steps for no reason.

    ## Example
    ```python
    import torch

    scaler = torch.amp.GradScaler("cuda")
    for inputs, targets in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(inputs), targets)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    Use instead:
    ```python
    import torch

    for inputs, targets in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    There is no automatic fix: removing the scaler means rewriting every
    `scale`/`step`/`update` call that uses it.
    `GradScaler("cuda", enabled=(amp_dtype == torch.float16))` keeps one code
    path for both dtypes.

    ## References
    - [Automatic Mixed Precision package: `torch.amp` (gradient scaling)](https://pytorch.org/docs/stable/amp.html#gradient-scaling)
    - [Automatic Mixed Precision recipe](https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html)
    - [`torch.autocast` and the `dtype` argument](https://pytorch.org/docs/stable/amp.html#torch.autocast)
    """

    code = "TL403"
    name = "grad-scaler-with-bfloat16"
    summary = "A GradScaler is used with bfloat16 autocast, which needs no loss scaling"
    fix_availability = "none"
    requires_any = ("GradScaler",)

    VALID = [
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x)
        """),
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda", enabled=(amp_dtype == torch.float16))
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x)
        """),
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=amp_dtype):
                loss = model(x)
        """),
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.cuda.amp.autocast():
                loss = model(x)
        """),
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda", enabled=False)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x)
        """),
        Valid("""
            import torch
            def train_fp16():
                scaler = torch.amp.GradScaler("cuda")
                with torch.autocast("cuda"):
                    loss = model(x)

            def train_bf16():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x)
        """),
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(x)
        """),
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            model = model.to(torch.bfloat16)
        """),
        Valid("""
            import torch
            def train(model, x, scaler):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x)
                with torch.autocast("cuda"):
                    aux = model(x)

            def main():
                scaler = torch.amp.GradScaler("cuda")
                train(model, x, scaler)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            def train(model, x, scaler):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    return model(x)

            def main():
                scaler = torch.amp.GradScaler("cuda")
                train(model, x, scaler)
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x)
            """,
            line=2,
            message="bfloat16",
        ),
        Invalid(
            """
            from torch.cuda.amp import GradScaler, autocast
            import torch
            def train(model, loader):
                scaler = GradScaler()
                for x in loader:
                    with autocast(dtype=torch.bfloat16):
                        loss = model(x)
                    scaler.scale(loss).backward()
            """,
            line=4,
        ),
        Invalid(
            """
            import torch as T
            class Trainer:
                def __init__(self):
                    self.scaler = T.GradScaler("cuda", enabled=True)

                def step(self, x):
                    with T.autocast(device_type="cuda", dtype=T.bfloat16):
                        return self.model(x)
            """,
            line=4,
        ),
        Invalid(
            """
            import torch
            AMP_DTYPE = torch.bfloat16
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=AMP_DTYPE):
                loss = model(x)
            """,
        ),
        Invalid(
            """
            import torch
            from torch import bfloat16
            scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10)
            with torch.amp.autocast("cuda", bfloat16):
                loss = model(x)
            """,
        ),
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cpu")
            with torch.autocast("cpu"):
                loss = model(x)
            """,
            message="bfloat16",
        ),
        Invalid(
            """
            import torch
            @torch.autocast("cuda", dtype=torch.bfloat16)
            def forward(x):
                return model(x)
            scaler = torch.amp.GradScaler("cuda")
            scaler2 = torch.cuda.amp.GradScaler()
            """,
            count=2,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.scalers: List[Tuple[object, cst.Call]] = []
        self.autocasts: Dict[object, List[Optional[str]]] = {}
        self.first_autocast: Dict[object, cst.Call] = {}  # where each scope's first region opens

    def _scope(self) -> object:
        function = self.ctx.function
        while function is not None:
            if function.class_name is not None:
                return ("class", function.class_name)
            if function.parent is None:
                return function.node
            function = function.parent
        if self.ctx.enclosing_class():
            return ("class", self.ctx.enclosing_class())
        return None

    def visit_Call(self, node: cst.Call) -> None:
        if is_grad_scaler_call(self.ctx, node):
            if enabled(self.ctx, node) is True:
                self.scalers.append((self._scope(), node))
        elif is_autocast_call(self.ctx, node):
            if enabled(self.ctx, node) is not False:
                self.autocasts.setdefault(self._scope(), []).append(autocast_dtype(self.ctx, node))
                self.first_autocast.setdefault(self._scope(), node)

    def finish(self) -> None:
        for scope, node in self.scalers:
            dtypes = self.autocasts.get(scope)
            region = self.first_autocast.get(scope) or next(iter(self.first_autocast.values()), None)
            if not dtypes:
                # Created in one function (``main``) and used in another: the module decides.
                dtypes = [d for found in self.autocasts.values() for d in found]
            if not dtypes or any(d != _BFLOAT16 for d in dtypes):
                continue
            self.report(
                node,
                "this GradScaler is always enabled, but every autocast region here computes in bfloat16, "
                "whose float32-sized exponent range needs no loss scaling; "
                "drop the scaler or enable it only for float16",
                evidence=[
                    Evidence(f"the scaler is always enabled: `{self.ctx.code_line(node)}`", node=node),
                    *(
                        [Evidence(f"autocast computes in bfloat16: `{self.ctx.code_line(region)}`", node=region)]
                        if region is not None
                        else []
                    ),
                ],
            )
