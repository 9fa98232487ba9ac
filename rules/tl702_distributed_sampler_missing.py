from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    LoaderInfo,
    LoopInfo,
    dotted_name,
    is_dataloader_call,
    keyword,
    last_name,
    literal_bool,
    loop_trains,
)
from torchlint.rule import Evidence, Invalid, Rule, Valid

_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel")
_NON_DISTRIBUTED_SAMPLERS = frozenset(
    {"RandomSampler", "SequentialSampler", "WeightedRandomSampler", "SubsetRandomSampler"}
)
_TRAIN_NAME = re.compile(r"(?i)train")
_EVAL_NAME = re.compile(r"(?i)(val|test|eval|infer|predict|calib)")
# Datasets that shard themselves (iterable/streaming datasets, explicit rank slicing).
_SELF_SHARDING = re.compile(r"(?i)(iterable|stream|webdataset|wds\.|split_dataset_by_node|rank|world_size|shard)")


class DistributedSamplerMissing(Rule):
    """## What it does
    In a module that wraps its model in `DistributedDataParallel` (or FSDP),
    flags the training `DataLoader` when it has no `DistributedSampler`, and
    flags a shuffling `DistributedSampler` whose `set_epoch()` is never
    called although the data is iterated for several epochs.

    The training loader is a `DataLoader` iterated by a loop that trains
    (calls `backward()` or an optimizer step, directly or through a function
    of the module), or one stored under a name containing `train`; loaders
    named for validation or testing are left alone. A loader counts as
    distributed when its `sampler=` or `batch_sampler=` is, or is assigned
    from, something whose name contains `Distributed`. The rule stays silent
    when the sampler cannot be seen (a parameter, a factory call), and when
    the dataset evidently shards itself: an `IterableDataset`, a streaming or
    WebDataset pipeline, `split_dataset_by_node`, or rank-based slicing
    visible in the `DataLoader` call.

    ## Why is this bad?
    Without a `DistributedSampler` every rank iterates the *whole* dataset:
    each epoch does world-size times the work, and since all ranks see the
    same batches in the same order (with the same seed), the extra work buys
    nothing. A `DistributedSampler` gives each rank its own shard. Its
    shuffle order is seeded by the epoch number, so without
    `sampler.set_epoch(epoch)` at the start of each epoch every epoch sees
    the same order.

    ## Example
    ```python
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    model = DDP(net, device_ids=[rank])
    train_loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for epoch in range(epochs):
        for x, y in train_loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    ```

    Use instead:
    ```python
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler

    model = DDP(net, device_ids=[rank])
    sampler = DistributedSampler(dataset, shuffle=True)
    train_loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
    ```

    ## Known problems
    A dataset that shards itself in a way the rule cannot see (a custom
    `Dataset` that reads `dist.get_rank()` internally) is reported; add a
    `# noqa: TL702` there.

    ## Fix safety
    There is no automatic fix: adding a sampler means removing `shuffle=True`
    from the loader and calling `set_epoch` in the epoch loop.

    ## References
    - [`torch.utils.data.distributed.DistributedSampler`](https://pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler)
    - [Getting started with DistributedDataParallel](https://pytorch.org/tutorials/intermediate/ddp_tutorial.html)
    """

    code = "TL702"
    name = "distributed-sampler-missing"
    summary = "A DDP training DataLoader has no DistributedSampler, or its sampler never gets `set_epoch()`"
    requires_any = _WRAPPERS

    VALID = [
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            model = DDP(net)
            sampler = DistributedSampler(ds)
            train_loader = DataLoader(ds, sampler=sampler)
            for epoch in range(3):
                sampler.set_epoch(epoch)
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
        """),
        Valid("""
            from torch.utils.data import DataLoader
            train_loader = DataLoader(ds, shuffle=True)
            for epoch in range(3):
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            model = DDP(net)
            val_loader = DataLoader(val_ds, batch_size=64)
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            model = DDP(net)
            sampler = DistributedSampler(ds) if distributed else None
            train_loader = DataLoader(ds, sampler=sampler, shuffle=sampler is None)
            for epoch in range(3):
                if distributed:
                    sampler.set_epoch(epoch)
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            model = DDP(net)
            train_loader = DataLoader(ds, sampler=make_sampler(ds))
            for x in train_loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, IterableDataset
            class Stream(IterableDataset):
                def __iter__(self):
                    yield from range(10)
            model = DDP(net)
            train_loader = DataLoader(Stream(), batch_size=8)
            for x in train_loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            model = DDP(net)
            sampler = DistributedSampler(ds, shuffle=False)
            train_loader = DataLoader(ds, sampler=sampler)
            for epoch in range(3):
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            model = DDP(net)
            train_loader = DataLoader(ds, sampler=DistributedSampler(ds))
            for x in train_loader:
                model(x).sum().backward()
                optimizer.step()
        """),
        Valid("""
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, Subset
            model = DDP(net)
            train_loader = DataLoader(Subset(ds, range(rank, len(ds), world_size)))
            for x in train_loader:
                model(x).sum().backward()
                optimizer.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            model = DDP(net)
            train_loader = DataLoader(ds, batch_size=32, shuffle=True)
            for x in train_loader:
                model(x).sum().backward()
                optimizer.step()
            """,
            line=4,
            message="no `DistributedSampler`",
        ),
        Invalid(
            """
            import torch
            model = torch.nn.parallel.DistributedDataParallel(net)
            loader = torch.utils.data.DataLoader(ds, batch_size=32)
            for epoch in range(3):
                for x, y in loader:
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
            """,
            line=3,
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader, RandomSampler
            model = DDP(net)
            train_loader = DataLoader(ds, sampler=RandomSampler(ds))
            """,
            message="`RandomSampler`",
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            from torch.utils.data.distributed import DistributedSampler
            model = DDP(net)
            sampler = DistributedSampler(ds)
            train_loader = DataLoader(ds, sampler=sampler)
            for epoch in range(3):
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
            """,
            line=5,
            message="`set_epoch(epoch)`",
        ),
        Invalid(
            """
            from torch.nn.parallel import DistributedDataParallel as DDP
            from torch.utils.data import DataLoader
            def main():
                model = DDP(net)
                kwargs = dict(batch_size=32, num_workers=4)
                train_dl = DataLoader(train_set, shuffle=True, **kwargs)
                for epoch in range(3):
                    for batch in train_dl:
                        model(batch).sum().backward()
                        optimizer.step()
            """,
            line=6,
        ),
        Invalid(
            """
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.utils.data import DataLoader, DistributedSampler
            model = FSDP(net)
            train_loader = DataLoader(ds, sampler=DistributedSampler(ds, shuffle=True))
            for epoch in range(3):
                for x in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
            """,
            line=4,
            message="`set_epoch(epoch)`",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.has_wrapper = False
        self.wrapper: Optional[cst.Call] = None  # the first DDP/FSDP wrap
        self.iterable_classes: Set[str] = set()
        # (loader call, sampler verdict, sampler call node or None)
        self.loader_samplers: List[Tuple[cst.Call, str, Optional[cst.Call], bool]] = []
        # (function node or None, name) -> every value assigned to it so far, in any branch
        self.assigned: Dict[Tuple[Optional[cst.CSTNode], str], List[cst.BaseExpression]] = {}

    def visit_Assign(self, node: cst.Assign) -> None:
        scope = self.ctx.function.node if self.ctx.function is not None else None
        for target in node.targets:
            name = dotted_name(target.target)
            if name is not None:
                self.assigned.setdefault((scope, name), []).append(node.value)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for base in node.bases:
            name = last_name(base.value) or ""
            if "Iterable" in name or name in self.iterable_classes:
                self.iterable_classes.add(node.name.value)

    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        qualified = ctx.qualified_name(node.func) or ""
        if qualified.startswith("torch.") and qualified.rsplit(".", 1)[-1] in _WRAPPERS:
            self.has_wrapper = True
            self.wrapper = self.wrapper or node
            return
        if not is_dataloader_call(ctx.names, node):
            return
        verdict, sampler_call = self._sampler(node)
        self.loader_samplers.append((node, verdict, sampler_call, self._self_sharding(node)))

    def _resolve(self, expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
        name = dotted_name(expr) if expr is not None else None
        if name is not None:
            return self.ctx.value_of(name) or expr
        return expr

    def _sampler(self, call: cst.Call) -> Tuple[str, Optional[cst.Call]]:
        """("none" | "distributed" | "plain:<Name>" | "unknown", the DistributedSampler call)."""
        loader = None
        for info in self.ctx.facts.loaders:
            if info.call is call:
                loader = info
        expr = loader.sampler if loader is not None else None
        if expr is None:
            arg = keyword(call, "batch_sampler")
            expr = arg.value if arg is not None else None
        if expr is None:
            if any(a.star == "**" for a in call.args) and loader is not None and loader.pinned is None:
                return "unknown", None
            return "none", None
        verdicts = [self._sampler_value(value) for value in self._values(expr)]
        # Chosen per branch (`if args.distributed: ... else: RandomSampler(...)`): distributed when it can be.
        for verdict in verdicts:
            if verdict[0] == "distributed":
                return verdict
        if any(verdict[0] == "unknown" for verdict in verdicts):
            return "unknown", None
        plain = [verdict for verdict in verdicts if verdict[0].startswith("plain:")]
        return plain[0] if plain else ("none", None)

    def _values(self, expr: cst.BaseExpression) -> List[cst.BaseExpression]:
        """Every value ``expr`` (a name) was assigned in this scope, in any branch."""
        name = dotted_name(expr)
        if name is None:
            return [expr]
        scope = self.ctx.function.node if self.ctx.function is not None else None
        values = self.assigned.get((scope, name)) or self.assigned.get((None, name))
        return list(values) if values else [self._resolve(expr) or expr]

    def _sampler_value(self, value: cst.BaseExpression) -> Tuple[str, Optional[cst.Call]]:
        if isinstance(value, cst.Name) and value.value == "None":
            return "none", None
        text = self.ctx.code_for(value)
        if "Distributed" in text:
            calls = [value] if isinstance(value, cst.Call) else []
            if isinstance(value, cst.IfExp):
                calls = [branch for branch in (value.body, value.orelse) if isinstance(branch, cst.Call)]
            distributed_call = next((c for c in calls if "Distributed" in (last_name(c.func) or "")), None)
            return "distributed", distributed_call
        if isinstance(value, cst.IfExp):
            branches = [self._sampler_value(value.body), self._sampler_value(value.orelse)]
            plain = [b for b in branches if b[0].startswith("plain:")]
            if plain and all(b[0].startswith("plain:") or b[0] == "none" for b in branches):
                return plain[0]
            return "unknown", None
        if isinstance(value, cst.Call) and last_name(value.func) in _NON_DISTRIBUTED_SAMPLERS:
            return f"plain:{last_name(value.func)}", None
        return "unknown", None

    def _self_sharding(self, call: cst.Call) -> bool:
        dataset = call.args[0].value if call.args and call.args[0].keyword is None else None
        if dataset is None:
            arg = keyword(call, "dataset")
            dataset = arg.value if arg is not None else None
        pieces = [self.ctx.code_for(call)]
        resolved = self._resolve(dataset)
        if resolved is not None and resolved is not dataset:
            pieces.append(self.ctx.code_for(resolved))
        text = " ".join(pieces)
        if _SELF_SHARDING.search(text):
            return True
        if isinstance(resolved, cst.Call) and (last_name(resolved.func) or "") in self.iterable_classes:
            return True
        return False

    def finish(self) -> None:
        if not self.has_wrapper:
            return
        facts = self.ctx.facts
        has_set_epoch = "set_epoch" in self.ctx.source
        has_epoch_loop = any(loop.parent is not None for loop in facts.loops.values())
        for call, verdict, sampler_call, self_sharding in self.loader_samplers:
            info = next((candidate for candidate in facts.loaders if candidate.call is call), None)
            if info is None or not self._is_training_loader(info):
                continue
            name = f"`{info.target}`" if info.target else "this DataLoader"
            assert self.wrapper is not None  # has_wrapper
            evidence = [
                Evidence(f"the model trains distributed: `{self.ctx.code_line(self.wrapper)}`", node=self.wrapper),
            ]
            loops = self._training_loops(info)
            evidence.append(
                Evidence(f"a training loop iterates it: {loops[0].line_hint}", node=loops[0].node)
                if loops
                else Evidence(f"a training loader by its name, {name}", node=call)
            )
            if verdict == "none" and not self_sharding:
                self.report(
                    call,
                    f"training DataLoader {name} in a DistributedDataParallel module has no `DistributedSampler`: "
                    "every rank iterates the whole dataset; pass `sampler=DistributedSampler(dataset)`",
                    evidence=evidence,
                )
            elif verdict.startswith("plain:") and not self_sharding:
                self.report(
                    call,
                    f"training DataLoader {name} in a DistributedDataParallel module uses `{verdict[6:]}`, not a "
                    "`DistributedSampler`: every rank iterates the whole dataset",
                    evidence=evidence,
                )
            elif verdict == "distributed" and sampler_call is not None and not has_set_epoch and has_epoch_loop:
                shuffle = keyword(sampler_call, "shuffle")
                if shuffle is not None and literal_bool(shuffle.value) is False:
                    continue
                self.report(
                    sampler_call,
                    "this `DistributedSampler` never gets `set_epoch(epoch)`: it shuffles in the same order every "
                    "epoch; call `sampler.set_epoch(epoch)` at the start of each epoch",
                    evidence=evidence,
                )

    def _is_training_loader(self, info: LoaderInfo) -> bool:
        target = (info.target or "").rsplit(".", 1)[-1]
        if target and _EVAL_NAME.search(target):
            return False
        if target and _TRAIN_NAME.search(target):
            return True
        return bool(self._training_loops(info))

    def _training_loops(self, info: LoaderInfo) -> List[LoopInfo]:
        found = []
        for loop in self.ctx.facts.loops.values():
            node = loop.node
            if not isinstance(node, cst.For) or (info.target and loop.function is not info.function):
                continue  # a loader of the same name in another function
            if self.ctx.facts.loader_for(node.iter, loop.function) is info and loop_trains(self.ctx, loop):
                found.append(loop)
        return found
