"""The wrong fixes of the 2026-11 reliability report (reproductions 4 to 13),
one run reaching the fixed point (item 4), and TL501's linear time (21).

Each test is named by the reproduction's number. Where the program can run
on the CPU, it runs before and after ``torchlint --fix`` (with
``--unsafe-fixes`` where that is what went wrong) and must behave the same;
where the difference needs a GPU, the test checks what the fix does to the
code.
"""
from __future__ import annotations

import filecmp
import glob
import importlib.util
import inspect
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from torchlint import fixer
from torchlint.fixer import fix_text, pre_pep701_problems
from torchlint.linter import FileOptions
from torchlint.registry import all_rules

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
ALL = ["--preview", "--select", "ALL", "--isolated", "--no-cache", "-q"]


def write(folder, files):
    for name, text in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def torchlint(folder, *args):
    return subprocess.run([sys.executable, "-m", "torchlint", *ALL, *args], cwd=folder, capture_output=True, text=True, timeout=300)


def python(folder, *args):
    outcome = subprocess.run([sys.executable, *args], cwd=folder, capture_output=True, text=True, timeout=300)
    return outcome.returncode, outcome.stdout.strip().splitlines()[-1:] if outcome.stdout.strip() else outcome.stderr.strip().splitlines()[-1:]


def snapshot(folder):
    return {p.name: p.read_text() for p in sorted(folder.rglob("*.py"))}


def fixed_by(code, source, unsafe=False, **options):
    result = fix_text(textwrap.dedent(source), "train.py", FileOptions(rules=[all_rules()[code]], **options), unsafe)
    assert result.error is None, result.error
    return result.text


def same_behaviour_after_fix(tmp_path, files, program, *fix_args):
    """Run ``program``, fix the tree, run it again: same output, and a second
    fix changes nothing."""
    write(tmp_path, files)
    before = python(tmp_path, *program)
    assert before[0] == 0, before
    torchlint(tmp_path, "--fix", *fix_args)
    after_once = snapshot(tmp_path)
    after = python(tmp_path, *program)
    assert after == before, (after, after_once)
    torchlint(tmp_path, "--fix", *fix_args)
    assert snapshot(tmp_path) == after_once, "a second --fix changed more"
    return after_once


# -- 4: TL603 inside a forward hook --------------------------------------------------------
HOOK = """\
    import torch
    import torch.nn as nn

    model = nn.Linear(2, 2)


    def hook(module, inputs, output):
        # run the layer again without its hooks, on a scaled input
        return module.forward(inputs[0] * 0.5)


    def pre_hook(module, args):
        return (module.forward(args[0]),)


    model.register_forward_hook(hook)
    other = nn.Linear(2, 2)
    other.register_forward_pre_hook(pre_hook)
    print(model(torch.ones(1, 2)).shape, other(torch.ones(1, 2)).shape)
"""


@needs_torch
def test_04_tl603_never_rewrites_forward_inside_a_hook(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, {"hook.py": HOOK}, ["hook.py"], "--unsafe-fixes")
    assert fixed["hook.py"].count(".forward(") == 2


def test_04_tl603_fix_is_unsafe_elsewhere():
    source = "out = model.forward(x)\n"
    assert fixed_by("TL603", source) == source  # hooks would now run: not a safe change
    assert fixed_by("TL603", source, unsafe=True) == "out = model(x)\n"


# -- 5: a second --fix breaks DETR (custom batch class, cross-file cascade) ------------------
DETR = {
    "setup.cfg": "",
    "batch.py": """\
        class Batch:                      # like DETR's NestedTensor
            def __init__(self, tensors):
                self.tensors = tensors

            def to(self, device):
                return Batch(self.tensors.to(device))


        def collate(items):
            import torch
            return Batch(torch.stack([x for x, _ in items])), torch.stack([y for _, y in items])
    """,
    "main.py": """\
        import torch
        from torch.utils.data import DataLoader

        from batch import collate
        from engine import train_one_epoch


        def main():
            data = [(torch.ones(3), torch.ones(1)) for _ in range(8)]
            loader = DataLoader(data, batch_size=4, collate_fn=collate)
            model = torch.nn.Linear(3, 1)
            train_one_epoch(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), torch.device("cpu"))
            print("trained")


        if __name__ == "__main__":
            main()
    """,
    "engine.py": """\
        def train_one_epoch(model, loader, optimizer, device):
            for samples, targets in loader:
                samples = samples.to(device)
                loss = (model(samples.tensors) - targets.to(device)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    """,
}


