from __future__ import annotations

from typing import List, Optional

import libcst as cst

from torchlint.model import (
    FRAMEWORK_AMP_WRAPPERS,
    MIXED_PRECISION_VALUES,
    TrainerRun,
    dotted_name,
    framework_run_evidence,
    framework_training_run,
    last_name,
    outermost_loop_in_function,
    training_entry_loop,
    training_loop_evidence,
)
from torchlint.rule import Evidence, Invalid, Rule, Valid

_AUTOCAST = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.cuda.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.cuda.amp.autocast_mode.autocast",
        "torch.amp.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.GradScaler",
    }
)


class ChannelsLastNotUsed(Rule):
    """## What it does
    Flags a *training entry point* that trains a 2-D (or 3-D) convolutional
    network under automatic mixed precision without ever using the
    `torch.channels_last` (or `torch.channels_last_3d`) memory format.
    Opt-in: enable it with `--extend-select TL803`.

    A training entry point is a module that runs as a script and trains: it
    contains a training loop (a loop that calls `backward()` or an
    optimizer's `step()`, directly or through a function of the module) and
    either has an `if __name__ == "__main__":` block or top-level code that
    reaches the training (a module-level training loop, a module-level
    call of a module function that trains, or one that hands it to a
    launcher such as `mp.spawn(train, ...)`). The network is convolutional
    when the module builds or runs `nn.Conv2d`/`nn.Conv3d` (or their
    transposed/lazy variants, `F.conv2d`, …), a torchvision CNN
    (`torchvision.models.resnet50()`, …) or a timm convolutional
    architecture (`timm.create_model("resnet50d")`); it trains under AMP
    when the module uses `torch.autocast` / `torch.cuda.amp.autocast` or a
    `GradScaler`, or asks a framework for mixed precision (mmengine's
    `AmpOptimWrapper`, `Accelerator(mixed_precision="fp16")`, Lightning's
    `Trainer(precision="16-mixed")`; a setting read from the enclosing
    function's parameter counts with its default). 1-D convolutions do not
    count: channels-last applies to 4-D and 5-D tensors only. The finding
    points at the outermost loop around the training loop, or at the
    trainer when the loop is a framework's (`runner.train()`,
    `trainer.fit(...)`).

    ## Why is this bad?
    Tensor cores compute convolutions in NHWC layout. With the default
    NCHW (`contiguous_format`) layout, cuDNN transposes activations before
    and after every fp16/bf16 convolution. Converting the model and the
    input batches with `memory_format=torch.channels_last` removes those
    transposes; PyTorch reports 8–35% faster training for common CNNs under
    AMP on Volta and newer GPUs.

    ## Example
    ```python
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda()
    for images, labels in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images.cuda()), labels.cuda())
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    Use instead:
    ```python
    import torch
    import torchvision

    model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
    for images, labels in loader:
        images = images.cuda().to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images), labels.cuda())
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Known problems
    A model whose layers are mostly not convolutions (a ViT with a
    convolutional patch embedding) gains little; silence the finding with
    `# noqa: TL803` there.

    ## Fix safety
    There is no automatic fix: the model and its input batches must both be
    converted, and custom kernels or `.view()` calls that assume contiguous
    NCHW strides may need changes.

    ## References
    - [Channels last memory format in PyTorch](https://pytorch.org/tutorials/intermediate/memory_format_tutorial.html)
    - [Performance tuning guide: use channels_last memory format for computer vision models](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html)
    - [CUDA automatic mixed precision examples](https://pytorch.org/docs/stable/notes/amp_examples.html)
    """

    code = "TL803"
    name = "channels-last-not-used"
    summary = "A convolutional network trained under AMP does not use the channels-last memory format"
    default_enabled = False
    requires_any = ("autocast", "GradScaler", "AmpOptimWrapper", "precision")

    VALID = [
        Valid("""
            import torchvision
            from mmengine.optim import OptimWrapper
            from mmengine.runner import Runner
            runner = Runner(model=torchvision.models.resnet50(),
                            optim_wrapper=dict(type=OptimWrapper, optimizer=dict(type="SGD", lr=0.1)))
            runner.train()
        """),
        Valid("""
            from accelerate import Accelerator
            from timm import create_model
            def training_loop(mixed_precision="no"):
                accelerator = Accelerator(mixed_precision=mixed_precision)
                model = create_model("resnet50d")
                for batch in loader:
                    accelerator.backward(model(batch).sum())
                    optimizer.step()
            notebook_launcher(training_loop, ())
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3).cuda().to(memory_format=torch.channels_last)
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x.to(memory_format=torch.channels_last)).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3).cuda()
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Conv1d(3, 8, 3).cuda()
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            def train(loader):
                model = nn.Conv2d(3, 8, 3).cuda()
                for x in loader:
                    with torch.autocast("cuda"):
                        loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
        """),
        Valid("""
            import torch
            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torchvision
            model = torchvision.models.resnet18().cuda()
            if __name__ == "__main__":
                with torch.no_grad(), torch.autocast("cuda"):
                    for x in loader:
                        print(model(x).argmax(1))
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Conv3d(1, 4, 3).cuda().to(memory_format=torch.channels_last_3d)
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torchvision
            model = torchvision.models.vit_b_16().cuda()
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3).cuda()
            for x in loader:
                x = x.contiguous(memory_format=torch.channels_last)
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3).cuda()
            for x in loader:
                with amp_context():
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            class Net(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 3)
            def train(model, loader, optimizer):
                for x in loader:
                    with torch.autocast("cuda"):
                        loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torchvision
            from mmengine.runner import Runner
            runner = Runner(model=torchvision.models.resnet50(),
                            optim_wrapper=dict(type="AmpOptimWrapper", optimizer=dict(type="SGD", lr=0.1)))
            runner.train()
            """,
            line=3,
        ),
        Invalid(
            """
            from accelerate import Accelerator, notebook_launcher
            from timm import create_model

            def training_loop(mixed_precision="fp16"):
                accelerator = Accelerator(mixed_precision=mixed_precision)
                model = create_model("resnet50d")
                for batch in loader:
                    accelerator.backward(model(batch).sum())
                    optimizer.step()

            notebook_launcher(training_loop, ())
            """,
            line=7,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()).cuda()
            for x in loader:
                with torch.autocast("cuda"):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
            """,
            line=4,
            message="channels_last",
        ),
        Invalid(
            """
            import torch
            import torchvision
            from torch.cuda.amp import GradScaler, autocast

            def main():
                model = torchvision.models.resnet50().cuda()
                scaler = GradScaler()
                for epoch in range(90):
                    for images, labels in train_loader:
                        with autocast():
                            loss = criterion(model(images), labels)
                        scaler.scale(loss).backward()
                        scaler.step(optimizer)
                        scaler.update()

            if __name__ == "__main__":
                main()
            """,
            line=8,
        ),
        Invalid(
            """
            import torch as T
            import torch.nn.functional as F
            def step(x, w, opt):
                with T.amp.autocast("cuda", dtype=T.bfloat16):
                    loss = F.conv2d(x, w).mean()
                loss.backward()
                opt.step()
            for x in loader:
                step(x, weight, opt)
            """,
            line=8,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            model = nn.Conv3d(1, 4, 3).cuda()
            if __name__ == "__main__":
                for x in loader:
                    with torch.autocast(device_type="cuda"):
                        loss = model(x).mean()
                    loss.backward()
                    optimizer.step()
            """,
            line=5,
            message="channels_last_3d",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.conv_dims = 0
        self.convolution: Optional[cst.Call] = None  # the first 2-D/3-D convolution
        self.amp: Optional[cst.CSTNode] = None  # the first call or setting that turns mixed precision on

    def visit_Call(self, node: cst.Call) -> None:
        qualified = self.ctx.qualified_name(node.func)
        amp = node if qualified in _AUTOCAST else self._framework_amp(node, qualified)
        if amp is not None:
            self.amp = self.amp or amp
            return
        built = self.ctx.convolution_built(node)
        if built is not None and built[0] >= 2:
            self.conv_dims = max(self.conv_dims, built[0])
            self.convolution = self.convolution or node

    def finish(self) -> None:
        if self.convolution is None or self.amp is None or "channels_last" in self.ctx.source:
            return
        loop = training_entry_loop(self.ctx)
        fmt = "channels_last_3d" if self.conv_dims == 3 else "channels_last"
        if loop is None:
            run = framework_training_run(self.ctx)
            if run is not None:
                self._report_framework(run, fmt)
            return
        outer = outermost_loop_in_function(loop)
        self.report(
            outer.node,
            f"a convolutional network trains under mixed precision in the default NCHW layout; convert the model "
            f"and the input batches with `.to(memory_format=torch.{fmt})` "
            "to use tensor-core convolutions without transposes",
            evidence=[*self._network(), training_loop_evidence(self.ctx, loop)],
        )

    def _network(self) -> List[Evidence]:
        assert self.convolution is not None and self.amp is not None
        return [
            Evidence(f"the network is convolutional: `{self.ctx.code_line(self.convolution)}`", node=self.convolution),
            Evidence(f"mixed precision: `{self.ctx.code_line(self.amp)}`", node=self.amp),
        ]

    def _framework_amp(self, node: cst.Call, qualified: Optional[str]) -> Optional[cst.CSTNode]:
        """Mixed precision asked of a framework, and where: mmengine's
        ``AmpOptimWrapper`` (built, or named as a config's ``type``),
        accelerate's ``Accelerator(mixed_precision="fp16")``, Lightning's
        ``Trainer(precision="16-mixed")``."""
        if (qualified or "").rpartition(".")[2] in FRAMEWORK_AMP_WRAPPERS:
            return node
        for arg in node.args:
            key = arg.keyword.value if arg.keyword is not None else None
            if key == "type" and _name_or_string(arg.value) in FRAMEWORK_AMP_WRAPPERS:
                return arg
            if key == "mixed_precision" or (key == "precision" and last_name(node.func) == "Trainer"):
                if _name_or_string(self._setting(arg.value)) in MIXED_PRECISION_VALUES:
                    return node
        return None

    def _setting(self, value: cst.BaseExpression) -> cst.BaseExpression:
        """The literal a setting holds: a constant, or the default of the
        enclosing function's parameter (``def train(mixed_precision="fp16")``)."""
        value = self.ctx.constant(value)
        function = self.ctx.function
        if isinstance(value, cst.Name) and function is not None:
            for param in function.node.params.params:
                if param.name.value == value.value and param.default is not None:
                    return param.default
        return value

    def _report_framework(self, run: TrainerRun, fmt: str) -> None:
        if run.framework not in ("mmengine", "lightning"):
            return  # the trainer collates and moves the batches itself: the script cannot convert them
        self.report(
            run.constructor,
            f"a convolutional network trains under mixed precision in the default NCHW layout; convert the model "
            f"and the input batches with `.to(memory_format=torch.{fmt})` "
            "to use tensor-core convolutions without transposes",
            evidence=[
                *self._network(),
                framework_run_evidence(self.ctx, run),
            ],
        )


def _name_or_string(node: cst.BaseExpression) -> Optional[str]:
    """``AmpOptimWrapper`` or ``"AmpOptimWrapper"``, ``"fp16"``, ``16``: the name or literal text."""
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    if isinstance(node, cst.Integer):
        return node.value
    return last_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else dotted_name(node)
