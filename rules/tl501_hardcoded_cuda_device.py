from __future__ import annotations

import itertools
import re
from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    Site,
    dotted_name,
    iter_subtree,
    last_name,
    mentions_cuda_availability,
    requires_cuda,
)
from torchlint.rule import DISPLAY_ONLY, SAFE, UNSAFE, Evidence, Fix, Invalid, Rule, Valid

if TYPE_CHECKING:
    from typing import TypeGuard  # Python 3.10+; only mypy reads it

_CUDA_LITERAL = re.compile(r"^cuda(:\d+)?$")
# Names of variables and parameters that hold a device.
_DEVICE_NAME = re.compile(r"(?i)^(device|dev|_device|\w+_device)$")
# Keywords whose value is a device (not a device *type*).
_DEVICE_KEYWORDS = frozenset({"device", "map_location"})
# APIs that take a device type, or are CUDA's own API: their arguments are not
# a hardcoded placement.
_EXEMPT_CALLEES = (
    "torch.cuda.",
    "torch.backends.",
    "torch.autocast",
    "torch.amp.",
    "torch.cpu.amp.",
    "torch.GradScaler",
    "torch.distributed.fsdp.sharded_grad_scaler.",
    "torch.utils.cpp_extension.",
    "torch.utils.benchmark.",
)
# An ``if`` testing something like this chooses between devices: both
# branches exist on purpose (``if args.cuda:``, ``if device == "cpu":``).
_DEVICE_CHOICE = re.compile(r"(?i)(cuda|gpu|cpu|mps|xla|tpu|device|accelerat|hpu|npu|xpu)")
# A decorator saying "this needs CUDA": CUDA-only by design.
_CUDA_ONLY = re.compile(r"(?i)(cuda|gpu)")
# Function, class and file names of code that is CUDA-only by design: CUDA,
# cuDNN, NCCL, Triton kernels, GPU benchmarks.
_CUDA_ONLY_CODE = re.compile(r"(?i)(cuda|cudnn|gpu|triton|nccl|cutlass|nvidia|bench)")
# Importing one of these makes a module CUDA-only by design.
_CUDA_ONLY_MODULES = (
    "triton",
    "bitsandbytes",
    "cupy",
    "pycuda",
    "apex",
    "cutlass",
    "cuda",
    "tensorrt",
    "flash_attn",
    "transformer_engine",
    "msamp",
    "vllm",
)

# Devices other than CUDA that code may choose: assigning one to a device
# variable (or defaulting a device parameter to one) says the code runs there.
_OTHER_DEVICE = re.compile(r"^(cpu|mps|xpu|xla|npu|hpu|meta)(:\d+)?$")

# Classes whose ``device`` is a device *type* (GradScaler and autocast subclasses).
_DEVICE_TYPE_CLASS = re.compile(r"(?i)(scaler|autocast)")


def is_cuda_literal(node: Optional[cst.CSTNode]) -> TypeGuard[cst.SimpleString]:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return isinstance(value, str) and bool(_CUDA_LITERAL.match(value))
    return False


