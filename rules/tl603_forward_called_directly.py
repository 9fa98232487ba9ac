from __future__ import annotations

import re
from typing import List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import FunctionInfo, dotted_name, is_module_base, names_a_module
from torchlint.rule import DISPLAY_ONLY, UNSAFE, Evidence, Invalid, Rule, Valid

# Attributes that hold the module a wrapper wraps: a wrapper's forward calling
# their ``forward`` bypasses the inner hooks on purpose (DDP, FSDP, checkpoint
# and compile wrappers, EMA shadows).
_WRAPPED_ATTRS = frozenset(
    {
        "module",
        "_module",
        "model",
        "_model",
        "wrapped",
        "_wrapped",
        "wrapped_module",
        "_wrapped_module",
        "_fsdp_wrapped_module",
        "_checkpoint_wrapped_module",
        "_orig_mod",
        "orig_module",
        "_orig_module",
        "inner",
        "_inner",
        "base_model",
        "base_layer",
        "original_module",
        "original_model",
    }
)
# Receivers whose ``forward`` is the calling convention: RPC remote modules
# (which refuse hooks) and lite-interpreter / RRef handles.
_NOT_EAGER_MODULE = re.compile(r"(?i)(remote|rref|mobile|lite)")
# Methods in which calling ``forward`` directly is how hook machinery or a
# wrapper is implemented.
_WRAPPER_METHODS = re.compile(r"(?i)^(__call__|_call_impl|_wrapped_call_impl|.*forward.*|_run_.*)$")


