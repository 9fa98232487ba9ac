"""TL501 skips CUDA-only toolkits, and every rule skips test modules, unless told otherwise."""
import pytest

from torchlint.linter import FileOptions, lint_text
from torchlint.registry import all_rules

SOURCE = "import torch\n\ndef make(device):\n    return torch.zeros(3).cuda()\n"


def _codes(path, source=SOURCE, **options):
    rule = all_rules()["TL501"]
    out = lint_text(source, path, FileOptions(rules=[rule], rule_options={"TL501": options}))
    return [d.code for d in out.diagnostics]


@pytest.mark.parametrize("path", ["tests/test_model.py", "pkg/testing/_internal/distributed_test.py", "conftest.py", "test/utils.py"])
def test_test_modules_are_skipped_unless_asked(path):
    assert _codes(path) == []
    assert _codes(path, **{"check-tests": True}) == ["TL501"]


@pytest.mark.parametrize("path", ["src/model.py", "contest.py", "latest.py", "attestation/x.py"])
def test_other_modules_are_checked(path):
    assert _codes(path) == ["TL501"]


@pytest.mark.parametrize("module", ["cutlass", "cuda.bindings.driver", "tensorrt"])
def test_cuda_toolkit_modules_are_cuda_only(module):
    assert _codes("src/kernels.py", f"import {module}\n" + SOURCE) == []


EVAL_SOURCE = "import torch\n\ndef check(model, loader):\n    model.eval()\n    for x, y in loader:\n        yield model(x)\n"
FORWARD_SOURCE = "import torch\n\nmodel = torch.nn.Linear(2, 2)\ny = model.forward(torch.ones(2))\n"


@pytest.mark.parametrize("code, source", [("TL601", EVAL_SOURCE), ("TL603", FORWARD_SOURCE)])
def test_tl601_and_tl603_skip_test_modules_unless_asked(code, source):
    rule = all_rules()[code]

    def codes(path, **options):
        out = lint_text(source, path, FileOptions(rules=[rule], rule_options={code: options}))
        return [d.code for d in out.diagnostics]

    assert codes("tests/models/test_encoder.py") == []
    assert codes("tests/models/test_encoder.py", **{"check-tests": True}) == [code]
    assert codes("src/evaluate.py") == [code]


@pytest.mark.parametrize(
    "source, expected",
    [
        ("import torch\ndef f(rank):\n    torch.cuda.set_device(rank)\n", True),
        ("import torch.distributed as dist\ndist.init_process_group(backend='nccl')\n", True),
        ("import torch.distributed as dist\ndist.init_process_group('nccl', init_method='env://')\n", True),
        ("def f(args):\n    args.dist_backend = 'nccl'\n", True),
        ("if __name__ == '__main__':\n    torch.cuda.set_device(0)\n", True),
        ("if args.distributed:\n    torch.cuda.set_device(0)\n", False),
        ("try:\n    torch.cuda.set_device(0)\nexcept RuntimeError:\n    pass\n", False),
        ("dist.init_process_group(backend='gloo')\n", False),
        ("dist.init_process_group(backend=args.backend)\n", False),
        ("torch.xpu.set_device(0)  # nccl in a comment\n", False),
        # a Lightning Trainer that asks for GPUs
        ("import pytorch_lightning as pl\ntrainer = pl.Trainer(devices=[0], max_epochs=3)\n", True),
        ("from lightning import Trainer\nTrainer(accelerator='gpu', devices=2).fit(model)\n", True),
        ("import pytorch_lightning as pl\ndef main():\n    trainer = pl.Trainer(gpus=1)\n", True),
        ("import pytorch_lightning as pl\ntrainer = pl.Trainer(gpus=0)\n", False),
        ("import lightning as L\ntrainer = L.Trainer(accelerator='auto', devices=1)\n", False),
        ("import lightning as L\ntrainer = L.Trainer(accelerator='cpu', devices=[0])\n", False),
        ("import lightning as L\nif torch.cuda.is_available():\n    trainer = L.Trainer(devices=[0])\n", False),
        # transformers' Trainer is another class
        ("from transformers import Trainer\ntrainer = Trainer(model=m, args=a)\n", False),
        ("from transformers import Trainer\ntrainer = Trainer(devices=[0])\n", False),
    ],
)
def test_requires_cuda(source, expected):
    from torchlint.project import requires_cuda

    assert requires_cuda(source) is expected


def test_importing_a_nccl_module_of_the_project(tmp_path):
    """pkg/distributed.py sets up NCCL unconditionally: modules importing it
    are CUDA-only by design; others of the project are still checked."""
    import subprocess
    import sys

    root = tmp_path / "project"  # (the test's own directory name mentions CUDA: a CUDA-only path)
    root.mkdir()
    (root / "setup.py").write_text("from setuptools import setup\nsetup(name='pkg')\n")
    pkg = root / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "distributed.py").write_text("import torch.distributed as dist\ndef enable():\n    dist.init_process_group(backend='nccl')\n")
    (pkg / "logging.py").write_text("import torch\nimport pkg.distributed as distributed\ndef sync(x, device):\n    return torch.tensor(x, device='cuda')\n")
    (pkg / "other.py").write_text("import torch\ndef sync(x, device):\n    return torch.tensor(x, device='cuda')\n")
    out = subprocess.run(
        [sys.executable, "-m", "torchlint", "check", "--isolated", "--preview", "--select", "TL501", "--output-format", "concise", str(pkg)],
        capture_output=True, text=True,
    )
    assert "other.py:3:" in out.stdout
    assert "logging.py" not in out.stdout


def test_every_rule_leaves_test_modules_alone_unless_asked():
    """judging.md's "not training code": a test module is skipped by every rule,
    and the ``check-tests`` option of each rule brings it back."""
    for code, rule in all_rules().items():
        if code == "TL000":
            assert "check-tests" not in rule.options  # a file that does not parse is reported anywhere
            continue
        assert rule.options["check-tests"].default is False, code
    source = (
        "import torch\n\n"
        "def test_step(model, loader, optimizer):\n"
        "    for x, y in loader:\n"
        "        loss = model(x.cuda(), torch.zeros(4).cuda()).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
        "        print(loss.item())\n"
    )
    rules = [all_rules()[code] for code in ("TL101", "TL204")]

    def codes(path, **options):
        out = lint_text(source, path, FileOptions(rules=rules, rule_options={r.code: options for r in rules}))
        return sorted(d.code for d in out.diagnostics)

    assert codes("src/train.py") == ["TL101", "TL204"]
    assert codes("tests/test_train.py") == []
    assert codes("tests/test_train.py", **{"check-tests": True}) == ["TL101", "TL204"]
