from __future__ import annotations

import re
from typing import Optional, Tuple

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

# The script already decides about TF32 (either way).
_DECIDED = re.compile(r"allow_tf32|set_float32_matmul_precision|fp32_precision|\btf32\b|TF32")
# Mixed or reduced precision: matmuls do not run in float32, TF32 is moot.
_LOW_PRECISION = re.compile(
    r"autocast|GradScaler|\.half\(\)|float16|bfloat16|\bfp16\b|\bbf16\b|\bamp\b|mixed_precision|\.to\(torch\.half"
    r"|load_in_8bit|load_in_4bit|BitsAndBytesConfig"
)


# The training precision is decided by a launcher or a config this module does not show.
_PRECISION_ELSEWHERE = re.compile(
    r"\bAccelerator\(|set_default_dtype|get_dtype\(|\bprecision\s*=|\bdtype\s*=\s*(cfg|config|args)\b"
)
# Models whose time goes into float32 matmuls (transformers, attention, explicit matmuls).
_MATMUL_MODELS = re.compile(
    r"Transformer|MultiheadAttention|scaled_dot_product_attention|from_pretrained|torch\.matmul|\.matmul\(|\.bmm\(|torch\.bmm|einsum\(|\bF\.linear\("
)
# A checkpoint name of a convolutional architecture.
_CONV_CHECKPOINT = re.compile(
    r"[\"'][^\"'\n]*(resnet|resnext|convnext|efficientnet|mobilenet|regnet|vgg|densenet|yolo|unet)[^\"'\n]*[\"']",
    re.IGNORECASE,
)
_NOT_A_MODEL = re.compile(r"Tokenizer|Processor|Config|FeatureExtractor|tokenizer|processor")
_LINEAR = re.compile(r"\bLinear\(\s*(\w+)\s*,\s*(\w+)")
# A Linear layer this large (in x out) is a matmul worth tensor cores; smaller ones make a tiny MLP.
_LARGE_LINEAR = 512 * 512


def _matmul_model(source: str) -> Optional["re.Match[str]"]:
    """Where the module shows a model whose float32 matmuls TF32 would speed
    up, if it does. Convolutions do not count: cuDNN runs them in TF32 by default."""
    matches = list(_MATMUL_MODELS.finditer(source))
    if matches:
        # the evidence to show: a model rather than its tokenizer or config, where the module has one
        models = [m for m in matches if not _NOT_A_MODEL.search(_line_of(source, m, width=10_000))]
        return (models or matches)[0]
    for linear in _LINEAR.finditer(source):
        sizes = [_size(source, side) for side in linear.groups()]
        known = [size for size in sizes if size is not None]
        literal = all(side.replace("_", "").isdigit() for side in linear.groups())
        if len(known) == 2 and known[0] * known[1] >= (_LARGE_LINEAR if literal else _WIDE * _WIDE):
            return linear
        if len(known) == 1 and known[0] >= _WIDE and not any(side.isdigit() for side in linear.groups()):
            return linear  # ``Linear(hidden_size, vocab_size)``, 1024 wide into a size only known at run time
    return None


# One side this wide, the other a size set at run time (a vocabulary, a class count from the data).
_WIDE = 1024


def _size(source: str, text: str) -> Optional[int]:
    """A Linear layer's size: a literal, or a name the script assigns one number (``hidden_size = 1024``)."""
    if text.replace("_", "").isdigit():
        return int(text.replace("_", ""))
    assigned = re.findall(rf"^\s*{re.escape(text)}\s*=\s*(\d[\d_]*)\s*(?:#.*)?$", source, re.MULTILINE)
    return int(assigned[0].replace("_", "")) if len(set(assigned)) == 1 else None


def _line_of(source: str, match: "re.Match[str]", width: int = 60) -> str:
    """The source line a match is on, stripped and cut to ``width``."""
    start = source.rfind("\n", 0, match.start()) + 1
    end = source.find("\n", match.start())
    line = source[start : end if end != -1 else len(source)].strip()
    return line if len(line) <= width else line[: width - 1] + "…"


def _place(source: str, match: "re.Match[str]") -> Tuple[int, int]:
    """1-based row and column of a match in the module's text."""
    before = source[: match.start()]
    return before.count("\n") + 1, match.start() - (before.rfind("\n") + 1) + 1