@needs_torch
@pytest.mark.parametrize("level", [[], ["--unsafe-fixes"]])
def test_05_custom_batch_class_across_files_keeps_training(tmp_path, level):
    fixed = same_behaviour_after_fix(tmp_path, DETR, ["main.py"], *level)
    assert "non_blocking" not in fixed["engine.py"]


# -- 6: TL201 on a custom .to(self, device), and a host write after the copy -----------------
CUSTOM_TO = """\
    import torch
    from torch.utils.data import DataLoader


    class Batch:
        def __init__(self, x):
            self.x = x

        def to(self, device):
            return Batch(self.x.to(device))


    def collate(items):
        return Batch(torch.stack(items))


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        loader = DataLoader([torch.ones(3)] * 8, batch_size=4, pin_memory=True, collate_fn=collate)
        model = torch.nn.Linear(3, 1).to(device)
        for batch in loader:
            batch = batch.to(device)
            model(batch.x).sum().backward()
        print("ok")


    main()
"""


@needs_torch
def test_06_tl201_leaves_a_custom_to_method_alone(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, {"t.py": CUSTOM_TO}, ["t.py"], "--unsafe-fixes")
    assert "non_blocking" not in fixed["t.py"]


HOST_WRITE = """\
    import torch
    from torch.utils.data import DataLoader

    dev = torch.device("cuda")
    loader = DataLoader(ds, batch_size=2, pin_memory=True)
    for x, y in loader:
        x_gpu = x.to(dev)
        x.mul_(0)  # the host batch is reused right after the copy
        model(x_gpu).sum().backward()
"""


def test_06_tl201_offers_no_fix_when_the_host_tensor_is_written_after_the_copy():
    assert fixed_by("TL201", HOST_WRITE, unsafe=True) == textwrap.dedent(HOST_WRITE)
    without_write = textwrap.dedent(HOST_WRITE).replace("    x.mul_(0)  # the host batch is reused right after the copy\n", "")
    assert "x.to(dev, non_blocking=True)" in fixed_by("TL201", without_write)  # a default-collated, pinned batch


# -- 7: TL501 moving to the wrong device ---------------------------------------------------------
DEVICES = """\
    import torch


    def offload(model, x):
        cpu_device = torch.device("cpu")   # where checkpoints go
        y = x.cuda()
        model.cuda()
        return model(y), cpu_device


    def make_mask(n, device=None):
        return torch.ones(n, n).tril().cuda()


    def step(batch, model, target_device="cpu"):
        return model(batch.cuda()).to(target_device)
"""


def test_07_tl501_never_moves_to_a_variable_that_holds_no_gpu():
    fixed = fixed_by("TL501", DEVICES, unsafe=True)
    assert fixed == textwrap.dedent(DEVICES), fixed


def test_07_tl501_is_safe_only_for_the_device_cuda_would_use():
    chosen = 'import torch\ndevice = torch.device("cuda" if torch.cuda.is_available() else "cpu")\nx = x.cuda()\n'
    assert fixed_by("TL501", chosen).endswith("x = x.to(device)\n")
    for value in ('torch.device(f"cuda:{rank}")', "args.device"):
        # Neither holds evidently the device `.cuda()` would use: no safe fix (and, since TL501
        # fires only where the module shows it runs without CUDA, no finding at all here).
        source = f"import torch\ndevice = {value}\nx = x.cuda()\n"
        assert fixed_by("TL501", source) == source
        assert fixed_by("TL501", source, unsafe=True) == source
    parameter = "def f(x, device):\n    return x.cuda()\n"
    assert fixed_by("TL501", parameter) == parameter