class ForwardCalledDirectly(Rule):
    """## What it does
    Flags `model.forward(x)` on an `nn.Module`: calling the `forward` method
    instead of the module itself.

    A receiver counts as a module when it was built from a `torch.nn` class
    or from a module class defined in the same file, or when its name says so
    (`model`, `net`, `encoder`, `backbone`, `self.decoder`, …). The rule stays
    silent on the deliberate uses: `super().forward(x)` and
    `Base.forward(self, x)` inside an override, `self.forward(…)`, and a
    wrapper whose `forward` (or `__call__`) delegates to the module it wraps
    (`self.module.forward(…)`, `self._orig_mod.forward(…)`,
    `self._fsdp_wrapped_module.forward(…)`), which skips the inner hooks on
    purpose. Calls on call results and subscripts (`layers[i].forward(x)`)
    are left alone, since what they return is not visible.

    Test modules (`test_*.py`, `*_test.py`, `conftest.py`, files under
    `test/`, `tests/` or `testing/`) are skipped: a unit test calls the
    method under test on purpose. Set the `check-tests` option to check
    them too.

    ## Why is this bad?
    `nn.Module.__call__` runs the forward pre-hooks and hooks registered on the
    module, and sets up backward hooks, before and after calling `forward`.
    Calling `forward` directly silently skips them: `register_forward_hook`
    based feature extraction, pruning and quantization observers, FSDP and
    DDP bookkeeping, `torch.utils.hooks` profilers and activation-checkpoint
    wrappers all stop working.

    ## Example
    ```python
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    out = model.forward(x)
    ```

    Use instead:
    ```python
    import torch.nn as nn

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    out = model(x)
    ```

    ## Fix safety
    The fix replaces `model.forward(args)` with `model(args)` and is unsafe:
    `__call__` passes the same positional and keyword arguments to
    `forward` and returns its result, but the hooks registered on the module
    now run, and which hooks a module carries (a library's, a profiler's,
    a quantization observer's) is not visible in the code. Inside a hook,
    where `module.forward(...)` is the way to run the module again without
    its hooks, no fix is offered: `module(...)` would call the hook again,
    without end. A function counts as a hook when the file passes it to a
    `register_*hook*` call, or when its name says so (`*hook*`).

    ## References
    - [`torch.nn.Module.forward`: "one should call the Module instance afterwards instead of this"](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.forward)
    - [`torch.nn.Module.register_forward_hook`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.register_forward_hook)
    """

    code = "TL603"
    name = "forward-called-directly"
    summary = "`module.forward(x)` bypasses the module's hooks; call `module(x)`"
    fix_availability = "always"
    requires_any = (".forward(",)

    VALID = [
        Valid("""
            import torch.nn as nn
            class Block(nn.Linear):
                def forward(self, x):
                    return super().forward(x) * 2
        """),
        Valid("""
            import torch.nn as nn
            class Block(nn.Linear):
                def forward(self, x):
                    return nn.Linear.forward(self, x) * 2
        """),
        Valid("""
            import torch.nn as nn
            class Wrapper(nn.Module):
                def __init__(self, module):
                    super().__init__()
                    self.module = module
                def forward(self, *args, **kwargs):
                    return self.module.forward(*args, **kwargs)
        """),
        Valid("""
            class Compiled:
                def __call__(self, *args):
                    return self._orig_mod.forward(*args)
        """),
        Valid("""
            out = model(x)
        """),
        Valid("""
            class Pipeline:
                def run(self, x):
                    return self.forward(x)
        """),
        Valid("""
            import torch
            class Square(torch.autograd.Function):
                @staticmethod
                def forward(ctx, x):
                    return x * x
            y = Square.forward(None, x)
        """),
        Valid("""
            handler = get_handler()
            result = handler.forward(request)
        """),
        Valid("""
            traced = torch.jit.trace(model.forward, example)
        """),
        Valid("""
            out = layers[i].forward(x)
        """),
        Valid("""
            out = build_model().forward(x)
        """),
        Valid("""
            fn = model.forward
        """),
        Valid("""
            class FSDPWrapper:
                def forward(self, x):
                    return self._fsdp_wrapped_module.forward(x)
        """),
        Valid("""
            signal = filter_bank.forward(samples)
        """),
        Valid("""
            ret = remote_module.forward(*args)
        """),
        Valid("""
            import torch
            @torch.jit.script
            def run(module: MyModuleInterface, t: torch.Tensor):
                return module.forward() + t
        """),
        Valid("""
            class CompiledArtifact:
                def __call__(self, *args, **kwargs):
                    return self.graph_module.forward(*args, **kwargs)
        """),
        Valid("""
            import inspect
            params = inspect.signature(model.forward).parameters
        """),
    ]

    INVALID = [
        # Inside a hook, `module(...)` would run the hook again: no fix.
        Invalid(
            """
            import torch.nn as nn
            model = nn.Linear(2, 2)

            def rerun(module, inputs, output):
                return module.forward(inputs[0] * 0.5)

            model.register_forward_hook(rerun)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            out = model.forward(x)
            """,
            fixed="""
            out = model(x)
            """,
            unsafe_fixes=True,
            message="`model.forward(...)`",
        ),
        Invalid(
            """
            logits = self.model.forward(input_ids, attention_mask=mask)
            """,
            fixed="""
            logits = self.model(input_ids, attention_mask=mask)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            import torch.nn as nn
            head = nn.Linear(16, 4)
            y = head.forward(features)
            """,
            fixed="""
            import torch.nn as nn
            head = nn.Linear(16, 4)
            y = head(features)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            from torch import nn
            class Tiny(nn.Module):
                def forward(self, x):
                    return x
            tiny = Tiny()
            y = tiny.forward(x)
            """,
            fixed="""
            from torch import nn
            class Tiny(nn.Module):
                def forward(self, x):
                    return x
            tiny = Tiny()
            y = tiny(x)
            """,
            unsafe_fixes=True,
            line=6,
        ),
        Invalid(
            """
            class Model:
                def forward(self, x):
                    h = self.encoder.forward(x)
                    return self.decoder(h)
            """,
            fixed="""
            class Model:
                def forward(self, x):
                    h = self.encoder(x)
                    return self.decoder(h)
            """,
            unsafe_fixes=True,
            line=3,
        ),
        Invalid(
            """
            for batch in loader:
                loss = criterion(net.forward(batch), batch)
            """,
            fixed="""
            for batch in loader:
                loss = criterion(net(batch), batch)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            import torchvision
            resnet = torchvision.models.resnet18()
            feats = resnet.forward(images)
            """,
            fixed="""
            import torchvision
            resnet = torchvision.models.resnet18()
            feats = resnet(images)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            def predict(model, x):
                return model.module.forward(x)
            """,
            fixed="""
            def predict(model, x):
                return model.module(x)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            a = encoder.forward(x)
            b = decoder.forward(a)
            """,
            fixed="""
            a = encoder(x)
            b = decoder(a)
            """,
            unsafe_fixes=True,
            count=2,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # (call, receiver name, the callee that built the receiver, if known)
        self.candidates: List[Tuple[cst.Call, str, Optional[str], Optional[str], Optional[FunctionInfo]]] = []
        self.hooks: Set[str] = set()  # names of the functions the file registers as hooks
        self.module_classes: Set[str] = set()
        self.other_classes: Set[str] = set()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            qualified = self.ctx.qualified_name(base.value) or dotted_name(base.value) or ""
            if is_module_base(qualified) or qualified in self.module_classes:
                self.module_classes.add(node.name.value)
                return
        self.other_classes.add(node.name.value)

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "forward"):
            return
        receiver = dotted_name(func.value)
        if receiver is None:
            return  # super().forward(...), build().forward(...), layers[i].forward(...)
        parts = receiver.split(".")
        if parts[0] in ("self", "cls") and len(parts) == 1:
            return
        if parts[-1][:1].isupper():
            return  # Base.forward(self, x), Function.forward(ctx, ...)
        if self.ctx.qualified_name(func.value) is not None:
            return  # an imported name (a module, a class), not an instance
        if _NOT_EAGER_MODULE.search(parts[-1]):
            return  # RPC RemoteModule / lite-interpreter modules: forward is their calling convention
        function = self.ctx.function
        if function is not None and parts[0] == "self" and len(parts) == 2:
            if function.name in ("__call__", "_call_impl", "_wrapped_call_impl"):
                return
            if parts[1] in _WRAPPED_ATTRS and _WRAPPER_METHODS.match(function.name):
                return
        if self._in_torchscript():
            return
        built_by = None
        value = self.ctx.value_of(receiver)
        if isinstance(value, cst.Call):
            built_by = self.ctx.qualified_name(value.func) or dotted_name(value.func)
        self.candidates.append((node, receiver, built_by, parts[-1], self.ctx.function))

    def leave_Call(self, node: cst.Call) -> None:
        # ``module.register_forward_pre_hook(_pre_forward)``: remember the hook.
        func = node.func
        if isinstance(func, cst.Attribute) and "hook" in func.attr.value and func.attr.value.startswith("register"):
            for arg in node.args[:1]:
                name = (
                    dotted_name(arg.value.args[0].value)
                    if isinstance(arg.value, cst.Call) and arg.value.args
                    else dotted_name(arg.value)
                )
                if name is not None:
                    self.hooks.add(name.rsplit(".", 1)[-1])  # functools.partial(hook, ...) too

    def _module_reason(self, receiver: str, built_by: Optional[str], last: Optional[str]) -> str:
        """Why ``receiver`` is taken for a module (``_is_module``), as the finding states it."""
        if built_by is not None and (
            built_by.startswith(("torch.nn.", "torchvision.models."))
            or built_by.rsplit(".", 1)[-1] in self.module_classes
        ):
            return f"`{receiver}` is a module: built by `{built_by}(...)`"
        return f"`{receiver}` is a module, by its name (`{last}`)"

    def _in_torchscript(self) -> bool:
        """TorchScript code calls interface methods by name (``m.forward()``)."""
        function = self.ctx.function
        while function is not None:
            for decorator in function.node.decorators:
                expr = decorator.decorator.func if isinstance(decorator.decorator, cst.Call) else decorator.decorator
                if (self.ctx.qualified_name(expr) or "").startswith("torch.jit."):
                    return True
            function = function.parent
        return False

    def finish(self) -> None:
        for call, receiver, built_by, last, function in self.candidates:
            if not self._is_module(receiver, built_by, last):
                continue
            replacement = call.with_changes(func=call.func.value)  # type: ignore[attr-defined]
            applicability = DISPLAY_ONLY if self._in_hook(function) else UNSAFE
            fix = self.ctx.fix(
                applicability,
                f"Call `{receiver}(...)` instead of `{receiver}.forward(...)`",
                self.ctx.replace(call, replacement),
            )
            self.report(
                call,
                f"`{receiver}.forward(...)` bypasses the module's forward and backward hooks; call `{receiver}(...)`",
                fix,
                evidence=[Evidence(self._module_reason(receiver, built_by, last), node=call)],
            )

    def _in_hook(self, function: Optional[FunctionInfo]) -> bool:
        while function is not None:
            if function.name in self.hooks or "hook" in function.name.lower():
                return True
            function = function.parent
        return False

    def _is_module(self, receiver: str, built_by: Optional[str], last: Optional[str]) -> bool:
        if built_by is not None:
            short = built_by.rsplit(".", 1)[-1]
            if built_by.startswith(("torch.nn.", "torchvision.models.")) or short in self.module_classes:
                return True
            if short in self.other_classes:
                return False
        return names_a_module(last)
