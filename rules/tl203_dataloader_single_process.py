from __future__ import annotations

from typing import Dict, List, Optional, Set

import libcst as cst

from torchlint.model import (
    FRAMEWORK_LOADER_ARGUMENTS,
    FRAMEWORK_LOADER_KEYWORDS,
    FRAMEWORK_TRAINING_LOADERS,
    PER_ITEM_WORK,
    LoaderInfo,
    LoopInfo,
    TrainerRun,
    does_per_item_work,
    dotted_name,
    framework_run_evidence,
    framework_training_runs,
    iter_subtree,
    keyword_value,
    last_name,
)
from torchlint.rule import Evidence, Invalid, Rule, Valid


class DataloaderSingleProcess(Rule):
    """## What it does
    Flags a `DataLoader(...)` (or torchdata's `StatefulDataLoader(...)`) that loads data in the training process itself,
    because `num_workers` is left out or set to `0`, in a module that trains
    (it calls `backward()` or steps an optimizer).

    Whether worker processes pay off depends on the workload: datasets that
    already hold tensors in memory, tiny datasets and some debugging setups
    are faster or simpler in one process. So the rule fires only where
    loading a batch is real work the workers could take over: the dataset
    is a `torchvision.datasets` dataset, is built with a per-item
    `transform=`, is a Hugging Face dataset (or a split of one) whose
    `with_transform`/`set_transform` function decodes or transforms every
    item it hands out, or is a class of the same module (or imported
    from another module of the project) whose `__getitem__` reads or
    decodes files (`open`, `Image.open`, `imread`,
    `np.load`, `torch.load`, `torchaudio.load`, `read_image`, …) or applies
    a transform. (`Subset`, `ConcatDataset` and names assigned from these
    are followed.)

    It also needs evidence that the training runs on a GPU: the same file
    moves a tensor or the model to an accelerator (`.cuda()`, `.to(device)`).
    A script that trains on the CPU has no GPU to keep fed.

    A loader can also be a framework's: a training framework that builds
    the DataLoader from a configuration dict it is given and runs the loop
    itself (mmengine's `Runner(train_dataloader=dict(...))`, followed by
    `runner.train()`). The dict is the loader's arguments, so the same
    evidence applies; the framework places the model on the GPU when one is
    present, which is the GPU evidence there. A DataLoader the script builds
    and hands to a framework to train with counts the same way: composer's
    `Trainer(train_dataloader=loader)` run with `trainer.fit()`, Lightning's
    `trainer.fit(model, train_dataloaders=loader)`; a trainer told to use the
    CPU (`device="cpu"`, `accelerator="cpu"`) is no GPU evidence, and a run
    bounded to a handful of batches (`train_subset_num_batches=5`,
    `max_duration="10ba"`, `limit_train_batches=20`, `max_steps=10`,
    `fast_dev_run=True`) is a demonstration that workers would not pay back. Hugging Face's `Trainer`
    (and TRL's `SFTTrainer`) builds its training DataLoader from
    `TrainingArguments`: with `dataloader_num_workers` left out or 0 and a
    `train_dataset` that does per-item work, the finding points at the
    arguments. A dataset's transform counts when it is set in place too
    (`train_ds.set_transform(preprocess)`), and a transform function counts
    as per-item work when it calls a module-level pipeline of
    torchvision, albumentations, kornia or MONAI transforms.

    Not flagged: in-memory datasets (`TensorDataset`, tensors, lists) and
    datasets whose per-item work cannot be seen (a Hugging Face dataset, a
    class from an installed library); loaders that only evaluation loops iterate;
    `num_workers` given as an expression (`args.workers`,
    `os.cpu_count()`); `**kwargs` the rule cannot see; and modules that do
    not train.

    ## Why is this bad?
    With `num_workers=0` the main process reads, decodes and augments every
    batch between training steps, while the GPU waits. Worker processes
    prepare the next batches in parallel with the training step, so the GPU
    is fed without gaps.

    ## Example
    ```python
    from torch.utils.data import DataLoader
    from torchvision import datasets

    dataset = datasets.ImageFolder("data/train", transform=augment)
    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    from torch.utils.data import DataLoader
    from torchvision import datasets

    dataset = datasets.ImageFolder("data/train", transform=augment)
    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8, persistent_workers=True)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
    ```

    ## Fix safety
    There is no fix: the right number of workers depends on the machine and
    the dataset, and workers require a dataset that can be pickled (or a
    `fork` start method).

    ## References
    - [`torch.utils.data`: single- and multi-process data loading](https://pytorch.org/docs/stable/data.html#single-and-multi-process-data-loading)
    - [Performance tuning guide: enable async data loading and augmentation](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#enable-async-data-loading-and-augmentation)
    """

    code = "TL203"
    name = "dataloader-single-process"
    summary = "A training DataLoader loads batches in the main process (`num_workers` missing or 0)"
    fix_availability = "none"
    requires_any = ("DataLoader", "Runner", "Trainer")  # a framework's trainer builds or takes the loader

    VALID = [
        Valid("""
            import torchvision
            from mmengine.runner import Runner
            train_set = torchvision.datasets.CIFAR10("data", transform=tf)
            runner = Runner(model=model, train_dataloader=dict(batch_size=32, dataset=train_set, num_workers=4))
            runner.train()
        """),
        Valid("""
            from mmengine.runner import Runner
            from torch.utils.data import TensorDataset
            runner = Runner(model=model, train_dataloader=dict(batch_size=32, dataset=TensorDataset(x, y)))
            runner.train()
        """),
        Valid("""
            import torchvision
            from mmengine.runner import Runner
            train_set = torchvision.datasets.CIFAR10("data", transform=tf)
            def build():
                return Runner(model=model, train_dataloader=dict(batch_size=32, dataset=train_set))
        """),
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            ds = datasets.ImageFolder(root, transform=tf)
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x, y in loader:
                model(x.cuda()).sum().backward()
        """),
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            ds = datasets.ImageFolder(root, transform=tf)
            loader = DataLoader(ds, batch_size=32, num_workers=args.workers)
            for x, y in loader:
                model(x.cuda()).sum().backward()
        """),
        # No training in this module: an evaluation script.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            loader = DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=32)
            with torch.no_grad():
                for x, y in loader:
                    preds = model(x.cuda())
        """),
        # kwargs the rule cannot see.
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            ds = datasets.ImageFolder(root, transform=tf)
            loader = DataLoader(ds, **loader_kwargs)
            for x, y in loader:
                model(x.cuda()).sum().backward()
        """),
        # kwargs dict with workers.
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            ds = datasets.ImageFolder(root, transform=tf)
            kwargs = {"num_workers": 8, "pin_memory": True}
            loader = DataLoader(ds, **kwargs)
            for x, y in loader:
                model(x.cuda()).sum().backward()
        """),
        # In memory: an index into tensors is all a worker would do.
        Valid("""
            import torch
            from torch.utils.data import DataLoader, TensorDataset
            ds = TensorDataset(torch.randn(1000, 10), torch.randn(1000, 1))
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            for x, y in loader:
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
        """),
        # A dataset whose per-item work cannot be seen (tokenized Hugging Face data).
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(tokenized["train"], batch_size=16, collate_fn=pad)
            for batch in loader:
                loss = model(**batch.to(device)).loss
                loss.backward()
        """),
        # Only an evaluation loop iterates it.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            from torchvision import datasets
            train_loader = DataLoader(datasets.ImageFolder(a, transform=tf), batch_size=64, num_workers=8)
            val_loader = DataLoader(datasets.ImageFolder(b, transform=tf), batch_size=64)
            for x, y in train_loader:
                model(x.cuda()).sum().backward()
            with torch.no_grad():
                for x, y in val_loader:
                    model(x.cuda())
        """),
        # Stored and never used: the training loop iterates another loader.
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            unused_loader = DataLoader(datasets.MNIST(root, transform=tf), batch_size=64)
            train_loader = DataLoader(datasets.MNIST(root, transform=tf), batch_size=64, num_workers=4)
            for x, y in train_loader:
                model(x.cuda()).sum().backward()
        """),
        # Only peeked at: one batch taken to look at a sample.
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            check_loader = DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=1)
            sample = first(check_loader)
            images, labels = next(iter(check_loader))
            train_loader = DataLoader(datasets.ImageFolder(root, transform=tf), batch_size=64, num_workers=8)
            for x, y in train_loader:
                model(x.cuda()).sum().backward()
        """),
        # Trains on the CPU: nothing in the file moves data or the model to a GPU.
        Valid("""
            from torch.utils.data import DataLoader
            from torchvision import datasets
            loader = DataLoader(datasets.MNIST(root, transform=tf), batch_size=64)
            for x, y in loader:
                loss = criterion(model(x.reshape(-1, 784)), y)
                loss.backward()
                optimizer.step()
        """),
        # Not torch's DataLoader call: a method named like it on another object.
        Valid("""
            loader = builder.make(ds)
            for x, y in loader:
                model(x).sum().backward()
        """),
    ]

    INVALID = [
        Invalid(
            """
            from datasets import load_dataset
            from torchvision import transforms
            from transformers import Trainer, TrainingArguments

            augment = transforms.Compose([transforms.RandomResizedCrop(224), transforms.ToTensor()])

            def to_pixels(batch):
                batch["pixel_values"] = [augment(image.convert("RGB")) for image in batch["image"]]
                return batch

            train_ds = load_dataset("imagefolder", data_dir="photos")["train"]
            train_ds.set_transform(to_pixels)
            args = TrainingArguments("out", per_device_train_batch_size=64)
            Trainer(model=model, args=args, train_dataset=train_ds).train()
            """,
            line=13,
            message="set `dataloader_num_workers`",
        ),
        Invalid(
            """
            from composer import Trainer
            from torch.utils.data import DataLoader
            from torchvision import datasets, transforms

            train_set = datasets.CIFAR10("data", transform=transforms.ToTensor())
            train_dataloader = DataLoader(train_set, batch_size=128, shuffle=True)
            Trainer(model=model, train_dataloader=train_dataloader, max_duration="10ep").fit()
            """,
            line=6,
            message="the composer trainer trains with this DataLoader",
        ),
        Invalid(
            """
            import torchvision
            from mmengine.runner import Runner

            def main():
                train_set = torchvision.datasets.CIFAR10("data", transform=tf)
                train_dataloader = dict(batch_size=32, dataset=train_set, sampler=dict(type="DefaultSampler"))
                runner = Runner(model=model, train_dataloader=train_dataloader)
                runner.train()

            if __name__ == "__main__":
                main()
            """,
            line=6,
            message="the mmengine trainer builds its training DataLoader",
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            from torchvision import datasets
            ds = datasets.CIFAR10(root, train=True, transform=augment)
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
            line=4,
            message="`num_workers` is not set",
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(MyImages(files, transform=augment), batch_size=32, num_workers=0)
            for x, y in loader:
                loss = model(x.to(device))
                loss.backward()
            """,
            message="`num_workers=0`",
        ),
        Invalid(
            """
            import torch
            from PIL import Image
            class Folder(torch.utils.data.Dataset):
                def __getitem__(self, index):
                    return Image.open(self.paths[index]).convert("RGB"), self.labels[index]
            loader = torch.utils.data.DataLoader(Folder(), batch_size=32)
            def train():
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = model(x.to(device))
                    loss.backward()
                    optimizer.step()
            """,
            line=6,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader, Subset
            from torchvision.datasets import ImageFolder
            full = ImageFolder(root, transform=tf)
            part = Subset(full, indices)
            kwargs = {"batch_size": 8, "num_workers": 0}
            loader = DataLoader(part, **kwargs)
            for x, y in loader:
                model(x.cuda()).sum().backward()
            """,
            line=6,
        ),
        Invalid(
            """
            from torch.utils import data
            from torchvision import datasets
            train_loader = data.DataLoader(datasets.MNIST(root, transform=tf), batch_size=64)
            val_loader = data.DataLoader(datasets.MNIST(root, train=False, transform=tf), batch_size=64, num_workers=0)
            def loaders():
                return train_loader, val_loader
            for x, y in train_loader:
                model(x.cuda()).sum().backward()
            """,
            count=2,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            import numpy as np
            class Shards:
                def __getitem__(self, i):
                    return np.load(self.files[i])
            kwargs = dict(batch_size=8)
            loader = DataLoader(Shards(), **kwargs)
            for x, y in loader:
                scaler.scale(model(x.cuda())).backward()
            """,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # name -> expressions assigned to it anywhere in the module
        self.assigned: Dict[str, List[cst.BaseExpression]] = {}
        # classes of this module whose __getitem__ reads, decodes or transforms
        self.loading_classes: Set[str] = set()
        # name -> transform functions set on it in place (``train_ds.set_transform(preprocess)``)
        self.set_in_place: Dict[str, List[cst.BaseExpression]] = {}

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value == "set_transform" and node.args:
            name = dotted_name(func.value)
            if name is not None:
                self.set_in_place.setdefault(name, []).append(node.args[0].value)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            name = dotted_name(target.target)
            if name is not None:
                self.assigned.setdefault(name, []).append(node.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value == "__getitem__":
            owner = self.ctx.enclosing_class()
            if owner and does_per_item_work(node):
                self.loading_classes.add(owner)

    def finish(self) -> None:
        facts = self.ctx.facts
        trains = any(loop.trains for loop in facts.loops.values()) or any(
            info.trains for infos in facts.functions.values() for info in infos
        )
        if not trains:
            for run in framework_training_runs(self.ctx):
                self._check_framework_loaders(run)
            return
        move = self.ctx.accelerator_move()
        if move is None:
            return  # nothing in this file runs on a GPU: no GPU waits for the loader
        for loader in facts.loaders:
            assert loader.call is not None  # the module's own loaders: each has its call
            reason = self._single_process(loader)
            dataset = _dataset_argument(loader.call)
            if (
                reason is None
                or self._evaluation_only(loader)
                or self._not_a_data_feed(loader)
                or not self._loads_per_item(dataset)
            ):
                continue
            self.report(
                loader.call,
                f"{reason}: this DataLoader reads and transforms every sample in the training process "
                "while the GPU waits; "
                "set `num_workers` to a few worker processes",
                evidence=[
                    Evidence(_REAL_WORK, node=dataset),
                    Evidence(f"the work runs on a GPU: `{_last_line(self.ctx.code_for(move))}`", node=move),
                    *(
                        Evidence(f"a training loop iterates it: {loop.line_hint}", node=loop.node)
                        for loop in self._loops_over(loader)[:1]
                        if self._loop_trains(loop)
                    ),
                ],
            )

    def _check_framework_loaders(self, run: TrainerRun) -> None:
        """The loader configurations a framework trainer builds its training DataLoader from."""
        if run.framework in FRAMEWORK_LOADER_ARGUMENTS:
            self._check_framework_arguments(run)
            return
        if run.framework in FRAMEWORK_TRAINING_LOADERS:
            self._check_handed_loaders(run)
        for keyword in FRAMEWORK_LOADER_KEYWORDS.get(run.framework, ()):
            config = self._config_dict(keyword_value(run.constructor, keyword))
            if config is None:
                continue
            if any(arg.star for arg in config.args):
                continue  # keys the rule cannot see
            reason = _single_process_reason(keyword_value(config, "num_workers"))
            if reason is None:
                continue
            dataset = keyword_value(config, "dataset")
            if not self._loads_per_item(dataset):
                continue
            how = "builds its training DataLoader from this dict, which"
            self._report_framework_loader(config, reason, how, dataset, run)

    def _check_handed_loaders(self, run: TrainerRun) -> None:
        """DataLoaders the script builds and hands to a framework trainer to
        train with (composer's ``Trainer(train_dataloader=loader)``, Lightning's
        ``trainer.fit(model, train_dataloaders=loader)``)."""
        handed = [
            _argument(call, keyword, position) if position is not None else keyword_value(call, keyword)
            for call, (keyword, position) in zip((run.constructor, run.run), FRAMEWORK_TRAINING_LOADERS[run.framework])
        ]
        for loader in self.ctx.facts.loaders:
            call = loader.call
            assert call is not None  # the module's own loaders: each has its call
            if not any(
                value is call or (isinstance(value, cst.Name) and value.value == loader.target) for value in handed
            ):
                continue
            reason = self._single_process(loader)
            dataset = _dataset_argument(call)
            if reason is None or not self._loads_per_item(dataset):
                continue
            self._report_framework_loader(call, reason, "trains with this DataLoader, which", dataset, run)

    def _check_framework_arguments(self, run: TrainerRun) -> None:
        """A trainer that builds its loader from an arguments object: Hugging
        Face's ``Trainer(args=TrainingArguments(...), train_dataset=...)``
        leaves ``dataloader_num_workers`` at 0 unless it is given."""
        workers_key, dataset_parameter = FRAMEWORK_LOADER_ARGUMENTS[run.framework]
        arguments = run.arguments
        if arguments is None or any(arg.star for arg in arguments.args):
            return  # settings the rule cannot see
        if any(arg.star for arg in run.constructor.args):
            return
        reason = _single_process_reason(keyword_value(arguments, workers_key))
        dataset = _argument(run.constructor, *dataset_parameter)
        if reason is None or not self._loads_per_item(dataset):
            return
        reason = reason.replace("num_workers", workers_key)
        how = "builds its training DataLoader from these arguments, so it"
        self._report_framework_loader(arguments, reason, how, dataset, run, setting=workers_key)

    def _report_framework_loader(
        self,
        node: cst.CSTNode,
        reason: str,
        how: str,
        dataset: Optional[cst.BaseExpression],
        run: TrainerRun,
        setting: str = "num_workers",
    ) -> None:
        """A framework's training loader that loads in the training process."""
        self.report(
            node,
            f"{reason}: the {run.framework} trainer {how} reads and transforms every sample in the training process "
            f"while the GPU waits; set `{setting}` to a few worker processes",
            evidence=[
                Evidence(_REAL_WORK, node=dataset),
                framework_run_evidence(self.ctx, run),
            ],
        )

    def _config_dict(self, value: Optional[cst.BaseExpression]) -> Optional[cst.Call]:
        """``dict(batch_size=..., dataset=...)``, directly or through the name it was assigned to once."""
        if isinstance(value, cst.Name):
            assigned = self.assigned.get(value.value, ())
            value = assigned[0] if len(assigned) == 1 else None
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
            return value
        return None

    def _single_process(self, loader: LoaderInfo) -> Optional[str]:
        call = loader.call
        assert call is not None  # the module's own loaders: each has its call
        value = loader.num_workers
        if value is None:
            for arg in call.args:
                if arg.star == "**" and dotted_name(arg.value) not in self.ctx.facts.dict_literals:
                    return None  # kwargs the rule cannot see
                if arg.star == "*":
                    return None  # positional arguments may include num_workers
            if len([a for a in call.args if a.keyword is None and not a.star]) > 5:
                return None  # num_workers passed positionally
        return _single_process_reason(value)

    def _loops_over(self, loader: LoaderInfo) -> List[LoopInfo]:
        """The ``for`` loops of the module that iterate the loader's name."""
        if loader.target is None:
            return []
        return [
            loop
            for loop in self.ctx.facts.loops.values()
            if isinstance(loop.node, cst.For) and _iterates(loop.node.iter, loader.target)
        ]

    def _evaluation_only(self, loader: LoaderInfo) -> bool:
        """Loops iterate this loader's name, and none of them trains."""
        loops = self._loops_over(loader)
        return bool(loops) and not any(self._loop_trains(loop) for loop in loops)

    def _not_a_data_feed(self, loader: LoaderInfo) -> bool:
        """The loader is stored under a name that nothing reads (dead code), or
        every use of it takes one batch (``first(loader)``,
        ``next(iter(loader))``): a look at a sample."""
        if loader.target is None:
            return False
        uses = peeks = 0
        for node in iter_subtree(self.ctx.module):
            if isinstance(node, (cst.Name, cst.Attribute)) and dotted_name(node) == loader.target:
                uses += 1
            elif isinstance(node, cst.Call) and last_name(node.func) in _PEEKS:
                peeks += sum(1 for arg in node.args if dotted_name(arg.value) == loader.target)
        reads = uses - len(self.assigned.get(loader.target, ()))  # the assignments' targets are no reads
        return reads == peeks

    def _loop_trains(self, loop: LoopInfo) -> bool:
        """It, or a loop nested in it, trains (directly or through a module function)."""
        for inner in self.ctx.facts.loops.values():
            outer: Optional[LoopInfo] = inner
            while outer is not None and outer is not loop:
                outer = outer.parent
            if outer is loop and (inner.trains or any(self.ctx.facts.function_trains(name) for name in inner.calls)):
                return True
        return False

    def _loads_per_item(self, node: Optional[cst.BaseExpression], depth: int = 0) -> bool:
        """Is fetching one sample of this dataset real work (I/O, decoding, a transform)?"""
        if node is None or depth > 4:
            return False
        if isinstance(node, cst.Name):
            if any(self._does_per_item_work(f) for f in self.set_in_place.get(node.value, ())):
                return True
            return any(self._loads_per_item(value, depth + 1) for value in self.assigned.get(node.value, ()))
        if isinstance(node, (cst.List, cst.Tuple)):
            return any(self._loads_per_item(element.value, depth + 1) for element in node.elements)
        if isinstance(node, cst.Subscript):  # ``dataset_dict["train"]``: a split keeps its on-access transform
            return self._transformed_on_access(node.value, depth + 1)
        if not isinstance(node, cst.Call):
            return False
        if self._transformed_on_access(node, depth):
            return True
        qname = self.ctx.qualified_name(node.func) or dotted_name(node.func) or ""
        if qname.startswith("torchvision.datasets."):
            return True
        if any(
            arg.keyword is not None and arg.keyword.value in _TRANSFORM_KEYWORDS and not _is_none(arg.value)
            for arg in node.args
        ):
            return True
        name = qname.rsplit(".", 1)[-1]
        if name in self.loading_classes or self.ctx.class_loads_per_item(node.func):
            return True
        if name in _WRAPPERS and node.args:
            return self._loads_per_item(node.args[0].value, depth + 1)
        return False

    def _transformed_on_access(self, node: cst.BaseExpression, depth: int) -> bool:
        """A Hugging Face dataset (or split) whose ``with_transform``/``set_transform``
        function decodes, reads or transforms every item it hands out."""
        if depth > 4:
            return False
        if isinstance(node, cst.Name):
            if any(self._does_per_item_work(f) for f in self.set_in_place.get(node.value, ())):
                return True
            return any(self._transformed_on_access(v, depth + 1) for v in self.assigned.get(node.value, ()))
        if isinstance(node, cst.Subscript):
            return self._transformed_on_access(node.value, depth + 1)
        if not isinstance(node, cst.Call) or not isinstance(node.func, cst.Attribute):
            return False
        method = node.func.attr.value
        if method in _ON_ACCESS_TRANSFORMS and node.args:
            return self._does_per_item_work(node.args[0].value)
        return method in _KEEP_TRANSFORM and self._transformed_on_access(node.func.value, depth + 1)

    def _does_per_item_work(self, function: cst.BaseExpression) -> bool:
        """Does a transform function (a function of this module, or a lambda)
        decode, read or transform samples?"""
        if isinstance(function, cst.Lambda):
            calls = (sub for sub in iter_subtree(function.body) if isinstance(sub, cst.Call))
            return any(last_name(call.func) in PER_ITEM_WORK for call in calls)
        if isinstance(function, cst.Name):
            return any(
                does_per_item_work(info.node) or self._applies_transform_pipeline(info.node)
                for info in self.ctx.facts.functions.get(function.value, ())
            )
        return False

    def _applies_transform_pipeline(self, function: cst.FunctionDef) -> bool:
        """Does the function call a module-level transform pipeline
        (``train_transforms = Compose([RandomResizedCrop(224), ToTensor()])``,
        then ``train_transforms(image)``) on what it hands out?"""
        for sub in iter_subtree(function.body):
            if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Name):
                built = self.ctx.facts.module_constants.get(sub.func.value)
                if isinstance(built, cst.Call) and (self.ctx.qualified_name(built.func) or "").startswith(
                    _TRANSFORM_LIBRARIES
                ):
                    return True
        return False


_REAL_WORK = "fetching a sample is real work (files read or decoded, or a transform applied)"
# A Hugging Face dataset's transform set with these runs on every access, in
# the process that fetches the item (``dataset.with_transform(preprocess)``),
# unlike ``.map()``, which runs once ahead of training.
_ON_ACCESS_TRANSFORMS = frozenset({"with_transform", "set_transform"})
# Dataset methods whose result keeps the on-access transform of their receiver.
_KEEP_TRANSFORM = frozenset({"remove_columns", "rename_column", "rename_columns", "select", "shuffle", "filter"})
# Calls that take one batch of a loader: a look at a sample.
_PEEKS = frozenset({"first", "next", "iter"})
# Libraries whose pipelines decode or augment one sample per call.
_TRANSFORM_LIBRARIES = ("torchvision.transforms", "albumentations", "kornia.augmentation", "monai.transforms")
_TRANSFORM_KEYWORDS = frozenset({"transform", "transforms", "target_transform"})
_WRAPPERS = frozenset({"Subset", "ConcatDataset", "ChainDataset"})


def _argument(call: cst.Call, keyword: str, position: int) -> Optional[cst.BaseExpression]:
    """A call's argument for a parameter, given by keyword or by position."""
    found = keyword_value(call, keyword)
    if found is not None:
        return found
    positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    return positional[position] if len(positional) > position else None


def _dataset_argument(call: cst.Call) -> Optional[cst.BaseExpression]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dataset":
            return arg.value
    first = call.args[0] if call.args else None
    return first.value if first is not None and first.keyword is None and not first.star else None


def _iterates(iterable: cst.BaseExpression, name: str) -> bool:
    return any(dotted_name(sub) == name for sub in iter_subtree(iterable) if isinstance(sub, (cst.Name, cst.Attribute)))


def _is_none(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "None"


def _last_line(code: str) -> str:
    """A call that spans lines, named by its last line (``….to(device)``)."""
    lines = code.strip().splitlines()
    return lines[0] if len(lines) == 1 else "…" + lines[-1].strip()


def _single_process_reason(workers: Optional[cst.BaseExpression]) -> Optional[str]:
    """Why a loader's ``num_workers`` leaves loading in the training process, if it does."""
    if workers is None:
        return "`num_workers` is not set"
    if isinstance(workers, cst.Integer) and workers.evaluated_value == 0:
        return "`num_workers=0`"
    return None