# -- 8: TL301 on optimizer wrappers, and torch 1.x semantics ----------------------------------------
WRAPPER = {
    "wrappers.py": """\
        class FP16Optimizer:                       # apex.fp16_utils.FP16_Optimizer's signature
            def __init__(self, opt):
                self.opt = opt

            def zero_grad(self, set_grads_to_None=False):
                self.opt.zero_grad()

            def step(self):
                self.opt.step()
    """,
    "train.py": """\
        import torch

        from wrappers import FP16Optimizer


        def train(model, loader):
            optimizer = FP16Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
            for x, y in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()


        if __name__ == "__main__":
            train(torch.nn.Linear(2, 1), [(torch.ones(1, 2), None)])
            print("ok")
    """,
}
TWO_HEADS = {
    "two.py": """\
        import torch, torch.nn as nn

        class TwoHeads(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(4, 1), nn.Linear(4, 1)
            def forward(self, x, head):
                return self.a(x) if head == 0 else self.b(x)

        def train(loader):
            torch.manual_seed(0)
            model = TwoHeads()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
            for x, head in loader:
                optimizer.zero_grad()
                model(x, head).pow(2).mean().backward()
                optimizer.step()
            return round(model.b.weight.sum().item(), 4)

        torch.manual_seed(1)
        print(train([(torch.randn(8, 4), i % 2 if i < 4 else 0) for i in range(10)]))
    """,
    "as_torch1.py": """\
        import runpy, sys, torch
        orig = torch.optim.Optimizer.zero_grad      # torch < 2.0 default: zero_grad() keeps zero tensors
        torch.optim.Optimizer.zero_grad = lambda self, set_to_none=False: orig(self, set_to_none=set_to_none)
        runpy.run_path(sys.argv[1], run_name="__main__")
    """,
}


@needs_torch
def test_08_tl301_leaves_an_imported_optimizer_wrapper_alone(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, WRAPPER, ["train.py"], "--unsafe-fixes", "--target-torch", "1.13")
    assert "set_to_none" not in fixed["train.py"]


@needs_torch
def test_08_tl301_safe_fixes_keep_torch1_training_results(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, TWO_HEADS, ["as_torch1.py", "two.py"], "--target-torch", "1.13")
    assert "set_to_none" not in fixed["two.py"]
    assert "set_to_none=True" in fixed_by("TL301", TWO_HEADS["two.py"], unsafe=True, target_torch=(1, 13))


# -- 9: TL202 on a local DataLoader class, and datasets of CUDA tensors ------------------------------
LOCAL_LOADER = """\
    import torch


    class DataLoader:
        def __init__(self, data, batch_size):
            self.data, self.batch_size = data, batch_size

        def __iter__(self):
            for i in range(0, len(self.data), self.batch_size):
                yield torch.stack(self.data[i : i + self.batch_size])


    def main():
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        model = torch.nn.Linear(3, 1).to(device)
        for x in DataLoader([torch.ones(3)] * 8, batch_size=4):
            model(x.to(device)).sum().backward()
        print("ok")


    main()
"""


@needs_torch
def test_09_tl202_leaves_a_local_dataloader_class_alone(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, {"t.py": LOCAL_LOADER}, ["t.py"], "--unsafe-fixes")
    assert "pin_memory" not in fixed["t.py"]


def test_09_tl202_pinning_is_unsafe_since_the_dataset_may_return_cuda_tensors():
    source = textwrap.dedent(
        """\
        from torch.utils.data import DataLoader
        loader = DataLoader(cuda_rows, batch_size=16, num_workers=2)
        for x in loader:
            x = x.to(dev)
        """
    )
    assert fixed_by("TL202", source) == source
    assert "pin_memory=True" in fixed_by("TL202", source, unsafe=True)


