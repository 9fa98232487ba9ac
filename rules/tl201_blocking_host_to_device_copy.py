from __future__ import annotations

import re
from typing import List, Optional, Tuple

import libcst as cst

from torchlint.model import (
    UNKNOWN_PART,
    LoaderInfo,
    Origin,
    Site,
    dotted_name,
    keyword,
    last_name,
    mentions_cuda_availability,
    uses_default_collate,
)
from torchlint.rule import DISPLAY_ONLY, SAFE, UNSAFE, Evidence, Invalid, Option, Rule, Valid

# A name that holds a device: `device`, `args.device`, `self.dev`, `local_rank`, `x.device`.
_DEVICE_NAME = re.compile(r"(?i)(^|_)(device|dev|gpu|cuda|rank|local_rank|gpu_id|device_id)s?$|^device")


class BlockingHostToDeviceCopy(Rule):
    """## What it does
    Flags `.to(device)`, `.to("cuda")`, `.to(device, dtype)` and `.cuda()` on
    batch data inside a loop over a DataLoader (or batches pulled with
    `next(...)`) when the batches are in pinned memory and the copy does not
    pass `non_blocking=True`. Pinned batches are recognised from a
    `DataLoader(..., pin_memory=True)` visible in the module (also through a
    `**kwargs` dict, or `pin_memory=torch.cuda.is_available()`), from a
    loader another file of the project builds and passes in or returns
    (`a, b, train_loader, val_loader = build_loader(config)`, with
    `pin_memory=config.DATA.PIN_MEMORY` read from the project's config
    defaults), and from tensors that were `.pin_memory()`'d. Batch parts
    copied with `map(lambda t: t.cuda(), (x, y))` are copies too.

    When the loader is not visible in the module (it is a parameter, or built
    elsewhere), the rule stays silent unless the `assume-pinned` option is
    set. When the loader is visibly unpinned (`pin_memory=False` or left out),
    the copy is not flagged: `non_blocking` does nothing for pageable memory,
    and TL202 points at the loader instead.

    Not flagged: dtype-only casts (`.to(torch.float16)`), copies to the CPU,
    module moves (`model.to(device)`), values that are not batch data, batches
    of a loader that a framework already placed on the device
    (`accelerator.prepare(loader)`), and copies that already pass
    `non_blocking` (either way) or `**kwargs`.

    ## Why is this bad?
    A copy from pinned (page-locked) host memory can run asynchronously: with
    `non_blocking=True` the host queues it and moves on to queue the forward
    pass, and the copy overlaps with other work. Without it the host blocks
    until the copy has finished, on every batch, and the pinning the
    DataLoader paid for buys little.

    ## Known problems
    Data is followed through subscripts, attributes, unpacking and
    `.items()`/comprehensions of the batch, not through arbitrary calls: a
    batch passed through `.float()` may be a new, unpinned tensor, so such
    copies are left alone. A loader is matched to the loop by the name it is
    assigned to in the loop's scope, through the calls that pass it, or
    through the return value of a function of another project file.

    ## Example
    ```python
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=64, pin_memory=True, num_workers=4)
    for images, labels in loader:
        images = images.to(device)
        labels = labels.to(device)
        loss = criterion(model(images), labels)
    ```

    Use instead:
    ```python
    from torch.utils.data import DataLoader

    loader = DataLoader(dataset, batch_size=64, pin_memory=True, num_workers=4)
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        loss = criterion(model(images), labels)
    ```

    ## Fix safety
    The fix adds `non_blocking=True`. It is safe when the source is visibly
    pinned and its batches are torch tensors (a loader without a
    `collate_fn`, or a `.pin_memory()` tensor): the copy is ordered on the
    current CUDA stream before every kernel that uses its result, so results
    do not change. It is unsafe when pinning is only assumed
    (`assume-pinned`): the copy is then still synchronous for pageable
    memory, and code that hands the batch to another stream needs care.

    No fix is offered where adding the keyword can change what the program
    does: when the batch may be an object of the project's own class (a
    loader with a `collate_fn`, or one not visible), whose `to()` may not
    take `non_blocking` (`def to(self, device)`: TypeError), when the file
    defines such a `to`/`cuda` method, and when the function writes into the
    host tensor in place (`x.mul_(0)`, `x[...] = v`, `x += 1`): a
    non-blocking copy may still be reading it, and would send the new values.

    The rule never adds `non_blocking=True` to a copy **to the CPU**: a
    non-blocking device-to-host copy returns before the data has arrived, and
    reading it without `torch.cuda.synchronize()` (or an event) reads garbage.

    ## Options
    - `assume-pinned` (bool, default `false`): also flag copies of batches
      whose source is not visible in the module (a loader passed in as a
      parameter), assuming it is pinned. The fix is then unsafe.

    ## References
    - [A guide on good usage of `non_blocking` and `pin_memory()` in PyTorch](https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html)
    - [CUDA semantics: use pinned memory buffers](https://pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers)
    - [torch.utils.data: memory pinning](https://pytorch.org/docs/stable/data.html#memory-pinning)
    """

    code = "TL201"
    name = "blocking-host-to-device-copy"
    summary = "A copy of pinned batch data to the GPU blocks the host (no `non_blocking=True`)"
    fix_availability = "always"
    options = {
        "assume-pinned": Option(
            bool,
            False,
            "Also flag copies of batches whose source is not visible in the module, assuming pinned memory.",
        )
    }

    VALID = [
        # Visibly unpinned loader: TL202's business, not this rule's.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32)
            for x, y in loader:
                x = x.to(device)
        """),
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, pin_memory=False)
            for x, y in loader:
                x = x.cuda()
        """),
        # Already non-blocking (or explicitly blocking: the author chose).
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                y = y.cuda(non_blocking=False)
        """),
        # dtype-only cast.
        Valid("""
            import torch
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.to(torch.float16)
                y = y.to(dtype=torch.long)
        """),
        # Module moves and non-batch tensors.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                model.to(device)
                weights = class_weights.to(device)
        """),
        # Device-to-host copies are never made non-blocking.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                out = model(x.to(device, non_blocking=True))
                host = out.to("cpu")
                y_host = y.to("cpu")
        """),
        # Source not visible: silent by default.
        Valid("""
            def train(model, loader, device):
                for x, y in loader:
                    x, y = x.to(device), y.to(device)
                    model(x).sum().backward()
        """),
        # A framework already placed the batches on the device.
        Valid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
            for batch in loader:
                batch = batch.to(accelerator.device)
        """,
            options={"assume-pinned": True},
        ),
        # A copy with **kwargs may already pass non_blocking.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.to(device, **copy_kwargs)
        """),
        # `.float()` makes a new, pageable tensor: pinning does not carry over.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.float().to(device)
        """),
        # Positional non_blocking.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.cuda(0, True)
                y = y.to(device, None, True)
        """),
        # The name was rebound to a device tensor before the second move.
        Valid("""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
                x = x.to(device)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(dataset, batch_size=64, pin_memory=True)
            for x, y in loader:
                x = x.to(device)
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            loader = DataLoader(dataset, batch_size=64, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
            """,
        ),
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for x, y in loader:
                x = x.to(device)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, batch_size=32, pin_memory=True)
            for x, y in loader:
                x = x.to(device, non_blocking=True)
            """,
            line=4,
            message="pinned",
        ),
        Invalid(
            """
            import torch
            train_loader = torch.utils.data.DataLoader(ds, pin_memory=True)
            for step, (images, target) in enumerate(train_loader):
                images = images.cuda()
                target = target.to("cuda")
            """,
            fixed="""
            import torch
            train_loader = torch.utils.data.DataLoader(ds, pin_memory=True)
            for step, (images, target) in enumerate(train_loader):
                images = images.cuda(non_blocking=True)
                target = target.to("cuda", non_blocking=True)
            """,
            count=2,
        ),
        # Through a kwargs dict; `.to(device, dtype)`.
        Invalid(
            """
            import torch
            from torch.utils.data import DataLoader as DL
            kwargs = {"num_workers": 4, "pin_memory": True}
            loader = DL(ds, **kwargs)
            for batch in loader:
                x = batch["image"].to(device, torch.float16)
            """,
            fixed="""
            import torch
            from torch.utils.data import DataLoader as DL
            kwargs = {"num_workers": 4, "pin_memory": True}
            loader = DL(ds, **kwargs)
            for batch in loader:
                x = batch["image"].to(device, torch.float16, non_blocking=True)
            """,
        ),
        # A `collate_fn` may make batches of the project's own class, whose
        # `to()` may not take `non_blocking`: no fix.
        Invalid(
            """
            from torch.utils.data import DataLoader
            loader = DataLoader(ds, pin_memory=True, collate_fn=collate)
            for samples, targets in loader:
                samples = samples.to(device)
            """,
        ),
        # A tensor that was `.pin_memory()`'d.
        Invalid(
            """
            for chunk in chunks:
                staged = chunk.pin_memory()
                out = model(staged.to(device))
            """,
            fixed="""
            for chunk in chunks:
                staged = chunk.pin_memory()
                out = model(staged.to(device, non_blocking=True))
            """,
            message="`.pin_memory()`",
        ),
        # The loader is a parameter: flagged only with assume-pinned, unsafe fix.
        Invalid(
            """
            def train(model, loader, device):
                for x, y in loader:
                    x = x.to(device=device)
                    model(x).sum().backward()
            """,
            options={"assume-pinned": True},
            fixed=None,
            message="only helps",
        ),
        Invalid(
            """
            def train(model, loader, device):
                for x, y in loader:
                    x = x.to(device=device)
                    model(x).sum().backward()
            """,
            options={"assume-pinned": True},
            unsafe_fixes=True,
            fixed="""
            def train(model, loader, device):
                for x, y in loader:
                    x = x.to(device=device, non_blocking=True)
                    model(x).sum().backward()
            """,
        ),
        # Dict batches moved key by key; `pin_memory=torch.cuda.is_available()`.
        Invalid(
            """
            import torch
            loader = torch.utils.data.DataLoader(ds, pin_memory=torch.cuda.is_available())
            for batch in loader:
                batch = {k: v.to(device) for k, v in batch.items()}
            """,
            fixed="""
            import torch
            loader = torch.utils.data.DataLoader(ds, pin_memory=torch.cuda.is_available())
            for batch in loader:
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            """,
        ),
        # Batches pulled with next() in a step loop.
        Invalid(
            """
            from torch.utils.data import DataLoader
            train_loader = DataLoader(ds, pin_memory=True)
            data_iter = iter(train_loader)
            for step in range(num_steps):
                inputs, labels = next(data_iter)
                inputs = inputs.to(args.device)
            """,
            fixed="""
            from torch.utils.data import DataLoader
            train_loader = DataLoader(ds, pin_memory=True)
            data_iter = iter(train_loader)
            for step in range(num_steps):
                inputs, labels = next(data_iter)
                inputs = inputs.to(args.device, non_blocking=True)
            """,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.Call, Origin]] = []
        # (function node, dotted name) written in place: ``x.mul_(0)``, ``x[i] = v``, ``x += 1``
        self.written_in_place: set = set()
        # the file defines a ``to``/``cuda`` method that does not take ``non_blocking``
        self.own_to_without_non_blocking = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if node.name.value in ("to", "cuda") and self.ctx.class_names:
            params = node.params
            names = {p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)}
            if "non_blocking" not in names and not isinstance(params.star_kwarg, cst.Param):
                self.own_to_without_non_blocking = True

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._written(node.target)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if isinstance(target.target, cst.Subscript):
                self._written(target.target.value)

    def _written(self, expr: cst.BaseExpression) -> None:
        name = dotted_name(expr)
        if name is not None:
            scope = self.ctx.function.node if self.ctx.function is not None else None
            self.written_in_place.add((id(scope), name))

    # -- the copies ---------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value.endswith("_") and not func.attr.value.startswith("_"):
            self._written(func.value)  # an in-place tensor method
        if not isinstance(func, cst.Attribute) or func.attr.value not in ("to", "cuda"):
            return
        if not self._copies_to_device(node):
            return
        origin = self.ctx.batches.origin_of(func.value)
        if origin is None or origin.cast:
            return  # a cast made a new tensor in pageable memory
        if origin.kind == "loop" and not self.ctx.inside(origin.loop_node):
            return  # after the loop: the last batch, once
        if origin.kind == "next" and self.ctx.loop is None:
            return  # one batch pulled before the loop
        self.candidates.append((self.ctx.site(), node, origin))

    def _copies_to_device(self, call: cst.Call) -> bool:
        if any(arg.star for arg in call.args):
            return False
        if keyword(call, "non_blocking") is not None:
            return False
        positional = [arg.value for arg in call.args if arg.keyword is None]
        if call.func.attr.value == "cuda":  # type: ignore[attr-defined]
            return len(positional) <= 1
        device = keyword(call, "device")
        if device is not None:
            return len(positional) == 0 and self._is_gpu_device(device.value)
        if not positional or len(positional) > 2:
            return False
        if len(positional) == 2 and _is_bool_literal(positional[1]):
            return False  # .to(device, True): positional non_blocking
        return self._is_gpu_device(positional[0])

    def _is_gpu_device(self, expr: cst.BaseExpression, depth: int = 0) -> bool:
        if isinstance(expr, cst.SimpleString):
            text = expr.evaluated_value
            return isinstance(text, str) and text.startswith(("cuda", "xpu"))
        if isinstance(expr, cst.Integer):
            return True  # a CUDA ordinal
        if isinstance(expr, cst.IfExp):
            # torch.device("cuda" if torch.cuda.is_available() else "cpu"): the GPU when there is one.
            return self._is_gpu_device(expr.body, depth + 1) or self._is_gpu_device(expr.orelse, depth + 1)
        if isinstance(expr, cst.Call):
            qname = self.ctx.qualified_name(expr.func)
            if qname == "torch.device" and expr.args:
                return self._is_gpu_device(expr.args[0].value, depth + 1)
            return False
        if isinstance(expr, (cst.Name, cst.Attribute)):
            qname = self.ctx.qualified_name(expr)
            if qname is not None and qname.startswith("torch."):
                return False  # torch.float16 and friends: a dtype
            value = self.ctx.value_of(dotted_name(expr))
            if value is not None and depth < 3 and value is not UNKNOWN_PART:
                if isinstance(value, (cst.SimpleString, cst.Call)):
                    return self._is_gpu_device(value, depth + 1)
            name = last_name(expr) or ""
            return bool(_DEVICE_NAME.search(name))
        return False

    # -- deciding -------------------------------------------------------------------
    def finish(self) -> None:
        for site, call, origin in self.candidates:
            pinned, where = self._pinned(origin)
            if pinned is False:
                continue
            arguments = ", ".join(self.ctx.code_for(arg).rstrip(", ") for arg in call.args)
            if len(arguments) > 40:
                arguments = "..."
            what = f"`.{call.func.attr.value}({arguments})`"  # type: ignore[attr-defined]
            if pinned:
                message = (
                    f"{what} copies pinned batch data ({where}) to the GPU without `non_blocking=True`, "
                    "so the host blocks on every copy"
                )
                applicability = SAFE
            elif self.opts.get("assume-pinned"):
                message = (
                    f"{what} copies batch data to the GPU without `non_blocking=True`; the batch source is not "
                    "visible here, and `non_blocking` only helps if it is in pinned memory "
                    "(`DataLoader(pin_memory=True)`)"
                )
                applicability = UNSAFE
            else:
                continue
            if not self._keyword_cannot_change_behaviour(site, call, origin, assumed=applicability == UNSAFE):
                applicability = DISPLAY_ONLY
            fix = self.ctx.fix(applicability, "Add `non_blocking=True`", _add_non_blocking(self.ctx, call))
            self.report(call, message, fix, evidence=self._evidence(origin, where, call))

    def _evidence(self, origin: Origin, where: str, copy: cst.Call) -> List[Evidence]:
        """Where the batch comes from (the loader and its pinning) and the loop that copies it per batch."""
        facts = []
        loader = self.ctx.facts.loader_for(origin.source, origin.function) if origin.source is not None else None
        source = dotted_name(origin.source) if origin.source is not None else None
        # a loader built in another file is placed by its message (``where``); here, by its call
        place = loader.call if loader is not None and loader.call is not None and not loader.where else origin.loop_node
        if where and place is not None:
            text = f"the batch comes from `{source}`: {where}" if source else f"the batch is {where}"
            facts.append(Evidence(text, node=place))
        if origin.kind == "loop" and origin.loop_node is not None:
            facts.append(Evidence("the copy runs once per batch of this loop", node=origin.loop_node))
        if not facts:
            facts.append(
                Evidence(f"the copied tensor is pinned batch data: {where or 'a `.pin_memory()` result'}", node=copy)
            )
        return facts

    def _keyword_cannot_change_behaviour(self, site: Site, call: cst.Call, origin: Origin, assumed: bool) -> bool:
        """What `non_blocking=True` needs to be a pure speed-up: a torch tensor
        whose host memory nothing writes while the copy may still read it."""
        if self.own_to_without_non_blocking:
            return False
        receiver = call.func.value  # type: ignore[attr-defined]
        name = dotted_name(receiver)
        scope = id(site.function.node) if site.function is not None else id(None)
        if name is not None and any(where == scope and written == name for where, written in self.written_in_place):
            return False
        if origin.kind == "pinned":
            return True
        loader = self.ctx.facts.loader_for(origin.source, origin.function) if origin.source is not None else None
        if loader is None:
            return assumed  # `assume-pinned`: the user vouches for the batches; the fix is unsafe anyway
        if loader.call is None:
            return loader.default_collate
        return uses_default_collate(loader.call) or self._kwargs_without_collate(loader)

    def _kwargs_without_collate(self, loader: LoaderInfo) -> bool:
        """``DataLoader(ds, **kwargs)`` whose dicts are built in view and never get a ``collate_fn``."""
        call = loader.call
        assert call is not None  # the caller handles a loader from another file
        if any(arg.keyword is not None and arg.keyword.value == "collate_fn" for arg in call.args):
            return False
        if len([arg for arg in call.args if arg.keyword is None and not arg.star]) > 6 or any(
            arg.star == "*" for arg in call.args
        ):
            return False
        scope = id(loader.function.node) if loader.function is not None else 0
        for starred in (arg for arg in call.args if arg.star == "**"):
            name = dotted_name(starred.value)
            entries = self.ctx.facts.dicts.get((scope, name)) or self.ctx.facts.dicts.get((0, name)) if name else None
            if entries is None or "collate_fn" in entries:
                return False
        return True

    def _pinned(self, origin: Origin) -> Tuple[Optional[bool], str]:
        if origin.kind == "pinned":
            return True, "a `.pin_memory()` tensor"
        if origin.source is None:
            return None, ""
        loader = self.ctx.facts.loader_for(origin.source, origin.function)
        if loader is None:
            return None, ""
        if loader.pinned is None and self._pinned_when_on_cuda(loader):
            return True, "a DataLoader with `pin_memory` on whenever CUDA is"
        if loader.pinned:
            built = f" built in {loader.where}" if loader.where else ""
            return True, f"a DataLoader with `pin_memory=True`{built}"
        return loader.pinned, ""

    def _pinned_when_on_cuda(self, loader: LoaderInfo) -> bool:
        """``pin_memory=torch.cuda.is_available()`` / ``pin_memory=use_cuda``: pinned
        whenever a copy to CUDA can happen at all."""
        arg = keyword(loader.call, "pin_memory") if loader.call is not None else None
        if arg is None:
            return False
        if mentions_cuda_availability(self.ctx, arg.value):
            return True
        name = last_name(arg.value) if isinstance(arg.value, (cst.Name, cst.Attribute)) else None
        return bool(name and re.search(r"(?i)cuda|gpu", name))


def _add_non_blocking(ctx, call: cst.Call):
    if call.args:
        last = call.args[-1]
        return ctx.replace(last.value, f"{ctx.code_for(last.value)}, non_blocking=True")
    return ctx.replace(
        call,
        call.with_changes(
            args=[
                cst.Arg(
                    keyword=cst.Name("non_blocking"),
                    value=cst.Name("True"),
                    equal=cst.AssignEqual(
                        whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")
                    ),
                )
            ]
        ),
    )


def _is_bool_literal(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value in ("True", "False")