class HardcodedCudaDevice(Rule):
    """## What it does
    Flags `.cuda()` calls on tensors and modules, and `"cuda"` / `"cuda:N"`
    string literals used as a device: `device="cuda"` and
    `map_location="cuda"` arguments, `torch.device("cuda:0")`, `.to("cuda")`,
    parameter defaults such as `def run(device="cuda")`, and assignments
    such as `device = "cuda"`.

    It fires only on positive evidence that the code is meant to run
    without CUDA, and reports it: the module falls back to another device
    (`"cuda" if torch.cuda.is_available() else "cpu"`, a device variable
    or parameter set to `"cpu"`, `"mps"`, ...); the function is handed a
    device (a `device`, `dev` or `*_device` parameter) or chooses one itself
    (`dev = torch.device(args.device)`) and the line ignores it; or, for a
    `device="cuda"` default, a call in the module relies on the default
    and no other line of the module hardcodes CUDA (a demo that calls
    `model.cuda()` throughout is CUDA-only by design).
    Code with none of these (a training script, a demo or a library
    written for the GPU, a default every caller overrides) is left alone: a
    reviewer would not make it device-agnostic. An `is_available()` test
    that only seeds or configures CUDA, and `torch.device("cpu")` used to
    stage a load on the host, are no such evidence.

    Even then it stays silent where the code already chooses a device or
    CUDA is known to be there:
    - under a `torch.cuda.is_available()` / `device_count()` guard (an `if`,
      a conditional expression, `and`, or an early
      `if not torch.cuda.is_available(): raise/return/exit` or
      `assert torch.cuda.is_available()` in the function or module);
    - in the usual `device = "cuda" if torch.cuda.is_available() else "cpu"`
      idiom and any conditional expression that picks between devices;
    - in a branch of an `if` whose test is about the device (`if args.cuda:`,
      `if use_gpu:`, `if device == "cpu":`);
    - in device-type comparisons (`x.device.type == "cuda"`) and other
      strings that are not used as a device;
    - in device-*type* arguments (`torch.autocast("cuda", …)`,
      `torch.amp.GradScaler("cuda")`, `device_type="cuda"`) and arguments of
      `torch.cuda.*` calls themselves;
    - in a `try` body that has an `except` fallback, and in assignments to
      a name that says it is the CUDA device (`cuda_device = "cuda:0"`);
    - in a parameter default the function never uses (a signature kept for
      compatibility) or compares with another device (`if device == "cpu":`),
      and in `device` parameters of GradScaler/autocast subclasses (a device
      type);
    - in code that is CUDA-only by design: functions or classes whose
      decorator mentions CUDA or a GPU (`@unittest.skipIf(not TEST_CUDA, …)`,
      `@pytest.mark.skipif(not torch.cuda.is_available(), …)`,
      `@requires_cuda`, `@onlyCUDA`); functions, classes or base classes
      whose name mentions CUDA, cuDNN, NCCL, Triton, a GPU or a benchmark
      (`def _forward_cuda`, `class CUDATestBase`, `def benchmark`); files
      whose path mentions them (`ops/cuda/`, `backends/cudnn/`,
      `_triton_ops.py`); modules that import `triton`, `bitsandbytes`,
      `cupy`, `pycuda`, `apex`, `cutlass`, `cuda` (cuda-python), `tensorrt`,
      `flash_attn`, `transformer_engine`, `msamp` or `vllm`, or a CUDA extension the
      project builds (`CUDAExtension("name", …)` in its `setup.py`); and
      modules that call `torch.cuda.set_device(...)`, set up an NCCL
      process group (`init_process_group(backend="nccl")`,
      `args.dist_backend = "nccl"`) or build a Lightning `Trainer` that asks
      for GPUs (`accelerator="gpu"`, `gpus=1`, `devices=[0]`) unconditionally, which fails without
      CUDA just as an assertion would, and modules that import such a
      module of the same project (`import mypkg.distributed`);
    - in test modules (`test_*.py`, `*_test.py`, `conftest.py`, and files
      under `test/`, `tests/` or `testing/`): tests usually target a device
      on purpose. Set the `check-tests` option to check them too.

    `.cuda(i)` with a variable index (`.cuda(args.gpu)`, `.cuda(local_rank)`)
    is not flagged: the author placed the value on a chosen GPU, as
    distributed launchers do.

    ## Why is this bad?
    A hardcoded CUDA device makes the code crash with "Torch not compiled
    with CUDA enabled" or "no CUDA GPUs are available" on a laptop, a CPU CI
    runner, Apple silicon (`mps`) or another accelerator, and `"cuda:0"`
    silently piles every process of a multi-GPU job onto the first GPU.
    Choosing the device once and passing it down (`x.to(device)`) keeps the
    code portable and testable on CPU.

    ## Known problems
    Scripts that are CUDA-only by design (custom CUDA kernels, NCCL-only
    distributed jobs, GPU benchmarks) get findings unless they say so:
    assert it once at the top (`assert torch.cuda.is_available()`, or
    `if not torch.cuda.is_available(): sys.exit(...)`), which silences the
    whole module; or mark the function with a CUDA-requiring decorator; or
    put `# torchlint: noqa: TL501` at the top of the file; or turn the rule
    off for those paths with `per-file-ignores`. f-strings such as
    `f"cuda:{rank}"` are not flagged.

    ## Example
    ```python
    import torch

    def train(model, loader, device):
        model = model.cuda()
        for x, y in loader:
            x, y = x.to("cuda"), y.to("cuda")
    ```

    Use instead:
    ```python
    import torch

    def train(model, loader, device):
        model = model.to(device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ```

    ## Fix safety
    When exactly one device variable is in scope, the fix rewrites `.cuda()`
    as `.to(device)` and a `"cuda"` literal argument as that variable.
    "In scope" means: parameters of the enclosing function named `device`,
    `dev` or `*_device`, and names assigned earlier in that function that
    are named so or hold a `torch.device(...)`; if the function has none,
    such names assigned earlier at module level. Variables that evidently
    hold no GPU (`None`, `"cpu"`, `torch.device("cpu")`, as a value or a
    parameter's default) are not device variables here.

    The fix is safe when the variable evidently holds the device `.cuda()`
    moves to: `torch.device("cuda")`, or `"cuda"` when
    `torch.cuda.is_available()` and the CPU otherwise; the code then behaves
    the same on every machine it ran on before. It is unsafe for a
    parameter or any other value (`args.device`, `f"cuda:{rank}"`), which
    may be another device at run time. `.cuda(0)` (a literal index) and
    every case with zero or several candidate variables get a display-only
    suggestion. Parameter defaults and assignments have no fix: the choice
    of a default belongs to the author.

    ## References
    - [CUDA semantics: best practices, device-agnostic code](https://pytorch.org/docs/stable/notes/cuda.html#device-agnostic-code)
    - [`torch.device`](https://pytorch.org/docs/stable/tensor_attributes.html#torch-device)
    - [`torch.Tensor.to`](https://pytorch.org/docs/stable/generated/torch.Tensor.to.html)
    """

    code = "TL501"
    name = "hardcoded-cuda-device"
    summary = 'A `.cuda()` call or a `"cuda"` device literal ties code to CUDA'
    fix_availability = "sometimes"
    requires_any = ("cuda",)

    VALID = [
        Valid("""
            def check_device(a, b, device="cuda"):
                return a.device.type == b.device.type == device

            def should_decompose(mat1, mat2):
                return check_device(mat1, mat2, device="cuda") or check_device(mat1, mat2, device="xpu")
        """),
        Valid("""
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model.to(device)
        """),
        Valid("""
            import torch
            device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
        """),
        Valid("""
            import torch
            if torch.cuda.is_available():
                model = model.cuda()
                x = x.to("cuda")
        """),
        Valid("""
            def step(x):
                if x.device.type == "cuda":
                    return x
                return x.to(x.device)
        """),
        Valid("""
            import torch
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(x)
            scaler = torch.amp.GradScaler("cuda")
        """),
        Valid("""
            import torch
            with torch.autocast(device_type="cuda"):
                out = model(x)
            torch.cuda.set_device("cuda:0")
            free = torch.cuda.mem_get_info("cuda:0")
        """),
        Valid("""
            import torch
            if not torch.cuda.is_available():
                raise SystemExit("this benchmark needs a GPU")
            x = torch.randn(10, device="cuda")
            model.cuda()
        """),
        Valid("""
            import torch
            def main(args):
                if args.cuda:
                    model.cuda()
                device = "cuda" if args.gpu else "cpu"
        """),
        Valid("""
            import torch, unittest
            TEST_CUDA = torch.cuda.is_available()
            class T(unittest.TestCase):
                @unittest.skipIf(not TEST_CUDA, "needs CUDA")
                def test_kernel(self):
                    x = torch.ones(3, device="cuda")
                    self.assertEqual(x.cuda().sum().item(), 3)
        """),
        Valid("""
            def log(backend):
                print("cuda")
                stats = {"cuda": 0}
                return backend == "cuda"
        """),
        Valid("""
            import torch
            def to_rank(x, local_rank):
                return x.cuda(local_rank)
        """),
        Valid("""
            import torch
            use_cuda = torch.cuda.is_available()
            model = model.cuda() if use_cuda else model
            x = x.cuda() if use_cuda else x
        """),
        Valid("""
            def _forward_cuda(x):
                return kernel(x.cuda())
        """),
        Valid("""
            import torch
            import triton
            def launch(x):
                out = torch.empty_like(x, device="cuda")
                return out
        """),
        Valid("""
            import torch
            device_type = (current_accelerator() or torch.device("cuda")).type
        """),
        Valid("""
            f = f"cuda:{rank}"
            y = x.to(f"cuda:{rank}")
        """),
        # nothing says this code runs anywhere but on a GPU
        Valid("""
            import torch
            def train(model, loader):
                model = model.cuda()
                for x, y in loader:
                    x, y = x.cuda(non_blocking=True), y.to("cuda")
            device = torch.device("cuda:0")
        """),
        # seeding CUDA when present is no CPU fallback
        Valid("""
            import torch
            def seed(s):
                if torch.cuda.is_available():
                    torch.cuda.manual_seed(s)
            def build():
                return Net().cuda()
        """),
        # a CUDA default the function never reads: its body passes "cuda" itself (the keyword
        # `device=` and an attribute `.device` are the same word, not a read of the parameter)
        Valid("""
            def beeps(n, device="cuda"):
                return synth(n, device="cuda").to(torch.zeros(1).device)
            wave = beeps(3)
        """),
        # a call relies on the default, but the module is written for CUDA throughout: one default
        # changed would buy nothing
        Valid("""
            def load_img(path, device="cuda"):
                return read(path).to(device)
            def main():
                model = build().cuda()
                image = load_img("x.png")
        """),
        # a Lightning Trainer that asks for GPUs places the batches, and fails without CUDA first
        Valid("""
            import torch
            import pytorch_lightning
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            class Net(pytorch_lightning.LightningModule):
                def training_step(self, batch, index):
                    return self.model(batch["image"].cuda())
            trainer = pytorch_lightning.Trainer(devices=[0], max_epochs=10)
            trainer.fit(Net())
        """),
        # a CUDA default every caller overrides
        Valid("""
            def grid(size, device="cuda"):
                return make(size, device=device)
            def forward(feat):
                return grid(feat.shape, device=feat.device)
        """),
        # staging a load on the host is no claim that the code runs there
        Valid("""
            import torch
            def load(path):
                model = create(path, device=torch.device("cpu"))
                return model.cuda()
        """),
    ]

    INVALID = [
        # The device `.cuda()` moves to, or the CPU where there is no GPU: safe.
        Invalid(
            """
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            x = x.cuda()
            """,
            fixed="""
            import torch
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            x = x.to(device)
            """,
        ),
        # Variables that hold no GPU are not device variables: no fix.
        Invalid(
            """
            import torch
            def offload(model, x):
                cpu_device = torch.device("cpu")
                return model(x.cuda()), cpu_device
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            import torch
            def make_mask(n, device=None):
                return torch.ones(n, n).tril().cuda()
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            def evaluate(model, x, device):
                model = model.cuda()
                return model(x)
            """,
            fixed="""
            def evaluate(model, x, device):
                model = model.to(device)
                return model(x)
            """,
            unsafe_fixes=True,  # a parameter (or `args.device`) may be another device at run time
            line=2,
            message="`.cuda()`",
        ),
        # the module falls back to the CPU elsewhere: this line breaks that
        Invalid(
            """
            import torch
            def pick(args):
                return "cuda" if args.gpu and torch.cuda.is_available() else "cpu"
            DEVICE = torch.device("cuda:0")
            """,
            message='"cuda:0"',
        ),
        Invalid(
            """
            def place(w, src_device, dst_device):
                x = torch.zeros(3, device="cuda")
                y = w.to("cuda:1")
            """,
            count=2,
        ),
        # a Trainer that runs wherever it is started does not make the module CUDA-only
        Invalid(
            """
            import torch
            import lightning as L
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def show(model, batch):
                return model(batch["image"].cuda())
            L.Trainer(accelerator="auto", devices=1).fit(model)
            """,
            fixed="""
            import torch
            import lightning as L
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def show(model, batch):
                return model(batch["image"].to(device))
            L.Trainer(accelerator="auto", devices=1).fit(model)
            """,
        ),
        # a call relies on the CUDA default
        Invalid(
            """
            def run(model, device="cuda"):
                return model.to(device)
            out = run(net)
            """,
            message="default",
        ),
        # ... in a module that runs without CUDA elsewhere: the default breaks that
        Invalid(
            """
            import torch
            def run(model, device="cuda"):
                return model.to(device)
            fallback = "cuda" if torch.cuda.is_available() else "cpu"
            out = run(net)
            """,
            message="default",
        ),
        # no device variable: display-only
        Invalid(
            """
            import torch
            kind = "cuda" if torch.cuda.is_available() else "cpu"
            model = Net().cuda()
            """,
            fixed=None,
        ),
        # two device variables: ambiguous, display-only
        Invalid(
            """
            def copy(x, src_device, dst_device):
                return x.cuda()
            """,
            fixed=None,
        ),
        # a local assigned from torch.device(...) counts
        Invalid(
            """
            import torch
            def main(args):
                dev = torch.device(args.device)
                batch = batch.cuda(non_blocking=True)
            """,
            fixed="""
            import torch
            def main(args):
                dev = torch.device(args.device)
                batch = batch.to(dev, non_blocking=True)
            """,
            unsafe_fixes=True,  # a parameter (or `args.device`) may be another device at run time
        ),
        # a device literal in .to() replaced by the one device variable
        Invalid(
            """
            def predict(model, x, device):
                return model(x.to("cuda"))
            """,
            fixed="""
            def predict(model, x, device):
                return model(x.to(device))
            """,
            unsafe_fixes=True,  # a parameter (or `args.device`) may be another device at run time
        ),
        # torch.load(map_location="cuda"), import alias
        Invalid(
            """
            import torch as T
            on = "cuda" if T.cuda.is_available() else "cpu"
            state = T.load(path, map_location="cuda")
            """,
        ),
        # the module-level device variable is in scope inside a function without one
        Invalid(
            """
            import torch
            DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def load(model):
                return model.cuda()
            """,
            fixed="""
            import torch
            DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            def load(model):
                return model.to(DEVICE)
            """,
        ),
        # .cuda(0): a literal index, display-only
        Invalid(
            """
            def go(x, device):
                return x.cuda(0)
            """,
            fixed=None,
        ),
        # an assignment of a bare literal
        Invalid(
            """
            DEVICE = "cuda"
            def export(model, device="cpu"):
                return model.to(device)
            """,
            message="`DEVICE = ",
        ),
        # a test about something else is no device choice
        Invalid(
            """
            def setup(model, distributed, src_device, dst_device):
                if distributed:
                    model = model.cuda()
                return model
            """,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.CSTNode, str, Optional[Fix], Optional[Evidence]]] = []
        self.module_devices: List[str] = []
        path = ctx.path.replace("\\", "/").lower()
        self.cuda_only_file = any(_CUDA_ONLY_CODE.search(part) for part in path.split("/")[-3:])
        # device parameters with a CUDA default: function node -> {param name: [used, compared]}
        self.default_params: dict = {}
        # The first place where the module shows it runs without CUDA: a
        # `torch.cuda.is_available()` test or a non-CUDA device chosen.
        self.runs_without_cuda: Optional[Tuple[cst.CSTNode, str]] = None
        # Calls of functions of this module by simple name: name -> calls
        self.calls_by_name: dict = {}
        # per scope (its ``ctx.values``): [the dict, names looked at, device-like names]
        self._scope_devices: dict = {}
        # per scope: names assigned ``torch.device(...)`` there
        self._device_calls_assigned: dict = {}
        self._module_values: dict = {}  # module-level device variable -> its last value

    # -- walk ------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        qname = self.ctx.qualified_name(func) or ""
        self._note_cpu_claim_in_call(node, qname)
        callee = (
            last_name(func)
            if isinstance(func, cst.Name)
            or (
                isinstance(func, cst.Attribute)
                and isinstance(func.value, cst.Name)
                and func.value.value in ("self", "cls")
            )
            else None
        )
        if callee:
            self.calls_by_name.setdefault(callee, []).append(node)
        if self.cuda_only_file:
            return
        if qname.startswith(_EXEMPT_CALLEES):
            return
        if isinstance(func, cst.Attribute) and func.attr.value == "cuda":
            self._cuda_call(node, func)
            return
        if (
            qname == "torch.device"
            and node.args
            and node.args[0].keyword is None
            and is_cuda_literal(node.args[0].value)
        ):
            self._literal(
                node.args[0].value, f"`torch.device({node.args[0].value.value})` hardcodes a CUDA device", fixable=True
            )
            return
        if isinstance(func, cst.Attribute) and func.attr.value == "to" and node.args:
            first = node.args[0]
            if first.keyword is None and is_cuda_literal(first.value):
                self._literal(first.value, f"`.to({first.value.value})` hardcodes a CUDA device", fixable=True)
                return
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in _DEVICE_KEYWORDS and is_cuda_literal(arg.value):
                self._literal(
                    arg.value, f"`{arg.keyword.value}={arg.value.value}` hardcodes a CUDA device", fixable=True
                )

    def _note_cpu_claim_in_call(self, node: cst.Call, qname: str) -> None:
        if self.runs_without_cuda is not None:
            return
        if qname == "torch.cuda.is_available" and self._chooses_another_device():
            self.runs_without_cuda = (node, "the module falls back to another device when CUDA is missing")

    def _chooses_another_device(self) -> bool:
        """Is the `torch.cuda.is_available()` being visited the test of a
        choice with a non-CUDA device on the other side (`"cuda" if ... else
        "cpu"`, `if ...: dev = "cuda" else: dev = "cpu"`)? A bare
        `if torch.cuda.is_available(): torch.cuda.manual_seed(s)` is not."""
        for ancestor in reversed(self.ctx.ancestry()[:-1]):
            if isinstance(ancestor, (cst.IfExp, cst.If, cst.SimpleStatementLine)):
                return any(_is_other_device(sub) for sub in iter_subtree(ancestor))
        return False

    def _note_cpu_claim(self, name: Optional[str], value: Optional[cst.BaseExpression]) -> None:
        if (
            self.runs_without_cuda is None
            and name
            and _DEVICE_NAME.match(name)
            and value is not None
            and _is_other_device(value)
        ):
            self.runs_without_cuda = (value, f"the module sets `{name}` to `{value.value}`")  # type: ignore[attr-defined]

    def visit_Param(self, node: cst.Param) -> None:
        self._note_cpu_claim(node.name.value, node.default)
        if self.cuda_only_file or node.default is None or not is_cuda_literal(node.default):
            return
        if _DEVICE_NAME.match(node.name.value):
            function = next((n for n in reversed(self.ctx.ancestry()) if isinstance(n, cst.FunctionDef)), None)
            if function is not None and "device_type" in function.name.value.lower():
                return  # set_device_type(device="cuda"): a device type, by the function's own name
            if function is not None:
                self.default_params.setdefault(function, {})[node.name.value] = [False, False]
            self._literal(
                node.default,
                f"the default `{node.name.value}={node.default.value}` hardcodes a CUDA device; "
                "default to None and pick an available device",
                fixable=False,
            )

    def visit_Name(self, node: cst.Name) -> None:
        function = self.ctx.function
        if function is not None and self.default_params:
            params = self.default_params.get(function.node)
            if params is not None and node.value in params and not self._names_no_value(node):
                params[node.value][0] = True

    def _names_no_value(self, node: cst.Name) -> bool:
        """A keyword's name (``f(device="cuda")``), an attribute's (``x.device``) or a parameter's own
        name: the same word, not a read of the parameter."""
        stack = self.ctx.ancestry()
        parent = stack[-2] if len(stack) > 1 else None
        return (
            (isinstance(parent, cst.Arg) and parent.keyword is node)
            or (isinstance(parent, cst.Attribute) and parent.attr is node)
            or (isinstance(parent, cst.Param) and parent.name is node)
        )

    def visit_Comparison(self, node: cst.Comparison) -> None:
        function = self.ctx.function
        if function is None or not self.default_params:
            return
        params = self.default_params.get(function.node)
        if not params:
            return
        operands = [node.left] + [c.comparator for c in node.comparisons]
        # Compared with a literal, or with some tensor's `.device.type`: the
        # parameter is one device (type) among several, not a hardcoded one.
        if any(
            isinstance(o, cst.SimpleString) or (isinstance(o, cst.Attribute) and o.attr.value == "type")
            for o in operands
        ):
            for operand in operands:
                if isinstance(operand, cst.Name) and operand.value in params:
                    params[operand.value][1] = True

    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) == 1:
            target = node.targets[0].target
            self._note_cpu_claim(last_name(target), node.value)
            if (
                isinstance(target, cst.Name)
                and self.ctx.function is None
                and self._holds_device(target.value, node.value)
            ):
                self.module_devices.append(target.value)
            if not self.cuda_only_file and is_cuda_literal(node.value):
                name = last_name(target)
                if name and _DEVICE_NAME.match(name):
                    self._literal(
                        node.value,
                        f"`{dotted_name(target) or name} = {node.value.value}` hardcodes a CUDA device",
                        fixable=False,
                    )

    def leave_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Call) and self.ctx.qualified_name(node.value.func) == "torch.device":
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self._device_calls_assigned.setdefault(id(self.ctx.values), set()).add(target.target.value)

    def _holds_device(self, name: str, value: Optional[cst.CSTNode]) -> bool:
        if _DEVICE_NAME.match(name):
            return True
        return isinstance(value, cst.Call) and self.ctx.qualified_name(value.func) == "torch.device"

    def _cuda_call(self, node: cst.Call, func: cst.Attribute) -> None:
        receiver_qname = self.ctx.qualified_name(func.value)
        if receiver_qname is not None and (receiver_qname == "torch" or receiver_qname.startswith("torch.")):
            return  # torch.Tensor.cuda(x), torch.nn.Module.cuda(self): API plumbing
        positional = [a for a in node.args if a.keyword is None and a.star == ""]
        keywords = [(a.keyword.value, a) for a in node.args if a.keyword is not None]
        if any(a.star for a in node.args):
            return
        if positional and not isinstance(positional[0].value, cst.Integer):
            return  # .cuda(local_rank): a device the author chose
        if any(name == "device" and not isinstance(a.value, cst.Integer) for name, a in keywords):
            return
        device = self._device_in_scope()
        literal_index = bool(positional) or any(name == "device" for name, _ in keywords)
        extra = [a for name, a in keywords if name != "device"]
        target = device or "device"
        args = ", ".join([target] + [self.ctx.code_for(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in extra])
        replacement = func.with_changes(attr=cst.Name("to"))
        new_text = f"{self.ctx.code_for(replacement)}({args})"
        safe = device is not None and not literal_index
        fix = self.ctx.fix(
            self._device_safety(device) if safe else DISPLAY_ONLY,  # type: ignore[arg-type]
            f"Replace `.cuda()` with `.to({target})`" + ("" if device else " and pass the device in"),
            self.ctx.replace(node, new_text),
        )
        message = (
            "`.cuda()` hardcodes the CUDA device, so this code fails on machines without one; "
            "move it with `.to(device)`"
        )
        self._add(node, message, fix)

    def _literal(self, node: cst.SimpleString, message: str, fixable: bool) -> None:
        fix = None
        if fixable:
            device = self._device_in_scope()
            if device is not None and not self._defines(device):
                fix = self.ctx.fix(
                    self._device_safety(device), f"Use the device variable `{device}`", self.ctx.replace(node, device)
                )
            else:
                fix = self.ctx.fix(
                    DISPLAY_ONLY,
                    "Pass a device variable instead of the literal",
                    self.ctx.replace(node, device or "device"),
                )
        if not message.startswith("the default"):
            message += ", so this code fails on machines without one; use a device chosen once and passed in"
        self._add(node, message, fix)

    def _defines(self, device: str) -> bool:
        """Is the current statement the assignment of ``device`` itself?"""
        for node in reversed(self.ctx.ancestry()):
            if isinstance(node, cst.Assign):
                return any(dotted_name(t.target) == device for t in node.targets)
            if isinstance(node, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                return False
        return False

    def _device_in_scope(self) -> Optional[str]:
        """The one device variable visible here, or None (none, or several)."""
        names: Set[str] = set()
        function = self.ctx.function
        if function is not None:
            params = function.node.params
            for param in (*params.posonly_params, *params.params, *params.kwonly_params):
                if _DEVICE_NAME.match(param.name.value) and not (
                    param.default is not None
                    and (is_cuda_literal(param.default) or _not_a_gpu(self.ctx, param.default))
                ):
                    names.add(param.name.value)
        values = self.ctx.values
        for name in self._device_names_assigned(values):
            value = values.get(name)
            if (
                name in values
                and self._holds_device(name, value)
                and not is_cuda_literal(value)
                and not _not_a_gpu(self.ctx, value)
            ):
                names.add(name)
        if not names and function is not None:
            names = set(self.module_devices)
        return next(iter(names)) if len(names) == 1 else None

    def _device_names_assigned(self, values: dict) -> Set[str]:
        """The names of ``values`` (this scope's assignments) that may hold a
        device: named so, or ever assigned ``torch.device(...)`` here. Kept per
        scope and extended by the names added since the last question (a
        dict keeps insertion order), so a long scope costs linear time, not
        quadratic (every ``.cuda()`` asking about every earlier assignment)."""
        entry = self._scope_devices.get(id(values))
        if entry is None or entry[0] is not values or entry[1] > len(values):
            entry = self._scope_devices[id(values)] = [values, 0, set()]
        _, seen, found = entry
        if len(values) > seen:
            fresh = itertools.islice(reversed(values), len(values) - seen)
            found.update(name for name in fresh if "." not in name and self._holds_device(name, values[name]))
            entry[1] = len(values)
        return found | self._device_calls_assigned.get(id(values), set())

    def _device_safety(self, device: str) -> str:
        """SAFE when ``device`` evidently holds the CUDA device ``.cuda()`` would
        use (``torch.device("cuda" if torch.cuda.is_available() else "cpu")``):
        the code then behaves the same wherever it ran before. A parameter, or
        any other value, may be another device at run time: UNSAFE."""
        value = self.ctx.values.get(device)
        if value is None and device in self.module_devices:
            if device not in self._module_values:
                self._module_values[device] = next(
                    iter(reversed(list(_module_assignments(self.ctx.module, device)))), None
                )
            value = self._module_values[device]
        return SAFE if value is not None and _current_cuda_device(self.ctx, value) else UNSAFE

    def _add(self, node: cst.CSTNode, message: str, fix: Optional[Fix]) -> None:
        site = self.ctx.site()
        if site.node is not node:
            site = Site(self.ctx, site.stack + (node,), site.function, site.loop)
        self.candidates.append((site, node, message, fix, self._local_device_chosen()))

    def _local_device_chosen(self) -> Optional[Evidence]:
        """A device the enclosing function chose itself (`dev = torch.device(args.device)`),
        not CUDA by its own literal: this line ignores it."""
        if self.ctx.function is None:
            return None
        for name, value in self.ctx.scope_values().items():
            if "." in name or value is None or not self._holds_device(name, value) or _hardcodes_cuda(value):
                continue
            if isinstance(value, (cst.Call, cst.Name, cst.Attribute, cst.IfExp, cst.Subscript)):
                return Evidence(f"the function chooses its device in `{name}` and this line ignores it", node=value)
        return None

    # -- decide ------------------------------------------------------------------
    def finish(self) -> None:
        if any(self.ctx.names.imports_module(m) for m in _CUDA_ONLY_MODULES + self.ctx.project.cuda_only_imports):
            # Triton kernels, bitsandbytes, the project's CUDA extensions or CUDA-only modules: CUDA-only by design
            return
        if requires_cuda(self.ctx.source):
            return  # torch.cuda.set_device(...) / an NCCL process group, unconditionally: CUDA-only by design
        for site, node, message, fix, chosen in self.candidates:
            if (
                site.under_cuda_guard()
                or self._device_chosen(site)
                or self._cuda_only_by_design(site)
                or self._passed_as_device_type(site)
            ):
                continue
            if isinstance(site.parent, cst.Param) and self._default_is_a_choice(site):
                continue
            evidence = self._runs_without_cuda(site) or chosen
            if evidence is None:
                continue  # nothing says this code is meant to run anywhere but on a GPU
            if (
                isinstance(site.parent, cst.Param)
                and self.runs_without_cuda is None
                and self._hardcodes_cuda_elsewhere(site)
            ):
                continue  # only a call relies on the default, and the module is written for CUDA throughout
            self.report(node, message, fix, evidence=[evidence])

    def _hardcodes_cuda_elsewhere(self, site: Site) -> bool:
        """Another line of the module ties it to CUDA with nothing to choose another device: the
        module is written for CUDA throughout (a demo that calls ``model.cuda()``, an inference
        path whose every signature defaults to ``"cuda"``), and one default changed buys nothing."""
        return any(
            other is not site
            and not other.under_cuda_guard()
            and not self._device_chosen(other)
            and not self._passed_as_device_type(other)
            and not (isinstance(other.parent, cst.Param) and self._default_is_a_choice(other))
            for other, *_ in self.candidates
        )

    def _runs_without_cuda(self, site: Site) -> Optional[Evidence]:
        """The positive evidence that the hardcoded device breaks something:
        the module runs without CUDA by its own account, the function is handed
        a device and ignores it, or a call relies on a CUDA default."""
        if self.runs_without_cuda is not None:
            node, text = self.runs_without_cuda
            return Evidence(text, node=node)
        function = next((n for n in reversed(site.stack) if isinstance(n, cst.FunctionDef)), None)
        if function is None:
            return None
        params = function.params
        every = (*params.posonly_params, *params.params, *params.kwonly_params)
        in_param = next((n for n in site.stack if isinstance(n, cst.Param)), None)
        if in_param is not None:
            return self._call_relying_on_default(site, function, in_param)
        for param in every:
            if _DEVICE_NAME.match(param.name.value) and not (
                param.default is not None and _hardcodes_cuda(param.default)
            ):
                return Evidence(
                    f"`{function.name.value}` is handed a device as `{param.name.value}` and this line ignores it",
                    node=param,
                )
        return None

    def _call_relying_on_default(self, site: Site, function: cst.FunctionDef, param: cst.Param) -> Optional[Evidence]:
        """A call in this module that leaves the CUDA default in place."""
        positional = [*function.params.posonly_params, *function.params.params]
        if param not in positional and param not in function.params.kwonly_params:
            return None
        index = positional.index(param) if param in positional else None
        if index is not None and positional and positional[0].name.value in ("self", "cls"):
            index -= 1
        callee = function.name.value
        if callee == "__init__":
            owner = next((n for n in reversed(site.stack) if isinstance(n, cst.ClassDef)), None)
            if owner is None:
                return None
            callee = owner.name.value
        for call in self.calls_by_name.get(callee, ()):
            if any(a.star for a in call.args):
                continue  # ``f(*args, **kwargs)``: what is passed is not visible
            if any(a.keyword is not None and a.keyword.value == param.name.value for a in call.args):
                continue
            passed = sum(1 for a in call.args if a.keyword is None)
            if index is not None and passed > index:
                continue
            return Evidence(f"this call of `{callee}` relies on the default `{param.name.value}`", node=call)
        return None

    def _passed_as_device_type(self, site: Site) -> bool:
        """``check_device(a, b, device="cuda")`` where the module's own
        ``check_device`` only compares that parameter with device types."""
        call = next((n for n in reversed(site.stack[:-1]) if isinstance(n, cst.Call)), None)
        if call is None or not isinstance(call.func, cst.Name):
            return False
        arg = next((a for a in call.args if a.value is site.node), None)
        if arg is None or arg.keyword is None:
            return False
        for info in self.ctx.facts.functions.get(call.func.value, ()):
            state = self.default_params.get(info.node, {}).get(arg.keyword.value)
            if state is not None and state[1]:
                return True
        return False

    def _default_is_a_choice(self, site: Site) -> bool:
        """A CUDA default of a parameter the function never uses (a signature
        kept for compatibility), or one it compares with other devices
        (``if device == "cpu": ...``): the function supports several devices."""
        param = site.parent
        function = next((n for n in reversed(site.stack) if isinstance(n, cst.FunctionDef)), None)
        state = self.default_params.get(function, {}).get(param.name.value)  # type: ignore[union-attr]
        return state is not None and (not state[0] or state[1])

    def _device_chosen(self, site: Site) -> bool:
        for ancestor, child in site.ancestors():
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            if isinstance(ancestor, cst.IfExp) and child is not ancestor.test:
                return True
            if isinstance(ancestor, cst.Attribute) and child is ancestor.value and ancestor.attr.value == "type":
                return True  # ``(found or torch.device("cuda")).type``: only the device type is used
            if isinstance(ancestor, cst.Try) and child is ancestor.body and ancestor.handlers:
                return True  # tried, with a fallback when CUDA is missing
            if isinstance(ancestor, cst.Assign) and any(_mentions(t.target, _CUDA_ONLY) for t in ancestor.targets):
                return True  # ``cuda_device = ...``: knowingly the CUDA device
            if isinstance(ancestor, cst.If) and child is not ancestor.test and _mentions_device(ancestor.test):
                return True
            if isinstance(ancestor, cst.Comparison):
                return True
        return False

    def _cuda_only_by_design(self, site: Site) -> bool:
        for ancestor, _ in site.ancestors():
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                if _CUDA_ONLY_CODE.search(ancestor.name.value):
                    return True
                if isinstance(ancestor, cst.ClassDef) and (
                    _DEVICE_TYPE_CLASS.search(ancestor.name.value)
                    or any(
                        _mentions(base.value, _CUDA_ONLY_CODE) or _mentions(base.value, _DEVICE_TYPE_CLASS)
                        for base in ancestor.bases
                    )
                ):
                    return True
                for decorator in ancestor.decorators:
                    if _mentions(decorator.decorator, _CUDA_ONLY):
                        return True
        return False


def _not_a_gpu(ctx, value: Optional[cst.CSTNode]) -> bool:
    """``None``, ``"cpu"``, ``torch.device("cpu")``: a variable holding it is not
    where ``.cuda()`` moves things."""
    if isinstance(value, cst.Name) and value.value == "None":
        return True
    if isinstance(value, cst.SimpleString):
        text = value.evaluated_value
        return isinstance(text, str) and not _CUDA_LITERAL.match(text)
    if isinstance(value, cst.Call) and ctx.qualified_name(value.func) == "torch.device" and value.args:
        return _not_a_gpu(ctx, value.args[0].value)
    return False


def _current_cuda_device(ctx, value: cst.CSTNode) -> bool:
    """``torch.device("cuda")``, or ``"cuda"`` when CUDA is available and the
    CPU otherwise: the device ``.cuda()`` moves to (where it does not fail)."""
    if isinstance(value, cst.Call) and ctx.qualified_name(value.func) == "torch.device" and len(value.args) == 1:
        return _current_cuda_device(ctx, value.args[0].value)
    if isinstance(value, cst.SimpleString):
        return value.evaluated_value == "cuda"  # "cuda:1" need not be the current device
    if isinstance(value, cst.IfExp):
        return (
            mentions_cuda_availability(ctx, value.test)
            and _current_cuda_device(ctx, value.body)
            and _not_a_gpu(ctx, value.orelse)
        )
    return False


def _module_assignments(module: cst.Module, name: str):
    for statement in module.body:
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, cst.Assign) and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets
                ):
                    yield small.value


def _mentions(node: cst.CSTNode, pattern: re.Pattern) -> bool:
    for sub in iter_subtree(node):
        if isinstance(sub, cst.Name) and pattern.search(sub.value):
            return True
        if isinstance(sub, cst.SimpleString) and pattern.search(sub.value):
            return True
    return False


def _hardcodes_cuda(node: cst.CSTNode) -> bool:
    """`"cuda"`, `torch.device("cuda:0")`: a default that is itself the problem."""
    return any(is_cuda_literal(sub) for sub in iter_subtree(node))


def _is_other_device(node: cst.CSTNode) -> bool:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return isinstance(value, str) and bool(_OTHER_DEVICE.match(value))
    return False


def _mentions_device(test: cst.BaseExpression) -> bool:
    return _mentions(test, _DEVICE_CHOICE)
