from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    NO_GRAD_CONTEXTS,
    SET_GRAD_ENABLED,
    FunctionInfo,
    Site,
    dotted_name,
    exclusive_branches,
    is_no_grad_decorated,
    last_name,
    per_batch_anchor,
    steps_optimizer,
)
from torchlint.rule import DISPLAY_ONLY, UNSAFE, Edit, Evidence, Invalid, Rule, Valid

EVAL, TRAIN, FORWARD, GRAD, NO_GRAD_ON, NO_GRAD_OFF = "eval", "train", "forward", "grad", "no_grad_on", "no_grad_off"

_ENABLE_GRAD = frozenset({"torch.enable_grad", "torch.autograd.enable_grad", "torch.autograd.grad_mode.enable_grad"})
_AUTOGRAD_CALLS = frozenset(
    {"torch.autograd.grad", "torch.autograd.backward", "torch.autograd.functional.jacobian", "torch.func.grad"}
)
# Methods a framework already calls under no_grad (Lightning's evaluation
# hooks), or that belong to a training step whose backward runs elsewhere.
_FRAMEWORK_NO_GRAD = re.compile(
    r"^((validation|test|predict)_step|on_(validation|test|predict)_\w+|(validation|test)_epoch_end)$"
)
_TRAINING_CODE = re.compile(r"^(forward|__call__|training_step|train_step|_?forward_\w+)$")
# Calls that move or cast a module and return it: ``model.to(dev).eval()``.
_CHAINABLE = frozenset({"to", "cuda", "cpu", "half", "float", "bfloat16", "double", "requires_grad_", "train"})


@dataclass(eq=False)
class _Event:
    kind: str
    node: cst.CSTNode
    stack: Tuple[cst.CSTNode, ...]
    names: Tuple[str, ...] = ()  # EVAL/TRAIN: receivers; FORWARD: the callee
    site: Optional[Site] = None  # FORWARD: where the call sits (its loops)


@dataclass(eq=False)
class _Scope:
    function: Optional[FunctionInfo]
    events: List[_Event] = field(default_factory=list)
    eval_names: Set[str] = field(default_factory=set)
    needs_grad: bool = False  # backward, autograd.grad or requires_grad anywhere in it