# -- 10: TL401 when a helper already unscales ---------------------------------------------------------
HELPER_UNSCALES = """\
    import torch


    def unscale_for_clipping(scaler, optimizer):
        scaler.unscale_(optimizer)


    def train(model, loader, optimizer, scaler):
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = (model(x) - y).pow(2).mean()
            scaler.scale(loss).backward()
            unscale_for_clipping(scaler, optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()


    model = torch.nn.Linear(2, 1)
    train(model, [(torch.randn(4, 2), torch.randn(4, 1))] * 3, torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu"))
    print("ok")
"""


@needs_torch
def test_10_tl401_inserts_no_second_unscale_when_a_helper_unscales(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, {"t.py": HELPER_UNSCALES}, ["t.py"])
    assert fixed["t.py"].count("unscale_(") == 1


# -- 11: TL302 when the accumulator escapes through self ----------------------------------------------------
ESCAPES = """\
    import torch


    class Trainer:
        def __init__(self):
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1)
            self.log_scale = torch.zeros((), requires_grad=True)

        def epoch(self, loader, optimizer):
            total = 0
            for x, y in loader:
                optimizer.zero_grad()
                loss = (self.model(x) - y).pow(2).mean() * self.log_scale.exp()
                loss.backward(retain_graph=True)
                optimizer.step()
                total += loss
            self.epoch_loss = total

        def tune_scale(self):
            self.epoch_loss.backward()
            return self.log_scale.grad


    torch.manual_seed(1)
    t = Trainer()
    t.epoch([(torch.randn(4, 2), torch.randn(4, 1))] * 3, torch.optim.SGD(t.model.parameters(), lr=0.1))
    print(t.tune_scale() is not None)
"""


@needs_torch
def test_11_tl302_does_not_detach_an_accumulator_stored_on_self(tmp_path):
    fixed = same_behaviour_after_fix(tmp_path, {"t.py": ESCAPES}, ["t.py"])
    assert ".detach()" not in fixed["t.py"]


# -- 12: TL204 and floating-point arange ----------------------------------------------------------------
def test_12_tl204_float_arange_is_not_a_safe_fix():
    for call in ("torch.arange(0, 1, 0.1)", "torch.arange(0, 100, 0.1)", "torch.linspace(0, 1, 7)", "torch.arange(n)"):
        source = f"import torch\nfor batch in loader:\n    t = {call}.cuda()\n"
        assert fixed_by("TL204", source) == source, call
        assert "device=" in fixed_by("TL204", source, unsafe=True)
    exact = "import torch\nfor batch in loader:\n    t = torch.arange(0, x.size(1), 2).cuda()\n"
    assert 'torch.arange(0, x.size(1), 2, device="cuda")' in fixed_by("TL204", exact)


# -- 13: a fix inside an f-string must parse on Python 3.11 and older ------------------------------------
FSTRING = """\
    import torch


    def train(model, loader, optimizer):
        for x, y in loader:
            model(x).sum().backward()
            optimizer.step()
            print(f"ids={torch.arange(4).cuda()}")
"""


def test_13_fix_inside_an_fstring_uses_the_other_quote():
    fixed = fixed_by("TL204", FSTRING)
    assert "f\"ids={torch.arange(4, device='cuda')}\"" in fixed
    compile(fixed, "f.py", "exec")  # the running Python; the next test covers 3.12+


def _interpreters():
    """Pythons >= 3.12 on PATH (or installed by pyenv, whose shims may not be set up)."""
    candidates = [shutil.which(name) for name in ("python3.12", "python3.13", "python3.14")]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    found = []
    for path in candidates:
        if path and subprocess.run([path, "-c", "import tokenize; tokenize.FSTRING_START"], capture_output=True).returncode == 0:
            found.append(path)
    return found[:2]


