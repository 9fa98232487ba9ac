from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from torchlint.model import (
    TrainerRun,
    framework_run_evidence,
    framework_training_run,
    outermost_loop_in_function,
    torch_alias,
    training_entry_loop,
    training_loop_evidence,
)
from torchlint.rule import UNSAFE, Evidence, Invalid, Rule, Valid

# The script already decides about cuDNN autotuning (either way), or asks for
# determinism, which rules benchmark mode out.
_DECIDED = re.compile(
    r"cudnn\W+benchmark|cudnn_benchmark|use_deterministic_algorithms|cudnn\W+deterministic|benchmark\s*="
    # libraries' switches that set cuDNN deterministic (MONAI, Hugging Face, Lightning)
    r"|set_determinism|enable_full_determinism|deterministic\s*=\s*True"
)


class CudnnBenchmarkNotEnabled(Rule):
    """## What it does
    Flags a convolutional *training entry point* that never sets
    `torch.backends.cudnn.benchmark`. Opt-in: enable it with
    `--extend-select TL801`.

    A training entry point is a module that runs as a script and trains: it
    contains a training loop (a loop that calls `backward()` or an
    optimizer's `step()`, directly or through a function of the module) and
    either has an `if __name__ == "__main__":` block or top-level code that
    reaches the training (a module-level training loop, a module-level
    call of a module function that trains, or one that hands it to a
    launcher: `mp.spawn(train, ...)`, `notebook_launcher(training_loop, ...)`).
    Library modules that only define training functions are not entry
    points. It is convolutional when it builds or runs a convolution:
    `nn.Conv1d/2d/3d` (and transposed/lazy variants), `F.conv2d` and
    friends, a torchvision CNN constructor (`torchvision.models.resnet50()`,
    …), a timm convolutional architecture (`timm.create_model("resnet50d")`),
    a convolutional network of MONAI (`monai.networks.nets.UNet`,
    `DenseNet121`, …; not its transformer hybrids such as `UNETR`), diffusers
    (`UNet2DModel`) or segmentation_models_pytorch, or a model class of
    another file of the project that builds convolutions, imported by name,
    through a package's re-export, or with `from models import *`.
    The finding points at the outermost loop around the training loop.

    A script whose training loop is a framework's (an mmengine `Runner` it
    builds and runs with `runner.train()`, a Lightning `Trainer` with
    `trainer.fit(...)`) is an entry point too; the finding then points at
    the trainer, which takes the setting: `env_cfg=dict(cudnn_benchmark=True)`
    in mmengine, `Trainer(benchmark=True)` in Lightning; composer's and
    Hugging Face's trainers have no such setting, so the script sets the
    flag itself before the trainer runs.

    The rule stays silent when the module mentions the setting at all
    (`cudnn.benchmark = False` is a decision too, as is reading it from a
    config), or asks for determinism (`torch.backends.cudnn.deterministic`,
    `torch.use_deterministic_algorithms`, MONAI's `set_determinism`,
    `Trainer(deterministic=True)`), and for a framework run bounded to a
    handful of batches (`train_subset_num_batches=5`, `max_steps=10`,
    `fast_dev_run=True`): a demonstration that autotuning would not pay back.

    ## Why is this bad?
    With `benchmark = True`, cuDNN times the available convolution
    algorithms the first time it sees each input shape and then uses the
    fastest one. For convolutional networks with fixed input shapes this is
    often a large speed-up for free.

    **This is only right for fixed input shapes.** Every new shape triggers a
    new round of benchmarking, so with variable image sizes, variable
    sequence lengths or a ragged last batch (no `drop_last=True`), benchmark
    mode can be slower than the default. It also makes algorithm choice, and
    so results, vary from run to run. That is why the rule is opt-in.

    ## Example
    ```python
    import torch
    import torch.nn as nn

    def main():
        model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images.cuda()), labels.cuda())
            loss.backward()
            optimizer.step()

    if __name__ == "__main__":
        main()
    ```

    Use instead:
    ```python
    import torch
    import torch.nn as nn

    def main():
        torch.backends.cudnn.benchmark = True  # input shapes are fixed
        model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(10)).cuda()
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images.cuda()), labels.cuda())
            loss.backward()
            optimizer.step()

    if __name__ == "__main__":
        main()
    ```

    ## Fix safety
    The fix inserts `torch.backends.cudnn.benchmark = True` before the
    training loop. It is unsafe: it changes which convolution algorithms run
    (results differ in the last bits and between runs), and it slows down
    training whose input shapes vary.

    ## References
    - [Performance tuning guide: enable cuDNN auto-tuner](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#enable-cudnn-auto-tuner)
    - [`torch.backends.cudnn.benchmark`](https://pytorch.org/docs/stable/backends.html#torch.backends.cudnn.benchmark)
    - [Reproducibility: CUDA convolution benchmarking](https://pytorch.org/docs/stable/notes/randomness.html#cuda-convolution-benchmarking)
    """

    code = "TL801"
    name = "cudnn-benchmark-not-enabled"
    summary = "A convolutional training script never enables `torch.backends.cudnn.benchmark`"
    default_enabled = False
    fix_availability = "sometimes"
    # a text prefilter: a convolution, a CNN library, or a model class the project defines elsewhere
    requires_any = (
        "Conv",
        "conv",
        "torchvision",
        "timm",
        "monai",
        "diffusers",
        "segmentation_models_pytorch",
        "import",
    )

    VALID = [
        Valid("""
            import torchvision
            from mmengine.runner import Runner
            runner = Runner(model=torchvision.models.resnet50(), train_dataloader=loader_cfg,
                            env_cfg=dict(cudnn_benchmark=True))
            runner.train()
        """),
        Valid("""
            import torchvision
            from mmengine.runner import Runner
            def build():
                return Runner(model=torchvision.models.resnet50(), train_dataloader=loader_cfg)
        """),
        Valid("""
            import timm
            import torch.multiprocessing as mp
            def train(rank):
                model = timm.create_model("vit_base_patch16_224").cuda()
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()
            mp.spawn(train, nprocs=2)
        """),
        Valid("""
            import torch
            import torch.nn as nn
            torch.backends.cudnn.benchmark = True
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            torch.backends.cudnn.benchmark = False  # variable image sizes
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch.nn as nn
            def train(model, loader, optimizer):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
            def build():
                return nn.Conv2d(3, 8, 3)
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Linear(8, 8)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            torch.use_deterministic_algorithms(True)
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch.backends.cudnn as cudnn
            import torch.nn as nn
            cudnn.benchmark = args.benchmark
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3)
            if __name__ == "__main__":
                with torch.no_grad():
                    for x in loader:
                        print(model(x).shape)
        """),
        Valid("""
            import torch
            import torchvision
            model = torchvision.models.vit_b_16()
            for x, y in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            torch.backends.cudnn.deterministic = True
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3)
            with torch.backends.cudnn.flags(enabled=True, benchmark=True):
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torchvision
            from mmengine.runner import Runner

            def main():
                runner = Runner(model=torchvision.models.resnet50(), train_dataloader=loader_cfg)
                runner.train()

            if __name__ == "__main__":
                main()
            """,
            line=5,
            message="env_cfg=dict(cudnn_benchmark=True)",
        ),
        Invalid(
            """
            import lightning as L
            from torch import nn
            model = Classifier(nn.Conv2d(3, 16, 3))
            trainer = L.Trainer(max_epochs=10)
            trainer.fit(model, train_loader)
            """,
            line=4,
            message="Trainer(benchmark=True)",
        ),
        Invalid(
            """
            import torch
            import torch.multiprocessing as mp
            from timm import create_model

            def train(rank):
                model = create_model("resnet50d").cuda()
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()

            mp.spawn(train, nprocs=2)
            """,
            fixed="""
            import torch
            import torch.multiprocessing as mp
            from timm import create_model

            def train(rank):
                model = create_model("resnet50d").cuda()
                torch.backends.cudnn.benchmark = True
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()

            mp.spawn(train, nprocs=2)
            """,
            unsafe_fixes=True,
            line=7,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3)
            torch.backends.cudnn.benchmark = True
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            unsafe_fixes=True,
            line=4,
        ),
        Invalid(
            """
            import torch
            import torch.nn as nn
            model = nn.Conv2d(3, 8, 3)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            fixed=None,
            message="only right for fixed input shapes",
        ),
        Invalid(
            """
            import torch
            import torchvision

            def main():
                model = torchvision.models.resnet50().cuda()
                for epoch in range(90):
                    for images, labels in train_loader:
                        loss = criterion(model(images), labels)
                        loss.backward()
                        optimizer.step()

            if __name__ == "__main__":
                main()
            """,
            fixed="""
            import torch
            import torchvision

            def main():
                model = torchvision.models.resnet50().cuda()
                torch.backends.cudnn.benchmark = True
                for epoch in range(90):
                    for images, labels in train_loader:
                        loss = criterion(model(images), labels)
                        loss.backward()
                        optimizer.step()

            if __name__ == "__main__":
                main()
            """,
            unsafe_fixes=True,
            line=6,
        ),
        Invalid(
            """
            import torch as T
            import torch.nn.functional as F

            def train_step(w, x, opt):
                F.conv2d(x, w).sum().backward()
                opt.step()

            def run():
                for x in loader:
                    train_step(weight, x, opt)

            run()
            """,
            fixed="""
            import torch as T
            import torch.nn.functional as F

            def train_step(w, x, opt):
                F.conv2d(x, w).sum().backward()
                opt.step()

            def run():
                T.backends.cudnn.benchmark = True
                for x in loader:
                    train_step(weight, x, opt)

            run()
            """,
            unsafe_fixes=True,
            line=9,
        ),
        Invalid(
            """
            from torch import nn
            model = nn.Sequential(nn.Conv3d(1, 4, 3))
            if __name__ == "__main__":
                for x in loader:
                    model(x).mean().backward()
                    optim.step()
            """,
            fixed=None,
            unsafe_fixes=True,
            message="cudnn.benchmark",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.convolution: Optional[cst.Call] = None  # the first convolution the module builds or runs
        self.defined_at: Optional[str] = None  # where its class is, when another file defines it

    def visit_Call(self, node: cst.Call) -> None:
        if self.convolution is None:
            built = self.ctx.convolution_built(node)
            if built is not None:
                self.convolution, self.defined_at = node, built[1]

    def finish(self) -> None:
        if self.convolution is None or _DECIDED.search(self.ctx.source):
            return
        loop = training_entry_loop(self.ctx)
        if loop is None:
            run = framework_training_run(self.ctx)
            if run is not None:
                self._report_framework(run)
            return
        outer = outermost_loop_in_function(loop)
        alias = torch_alias(self.ctx.names)
        fix = None
        if alias is not None:
            fix = self.ctx.fix(
                UNSAFE,
                "Set `torch.backends.cudnn.benchmark = True` before the training loop",
                self.ctx.insert_line_before(outer.node, f"{alias}.backends.cudnn.benchmark = True"),
            )
        self.report(
            outer.node,
            "convolutional training runs without `torch.backends.cudnn.benchmark = True`; if input shapes are "
            "fixed, enabling it lets cuDNN pick the fastest algorithms (only right for fixed input shapes)",
            fix,
            evidence=[
                self._convolutional(),
                training_loop_evidence(self.ctx, loop),
            ],
        )

    def _convolutional(self) -> Evidence:
        assert self.convolution is not None
        where = f" (its class at {self.defined_at} builds convolutions)" if self.defined_at else ""
        return Evidence(
            f"the network is convolutional: `{self.ctx.code_line(self.convolution)}`{where}", node=self.convolution
        )

    def _report_framework(self, run: TrainerRun) -> None:
        """The training loop is a framework's: the setting goes to its trainer."""
        # a trainer with no setting of its own (composer's, Hugging Face's): the flag, set by the script
        setting = _FRAMEWORK_SETTING.get(run.framework, "`torch.backends.cudnn.benchmark = True` before it runs")
        self.report(
            run.constructor,
            f"convolutional training runs without cuDNN autotuning; if input shapes are fixed, {setting} lets cuDNN "
            "pick the fastest algorithms (only right for fixed input shapes)",
            evidence=[
                self._convolutional(),
                framework_run_evidence(self.ctx, run),
            ],
        )


# How each framework's trainer is told to enable cudnn.benchmark (it sets the flag itself).
_FRAMEWORK_SETTING = {
    "mmengine": "`env_cfg=dict(cudnn_benchmark=True)`",
    "lightning": "`Trainer(benchmark=True)`",
}