class EvalWithoutNoGrad(Rule):
    """## What it does
    Flags a `model.eval()` call that is followed, in the same function (or
    the module's top level), by a forward pass through that model
    (`model(x)`, `model.forward(x)`) that runs with autograd on: outside
    `torch.no_grad()` / `torch.inference_mode()` (or `set_grad_enabled(False)`)
    blocks, in a function that is not decorated with them (under any import
    alias, or with a decorator of the same module built on them), and not
    called from a caller in the same module that holds no-grad mode. The
    finding points at the `.eval()` call and names the first unguarded
    forward call.

    It fires only where that forward pass runs once per batch: inside a loop
    (or comprehension) over a data source, or in a function a batch loop
    calls, and not under a periodic guard (`if step % N == 0:`). A single
    forward (a demo, a plot, a probe at a checkpoint) keeps its graph for a
    moment and costs nothing worth a finding.

    It stays silent when, after `.eval()` and before the model's next
    `.train()`, the code calls `backward()`, `torch.autograd.grad`, an
    optimizer's `step()`, or sets `requires_grad`: that is `.eval()` used to
    freeze batch-norm statistics or dropout while training, or evaluation
    that needs gradients. It also stays silent when the eval'd model is
    never called in that scope, in forward passes under an explicit
    `torch.enable_grad()`, in Lightning's evaluation hooks
    (`validation_step`, `test_step`, `predict_step`, which Lightning runs
    under no-grad), and in `forward`/`training_step` methods, whose backward
    runs in the caller.

    Test modules (`test_*.py`, `*_test.py`, `conftest.py`, files under
    `test/`, `tests/` or `testing/`) are skipped: a test that compares
    outputs keeps its graph for a moment on purpose or at no cost. Set the
    `check-tests` option to check them too.

    ## Why is this bad?
    `.eval()` only switches layers such as dropout and batch norm to their
    inference behaviour; it does not turn off autograd. Every forward pass
    still records the graph and keeps every intermediate activation alive
    for a backward pass that never comes, so evaluation uses several times
    the memory it needs (often the cause of an out-of-memory error during
    validation) and runs slower. `torch.no_grad()` or, better,
    `torch.inference_mode()` releases them.

    ## Known problems
    Only forward calls through the same name as the `.eval()` receiver are
    followed (`model.eval()` then `model(x)`); a forward through a helper
    function is not. Statement order is source order within the function,
    branches of one `if`/`else` excluded from each other.

    ## Example
    ```python
    import torch

    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
        return correct
    ```

    Use instead:
    ```python
    import torch

    @torch.no_grad()
    def evaluate(model, loader):
        model.eval()
        correct = 0
        for x, y in loader:
            correct += (model(x).argmax(1) == y).sum()
        return correct
    ```

    ## Fix safety
    The fix adds `@torch.no_grad()` to the function (spelled with the
    module's own alias for torch, `@T.no_grad()`, or `@no_grad()` when that
    is imported; when torch is not imported at all the fix also adds
    `import torch` above the module's first import, on one finding per fix
    pass). It is offered when the function never calls `backward()`,
    `torch.autograd.grad`, an optimizer step or `requires_grad_`, and it is
    unsafe all the same: evaluation code may need gradients in ways a linter
    cannot see (saliency maps, adversarial examples, a caller that
    backpropagates through the returned outputs), and a tensor created under
    no_grad cannot later be backpropagated through. Otherwise (the function
    trains, is `async`, or the code is at module level) the suggestion is
    display-only.

    ## References
    - [`torch.no_grad`](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
    - [`torch.inference_mode`](https://pytorch.org/docs/stable/generated/torch.inference_mode.html)
    - [Autograd mechanics: locally disabling gradient computation (evaluation mode is not a no-grad mode)](https://pytorch.org/docs/stable/notes/autograd.html#evaluation-mode-nn-module-eval)
    """

    code = "TL601"
    name = "eval-without-no-grad"
    summary = "`model.eval()` followed by forward passes that still record the autograd graph"
    fix_availability = "sometimes"
    requires_any = ("eval",)

    VALID = [
        # A single forward (a demo, a plot, a probe): nothing runs it per batch.
        Valid("""
            import torch
            def show_sample(model, image):
                model.eval()
                plot(model(image[None]))
        """),
        # Sampling only on some steps: the forward is under a periodic guard.
        Valid("""
            import torch
            def fit(model, loader, val_loader, optimizer):
                for step, (x, y) in enumerate(loader):
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
                    if step % sample_interval == 0:
                        model.eval()
                        save_image(model(fixed_noise))
                        model.train()
        """),
        Valid("""
            import torch
            def evaluate(model, loader):
                model.eval()
                with torch.no_grad():
                    for x in loader:
                        model(x)
        """),
        Valid("""
            import torch as T
            @T.inference_mode()
            def evaluate(model, loader):
                model.eval()
                return [model(x) for x in loader]
        """),
        Valid("""
            from torch import no_grad
            @no_grad()
            def evaluate(model, x):
                model.eval()
                return model(x)
        """),
        # freezing batch norm while training
        Valid("""
            def train(model, loader, optimizer):
                model.eval()
                for x, y in loader:
                    loss = criterion(model(x), y)
                    loss.backward()
                    optimizer.step()
        """),
        # eval with no forward call in the same scope
        Valid("""
            def export(model, path):
                model.eval()
                save(model, path)
        """),
        # a caller in the same module holds no_grad
        Valid("""
            import torch
            def run_eval(model, x):
                model.eval()
                return model(x)

            def main(model, x):
                with torch.no_grad():
                    return run_eval(model, x)
        """),
        # a decorator of the same module built on no_grad
        Valid("""
            import functools
            import torch
            def no_grad_eval(fn):
                @functools.wraps(fn)
                def wrapper(*args, **kwargs):
                    with torch.no_grad():
                        return fn(*args, **kwargs)
                return wrapper

            @no_grad_eval
            def evaluate(model, x):
                model.eval()
                return model(x)
        """),
        # saliency: gradients wanted
        Valid("""
            import torch
            def saliency(model, x):
                model.eval()
                x.requires_grad_(True)
                score = model(x).max()
                return torch.autograd.grad(score, x)[0]
        """),
        # set_grad_enabled(False) as a statement
        Valid("""
            import torch
            def predict(model, x):
                torch.set_grad_enabled(False)
                model.eval()
                return model(x)
        """),
        # Lightning evaluation hooks run under no_grad
        Valid("""
            class Lit:
                def validation_step(self, batch, idx):
                    self.model.eval()
                    return self.model(batch)
        """),
        # not a module: str.eval / ast-like objects are never called afterwards
        Valid("""
            def compute(expr):
                value = expr.eval()
                return value
        """),
        # the eval'd module is handed to a tracer; the name is rebound
        Valid("""
            import torch
            def compile_for_inference(f, inps):
                f = torch.jit.freeze(f.eval())
                for _ in range(3):
                    f(*inps)
                return f
        """),
        # eval and forward in different branches
        Valid("""
            def run(model, x, training):
                if not training:
                    model.eval()
                else:
                    out = model(x)
                    out.backward()
        """),
        # explicit enable_grad around the forward
        Valid("""
            import torch
            def attack(model, x):
                model.eval()
                with torch.enable_grad():
                    out = model(x)
                return out
        """),
        # inference_mode context at module level
        Valid("""
            import torch
            model.eval()
            with torch.inference_mode():
                out = model(batch)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch

            def evaluate(model, loader):
                model.eval()
                total = 0
                for x, y in loader:
                    total += (model(x).argmax(1) == y).sum()
                return total
            """,
            fixed="""
            import torch

            @torch.no_grad()
            def evaluate(model, loader):
                model.eval()
                total = 0
                for x, y in loader:
                    total += (model(x).argmax(1) == y).sum()
                return total
            """,
            unsafe_fixes=True,
            line=4,
            message="`model(x)`",
        ),
        # the unsafe fix is not applied by plain --fix
        Invalid(
            """
            import torch
            def predict(model, x):
                model.eval()
                return model(x)

            for batch in loader:
                preds.append(predict(model, batch))
            """,
            fixed=None,
        ),
        # torch imported under an alias: the decorator uses it
        Invalid(
            """
            import torch as T
            class Evaluator:
                def run(self, loader):
                    self.model.eval()
                    for batch in loader:
                        logits = self.model.forward(batch)
                        yield logits.softmax(-1)
            """,
            fixed="""
            import torch as T
            class Evaluator:
                @T.no_grad()
                def run(self, loader):
                    self.model.eval()
                    for batch in loader:
                        logits = self.model.forward(batch)
                        yield logits.softmax(-1)
            """,
            unsafe_fixes=True,
            message="`self.model.forward(batch)`",
        ),
        # no_grad imported by name
        Invalid(
            """
            from torch import no_grad
            def predict(net, loader):
                net.eval()
                for x, _ in loader:
                    yield net(x)
            """,
            fixed="""
            from torch import no_grad
            @no_grad()
            def predict(net, loader):
                net.eval()
                for x, _ in loader:
                    yield net(x)
            """,
            unsafe_fixes=True,
        ),
        # torch not imported: the fix adds the import too
        Invalid(
            '''
            """Evaluation helpers."""
            import numpy as np

            def predict(model, loader):
                model.eval()
                for x in loader:
                    yield np.asarray(model(x))
            ''',
            fixed='''
            """Evaluation helpers."""
            import torch
            import numpy as np

            @torch.no_grad()
            def predict(model, loader):
                model.eval()
                for x in loader:
                    yield np.asarray(model(x))
            ''',
            unsafe_fixes=True,
        ),
        # validation inside the training function: backward only before eval
        Invalid(
            """
            import torch
            def fit(model, train_loader, val_loader, optimizer):
                for epoch in range(10):
                    model.train()
                    for x, y in train_loader:
                        loss = criterion(model(x), y)
                        loss.backward()
                        optimizer.step()
                    model.eval()
                    for x, y in val_loader:
                        val_loss = criterion(model(x), y)
            """,
            fixed=None,
            unsafe_fixes=True,
            line=9,
        ),
        # chained eval and an eval()'d model assigned
        Invalid(
            """
            import torch
            def load_and_run(path, loader, device):
                model = Net().to(device).eval()
                for x in loader:
                    x = x.to(device)
                    yield model(x)
            """,
            message="`model(x)`",
        ),
        # module-level script code: display-only
        Invalid(
            """
            import torch
            model = build()
            model.eval()
            for batch in test_loader:
                preds = model(batch)
            """,
            fixed=None,
            unsafe_fixes=True,
        ),
        # a set_grad_enabled(True) after eval does not count as no-grad
        Invalid(
            """
            import torch
            def run(model, loader):
                model.eval()
                with torch.set_grad_enabled(True):
                    pass
                for x in loader:
                    yield model(x)
            """,
        ),
        # a caller without no_grad does not cover
        Invalid(
            """
            import torch
            def run_eval(model, x):
                model.eval()
                return model(x)

            def main(model, loader):
                for x, y in loader:
                    run_eval(model, x)
            """,
        ),
        # forward after eval in a no_grad block, a second one outside it
        Invalid(
            """
            import torch
            def check(model, loader):
                model.eval()
                for x, y in loader:
                    with torch.no_grad():
                        a = model(x)
                    b = model(y)
            """,
            message="`model(y)`",
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.scopes: Dict[Optional[cst.CSTNode], _Scope] = {}
        # callee name -> sites of its calls in this module (for "a caller holds no_grad")
        self.call_sites: Dict[str, List[Site]] = {}
        self.torch_import_reported = False

    def _scope(self) -> _Scope:
        function = self.ctx.function
        key = function.node if function is not None else None
        scope = self.scopes.get(key)
        if scope is None:
            scope = self.scopes[key] = _Scope(function)
        return scope

    def _add(self, scope: _Scope, kind: str, node: cst.CSTNode, names: Tuple[str, ...] = ()) -> None:
        site = self.ctx.site() if kind == FORWARD else None
        scope.events.append(_Event(kind, node, self.ctx.ancestry(), names, site))

    # -- walk ------------------------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if isinstance(func, cst.Name) or (
            isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value in ("self", "cls")
        ):
            callee = last_name(func)
            if callee is not None:
                self.call_sites.setdefault(callee, []).append(self.ctx.site())
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method == "eval" and not node.args:
                self._eval(node, func)
                return
            if method == "train" and (not node.args or _is_true(node.args[0].value)):
                receiver = _receiver_root(func.value)
                if receiver:
                    self._add(self._scope(), TRAIN, node, (receiver,))
                return
            if method == "backward" or method == "requires_grad_" or (method == "step" and steps_optimizer(func.value)):
                scope = self._scope()
                scope.needs_grad = True
                self._add(scope, GRAD, node)
                return
        qname = self.ctx.qualified_name(func)
        if qname is not None:
            if qname in _AUTOGRAD_CALLS:
                scope = self._scope()
                scope.needs_grad = True
                self._add(scope, GRAD, node)
                return
            if qname in SET_GRAD_ENABLED and node.args and isinstance(self.ctx.current_parent(), cst.Expr):
                value = node.args[0].value
                self._add(self._scope(), NO_GRAD_ON if _is_false(value) else NO_GRAD_OFF, node)
                return
        scope = self._scope()
        if scope.eval_names:
            target = dotted_name(func)
            if target is not None and (
                target in scope.eval_names
                or (target.endswith(".forward") and target[: -len(".forward")] in scope.eval_names)
            ):
                self._add(scope, FORWARD, node, (target,))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            if (
                isinstance(target.target, cst.Attribute)
                and target.target.attr.value == "requires_grad"
                and _is_true(node.value)
            ):
                scope = self._scope()
                scope.needs_grad = True
                self._add(scope, GRAD, node)

    def _eval(self, node: cst.Call, func: cst.Attribute) -> None:
        names = set()
        receiver = _receiver_root(func.value)
        if receiver:
            names.add(receiver)
        parent = self.ctx.current_parent()
        if isinstance(parent, cst.Arg):
            return  # ``torch.jit.freeze(f.eval())``: the eval'd module is handed to someone else
        if isinstance(parent, cst.Assign) and parent.value is node:
            for target in parent.targets:
                name = dotted_name(target.target)
                if name:
                    names.add(name)
        if not names:
            return
        scope = self._scope()
        scope.eval_names |= names
        self._add(scope, EVAL, node, tuple(sorted(names)))

    # -- decide ------------------------------------------------------------------
    def finish(self) -> None:
        for scope in self.scopes.values():
            if not scope.eval_names:
                continue
            function = scope.function
            if function is not None and (
                _FRAMEWORK_NO_GRAD.match(function.name) or _TRAINING_CODE.match(function.name)
            ):
                continue
            events = scope.events
            for index, event in enumerate(events):
                if event.kind == EVAL:
                    self._judge(scope, event, events[index + 1 :], events[:index])

    def _judge(self, scope: _Scope, eval_event: _Event, after: List[_Event], before: List[_Event]) -> None:
        receivers = set(eval_event.names)
        no_grad = any(e.kind == NO_GRAD_ON for e in before) and not any(
            e.kind == NO_GRAD_OFF for e in before if e is not None
        )
        first_unguarded: Optional[_Event] = None
        for event in after:
            if exclusive_branches(event.stack, eval_event.stack):
                continue
            if event.kind == TRAIN and receivers & set(event.names):
                break
            if event.kind == GRAD:
                return  # eval used for freezing, or evaluation that needs gradients
            if event.kind == NO_GRAD_ON:
                no_grad = True
            elif event.kind == NO_GRAD_OFF:
                no_grad = False
            elif event.kind == FORWARD and first_unguarded is None and not no_grad:
                target = event.names[0]
                base = target[: -len(".forward")] if target.endswith(".forward") else target
                if base in receivers and not self._guarded(event):
                    first_unguarded = event
        if first_unguarded is None:
            return
        per_batch = _evaluation_loop(first_unguarded)
        if per_batch is None:
            return  # a single forward (a demo, a plot, a probe): its graph costs nothing worth a finding
        if self._covered_by_callers(scope.function, set()):
            return
        call_text = self.ctx.code_for(first_unguarded.node)
        if len(call_text) > 60 or "\n" in call_text:
            call_text = dotted_name(first_unguarded.node.func) + "(...)"  # type: ignore[attr-defined, operator]
        eval_text = self.ctx.code_for(eval_event.node)
        if len(eval_text) > 40:
            eval_text = ".eval()"
        message = (
            f"`{eval_text}` is followed by the forward pass `{call_text}` with autograd still on, so it keeps every "
            "activation for a backward pass that never comes; "
            "run evaluation under `torch.no_grad()` or `torch.inference_mode()`"
        )
        evidence = [Evidence(per_batch[0], node=per_batch[1])]
        self.report(eval_event.node, message, self._fix(scope), evidence=evidence)

    def _guarded(self, event: _Event) -> bool:
        site = Site(self.ctx, event.stack, None, None)
        if site.in_no_grad():
            return True
        for ancestor, child in site.ancestors():
            if isinstance(ancestor, cst.With) and child is ancestor.body:
                for item in ancestor.items:
                    call = item.item
                    if isinstance(call, cst.Call):
                        qname = self.ctx.qualified_name(call.func)
                        if qname in _ENABLE_GRAD or qname in NO_GRAD_CONTEXTS:
                            return True
                        if qname in SET_GRAD_ENABLED and call.args and not _is_false(call.args[0].value):
                            return True  # an explicit grad-mode choice
        return False

    def _covered_by_callers(self, function: Optional[FunctionInfo], seen: Set[str], depth: int = 0) -> bool:
        """Is some call of ``function`` in this module made with no-grad on?"""
        if function is None or depth > 4 or function.name in seen:
            return False
        seen.add(function.name)
        for site in self.call_sites.get(function.name, ()):
            if site.function is not None and site.function.node is function.node:
                continue  # recursion
            if site.in_no_grad():
                return True
            if site.function is not None:
                if is_no_grad_decorated(self.ctx, site.function.node):
                    return True
                if self._covered_by_callers(site.function, seen, depth + 1):
                    return True
        return False

    def _fix(self, scope: _Scope):
        function = scope.function
        if function is None:
            return None
        node = function.node
        if any(_spells_no_grad(d.decorator) for d in node.decorators):
            return None  # already decorated (by a name the import table cannot resolve): never stack a second one
        if scope.needs_grad or function.trains or node.asynchronous is not None:
            return self.ctx.fix(
                DISPLAY_ONLY,
                "Run the evaluation under `torch.no_grad()`",
                self.ctx.insert_line_before(node, "@torch.no_grad()"),
            )
        decorator, import_edit = self._no_grad_spelling()
        if decorator is None:
            return self.ctx.fix(
                DISPLAY_ONLY,
                "Decorate the function with `@torch.no_grad()` (after `import torch`)",
                self.ctx.insert_line_before(node, "@torch.no_grad()"),
            )
        edits = [self.ctx.insert_line_before(node, decorator)]
        if import_edit is not None:
            edits.insert(0, import_edit)
        return self.ctx.fix(UNSAFE, f"Decorate the function with `{decorator}`", *edits)

    def _no_grad_spelling(self) -> Tuple[Optional[str], Optional[Edit]]:
        aliases = self.ctx.names.aliases
        for local, full in aliases.items():
            if full == "torch":
                return f"@{local}.no_grad()", None
        for local, full in aliases.items():
            if full in ("torch.no_grad", "torch.autograd.no_grad", "torch.autograd.grad_mode.no_grad"):
                return f"@{local}()", None
        # torch is not imported: add the import, on one finding per pass (the
        # fixer re-lints, so later findings get theirs once torch is there).
        if self.torch_import_reported:
            return None, None
        anchor = _import_anchor(self.ctx.module)
        if anchor is None:
            return None, None
        self.torch_import_reported = True
        return "@torch.no_grad()", self.ctx.insert_line_before(anchor, "import torch")


def _spells_no_grad(decorator: cst.BaseExpression) -> bool:
    """``@torch.no_grad()``, ``@no_grad``, ``@th.inference_mode()``: by the
    name alone, since the fix must not stack a decorator the file already has
    even where ``torch`` comes from a star import."""
    target = decorator.func if isinstance(decorator, cst.Call) else decorator
    name = dotted_name(target) or ""
    return name.rsplit(".", 1)[-1] in ("no_grad", "inference_mode")


def _import_anchor(module: cst.Module) -> Optional[cst.CSTNode]:
    """The module-level statement above which ``import torch`` may go: the first
    import that is not ``from __future__``, else the first statement after the
    docstring and ``__future__`` imports."""
    body = list(module.body)
    candidates = []
    for index, statement in enumerate(body):
        if isinstance(statement, cst.SimpleStatementLine):
            small = statement.body[0] if statement.body else None
            if (
                isinstance(small, cst.ImportFrom)
                and isinstance(small.module, cst.Name)
                and small.module.value == "__future__"
            ):
                continue
            if (
                index == 0
                and isinstance(small, cst.Expr)
                and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString))
            ):
                continue
            if isinstance(small, (cst.Import, cst.ImportFrom)):
                return statement
        candidates.append(statement)
    return candidates[0] if candidates else None