@pytest.mark.skipif(not _interpreters(), reason="needs a Python >= 3.12 on PATH")
@pytest.mark.parametrize("interpreter", _interpreters())
def test_13_the_fixer_refuses_pep701_fstrings_under_python_312(interpreter, tmp_path):
    """``pre_pep701_problems`` runs under 3.12+ (where compile() accepts PEP 701)."""
    cases = [
        "f\"{torch.arange(4, device='cuda')}\"\n",  # 0: the other quote
        'f"{torch.arange(4, device="cuda")}"\n',  # 1: its own quote
        'f"{a["k"]}" + f\'{b}\'\n',  # 1
        "f'{f\"{x}\"}'\n",  # 0: nested, other quote
        "f'{f'{x}'}'\n",  # 1: nested, same quote
        'f"""{"x"}"""\n',  # 0: a single quote inside triple quotes
    ]
    script = tmp_path / "count.py"
    script.write_text(
        "import io, sys, tokenize\nfrom typing import List\n"
        + inspect.getsource(pre_pep701_problems)
        + f"\nprint([pre_pep701_problems(case) for case in {cases!r}])\n"
    )
    outcome = subprocess.run([interpreter, str(script)], capture_output=True, text=True, timeout=60)
    assert outcome.stdout.strip() == "[0, 1, 1, 0, 1, 0]", outcome.stderr


def test_13_needs_newer_python_compares_with_the_original(monkeypatch):
    monkeypatch.setattr(fixer.sys, "version_info", (3, 12, 0))
    monkeypatch.setattr(fixer, "pre_pep701_problems", lambda text: text.count("!"))
    assert fixer.needs_newer_python("a", "a!") is not None
    assert fixer.needs_newer_python("a!", "b!") is None  # the code already needed 3.12


# -- item 4: one run, one answer ----------------------------------------------------------------------------
CASCADE = {
    "setup.cfg": "",
    "main.py": """\
        import torch
        from torch.utils.data import DataLoader

        from engine import train_one_epoch


        def main(dataset, model, optimizer, device):
            loader = DataLoader(dataset, batch_size=4, num_workers=4)
            train_one_epoch(model, loader, optimizer, device)
    """,
    "engine.py": """\
        def train_one_epoch(model, loader, optimizer, device):
            for x, y in loader:
                x = x.to(device)
                model(x).sum().backward()
                optimizer.step()
    """,
}


def test_fix_reaches_the_fixed_point_in_one_run_across_files(tmp_path):
    write(tmp_path, CASCADE)
    torchlint(tmp_path, "--fix", "--unsafe-fixes")
    once = snapshot(tmp_path)
    assert "pin_memory=True" in once["main.py"]  # run 1 pins the loader (TL202) ...
    assert "x.to(device, non_blocking=True)" in once["engine.py"]  # ... and then the copy it feeds (TL201)
    torchlint(tmp_path, "--fix", "--unsafe-fixes")
    assert snapshot(tmp_path) == once


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_fixes_do_not_depend_on_jobs_or_file_order(tmp_path, jobs):
    reference = tmp_path / "reference"
    write(reference, CASCADE)
    torchlint(reference, "--fix", "--unsafe-fixes", "--jobs", "1")
    for order in (["main.py", "engine.py"], ["engine.py", "main.py"]):
        tree = tmp_path / f"tree-{jobs}-{order[0]}"
        write(tree, CASCADE)
        outcome = torchlint(tree, "--fix", "--unsafe-fixes", "--show-fixes", "--jobs", jobs, *order)
        assert snapshot(tree) == snapshot(reference), outcome.stdout
        assert not filecmp.dircmp(reference, tree).diff_files


# -- 21: TL501 in linear time ----------------------------------------------------------------------------------
def test_21_tl501_looks_at_each_assignment_of_a_long_scope_once(monkeypatch):
    rule = all_rules()["TL501"]
    calls = {"count": 0}
    original = rule._holds_device

    def counted(self, name, value):
        calls["count"] += 1
        return original(self, name, value)

    monkeypatch.setattr(rule, "_holds_device", counted)

    def cost(lines):
        calls["count"] = 0
        body = "".join(f"    v{i} = x.cuda().sum().item()\n" for i in range(lines))
        fix_text("import torch\nfor x, y in loader:\n" + body, "m.py", FileOptions(rules=[rule]))
        return calls["count"]

    small, large = cost(500), cost(2000)
    assert large <= 4.5 * small, (small, large)  # quadratic would be 16x
    assert large <= 20 * 2000
