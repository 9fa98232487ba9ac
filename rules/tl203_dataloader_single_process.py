from __future__ import annotations

from typing import Optional

import libcst as cst

from torchlint.facts import LoaderInfo
from torchlint.names import dotted_name
from torchlint.rule import Invalid, Rule, Valid


class DataloaderSingleProcess(Rule):
    """## What it does
    Flags a `DataLoader(...)` that loads data in the training process itself,
    because `num_workers` is left out or set to `0`, in a module that trains
    (it calls `backward()` or steps an optimizer).

    This rule is opt-in (enable it with `--extend-select TL203`): whether
    worker processes pay off depends on the workload. Datasets that already
    hold tensors in memory, tiny datasets and some debugging setups are
    faster or simpler in one process.

    Not flagged: `num_workers` given as an expression (`args.workers`,
    `os.cpu_count()`), `**kwargs` the rule cannot see, and modules that do
    not train.

    ## Why is this bad?
    With `num_workers=0` the main process reads, decodes and augments every
    batch between training steps, while the GPU waits. Worker processes
    prepare the next batches in parallel with the training step, so the GPU
    is fed without gaps.

    ## Example
    ```python
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=64, shuffle=True)
    for images, labels in loader:
        loss = criterion(model(images), labels)
        loss.backward()
        optimizer.step()
    ```

    Use instead:
    ```python
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=8, persistent_workers=True)
    for images, labels in loader:
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
    default_enabled = False
    fix_availability = "none"
    requires_any = ("DataLoader",)

    VALID = [
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=4)
            for x, y in loader:
                model(x).sum().backward()
        """),
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=args.workers)
            for x, y in loader:
                model(x).sum().backward()
        """),
        # No training in this module: an evaluation script.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            with torch.no_grad():
                for x, y in loader:
                    preds = model(x)
        """),
        # kwargs the rule cannot see.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, **loader_kwargs)
            for x, y in loader:
                model(x).sum().backward()
        """),
        # kwargs dict with workers.
        Valid("""
            from torch.utils.data import DataLoader
            kwargs = {"num_workers": 8, "pin_memory": True}
            loader = DataLoader(ds, **kwargs)
            for x, y in loader:
                model(x).sum().backward()
        """),
        Valid("""
            import os
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, num_workers=os.cpu_count())
            for x, y in loader:
                loss = model(x)
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
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, shuffle=True)
            for x, y in loader:
                model(x).sum().backward()
            """,
            line=2,
            message="`num_workers` is not set",
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, num_workers=0)
            for x, y in loader:
                loss = model(x)
                loss.backward()
            """,
            message="`num_workers=0`",
        ),
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, batch_size=32)
            def train():
                for x, y in loader:
                    optimizer.zero_grad()
                    loss = model(x)
                    loss.backward()
                    optimizer.step()
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            kwargs = {"batch_size": 8, "num_workers": 0}
            loader = DataLoader(ds, **kwargs)
            for x, y in loader:
                model(x).sum().backward()
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.utils import data
            train_loader = data.DataLoader(train_ds, batch_size=64)
            val_loader = data.DataLoader(val_ds, batch_size=64, num_workers=0)
            for x, y in train_loader:
                model(x).sum().backward()
            """,
            count=2,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            kwargs = dict(batch_size=8)
            loader = DataLoader(ds, **kwargs)
            for x, y in loader:
                scaler.scale(model(x)).backward()
            """,
        ),
    ]

    def finish(self) -> None:
        facts = self.ctx.facts
        trains = any(loop.trains for loop in facts.loops.values()) or any(
            info.trains for infos in facts.functions.values() for info in infos
        )
        if not trains:
            return
        for loader in facts.loaders:
            reason = self._single_process(loader)
            if reason is not None:
                self.report(
                    loader.call,
                    f"{reason}: this DataLoader loads every batch in the training process while the GPU waits; "
                    "set `num_workers` to a few worker processes",
                )

    def _single_process(self, loader: LoaderInfo) -> Optional[str]:
        call = loader.call
        value = loader.num_workers
        if value is None:
            for arg in call.args:
                if arg.star == "**" and dotted_name(arg.value) not in self.ctx.facts.dict_literals:
                    return None  # kwargs the rule cannot see
                if arg.star == "*":
                    return None  # positional arguments may include num_workers
            if len([a for a in call.args if a.keyword is None and not a.star]) > 5:
                return None  # num_workers passed positionally
            return "`num_workers` is not set"
        if isinstance(value, cst.Integer) and value.evaluated_value == 0:
            return "`num_workers=0`"
        return None
