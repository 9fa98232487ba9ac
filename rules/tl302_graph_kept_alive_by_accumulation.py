from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import LoopInfo, Site, child_nodes, last_name, requires_grad_evidence
from torchlint.rule import SAFE, UNSAFE, Evidence, Invalid, Rule, Valid

# Calls that backpropagate through (or keep differentiating) their receiver/arguments.
_BACKPROP_METHODS = frozenset({"backward", "manual_backward", "grad", "scale", "vjp", "jvp"})
# Calls that only read or store the accumulated value: passing it there keeps the fix safe.
_READ_ONLY_CALLEES = frozenset(
    {
        "print",
        "float",
        "int",
        "str",
        "repr",
        "format",
        "round",
        "len",
        "item",
        "append",
        "extend",
        "log",
        "info",
        "debug",
        "warning",
        "add_scalar",
        "add_scalars",
        "write",
        "set_postfix",
        "set_description",
        "mean",
        "sum",
        "stack",
        "cat",
        "tensor",
        "isfinite",
        "isnan",
        "update",
        "log_dict",
        "log_metrics",
    }
)


class GraphKeptAliveByAccumulation(Rule):
    """## What it does
    Flags `total += loss` and `losses.append(loss)` in a training loop, when
    the accumulated value evidently carries autograd history (a loss or a
    model output, arithmetic on one, or a name the code calls `backward()`
    on) and is not `.detach()`ed or read with `.item()`. The accumulator must be created before the loop (a number, a
    tensor, an empty list) and must not be reset inside it.

    It stays silent when the accumulated value is later backpropagated
    (`total_loss.backward()`, `torch.stack(losses).sum().backward()`,
    `scaler.scale(total)`, `accelerator.backward(total)`): that is gradient
    accumulation by sum and needs the graphs. It also stays silent when the
    accumulator is returned or yielded, since the caller may backpropagate it,
    under `torch.no_grad()` / `torch.inference_mode()`, and in loops that do
    not train.

    ## Why is this bad?
    A tensor that requires grad holds a reference to the autograd graph that
    produced it, and that graph holds the activations saved for backward.
    `total += loss` builds a new tensor whose graph includes the previous
    `total`, so every iteration's graph, with all of its saved activations,
    stays alive until the loop ends. Memory grows with every step until an
    out-of-memory error, and the PyTorch FAQ lists this as the first cause of
    "my model reports cuda runtime error(2): out of memory".

    ## Example
    ```python
    total_loss = 0.0
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        total_loss += loss
    print(total_loss / len(loader))
    ```

    Use instead:
    ```python
    total_loss = 0.0
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        total_loss += loss.detach()
    print(total_loss / len(loader))
    ```

    ## Fix safety
    The fix appends `.detach()` to the accumulated value. Since the rule
    only fires when the accumulator is never backpropagated, returned or
    yielded, detaching changes nothing but memory: the fix is safe. When the
    accumulator is also passed to a function the rule does not know (which
    might differentiate it), or stored in an attribute or a container
    (`self.epoch_loss = total`, which another method may backpropagate), the
    fix is unsafe. `.item()` would also work, but
    it synchronizes with the device on every step (see TL101).

    ## References
    - [PyTorch FAQ: don't accumulate history across your training loop](https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory)
    - [`torch.Tensor.detach`](https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html)
    - [Autograd mechanics: saved tensors](https://pytorch.org/docs/stable/notes/autograd.html#saved-tensors)
    """

    code = "TL302"
    name = "graph-kept-alive-by-accumulation"
    summary = "A loss that requires grad is accumulated across iterations, keeping every graph alive"
    fix_availability = "always"
    requires_any = ("+=", "append")

    VALID = [
        Valid("""
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss.item()
        """),
        Valid("""
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss.detach()
        """),
        Valid("""
            def train_step(model, chunks, optimizer):
                total = 0
                for x, y in chunks:
                    total += criterion(model(x), y)
                optimizer.zero_grad()
                total.backward()
                optimizer.step()
        """),
        Valid("""
            losses = []
            for x, y in loader:
                losses.append(criterion(model(x), y))
                if len(losses) == 4:
                    torch.stack(losses).mean().backward()
                    optimizer.step()
                    losses = []
        """),
        Valid("""
            import torch
            total = 0.0
            with torch.no_grad():
                for x, y in val_loader:
                    total += criterion(model(x), y)
        """),
        Valid("""
            def compute_loss(model, loader):
                loss = 0
                for x, y in loader:
                    out = model(x)
                    loss += criterion(out, y)
                    out.sum().backward()
                return loss
        """),
        Valid("""
            correct = 0
            for x, y in loader:
                logits = model(x)
                logits.sum().backward()
                correct += (logits.argmax(-1) == y).sum()
        """),
        Valid("""
            for x, y in loader:
                loss = 0
                for head in heads:
                    loss += criterion(head(x), y)
                loss.backward()
                optimizer.step()
        """),
        Valid("""
            seen = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                seen += x.size(0)
        """),
        Valid("""
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total_loss += float(loss)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch.nn.functional as F
            total = 0.0
            for images, labels in loader:
                logits, aux = net(images)
                ce = F.cross_entropy(logits, labels)
                scaler.scale(ce).backward()
                scaler.step(optimizer)
                total += ce
            """,
            fixed="""
            import torch.nn.functional as F
            total = 0.0
            for images, labels in loader:
                logits, aux = net(images)
                ce = F.cross_entropy(logits, labels)
                scaler.scale(ce).backward()
                scaler.step(optimizer)
                total += ce.detach()
            """,
        ),
        Invalid(
            """
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss
            """,
            fixed="""
            total_loss = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                total_loss += loss.detach()
            """,
            line=6,
            message="`total_loss += loss`",
        ),
        Invalid(
            """
            losses = []
            for x, y in train_loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss)
            print(sum(losses) / len(losses))
            """,
            fixed="""
            losses = []
            for x, y in train_loader:
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
            print(sum(losses) / len(losses))
            """,
        ),
        Invalid(
            """
            import torch
            running = torch.zeros(())
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
                running += loss * x.size(0)
            """,
            fixed="""
            import torch
            running = torch.zeros(())
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
                running += (loss * x.size(0)).detach()
            """,
        ),
        Invalid(
            """
            outputs = []
            for batch in loader:
                out = model(batch)
                out.mean().backward()
                optimizer.step()
                outputs.append(out)
            """,
            fixed="""
            outputs = []
            for batch in loader:
                out = model(batch)
                out.mean().backward()
                optimizer.step()
                outputs.append(out.detach())
            """,
            message="`outputs.append(out)`",
        ),
        Invalid(
            """
            epoch_loss = 0
            for step, batch in enumerate(loader):
                outputs = model(**batch)
                loss = outputs.loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                epoch_loss += loss
            """,
            fixed="""
            epoch_loss = 0
            for step, batch in enumerate(loader):
                outputs = model(**batch)
                loss = outputs.loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                epoch_loss += loss.detach()
            """,
        ),
        Invalid(
            """
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss
            report(total)
            """,
            fixed=None,
        ),
        Invalid(
            """
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss
            report(total)
            """,
            fixed="""
            total = 0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                total += loss.detach()
            report(total)
            """,
            unsafe_fixes=True,
        ),
        Invalid(
            """
            def train_epoch(model, loader, optimizer):
                tr_loss = 0.0
                history = []
                for batch in loader:
                    loss = model(batch).mean()
                    loss.backward()
                    optimizer.step()
                    tr_loss += loss
                    history.append(loss)
                return float(tr_loss)
            """,
            fixed="""
            def train_epoch(model, loader, optimizer):
                tr_loss = 0.0
                history = []
                for batch in loader:
                    loss = model(batch).mean()
                    loss.backward()
                    optimizer.step()
                    tr_loss += loss.detach()
                    history.append(loss.detach())
                return float(tr_loss)
            """,
            count=2,
            line=8,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.CSTNode, str, cst.BaseExpression, str, bool]] = []
        # (scope, name) of names written in a backward call itself: `loss` in
        # `loss.backward()` / `scaler.scale(loss).backward()` evidently requires grad
        self.backward_direct: Set[Tuple[object, str]] = set()
        # (scope, name) facts
        self.backpropagated: Set[Tuple[object, str]] = set()
        self.escapes: Set[Tuple[object, str]] = set()
        self.passed_elsewhere: Set[Tuple[object, str]] = set()
        self.assigned_in_loops: Dict[Tuple[object, str], Set[int]] = {}

    def _scope(self) -> object:
        return self.ctx.function.node if self.ctx.function is not None else None

    # -- accumulations -------------------------------------------------------
    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if self.ctx.loop is None or not isinstance(node.operator, cst.AddAssign):
            return
        if not isinstance(node.target, cst.Name):
            return
        name = node.target.value
        if self.ctx.value_of(name) is node.value:
            return  # never assigned before in this scope: a parameter or a global
        if requires_grad_evidence(self.ctx, node.value) is not False:
            self.candidates.append(
                (
                    self.ctx.site(),
                    node,
                    name,
                    node.value,
                    f"`{name} += {self.ctx.code_for(node.value)}`",
                    requires_grad_evidence(self.ctx, node.value) is True,
                )
            )

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        method = last_name(func)
        scope = self._scope()
        if isinstance(func, cst.Attribute) and (method in _BACKPROP_METHODS or method == "backward"):
            for part in [func.value] + [a.value for a in node.args]:
                self._mark_names(part, self.backpropagated, scope)
            if method in ("backward", "manual_backward"):
                for part in [func.value] + [a.value for a in node.args]:
                    for sub in _names_outside_host_reads(part):
                        self.backward_direct.add((scope, sub.value))
        elif self.ctx.qualified_name(func) in ("torch.autograd.backward", "torch.autograd.grad"):
            for arg in node.args:
                self._mark_names(arg.value, self.backpropagated, scope)
        if method not in _READ_ONLY_CALLEES:
            for arg in node.args:
                if isinstance(arg.value, cst.Name):
                    self.passed_elsewhere.add((scope, arg.value.value))
        if (
            self.ctx.loop is not None
            and method == "append"
            and isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and len(node.args) == 1
            and node.args[0].keyword is None
            and not node.args[0].star
        ):
            target = func.value.value
            initial = self.ctx.value_of(target)
            is_list = isinstance(initial, cst.List) or (
                isinstance(initial, cst.Call) and last_name(initial.func) == "list" and not initial.args
            )
            value = node.args[0].value
            if is_list and requires_grad_evidence(self.ctx, value) is not False:
                self.candidates.append(
                    (
                        self.ctx.site(),
                        node,
                        target,
                        value,
                        f"`{target}.append({self.ctx.code_for(value)})`",
                        requires_grad_evidence(self.ctx, value) is True,
                    )
                )

    def _mark_names(self, expr: cst.CSTNode, into: Set[Tuple[object, str]], scope: object, depth: int = 0) -> None:
        for sub in _names_outside_host_reads(expr):
            if isinstance(sub, cst.Name):
                key = (scope, sub.value)
                if key in into:
                    continue
                into.add(key)
                bound = self.ctx.value_of(sub.value)
                if bound is not None and depth < 3:
                    self._mark_names(bound, into, scope, depth + 1)

    def visit_Return(self, node: cst.Return) -> None:
        if node.value is not None:
            self._mark_names(node.value, self.escapes, self._scope())

    def visit_Yield(self, node: cst.Yield) -> None:
        if isinstance(node.value, cst.BaseExpression):
            self._mark_names(node.value, self.escapes, self._scope())

    def visit_Assign(self, node: cst.Assign) -> None:
        if any(not isinstance(target.target, cst.Name) for target in node.targets):
            # ``self.epoch_loss = total``, ``history["loss"] = total``: stored where
            # another method may backpropagate it, out of this rule's sight
            for sub in _names_outside_host_reads(node.value):
                if isinstance(sub, cst.Name):
                    self.passed_elsewhere.add((self._scope(), sub.value))
        if self.ctx.loop is None:
            return
        loops = set()
        loop: Optional[LoopInfo] = self.ctx.loop
        while loop is not None:
            loops.add(id(loop.node))
            loop = loop.parent
        for target in node.targets:
            if isinstance(target.target, cst.Name):
                self.assigned_in_loops.setdefault((self._scope(), target.target.value), set()).update(loops)

    # -- deciding ------------------------------------------------------------
    def finish(self) -> None:
        for site, node, name, value, text, evident in self.candidates:
            scope = site.function.node if site.function is not None else None
            key = (scope, name)
            if not evident and not (isinstance(value, cst.Name) and (scope, value.value) in self.backward_direct):
                continue
            if key in self.backpropagated or key in self.escapes:
                continue
            if site.in_no_grad() or site.in_exception_path():
                continue
            loop = site.batch_loop()
            if loop is None or not any(enclosing.trains for enclosing in site.loops()):
                continue
            if id(loop.node) in self.assigned_in_loops.get(key, ()):
                continue  # reset on every iteration: one graph at a time
            what = "`.append()`" if isinstance(node, cst.Call) else "`+=`"
            self.report(
                node,
                f"{text} keeps the autograd graph of every iteration of {loop.line_hint} alive: "
                f"the accumulated value requires grad and {name} is never backpropagated; accumulate `.detach()`",
                self._fix(value, key in self.passed_elsewhere, what),
                evidence=[
                    Evidence(f"`{self.ctx.code_line(value)}` requires grad: the loop trains", node=value),
                    Evidence(f"accumulated on every iteration of {loop.line_hint}", node=loop.node),
                ],
            )

    def _fix(self, value: cst.BaseExpression, passed_elsewhere: bool, what: str):
        text = self.ctx.code_for(value)
        if isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not value.lpar:
            replacement = f"{text}.detach()"
        elif value.lpar:
            replacement = f"{text}.detach()"
        else:
            replacement = f"({text}).detach()"
        return self.ctx.fix(
            UNSAFE if passed_elsewhere else SAFE,
            "Accumulate `.detach()` of the value",
            self.ctx.replace(value, replacement),
        )


_HOST_READ_CALLS = frozenset({"float", "int", "round", "str", "len"})
_HOST_READ_METHODS = frozenset({"item", "tolist", "numpy", "detach"})


def _names_outside_host_reads(expr: cst.CSTNode):
    """Names in ``expr``, except under ``float(...)``/``x.item()``/``x.detach()``,
    whose results carry no graph."""
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Call):
            func = node.func
            if isinstance(func, cst.Name) and func.value in _HOST_READ_CALLS:
                continue
            if isinstance(func, cst.Attribute) and func.attr.value in _HOST_READ_METHODS:
                continue
        if isinstance(node, cst.Name):
            yield node
        stack.extend(child_nodes(node))
