from __future__ import annotations

from typing import Sequence

import libcst as cst

from torchlint.model import LoaderInfo, keyword, loop_trains
from torchlint.rule import UNSAFE, Evidence, Invalid, Rule, Valid


class DataloaderNotPinned(Rule):
    """## What it does
    Flags a `DataLoader(...)` that does not pass `pin_memory=True` (the
    keyword is left out, set to `False`, or `False` in a `**kwargs` dict)
    when the batches it yields are copied to a CUDA device in the same
    module: `.to(device)` / `.cuda()` (or `.type(Tensor)` with `Tensor` a
    CUDA tensor type) on the loop variable of a loop over the loader, or on
    a batch taken with `next(...)` where that copy runs on every step (a
    batch taken once for a periodic sample or a check is not flagged).

    It is the other half of TL201 (`blocking-host-to-device-copy`): for a
    pinned loader TL201 asks for `non_blocking=True` at the copy; for an
    unpinned one it stays silent, because `non_blocking` cannot help pageable
    memory, and this rule points at the loader instead. When the batches are
    copied in a function that receives the loader as a parameter, the rule
    flags the module's unpinned loaders if the module has no pinned one.

    Not flagged: loaders whose `pin_memory` is an expression (for example
    `torch.cuda.is_available()`), loaders handed to a framework that moves the
    batches itself (`accelerator.prepare(loader)`), and modules that never
    copy batches to a device. Nor are loaders without worker processes
    (`num_workers` left out or `0`): the main process would pin each batch
    itself, a host copy as slow as the one pinning saves; and, in a module
    that trains, batches copied only in evaluation loops (a loop that does
    not train): one pass per epoch, or one at the end, is a small share of
    the training's time. In an evaluation or inference script the passes
    are the work, and their loaders are checked.

    ## Why is this bad?
    Copies to the GPU from ordinary (pageable) host memory go through a
    staging buffer and block the host. With `pin_memory=True` the loader's
    worker thread puts each batch in page-locked memory, from which the copy
    is faster and can overlap with compute when made with
    `non_blocking=True`.

    ## Known problems
    Pinning fails when the dataset already returns CUDA tensors; a loader
    whose batches are already on the GPU needs no `.to(device)` either.
    Page-locked memory is a limited resource: very large batches with many
    workers can exhaust it.

    ## Example
    ```python
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        criterion(model(images), labels).backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=4, pin_memory=True)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        criterion(model(images), labels).backward()
        optimizer.step()
    ```

    ## Fix safety
    Adding `pin_memory=True` is unsafe: it changes where the batches live on
    the host, not their values, but pinning raises "cannot pin
    'torch.cuda.FloatTensor'" when the dataset already returns CUDA tensors,
    and what a dataset returns is not visible to a linter. Replacing an
    explicit `pin_memory=False` is unsafe too, because the author chose it
    (perhaps to save page-locked memory). A `False` inside a `**kwargs` dict
    is reported without a fix, and so is a `DataLoader` that is not torch's
    (a class of the project with that name may not take `pin_memory`).

    ## References
    - [CUDA semantics: use pinned memory buffers](https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers)
    - [`torch.utils.data`: memory pinning](https://pytorch.org/docs/stable/data.html#memory-pinning)
    - [A guide on good usage of `non_blocking` and `pin_memory()`](https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html)
    - [Performance tuning guide: enable async data loading and augmentation](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#enable-async-data-loading-and-augmentation)
    """

    code = "TL202"
    name = "dataloader-not-pinned"
    summary = "A DataLoader whose batches are copied to the GPU does not use pinned memory"
    fix_availability = "sometimes"
    requires_any = ("DataLoader",)

    VALID = [
        # No worker processes: the main process would pin each batch itself.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=0)
            for x, y in loader:
                x, y = x.cuda(), y.cuda()
                loss_fn(model(x), y).backward()
        """),
        # Copied only by the evaluation pass of a training script.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_ds, batch_size=64, num_workers=4, pin_memory=True)
            test_loader = DataLoader(test_ds, batch_size=256, num_workers=4)
            for x, y in train_loader:
                loss_fn(model(x.cuda(non_blocking=True)), y.cuda(non_blocking=True)).backward()
            with torch.no_grad():
                for x, y in test_loader:
                    correct += (model(x.cuda()).argmax(1) == y.cuda()).sum()
        """),
        # Stored in an attribute and handed to accelerate, which places the batches.
        Valid("""
            from torch.utils.data import DataLoader
            class Trainer:
                def __init__(self, accelerator, ds):
                    self.loader = DataLoader(ds, batch_size=8)
                    self.model, self.loader = accelerator.prepare(self.model, self.loader)

                def train(self):
                    for batch in self.loader:
                        batch = batch.to(self.device)
        """),
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
        """),
        # No copy to a device: a CPU-only script.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            for x, y in loader:
                loss = model(x).sum()
        """),
        # pin_memory decided at run time.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=torch.cuda.is_available())
            for x, y in loader:
                x = x.cuda()
        """),
        # kwargs that cannot be seen.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, **loader_kwargs)
            for x, y in loader:
                x = x.cuda()
        """),
        # Pinned through a kwargs dict.
        Valid("""
            from torch.utils.data import DataLoader
            kwargs = {"num_workers": 4, "pin_memory": True}
            loader = DataLoader(ds, **kwargs)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
        """),
        # A framework moves the batches.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=8)
            loader = accelerator.prepare(loader)
            for batch in loader:
                out = model(batch)
        """),
        # Moving to the CPU, or a dtype cast, is not a copy to the GPU.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=8)
            for x, y in loader:
                x = x.to(torch.float16)
                y = y.to("cpu")
        """),
        # Only the model moves.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=8)
            model.to(device)
            for x, y in loader:
                out = model(x)
        """),
        # The copied value is not batch data.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=8)
            for x, y in loader:
                mask = template.to(device)
        """),
        # Another module's DataLoader class without pin_memory, not iterated here.
        Valid("""
            from torch.utils.data import DataLoader
            def make_loader(ds):
                return DataLoader(ds, batch_size=8)
        """),
    ]

    INVALID = [
        # An inference script: its passes are the work.
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(images, batch_size=32, num_workers=2)
            with torch.no_grad():
                for x, y in loader:
                    logits = model(x.cuda())
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            from tqdm import tqdm

            train_loader = torch.utils.data.DataLoader(train_set, batch_size=512, num_workers=4)

            def train(model, loader):
                device = "cuda" if torch.cuda.is_available() else "cpu"
                progress_bar = tqdm(loader)
                for images, labels in progress_bar:
                    loss = model(images.to(device)).sum()
                    loss.backward()

            train(model, train_loader)
            """,
            line=4,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=4)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss_fn(model(x), y).backward()
            """,
            fixed="""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=4, pin_memory=True)
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                loss_fn(model(x), y).backward()
            """,
            unsafe_fixes=True,
            line=2,
            message="pin_memory",
        ),
        # Explicit False: unsafe fix.
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, num_workers=2, pin_memory=False)
            for batch in loader:
                batch = batch.cuda()
                model(batch).sum().backward()
            """,
            fixed=None,
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, num_workers=2, pin_memory=False)
            for batch in loader:
                batch = batch.cuda()
                model(batch).sum().backward()
            """,
            fixed="""
            import torch
            loader = torch.utils.data.DataLoader(ds, num_workers=2, pin_memory=True)
            for batch in loader:
                batch = batch.cuda()
                model(batch).sum().backward()
            """,
            unsafe_fixes=True,
        ),
        # pin_memory False in a kwargs dict: reported, no fix.
        Invalid(
            """
            from torch.utils.data import DataLoader
            kwargs = dict(batch_size=8, pin_memory=False)
            train_loader = DataLoader(ds, num_workers=4, **kwargs)
            for step, (images, labels) in enumerate(train_loader):
                images = images.cuda()
                optimizer.step()
            """,
            fixed=None,
            line=3,
        ),
        # Dict batches.
        Invalid(
            """
            from torch.utils.data import DataLoader as DL
            loader = DL(ds, batch_size=8, num_workers=2)
            for batch in loader:
                batch = {k: v.to(device) for k, v in batch.items()}
                input_ids = batch["input_ids"].to(device)
                model(input_ids).loss.backward()
            """,
            fixed="""
            from torch.utils.data import DataLoader as DL
            loader = DL(ds, batch_size=8, num_workers=2, pin_memory=True)
            for batch in loader:
                batch = {k: v.to(device) for k, v in batch.items()}
                input_ids = batch["input_ids"].to(device)
                model(input_ids).loss.backward()
            """,
            unsafe_fixes=True,
        ),
        # next(iter(loader)).
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=8)
            it = iter(loader)
            while True:
                x, y = next(it)
                x = x.to("cuda")
                model(x).sum().backward()
            """,
            fixed="""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=8, pin_memory=True)
            it = iter(loader)
            while True:
                x, y = next(it)
                x = x.to("cuda")
                model(x).sum().backward()
            """,
            unsafe_fixes=True,
        ),
        # The loader is built in main() and iterated in a function that receives it.
        Invalid(
            """
            from torch.utils.data import DataLoader

            def train(model, loader, device):
                for x, y in loader:
                    x = x.to(device)
                    loss = model(x, y)
                    loss.backward()

            def main():
                train_loader = DataLoader(ds, batch_size=64,
                                          shuffle=True, num_workers=4)
                train(model, train_loader, "cuda")
            """,
            fixed="""
            from torch.utils.data import DataLoader

            def train(model, loader, device):
                for x, y in loader:
                    x = x.to(device)
                    loss = model(x, y)
                    loss.backward()

            def main():
                train_loader = DataLoader(ds, batch_size=64,
                                          shuffle=True, num_workers=4, pin_memory=True)
                train(model, train_loader, "cuda")
            """,
            unsafe_fixes=True,
            line=10,
        ),
        # Two loaders, one pinned and one not: only the unpinned one.
        Invalid(
            """
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_ds, num_workers=4)
            val_loader = DataLoader(val_ds, num_workers=4, pin_memory=True)
            for x, y in train_loader:
                x = x.to(device)
                model(x).sum().backward()
            for x, y in val_loader:
                x = x.to(device, non_blocking=True)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            train_loader = DataLoader(train_ds, num_workers=4, pin_memory=True)
            val_loader = DataLoader(val_ds, num_workers=4, pin_memory=True)
            for x, y in train_loader:
                x = x.to(device)
                model(x).sum().backward()
            for x, y in val_loader:
                x = x.to(device, non_blocking=True)
            """,
            unsafe_fixes=True,
            line=2,
        ),
    ]

    def finish(self) -> None:
        unpinned = [
            info
            for info in self.ctx.facts.loaders
            if info.pinned is False and not self._handed_to_framework(info) and self._uses_workers(info)
        ]
        if not unpinned:
            return
        any_pinned = any(info.pinned is not False for info in self.ctx.facts.loaders)
        flagged = set()
        for origin, site in zip(self.ctx.facts.batch_copies, self.ctx.facts.batch_copy_sites):
            if not self._copied_for_training(origin.loop_node):
                continue
            if origin.loop_node is None and site.per_step()[0] is None:
                continue  # one batch taken with ``next()`` for a sample or a check: copied once
            loader = self.ctx.facts.loader_for(origin.source, origin.function)
            if loader is not None:
                targets = [loader] if loader.pinned is False and loader in unpinned else []
            elif not any_pinned:
                targets = unpinned
            else:
                targets = []
            for target in targets:
                if id(target) not in flagged:
                    flagged.add(id(target))
                    copied = (
                        [
                            Evidence(
                                "its batches are copied to the GPU once per batch of this loop", node=origin.loop_node
                            )
                        ]
                        if origin.loop_node is not None
                        else [
                            Evidence(
                                "its batches, taken with `next()`, are copied to the GPU in this module",
                                node=target.call,
                            )
                        ]
                    )
                    self._report(target, evidence=copied)
        for loader in unpinned:
            if id(loader) not in flagged:
                where = self.ctx.loader_copied_elsewhere(loader)
                if where is not None:
                    flagged.add(id(loader))
                    self._report(
                        loader,
                        where,
                        evidence=[Evidence(f"its batches are copied to the GPU in {where}", node=loader.call)],
                    )

    def _uses_workers(self, loader: LoaderInfo) -> bool:
        """``num_workers`` given and not 0: pinning then happens in the loader's
        pin thread, off the training loop. Without workers the main process
        pins each batch itself, a copy as slow as the one it saves."""
        if loader.num_workers is None:
            return False
        value = self.ctx.constant(loader.num_workers)
        return not (isinstance(value, cst.Integer) and value.evaluated_value == 0)

    def _copied_for_training(self, loop_node) -> bool:
        """The copy is in a loop that trains, outside any loop, or in a module
        that does not train at all (an evaluation or inference script, whose
        passes are the work). The evaluation passes of a training script are
        a small share of its time."""
        loop = self.ctx.facts.loops.get(id(loop_node)) if loop_node is not None else None
        if loop is None or loop_trains(self.ctx, loop):
            return True
        return not any(loop_trains(self.ctx, other) for other in self.ctx.facts.loops.values())

    def _handed_to_framework(self, loader: LoaderInfo) -> bool:
        return loader.target is not None and loader.target in self.ctx.batches.placed_by_framework

    def _report(self, loader: LoaderInfo, where: str = "this module", evidence: Sequence[Evidence] = ()) -> None:
        call = loader.call
        assert call is not None  # the module's own loaders: each has its call
        arg = keyword(call, "pin_memory")
        message = (
            f"this DataLoader's batches are copied to the GPU in {where}, but it does not use pinned memory"
            " (`pin_memory=True`), so every copy is a blocking copy from pageable memory"
        )
        fix = None
        if not (self.ctx.qualified_name(call.func) or "").startswith("torch."):
            pass  # a project's own DataLoader class: its constructor may not take the keyword
        elif arg is not None:
            fix = self.ctx.fix(UNSAFE, "Set `pin_memory=True`", self.ctx.replace(arg.value, "True"))
        elif not any(a.star == "**" for a in call.args):
            if call.args:
                last = call.args[-1]
                edit = self.ctx.replace(last.value, f"{self.ctx.code_for(last.value)}, pin_memory=True")
            else:
                edit = self.ctx.replace(call, f"{self.ctx.code_for(call.func)}(pin_memory=True)")
            fix = self.ctx.fix(UNSAFE, "Add `pin_memory=True`", edit)
        self.report(call, message, fix, evidence=evidence)