class Tf32NotEnabled(Rule):
    """## What it does
    Flags a float32 CUDA *training entry point* that never sets
    `torch.backends.cuda.matmul.allow_tf32` or calls
    `torch.set_float32_matmul_precision(...)`. Opt-in: enable it with
    `--extend-select TL802`.

    A training entry point is a module that runs as a script and trains: it
    contains a training loop (a loop that calls `backward()` or an
    optimizer's `step()`, directly or through a function of the module) and
    either has an `if __name__ == "__main__":` block or top-level code that
    reaches the training (a module-level training loop, or a module-level
    call of a module function that trains). It is a *float32 CUDA* entry
    point when it mentions `cuda` and shows no sign of mixed or reduced
    precision (`autocast`, `GradScaler`, `.half()`, `float16`, `bfloat16`,
    `amp`). The finding points at the outermost loop around the training
    loop.

    The module must also show a model whose time goes into float32
    matmuls: a transformer or attention layer, a `from_pretrained` model,
    explicit `matmul`/`bmm`/`einsum`, or a `Linear` layer of at least
    512×512 (sizes given as literals; through names the script assigns a
    number, at least 1024×1024, or 1024 wide into a size known only at run
    time, such as a vocabulary). Convolution-only nets are left alone (cuDNN
    already runs convolutions in TF32 by default), and so are tiny MLPs,
    pretrained convnets (`from_pretrained("microsoft/resnet-50")`) and
    models built in another module.

    Hugging Face's `Trainer` is a training entry point too: it puts the
    model on the GPU itself and takes the precision from its
    `TrainingArguments`; with none of `fp16`, `bf16` or `tf32` given, the
    finding points at the arguments and asks for `tf32=True`.

    The rule stays silent when the module mentions TF32 or the float32
    matmul precision at all (turning it off is a decision too), and when
    the precision is decided elsewhere (`Accelerator()`, `precision=`, a
    dtype from the config).

    ## Why is this bad?
    Since PyTorch 1.12, float32 matrix multiplications on Ampere and newer
    GPUs run in full float32 precision by default. TensorFloat-32 tensor
    cores run them several times faster with a 10-bit mantissa, which most
    training tolerates with no change in convergence. A float32 training
    script that never opts in leaves that speed unused.

    ## Example
    ```python
    import torch

    model = torch.nn.Linear(1024, 1024).cuda()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    import torch

    torch.set_float32_matmul_precision("high")
    model = torch.nn.Linear(1024, 1024).cuda()
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x.cuda()), y.cuda())
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    The fix inserts `torch.set_float32_matmul_precision("high")` before the
    training loop (`torch.backends.cuda.matmul.allow_tf32 = True` when
    `target-torch` is below 1.12). It is unsafe: it lowers the precision of
    float32 matrix multiplications, which some numerically sensitive models
    do not tolerate.

    ## References
    - [CUDA semantics: TensorFloat-32 (TF32) on Ampere (and later) devices](https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices)
    - [`torch.set_float32_matmul_precision`](https://pytorch.org/docs/stable/generated/torch.set_float32_matmul_precision.html)
    - [Numerical accuracy: TF32 on Nvidia Ampere devices](https://pytorch.org/docs/stable/notes/numerical_accuracy.html#tensorfloat-32-tf32-on-nvidia-ampere-and-later-devices)
    """

    code = "TL802"
    name = "tf32-not-enabled"
    summary = "A float32 CUDA training script never enables TF32 matmuls"
    default_enabled = False
    fix_availability = "sometimes"
    requires_any = ("cuda", "Trainer")

    VALID = [
        Valid("""
            from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

            model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
            args = TrainingArguments("out", per_device_train_batch_size=32, bf16=True)
            Trainer(model=model, args=args, train_dataset=train_set).train()
        """),
        Valid("""
            import torch
            torch.backends.cuda.matmul.allow_tf32 = True
            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            torch.set_float32_matmul_precision("highest")
            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(x).sum()
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            model = torch.nn.Linear(8, 8)
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            def train(model, loader, optimizer):
                model.cuda()
                for x in loader:
                    model(x).sum().backward()
                    optimizer.step()
        """),
        Valid("""
            import torch
            model = torch.nn.Linear(8, 8).cuda().half()
            for x in loader:
                model(x.half()).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            scaler = torch.cuda.amp.GradScaler()
            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                scaler.scale(model(x).sum()).backward()
                scaler.step(optimizer)
        """),
        Valid("""
            import torch
            model = torch.nn.Linear(8, 8).cuda()
            if __name__ == "__main__":
                with torch.no_grad():
                    for x in loader:
                        print(model(x))
        """),
        Valid("""
            import torch
            torch.backends.cuda.matmul.fp32_precision = "tf32"
            model = torch.nn.Linear(8, 8).cuda()
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            import torch
            class Trainer:
                def fit(self, loader):
                    self.model.cuda()
                    for x in loader:
                        self.model(x).sum().backward()
                        self.optimizer.step()
        """),
        # A tiny MLP: its matmuls are not where the time goes.
        Valid("""
            import torch
            model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).cuda()
            for x, y in loader:
                torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
                optimizer.step()
        """),
        # Convolutions only: cuDNN already runs them in TF32 (allow_tf32 defaults to True for cuDNN).
        Valid("""
            import torch
            from torch import nn
            model = nn.Sequential(nn.Conv2d(3, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3)).cuda()
            for x in loader:
                model(x.cuda()).mean().backward()
                optimizer.step()
        """),
        # The precision is decided by the launcher's configuration.
        Valid("""
            import torch
            from accelerate import Accelerator
            from transformers import AutoModelForCausalLM
            accelerator = Accelerator()
            model = AutoModelForCausalLM.from_pretrained("gpt2").cuda()
            for batch in loader:
                accelerator.backward(model(**batch).loss)
                optimizer.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

            model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
            args = TrainingArguments("out", per_device_train_batch_size=32)
            Trainer(model=model, args=args, train_dataset=train_set).train()
            """,
            line=4,
            message="TrainingArguments(tf32=True)",
        ),
        Invalid(
            """
            import torch
            model = torch.nn.Linear(1024, 1024).cuda()
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            model = torch.nn.Linear(1024, 1024).cuda()
            torch.set_float32_matmul_precision("high")
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            unsafe_fixes=True,
            line=3,
        ),
        Invalid(
            """
            import torch
            model = torch.nn.Linear(1024, 1024).cuda()
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            fixed="""
            import torch
            model = torch.nn.Linear(1024, 1024).cuda()
            torch.backends.cuda.matmul.allow_tf32 = True
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            unsafe_fixes=True,
            target_torch="1.11",
        ),
        Invalid(
            """
            import torch

            def main():
                device = torch.device("cuda")
                model = torch.nn.TransformerEncoder(layer, num_layers=12).to(device)
                for epoch in range(10):
                    for x, y in train_loader:
                        loss = loss_fn(model(x.to(device)), y.to(device))
                        loss.backward()
                        optimizer.step()

            if __name__ == "__main__":
                main()
            """,
            line=6,
            message="TF32",
        ),
        Invalid(
            """
            from torch import nn
            model = nn.Linear(1024, 1024).to("cuda")
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            fixed=None,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            import torch as T
            model = T.nn.Linear(4096, 4096).cuda()
            def step(batch):
                model(batch.cuda()).sum().backward()
                opt.step()
            while True:
                step(next(data_iter))
            """,
            fixed="""
            import torch as T
            model = T.nn.Linear(4096, 4096).cuda()
            def step(batch):
                model(batch.cuda()).sum().backward()
                opt.step()
            T.set_float32_matmul_precision("high")
            while True:
                step(next(data_iter))
            """,
            unsafe_fixes=True,
            line=6,
        ),
    ]

    def finish(self) -> None:
        source = self.ctx.source
        if _DECIDED.search(source) or _LOW_PRECISION.search(source):
            return
        matmuls = None if _PRECISION_ELSEWHERE.search(source) else _matmul_model(source)
        if matmuls is None or ("from_pretrained" in matmuls.group(0) and _CONV_CHECKPOINT.search(source)):
            return  # a pretrained convnet (``"microsoft/resnet-50"``): cuDNN runs it in TF32 already
        loop = training_entry_loop(self.ctx)
        if loop is None:
            run = framework_training_run(self.ctx)
            if run is not None and run.framework in _FRAMEWORK_TF32:
                self._report_framework(run, matmuls)
            return
        if "cuda" not in source:
            return
        outer = outermost_loop_in_function(loop)
        row, column = _place(source, matmuls)
        alias = torch_alias(self.ctx.names)
        fix = None
        if alias is not None:
            line = (
                f"{alias}.backends.cuda.matmul.allow_tf32 = True"
                if self.ctx.torch_below(1, 12)
                else f'{alias}.set_float32_matmul_precision("high")'
            )
            fix = self.ctx.fix(
                UNSAFE, "Enable TF32 matmuls before the training loop", self.ctx.insert_line_before(outer.node, line)
            )
        self.report(
            outer.node,
            "float32 CUDA training runs with full-precision float32 matmuls; on Ampere or newer GPUs "
            'TF32 (`torch.set_float32_matmul_precision("high")`) is several times faster',
            fix,
            evidence=[
                Evidence(
                    f"a model whose time goes into matmuls: `{_line_of(source, matmuls)}`", row=row, column=column
                ),
                training_loop_evidence(self.ctx, loop),
            ],
        )

    def _report_framework(self, run: TrainerRun, matmuls: "re.Match[str]") -> None:
        """A trainer that takes the precision from its arguments (Hugging Face's
        ``TrainingArguments``) and puts the model on the GPU itself."""
        setting = _FRAMEWORK_TF32[run.framework]
        arguments = run.arguments
        if arguments is None or any(arg.star for arg in arguments.args):
            return  # settings the rule cannot see
        row, column = _place(self.ctx.source, matmuls)
        self.report(
            arguments,
            f"the {run.framework} trainer trains in float32 with full-precision float32 matmuls; on Ampere or "
            f"newer GPUs TF32 (`{setting}`) is several times faster",
            evidence=[
                Evidence(
                    f"a model whose time goes into matmuls: `{_line_of(self.ctx.source, matmuls)}`",
                    row=row,
                    column=column,
                ),
                framework_run_evidence(self.ctx, run),
            ],
        )


# Trainers that put the model on the GPU and take TF32 from their arguments
# object (``TrainerRun.arguments``): the setting to add.
_FRAMEWORK_TF32 = {"transformers": "TrainingArguments(tf32=True)"}