def _receiver_root(node: cst.BaseExpression) -> Optional[str]:
    """``model`` for ``model``, ``model.to(dev)``, ``model.cuda().half()``."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in _CHAINABLE:
        node = node.func.value
    return dotted_name(node)


def _is_true(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _is_false(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def _evaluation_loop(forward: _Event) -> Optional[Tuple[str, cst.CSTNode]]:
    """How ``forward`` runs once per batch, and where that is seen: a loop
    over data around it (an evaluation loop over a loader), or a batch loop
    calling its function. None without one: the forward then runs a few
    times at most (a demo, a plot, a probe), and its graph costs nothing worth
    a finding."""
    site = forward.site
    if site is None:
        return None
    for loop in site.loops():
        if loop.iterates_data and site.runs_every_step(within=loop):
            return f"the forward pass runs once per batch: {loop.line_hint}", loop.node
    for ancestor, _ in site.ancestors():
        if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
            break
        comprehension = getattr(ancestor, "for_in", None)
        if isinstance(comprehension, cst.CompFor) and site.ctx.facts.is_data_source(comprehension.iter):
            source = dotted_name(comprehension.iter) or "the data"
            return f"the forward pass runs once per batch of `{source}`", ancestor
    step_loop, helper = site.per_step()
    if step_loop is None:
        return None
    where = "the forward pass" if helper is None else f"`{helper.name}()`"
    return f"{where} runs once per batch: {step_loop.line_hint}", per_batch_anchor(step_loop, helper)
