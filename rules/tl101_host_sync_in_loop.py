from __future__ import annotations

from typing import List, Optional, Sequence, Set, Tuple, Union

import libcst as cst

from torchlint.model import (
    SYNCHRONIZE_CALLS,
    Site,
    already_on_host,
    branch_taken_on_cuda,
    dotted_name,
    iter_subtree,
    last_name,
    launches_device_work,
    lives_on_host,
    module_evidence,
    per_batch_evidence,
    reads_host,
    tensor_evidence,
)
from torchlint.rule import DISPLAY_ONLY, Evidence, Fix, Invalid, Rule, Valid

_CONVERSIONS = ("float", "int", "bool")
_MODULE_METHODS = frozenset(
    {
        "parameters",
        "named_parameters",
        "state_dict",
        "load_state_dict",
        "modules",
        "named_modules",
        "children",
        "eval",
        "train",
        "buffers",
    }
)
_FORMATTERS = ("print", "str", "repr", "format")
# Tensor methods whose size arguments must be Python ints: a tensor there is read back.
# Container methods that keep what they are given.
_COLLECTING_METHODS = frozenset({"append", "extend", "add", "insert", "put", "put_nowait"})
# Tokenizer methods that turn token ids into text on the host.
_DECODERS = frozenset({"decode", "batch_decode", "convert_ids_to_tokens", "decode_batch"})
# (positions, keywords) of each one's int arguments.
_INT_ARGUMENT_METHODS = {"topk": ((0,), ("k",)), "kthvalue": ((0,), ("k",)), "narrow": ((1, 2), ("start", "length"))}


