from __future__ import annotations

import re
from typing import List, Optional, Tuple

import libcst as cst

from torchlint.model import dotted_name, torch_alias
from torchlint.rule import DISPLAY_ONLY, SAFE, Evidence, Fix, Invalid, Rule, Valid

# qualified name -> (new API, torch version that has it, version that deprecates the old one)
_DEPRECATED = {
    "torch.cuda.amp.autocast": ("autocast", (1, 12), "2.4"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", (1, 12), "2.4"),
    "torch.cuda.amp.GradScaler": ("GradScaler", (2, 3), "2.3"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("GradScaler", (2, 3), "2.3"),
}
# torch.cuda.amp.autocast(enabled, dtype, cache_enabled): positional parameters,
# which torch.amp.autocast(device_type, dtype, enabled, cache_enabled) orders differently.
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
_COMPAT_TEST = re.compile(
    r"(?i)(version|hasattr|is_torch|torch_\w*(greater|less|newer|older|ge|lt)|_TORCH_|amp\.GradScaler)"
)


class DeprecatedCudaAmpApi(Rule):
    """## What it does
    Flags calls of the device-specific AMP constructors
    `torch.cuda.amp.autocast(...)` and `torch.cuda.amp.GradScaler(...)`,
    however they are imported (`import torch as T`,
    `from torch.cuda.amp import autocast`, `from torch.cuda import amp`,
    aliases), and rewrites them to the device-generic API:
    `torch.amp.autocast("cuda", ...)` and `torch.amp.GradScaler("cuda", ...)`.

    Code that chooses between the two APIs by torch version (an `if` on a
    version check or `hasattr`, or a `try`/`except` fallback) is left alone.

    The rule fires only where every torch version the code supports has the
    new API (`torch.amp.autocast` appeared in torch 1.12,
    `torch.amp.GradScaler` in 2.3) and some of them deprecate the old one.
    The supported versions are `target-torch` when it is set, otherwise
    what the project's manifests declare (`pyproject.toml`, `setup.py`,
    `setup.cfg`, `requirements*.txt`, `environment.yml`, a Dockerfile's base
    image) and the newer APIs the code already uses (`torch.compile`,
    `torch.amp.GradScaler`, `torch.accelerator`). A project that pins torch
    1.8–2.1, or one whose versions are unknown, gets no finding: there the
    suggested API may not exist, or the old one is not deprecated yet.

    ## Why is this bad?
    `torch.cuda.amp.GradScaler(args...)` is deprecated since torch 2.3 and
    `torch.cuda.amp.autocast(args...)` since 2.4: each construction emits a
    `FutureWarning`, and the aliases are scheduled for removal. The generic
    API is documented as exactly equivalent and also serves CPU, XPU and
    other devices, so code that uses it needs no second spelling.

    ## Example
    ```python
    import torch

    model = torch.compile(model)  # torch >= 2.0, so torch.amp.autocast exists
    with torch.cuda.amp.autocast(dtype=torch.float16):
        loss = model(x)
    ```

    Use instead:
    ```python
    import torch

    model = torch.compile(model)
    with torch.amp.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    ```

    ## Fix safety
    The rewrite is the one the deprecation warning prescribes, and the new
    constructors are documented as equivalent. Positional arguments of
    `torch.cuda.amp.autocast(enabled, dtype, cache_enabled)` become keywords,
    because `torch.amp.autocast` orders its parameters differently.

    The fix is **safe**: the rule only fires where the new API exists on
    every supported torch. When the call is reached through
    `from torch.cuda.amp import autocast` and the module does not also
    `import torch`, the fix is display-only, since it would need a new
    import. A call with `*args` gets no fix.

    ## References
    - [Automatic Mixed Precision package: `torch.amp`](https://pytorch.org/docs/stable/amp.html)
    - [`torch.amp.GradScaler`](https://pytorch.org/docs/stable/amp.html#torch.amp.GradScaler)
    - [Automatic Mixed Precision recipe](https://pytorch.org/tutorials/recipes/recipes/amp_recipe.html)
    """

    code = "TL402"
    name = "deprecated-cuda-amp-api"
    summary = "`torch.cuda.amp.autocast`/`GradScaler` is deprecated in favour of `torch.amp`"
    fix_availability = "sometimes"
    requires_any = ("amp",)

    VALID = [
        Valid("""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x)
        """),
        Valid("""
            import torch
            if hasattr(torch.amp, "GradScaler"):
                scaler = torch.amp.GradScaler("cuda")
            else:
                scaler = torch.cuda.amp.GradScaler()
        """),
        Valid("""
            import torch
            from packaging import version
            if version.parse(torch.__version__) >= version.parse("2.3"):
                scaler = torch.amp.GradScaler("cuda")
            else:
                scaler = torch.cuda.amp.GradScaler()
        """),
        Valid("""
            try:
                from torch.amp import GradScaler
                scaler = GradScaler("cuda")
            except ImportError:
                from torch.cuda.amp import GradScaler
                scaler = GradScaler()
        """),
        Valid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
        """,
            target_torch="2.1",
        ),
        Valid("""
            from apex import amp
            model, optimizer = amp.initialize(model, optimizer)
        """),
        Valid("""
            import torch
            isinstance(scaler, torch.cuda.amp.GradScaler)
        """),
        Valid("""
            from my_project.cuda.amp import autocast
            with autocast():
                pass
        """),
        # Supported versions unknown: torch.amp.GradScaler may not exist there.
        Valid("""
            import torch
            scaler = torch.cuda.amp.GradScaler(init_scale=1024, enabled=use_amp)
        """),
        # torch.compile proves >= 2.0: autocast's new spelling exists, GradScaler's may not.
        Valid("""
            import torch
            model = torch.compile(model)
            scaler = torch.cuda.amp.GradScaler()
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler()
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            """,
            target_torch="2.4",
            message="deprecated",
        ),
        Invalid(
            """
            import torch
            scaler = torch.cuda.amp.GradScaler(init_scale=1024, enabled=use_amp)
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda", init_scale=1024, enabled=use_amp)
            """,
            target_torch="2.3",
            message="torch.amp.GradScaler",
        ),
        Invalid(
            """
            import torch
            model = torch.compile(model)
            with torch.cuda.amp.autocast(dtype=torch.bfloat16):
                out = model(x)
            """,
            fixed="""
            import torch
            model = torch.compile(model)
            with torch.amp.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            with torch.cuda.amp.autocast():
                out = model(x)
            """,
            fixed="""
            import torch
            with torch.amp.autocast("cuda"):
                out = model(x)
            """,
            target_torch="2.0",
        ),
        Invalid(
            """
            import torch as T
            with T.cuda.amp.autocast(True, T.bfloat16):
                out = model(x)
            """,
            fixed="""
            import torch as T
            with T.amp.autocast("cuda", enabled=True, dtype=T.bfloat16):
                out = model(x)
            """,
            target_torch="2.4",
        ),
        Invalid(
            """
            import torch
            from torch.cuda.amp import autocast, GradScaler
            scaler = GradScaler()
            with autocast(enabled=args.fp16):
                out = model(x)
            """,
            fixed="""
            import torch
            from torch.cuda.amp import autocast, GradScaler
            scaler = torch.amp.GradScaler("cuda")
            with torch.amp.autocast("cuda", enabled=args.fp16):
                out = model(x)
            """,
            count=2,
            target_torch="2.5",
        ),
        Invalid(
            """
            from torch.cuda.amp import GradScaler as GS
            scaler = GS(enabled=True)
            """,
            fixed=None,
            unsafe_fixes=True,
            target_torch="2.5",
            message="`from torch.cuda.amp import`",
        ),
        Invalid(
            """
            from torch.cuda import amp
            import torch
            scaler = amp.GradScaler(2.0**14)
            """,
            fixed="""
            from torch.cuda import amp
            import torch
            scaler = torch.amp.GradScaler("cuda", 2.0**14)
            """,
            target_torch="2.3",
        ),
        Invalid(
            """
            import torch
            class Trainer:
                @torch.cuda.amp.autocast()
                def forward(self, x):
                    return self.model(x)
            """,
            fixed="""
            import torch
            class Trainer:
                @torch.amp.autocast("cuda")
                def forward(self, x):
                    return self.model(x)
            """,
            target_torch="2.4",
        ),
        Invalid(
            """
            import torch
            with torch.cuda.amp.autocast(**amp_kwargs):
                out = model(x)
            """,
            fixed="""
            import torch
            with torch.amp.autocast("cuda", **amp_kwargs):
                out = model(x)
            """,
            target_torch="2.4",
        ),
        Invalid(
            """
            import torch
            with torch.cuda.amp.autocast(*amp_args):
                out = model(x)
            """,
            fixed=None,
            unsafe_fixes=True,
            target_torch="2.4",
        ),
    ]

    def visit_Call(self, node: cst.Call) -> None:
        qname = self.ctx.qualified_name(node.func)
        entry = _DEPRECATED.get(qname or "")
        if entry is None:
            return
        new_name, available, deprecated_in = entry
        if not self.ctx.torch_at_least(*available):
            return  # the new API may not exist on a supported torch (or the versions are unknown)
        if self.ctx.torch_all_below(*_version(deprecated_in)):
            return  # no supported torch deprecates the old spelling
        if self._in_compat_code():
            return
        alias = torch_alias(self.ctx.names)
        direct = (dotted_name(node.func) or "").split(".", 1)[0] == alias
        fix = self._fix(node, new_name, alias)
        spelled = "autocast" if new_name == "autocast" else "GradScaler"
        imported = "" if direct else " (through `from torch.cuda.amp import`)"
        versions = self.ctx.torch_range
        declared = ", ".join(versions.sources) or "target-torch"
        self.report(
            node,
            f"`torch.cuda.amp.{spelled}(...)`{imported} is deprecated since torch {deprecated_in}; "
            f'use `torch.amp.{spelled}("cuda", ...)`',
            fix,
            evidence=[
                Evidence(
                    f"the code supports torch {versions.describe()} (from {declared}):"
                    f" every such torch has `torch.amp.{spelled}`, and some deprecate the old spelling",
                    node=node,
                )
            ],
        )

    def _in_compat_code(self) -> bool:
        """Inside a version/hasattr branch or a try/except import fallback."""
        for ancestor, child in self.ctx.site().ancestors():
            if isinstance(ancestor, (cst.If, cst.IfExp)) and child is not ancestor.test:
                if _COMPAT_TEST.search(self.ctx.code_for(ancestor.test)):
                    return True
            if isinstance(ancestor, cst.IndentedBlock):
                # an earlier `if hasattr(torch.amp, "GradScaler"): return ...` in the same block
                for statement in ancestor.body:
                    if statement is child:
                        break
                    if isinstance(statement, cst.If) and _COMPAT_TEST.search(self.ctx.code_for(statement.test)):
                        return True
            if isinstance(ancestor, cst.Try):
                if child is not ancestor.body:
                    return True
                if any(_handles_missing_api(h) for h in ancestor.handlers):
                    return True
        return False

    def _fix(self, node: cst.Call, new_name: str, torch_alias: Optional[str]) -> Optional[Fix]:
        if any(arg.star == "*" for arg in node.args):
            return None
        args: List[str] = ['"cuda"']
        positional_index = 0
        for arg in node.args:
            text = self.ctx.code_for(arg.value)
            if arg.star == "**":
                args.append(f"**{text}")
            elif arg.keyword is not None:
                args.append(f"{arg.keyword.value}={text}")
            elif new_name == "autocast":
                if positional_index >= len(_AUTOCAST_POSITIONAL):
                    return None
                args.append(f"{_AUTOCAST_POSITIONAL[positional_index]}={text}")
                positional_index += 1
            else:
                args.append(text)
        replacement = f"{torch_alias or 'torch'}.amp.{new_name}({', '.join(args)})"
        # The rule only fires where the new API exists on every supported torch.
        applicability = DISPLAY_ONLY if torch_alias is None else SAFE  # display-only: would need `import torch`
        title = f'Use `torch.amp.{new_name}("cuda", ...)`'
        return self.ctx.fix(applicability, title, self.ctx.replace(node, replacement))


def _version(text: str) -> Tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


def _handles_missing_api(handler: cst.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = {
        dotted_name(t)
        for t in (
            [handler.type] if not isinstance(handler.type, cst.Tuple) else [e.value for e in handler.type.elements]
        )
    }
    return bool(names & {"ImportError", "AttributeError", "ModuleNotFoundError", "Exception"})