class HostSyncInLoop(Rule):
    """## What it does
    Flags operations that make the host wait for the GPU when they sit in the
    body of a training or evaluation loop, and so run on every batch:
    `.item()`, `.tolist()`, `.cpu()`, `.to("cpu")`, `.numpy()`, `float(t)`,
    `int(t)` and `bool(t)` of a tensor, `print` or string formatting of a
    tensor, `if`/`while`/`assert` on a tensor, and a tensor used where Python
    needs an int (`range(n)`, a slice bound `x[:n]`, `x.topk(k)`,
    `x.narrow(0, start, length)`). A sync inside a helper
    function that the loop calls is reported at the sync line, naming the
    loop: a function of the same module, a method of a class whose instance
    the loop is given a tensor (`meter.update(loss)`), or a function another
    module of the project imports and calls on every step (not a nested
    function, which runs when it is called, nor a decoding function, whose
    reads steer its loop). Writing a device tensor into a host tensor
    (`losses[k] = loss` with `losses = torch.zeros(n)`) is a copy back to the
    host, and a wait, as well.

    Copies whose result is kept in a host container (`preds.append(out.cpu())`,
    `[p.cpu() for p in outs]`, `results[k] = out.cpu().numpy()`), or handed
    to work only the host can do (`tokenizer.batch_decode(ids.cpu().numpy())`,
    directly or through a name) are left alone: the host needs that data
    (metrics, saving, decoding into text, a caching pass), so the copy is the
    work. Such a copy is still the iteration's wait, so a read next to it
    costs nothing more. `total.append(loss.item())` is still reported.

    Only the first wait of an iteration is reported: once a host read (or a
    `torch.cuda.synchronize()`, for timing) has drained the GPU, later reads
    in the same iteration find nothing queued and cost nothing more, unless a
    model or loss call, a backward, an optimizer step or a collective comes
    in between. Once the iteration has waited by design (an explicit
    `torch.cuda.synchronize()`, a step timer, in the loop's body above the
    read), later reads are not reported either. A read followed by the
    iteration's synchronize with no GPU work launched in between adds no
    stall: the host waits there anyway (TL102 speaks of the synchronize
    itself). A read *before* the model's backward or the optimizer step is
    reported even when a synchronize comes later: it stalls the launch of
    that work. A helper that synchronizes on every call is left alone. A NaN or inf
    guard on a tensor (`if torch.isnan(loss): raise …`) counts the same way:
    the host needs that answer every step by design, so the guard is not
    reported and the iteration's other reads are free.

    The rule stays silent under a periodic guard (`if step % N == 0:`), once
    per epoch or after the loop, on exception paths (`except` blocks, `raise`
    arguments, `assert` messages), on values that are evidently not device
    tensors (Python numbers, numpy values, `.cpu()` of a module), and in
    generation or sampling loops (`while`, `for … in range(…)` that do not
    train), whose control flow usually needs the value; there it reports only
    a host read whose result is thrown away.

    Test modules (`test_*.py`, `*_test.py`, `conftest.py`, files under
    `test/`, `tests/` or `testing/`) are skipped: a test that asserts on values inside its loops
    checks a result on purpose, and its speed is not the training run's.
    Set the `check-tests` option to check them too.

    ## Why is this bad?
    CUDA runs asynchronously: the host queues kernels and moves on. Reading a
    value back makes the host wait until every queued kernel has finished, so
    the GPU drains and then idles while the host prepares the next batch. One
    `.item()` per step can cost a large share of a training step's time.

    ## Example
    ```python
    for batch in loader:
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
    ```

    Use instead:
    ```python
    for step, batch in enumerate(loader):
        loss = model(batch).mean()
        loss.backward()
        optimizer.step()
        running_loss += loss.detach()
        if step % 100 == 0:
            print(running_loss.item() / (step + 1))
    ```

    ## Fix safety
    The fix is display-only. For `total += loss.item()` it suggests
    accumulating `loss.detach()` on the device instead, which changes `total`
    from a Python number into a tensor: code that later formats or compares
    `total` may need a `.item()` once, after the loop.

    ## References
    - [PyTorch performance tuning guide: avoid unnecessary CPU-GPU synchronization](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#avoid-unnecessary-cpu-gpu-synchronization)
    - [CUDA semantics: asynchronous execution](https://pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution)
    - [`torch.cuda.set_sync_debug_mode`](https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
    """

    code = "TL101"
    name = "host-sync-in-loop"
    summary = "A host-device synchronization runs on every iteration of a batch loop"
    fix_availability = "sometimes"
    # No text pre-filter: a helper without loops runs per batch when a loop in
    # another file of the project calls it.

    VALID = [
        # A NaN guard: the host needs the answer every step, by design; the
        # iteration waits there anyway, so the read after it adds nothing.
        Valid("""
            import torch
            for x, y in loader:
                loss = model(x.cuda()).sum()
                if not torch.isfinite(loss):
                    raise RuntimeError("loss diverged")
                loss.backward()
                optimizer.step()
                total += loss.item()
        """),
        # A deliberate synchronize every step (a timer): the host waits once per
        # step anyway, so the read before it adds no stall of its own.
        Valid("""
            import time
            import torch
            for x, y in loader:
                start = time.perf_counter()
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                total += loss.item()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - start)
        """),
        Valid("""
            for step, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                if step % 100 == 0:
                    print(loss.item())
        """),
        Valid("""
            for batch in loader:
                loss = model(batch)
                loss.backward()
            print(loss.item())
        """),
        Valid("""
            for epoch in range(10):
                for batch in loader:
                    loss = criterion(model(batch), batch)
                    loss.backward()
                print(f"epoch {epoch}: {loss.item():.3f}")
        """),
        Valid("""
            for batch in loader:
                try:
                    loss = model(batch)
                except RuntimeError:
                    print(loss.item())
                    raise
        """),
        Valid("""
            import numpy as np
            for batch in loader:
                scores = np.asarray(batch)
                total = float(scores.sum())
        """),
        Valid("""
            for batch in loader:
                n = len(batch)
                seen = int(n)
                print(seen)
        """),
        Valid("""
            for batch in loader:
                model.cpu()
        """),
        Valid("""
            import torch
            def generate(model, x, eos):
                for _ in range(64):
                    token = model(x).argmax(-1)
                    if token.item() == eos:
                        break
                    x = torch.cat([x, token], dim=-1)
                return x
        """),
        Valid("""
            for batch in loader:
                loss = model(batch)
                assert loss.dim() == 0, f"bad loss {loss.item()}"
        """),
        Valid("""
            def log(loss):
                print(loss.item())

            for step, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                if step % 50 == 0:
                    log(loss)
        """),
        Valid("""
            for i, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                if i == len(loader) - 1:
                    last = loss.item()
        """),
        Valid("""
            for step, batch in enumerate(loader):
                loss = model(batch)
                loss.backward()
                if step % args.log_interval != 0:
                    continue
                print(loss.item())
        """),
        # Python ints where ints are needed: nothing is read back.
        Valid("""
            for x, y in loader:
                x = x.to(device)
                out = model(x)
                top = out.topk(5)
                head = out[:, : len(y)]
                for i in range(x.size(0)):
                    pass
        """),
        # Results gathered on the host for metrics or saving: the copy is the work.
        Valid("""
            all_preds, by_id = [], {}
            for images, ids in loader:
                images = images.to(device)
                logits = model(images)
                all_preds.append(logits.argmax(1).cpu())
                by_id[ids[0]] = logits.softmax(-1).cpu().numpy()
                probs = [p.cpu() for p in logits.split(1)]
        """),
        # The first read drains the GPU; the later reads of the step are free.
        Valid("""
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                optimizer.step()
                torch.cuda.synchronize()
                meter.update(loss.item())
                print(f"loss {loss.item():.4f}")
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            for k, (x, y) in enumerate(val_loader):
                x = x.to(device)
                losses = torch.zeros(len(val_loader))
                losses[k] = criterion(model(x), y)
            """,
            message="a tensor in host memory",
        ),
        # A device tensor where Python needs an int is read back implicitly.
        Invalid(
            """
            for tokens, lengths in loader:
                tokens = tokens.to(device)
                scores = model(tokens)
                keep = (scores > 0).sum()
                kept = tokens[:, :keep]
            """,
            message="slice bound",
        ),
        Invalid(
            """
            for x, y in loader:
                x = x.to(device)
                scores = model(x)
                k = (scores > 0).sum()
                best = scores.topk(k)
            """,
            message="`.topk()`",
        ),
        Invalid(
            """
            for x, y in loader:
                x = x.to(device)
                out = model(x)
                n = out.argmax()
                for i in range(n):
                    pass
            """,
            message="`range()`",
        ),
        # Only the first of several reads in a step is reported; a model call
        # in between queues new work, so the next read waits again.
        Invalid(
            """
            for batch in loader:
                loss = model(batch)
                loss.backward()
                running += loss.item()
                print(f"loss {loss.item():.4f}")
                writer.add_scalar("loss", loss.item())
                aux = model(batch)
                writer.add_scalar("aux", aux.item())
            """,
            count=2,
        ),
        Invalid(
            """
            for batch in loader:
                loss = model(batch)
                loss.backward()
                total += loss.item()
            """,
            message="`.item()`",
            line=4,
        ),
        Invalid(
            """
            for x, y in train_loader:
                out = model(x)
                acc = (out.argmax(1) == y).sum().item()
            """,
        ),
        Invalid(
            """
            import torch as T
            for batch in loader:
                batch = batch.to(device)
                loss = model(batch)
                print(f"loss={loss:.4f}")
            """,
            message="formatting",
        ),
        Invalid(
            """
            for batch in loader:
                loss = criterion(model(batch), batch)
                if loss < 0.1:
                    break
            """,
            message="`if`",
        ),
        Invalid(
            """
            for batch in loader:
                batch = batch.to(device)
                logits = model(batch)
                preds = logits.argmax(-1).cpu()
            """,
            message="`.cpu()`",
        ),
        Invalid(
            """
            def log_metrics(loss):
                print(loss.item())

            for batch in loader:
                loss = model(batch)
                loss.backward()
                log_metrics(loss)
            """,
            message="called from",
            line=2,
        ),
        Invalid(
            """
            for batch in loader:
                batch = batch.to(device)
                loss = model(batch)
                value = float(loss)
            """,
            message="`float()`",
        ),
        Invalid(
            """
            step = 0
            while True:
                batch = next(data_iter)
                loss = model(batch)
                loss.backward()
                optimizer.step()
                print(loss)
            """,
            message="`print()`",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                loss = model(batch)
                assert (loss < 1e4).all()
            """,
            message="`assert`",
        ),
        Invalid(
            """
            for batch in loader:
                batch = batch.to(device)
                out = model(batch)
                out.tolist()
                out = model(batch)
                out.cpu().numpy()
            """,
            count=2,
        ),
        Invalid(
            """
            import torch
            def generate(model, x):
                for _ in range(64):
                    x = model(x)
                    x.sum().item()
                return x
            """,
            message="result is discarded",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # (site, node, what, fix, result discarded, parameter whose callers must pass a tensor,
        # what the finding claims besides running per batch)
        self.candidates: List[
            Tuple[Site, cst.CSTNode, str, Optional[Fix], bool, Optional[str], Sequence[Evidence]]
        ] = []
        # (id(block), index) of statements that run a `torch.cuda.synchronize()`
        self.synchronized_positions: Set[Tuple[int, int]] = set()

    # -- collecting candidates while walking -----------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.loop is None and self.ctx.function is None:
            return
        if self.ctx.qualified_name(node.func) in SYNCHRONIZE_CALLS:
            self.synchronized_positions.update(_unconditional_positions(self.ctx.site()))
            return
        method = reads_host(node)
        if method is not None:
            receiver = node.func.value  # type: ignore[attr-defined]
            if tensor_evidence(self.ctx, receiver) is False or lives_on_host(self.ctx, receiver):
                return  # not a tensor, or one in host memory: nothing to wait for
            if method == "cpu" and (
                module_evidence(self.ctx, receiver) or self._result_discarded(node) or self._used_as_module(node)
            ):
                return  # a discarded `.cpu()` result is a module moved in place
            if method != "item" and self._collected_on_host(node):
                # the copy is the point (results gathered on the host), and a wait all the same:
                # a later read of the iteration finds the GPU drained
                self.synchronized_positions.update(_unconditional_positions(self.ctx.site()))
                return
            self._candidate(node, f"`.{method}()`", self._accumulate_fix(node), discardable=True)
            return
        if _is_to_cpu(node):
            receiver = node.func.value  # type: ignore[attr-defined]
            if self._result_discarded(node):
                return  # `component.to("cpu")` as a statement moves a module
            if self._collected_on_host(node):
                return
            if (
                not already_on_host(receiver)
                and not module_evidence(self.ctx, receiver)
                and tensor_evidence(self.ctx, receiver) is not False
            ):
                self._candidate(node, '`.to("cpu")`', None, discardable=True)
            return
        if isinstance(node.func, cst.Name) and node.args:
            func = node.func.value
            if func in _CONVERSIONS and len(node.args) == 1:
                evidence = self._is_device_value(node.args[0].value)
                if evidence:
                    self._candidate(node, f"`{func}()` of a tensor", None, param=evidence)
            elif func == "range":
                self._implicit_int(node.args, "`range()` of a tensor")
                return
            elif func in _FORMATTERS:
                evidence = next(
                    (e for e in (self._is_device_value(a.value) for a in node.args if not a.keyword) if e), False
                )
                if evidence:
                    self._candidate(node, f"`{func}()` of a tensor", None, param=evidence)

        if isinstance(node.func, cst.Attribute) and node.func.attr.value in _INT_ARGUMENT_METHODS:
            # ``x.topk(k)``, ``x.narrow(0, start, length)``: Python ints the host must read
            positions, keywords = _INT_ARGUMENT_METHODS[node.func.attr.value]
            if (self.ctx.qualified_name(node.func) or "").startswith("torch."):
                positions = tuple(p + 1 for p in positions)  # ``torch.topk(x, k)``: the tensor comes first
            sizes = [
                a
                for i, a in enumerate(node.args)
                if (a.keyword is None and not a.star and i in positions)
                or (a.keyword is not None and a.keyword.value in keywords)
            ]
            self._implicit_int(sizes, f"a tensor as an int argument of `.{node.func.attr.value}()`")

    def visit_Assign(self, node: cst.Assign) -> None:
        """``losses[k] = loss`` with ``losses = torch.zeros(n)`` on the host: the
        device value is copied into host memory, and the host waits for it."""
        if self.ctx.loop is None and self.ctx.function is None:
            return
        for target in node.targets:
            host = target.target.value if isinstance(target.target, cst.Subscript) else None
            if (
                host is not None
                and tensor_evidence(self.ctx, host) is True
                and lives_on_host(self.ctx, host)
                and tensor_evidence(self.ctx, node.value) is True
                and not lives_on_host(self.ctx, node.value)
            ):
                name = self.ctx.code_line(host, width=30)
                made = self.ctx.value_of(dotted_name(host))
                facts = (
                    [Evidence(f"`{name}` is in host memory: `{self.ctx.code_line(made, width=50)}`", node=made)]
                    if made is not None
                    else []
                )
                what = f"writing a device tensor into `{name}`, a tensor in host memory,"
                self._candidate(node.value, what, None, facts=facts)
                return

    def visit_Slice(self, node: cst.Slice) -> None:
        """``x[:n]`` with a device tensor ``n``: the bound is read as a Python int."""
        if self.ctx.loop is None and self.ctx.function is None:
            return
        for bound in (node.lower, node.upper, node.step):
            if bound is not None:
                evidence = self._is_device_value(bound)
                if evidence:
                    self._candidate(bound, "a tensor as a slice bound (read as a Python int)", None, param=evidence)
                    return

    def _implicit_int(self, args, what: str) -> None:
        for arg in args:
            if arg.star or arg.keyword is not None and arg.keyword.value not in ("k", "start", "length"):
                continue
            evidence = self._is_device_value(arg.value)
            if evidence:
                self._candidate(arg.value, what, None, param=evidence)
                return

    def visit_FormattedStringExpression(self, node: cst.FormattedStringExpression) -> None:
        if self.ctx.loop is not None or self.ctx.function is not None:
            evidence = self._is_device_value(node.expression)
            if evidence:
                self._candidate(node, "formatting a tensor in an f-string", None, param=evidence)

    def visit_If(self, node: cst.If) -> None:
        self._test(node.test, "`if`")

    def visit_While(self, node: cst.While) -> None:
        self._test(node.test, "`while`")

    def visit_Assert(self, node: cst.Assert) -> None:
        self._test(node.test, "`assert`")

    def _test(self, test: cst.BaseExpression, keyword: str) -> None:
        if self.ctx.loop is None and self.ctx.function is None:
            return
        for part in _boolean_parts(test):
            evidence = self._is_device_value(part)
            if evidence and _checks_finite(part):
                # A NaN/inf guard stops or skips the step: the host needs the answer, every
                # step, by design. It is the iteration's wait, like an explicit synchronize.
                self.synchronized_positions.update(_unconditional_positions(self.ctx.site()))
                return
            if evidence:
                self._candidate(part, f"{keyword} on a tensor", None, param=evidence)
                return

    def _host_already_waited(self, site: Site, waited: Set[Tuple[int, int]]) -> bool:
        """Has the host already waited for the GPU earlier in this iteration
        (an earlier host read or a `torch.cuda.synchronize()` in a block that
        holds the node, with no model call, backward or optimizer step since)?"""
        for block, child in site.ancestors():
            if isinstance(block, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False  # the iteration (or the helper's body) starts here
            if not isinstance(block, cst.IndentedBlock):
                continue
            index = block.body.index(child)
            if (id(block), index) in waited:
                return True  # an earlier read in the same statement
            for earlier in range(index - 1, -1, -1):
                if (id(block), earlier) in waited or (id(block), earlier) in self.synchronized_positions:
                    return True
                if launches_device_work(self.ctx, block.body[earlier]):
                    return False
        return False

    def _synchronized_before(self, site: Site, loop) -> bool:
        """Has the iteration already waited by design before the read: a
        `torch.cuda.synchronize()` or a NaN guard in the loop's own body, in a
        statement above the one that holds the read? The host drained the
        GPU once this step; a later read is not worth a second finding."""
        body = getattr(getattr(loop, "node", None), "body", None)
        if body is None:
            return False
        for block, child in site.ancestors():
            if block is body and isinstance(block, cst.IndentedBlock):
                index = block.body.index(child)
                return any(block_id == id(body) and at < index for block_id, at in self.synchronized_positions)
        return False

    def _synchronized_next(self, site: Site) -> bool:
        """Does an explicit `torch.cuda.synchronize()` follow the read in the
        iteration, with no model call, backward or optimizer step launched in
        between? Then the host waits there anyway and the read only moves that
        wait a few statements earlier; one with GPU work in between stalls it."""
        for block, child in site.ancestors():
            if isinstance(block, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return False
            if not isinstance(block, cst.IndentedBlock):
                continue
            index = block.body.index(child)
            for later in range(index + 1, len(block.body)):
                if (id(block), later) in self.synchronized_positions:
                    return True
                if launches_device_work(self.ctx, block.body[later]):
                    return False
        return False

    def _collected_on_host(self, node: cst.CSTNode) -> bool:
        """Is the copied tensor kept in a host container: ``preds.append(out.cpu())``,
        ``[p.cpu() for p in preds]``, ``results[key] = out.cpu().numpy()``? Then the
        host needs the data (results gathered for metrics or saving, a caching
        pass whose purpose is the copy), and the copy is the work, not a stall."""
        stack = self.ctx.ancestry()
        index = len(stack) - 1
        while index > 0 and stack[index] is not node:
            index -= 1
        child = node
        for parent in reversed(stack[:index]):
            if isinstance(parent, cst.Attribute) or (isinstance(parent, cst.Call) and parent.func is child):
                child = parent  # ``.cpu().numpy()``, ``.cpu().float()``: the same value
                continue
            if isinstance(parent, cst.Arg):
                child = parent
                continue
            if isinstance(parent, cst.Call):
                if self._host_consumer(parent):
                    return True  # ``tokenizer.batch_decode(ids.cpu().numpy())``: the host works on it
                return isinstance(parent.func, cst.Attribute) and parent.func.attr.value in _COLLECTING_METHODS
            if isinstance(parent, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
                return child is parent.elt
            if isinstance(parent, cst.DictComp):
                return child is parent.value
            if isinstance(parent, (cst.Element, cst.DictElement, cst.List, cst.Tuple, cst.Dict)):
                child = parent
                continue
            if isinstance(parent, cst.Assign):
                if any(isinstance(t.target, cst.Subscript) for t in parent.targets):
                    return True
                names = {t.target.value for t in parent.targets if isinstance(t.target, cst.Name)}
                return bool(names) and self._consumed_on_host(names, stack[:index])
            return False
        return False

    def _host_consumer(self, call: cst.Call) -> bool:
        """A call whose work can only be done on the host: decoding token ids
        into text (``tokenizer.batch_decode``). (A numpy metric is not one: an
        accuracy computed in numpy for a print could be computed on the device.)"""
        return last_name(call.func) in _DECODERS

    def _consumed_on_host(self, names: Set[str], ancestors: Sequence[cst.CSTNode]) -> bool:
        """Is a name the copy was assigned to handed to a host consumer in the
        loop body (or function) that holds the assignment: ``ids = out.cpu()``
        … ``tokenizer.batch_decode(ids)``?"""
        scope = next(
            (a for a in reversed(ancestors) if isinstance(a, (cst.For, cst.While, cst.FunctionDef))),
            None,
        )
        if scope is None:
            return False
        for sub in iter_subtree(scope):
            if isinstance(sub, cst.Call) and self._host_consumer(sub):
                for arg in sub.args:
                    if any(isinstance(n, cst.Name) and n.value in names for n in iter_subtree(arg.value)):
                        return True
        return False

    def _used_as_module(self, node: cst.CSTNode) -> bool:
        """``m.cpu().parameters()``: the result of `.cpu()` is used as a module."""
        parent = self.ctx.current_parent() if self.ctx.current_node is node else None
        return isinstance(parent, cst.Attribute) and parent.attr.value in _MODULE_METHODS

    def _result_discarded(self, node: cst.CSTNode) -> bool:
        return self.ctx.current_node is node and isinstance(self.ctx.current_parent(), cst.Expr)

    def _is_device_value(self, expr: cst.BaseExpression) -> Union[bool, str]:
        """True for a device tensor; the parameter's name for a parameter the
        function's callers may pass a tensor for (decided after the walk,
        when every call is known); else False."""
        evidence = tensor_evidence(self.ctx, expr)
        if evidence is True:
            return not lives_on_host(self.ctx, expr)
        function = self.ctx.function
        if (
            evidence is None
            and function is not None
            and isinstance(expr, cst.Name)
            and expr.value in function.params
            and self.ctx.value_of(expr.value) is None
        ):
            return expr.value
        return False

    def _candidate(
        self,
        node: cst.CSTNode,
        what: str,
        fix: Optional[Fix],
        discardable: bool = False,
        param: Union[bool, str] = True,
        facts: Sequence[Evidence] = (),
    ) -> None:
        site = self.ctx.site()
        if self.ctx.current_node is not node:
            site = Site(self.ctx, site.stack + (node,), site.function, site.loop)
        discarded = discardable and isinstance(site.parent, cst.Expr)
        parameter = param if isinstance(param, str) else None
        self.candidates.append((site, node, what, fix, discarded, parameter, facts))

    def _accumulate_fix(self, call: cst.Call) -> Optional[Fix]:
        """``total += loss.item()`` -> ``total += loss.detach()`` (display-only)."""
        parent = self.ctx.current_parent()
        if not (isinstance(parent, cst.AugAssign) and parent.value is call):
            return None
        if reads_host(call) != "item":
            return None
        receiver = call.func.value  # type: ignore[attr-defined]
        if (
            isinstance(receiver, cst.Call)
            and isinstance(receiver.func, cst.Attribute)
            and receiver.func.attr.value == "detach"
        ):
            replacement = receiver
        else:
            replacement = cst.Call(func=cst.Attribute(value=receiver, attr=cst.Name("detach")))
        return self.ctx.fix(
            DISPLAY_ONLY,
            "Accumulate on the device with `.detach()` and read the total once after the loop",
            self.ctx.replace(call, replacement),
        )

    # -- deciding, once the module's loops and calls are known -------------------
    def _iteration_synchronizes(self, loop, helper) -> bool:
        """Does every call of the helper run an explicit `torch.cuda.synchronize()`?
        Then the helper waits for the GPU on each call anyway (a timer, a
        deliberate drain), and its read adds no stall of its own. In a loop's
        own body only a synchronize *before* the read makes it free
        (``_host_already_waited``): one after it leaves the read's stall in place,
        between the forward and the backward."""
        owner = helper.node
        body = getattr(owner, "body", None)
        return body is not None and any(block == id(body) for block, _ in self.synchronized_positions)

    def finish(self) -> None:
        # Where the host has already waited this iteration: (id(block), index of
        # the statement in it). A read after one of these, with no model call,
        # backward or optimizer step in between, finds the GPU drained and costs
        # nothing more; only the first read of an iteration is worth changing.
        waited: Set[Tuple[int, int]] = set()
        for site, node, what, fix, discarded, param, facts in self.candidates:
            if site.in_exception_path():
                continue
            if param is not None and not self.ctx.facts.param_receives_tensor(site.function, param):
                continue  # a parameter no caller in the module passes a tensor for
            already_waited = self._host_already_waited(site, waited)
            waited.update(_unconditional_positions(site))
            if already_waited:
                continue
            loop, helper = site.batch_context()
            if loop is None:
                # a generation or other non-batch loop: only a read nobody uses is worth a word
                if discarded and site.loop is not None:
                    self.report(
                        node,
                        f"{what} forces a host-device sync on every iteration, and its result is discarded",
                        evidence=[Evidence("runs on every iteration of this loop", node=site.loop.node)],
                    )
                continue
            if site.under_periodic_guard(within=loop if helper is None else None):
                continue
            if helper is not None and self._iteration_synchronizes(loop, helper):
                continue  # the helper drains the GPU itself on every call
            if helper is None and (self._synchronized_before(site, loop) or self._synchronized_next(site)):
                continue  # the iteration waits anyway: before the read, or next with nothing launched between
            if helper is None:
                message = (
                    f"{what} forces a host-device sync on every iteration of {loop.line_hint}; "
                    "keep the value on the device and read it once, or every N steps"
                )
            elif getattr(loop, "function", None) is helper:  # the step function itself
                message = (
                    f"{what} forces a host-device sync once per batch in {loop.line_hint}; "
                    "read the value every N steps instead"
                )
            else:
                message = (
                    f"{what} in `{helper.name}()` forces a host-device sync once per batch: "
                    f"it is called from {loop.line_hint}; "
                    "read the value every N steps instead"
                )
            self.report(node, message, fix, evidence=[*facts, *_loop_evidence(loop, helper)])


def _loop_evidence(loop, helper) -> List[Evidence]:
    """Why the read runs per batch: the loop, or the helper's call from it."""
    return [per_batch_evidence(loop, helper)]


def _unconditional_positions(site: Site) -> List[Tuple[int, int]]:
    """(id(block), index) of the statements that hold the node and run it
    whenever they run: not in an `if`/`else` body, a loop body, a handler, the
    far side of `and`/`or` or a conditional expression (a `with` body is run)."""
    positions = []
    unconditional = True
    for block, child in site.ancestors():
        if isinstance(block, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            break
        if isinstance(block, cst.IndentedBlock):
            if unconditional:
                positions.append((id(block), block.body.index(child)))
        elif isinstance(block, cst.If) and branch_taken_on_cuda(site.ctx, block, child):
            continue  # ``elif device == "cuda": torch.cuda.synchronize()``: runs on every GPU run
        elif isinstance(
            block, (cst.If, cst.Else, cst.ExceptHandler, cst.ExceptStarHandler, cst.Finally)
        ) and child is not getattr(block, "test", None):
            unconditional = False
        elif isinstance(block, cst.IfExp) and child is not block.test:
            unconditional = False
        elif isinstance(block, cst.BooleanOperation) and child is block.right:
            unconditional = False
        elif isinstance(block, (cst.ListComp, cst.GeneratorExp, cst.DictComp, cst.SetComp)):
            unconditional = False  # may run zero times
    return positions


_FINITENESS = frozenset({"isnan", "isinf", "isfinite", "isneginf", "isposinf", "isreal"})


def _checks_finite(test: cst.BaseExpression) -> bool:
    """``torch.isnan(loss)``, ``not torch.isfinite(loss).all()``, ``loss.isnan().any()``."""
    return any(isinstance(node, cst.Call) and last_name(node.func) in _FINITENESS for node in iter_subtree(test))


def _is_to_cpu(node: cst.Call) -> bool:
    if not (isinstance(node.func, cst.Attribute) and node.func.attr.value == "to" and node.args):
        return False
    first = node.args[0]
    if first.keyword is not None and first.keyword.value != "device":
        return False
    is_cpu = isinstance(first.value, cst.SimpleString) and first.value.evaluated_value == "cpu"
    non_blocking = any(a.keyword is not None and a.keyword.value == "non_blocking" for a in node.args)
    return is_cpu and not non_blocking


def _boolean_parts(test: cst.BaseExpression):
    if isinstance(test, cst.BooleanOperation):
        yield from _boolean_parts(test.left)
        yield from _boolean_parts(test.right)
    elif isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        yield from _boolean_parts(test.expression)
    else:
        yield test
