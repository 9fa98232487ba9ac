"""Questions rules ask about where a node sits: the shared analysis helpers.

A ``Site`` is a snapshot of a node's ancestors taken during the walk
(``ctx.site()``); its answers that depend on module-wide facts (is this loop a
batch loop, which loops call this function) are exact once the walk is over,
so rules ask them in ``finish()``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterator, List, Optional, Sequence, Tuple, Union

import libcst as cst

from torchlint.facts import FunctionInfo, LoopInfo, TrainerRun
from torchlint.names import dotted_name, last_name
from torchlint.tree import iter_subtree
from torchlint.vocabulary import (
    CUDA_AVAILABILITY,
    INDEX_NAME,
    NO_GRAD_CONTEXTS,
    PERIODIC_NAME,
    SET_GRAD_ENABLED,
    steps_optimizer,
)

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.model import FileModel


def exclusive_branches(a: Sequence[cst.CSTNode], b: Sequence[cst.CSTNode]) -> bool:
    """Do two nodes, given by their ancestor stacks (``Site.stack``, root first),
    sit in different branches of one ``if``/``else``, ``try``/``except`` or
    ``match``, so that no single run executes both? Used by rules that reason
    about statement order along one path (TL401, TL601)."""
    depth = 0
    for x, y in zip(a, b):
        if x is not y:
            break
        depth += 1
    if depth == 0 or depth >= len(a) or depth >= len(b):
        return False
    common, left, right = a[depth - 1], a[depth], b[depth]
    if isinstance(common, (cst.If, cst.IfExp)):
        return left is not common.test and right is not common.test
    if isinstance(common, (cst.Try, cst.TryStar)):
        if left is common.finalbody or right is common.finalbody:
            return False
        # body then else run together; a handler excludes the else (and most of the body)
        return {id(left), id(right)} != {id(common.body), id(common.orelse)}
    if isinstance(common, cst.Match):
        return True
    return False


def mentions_cuda_availability(ctx: "FileModel", node: cst.CSTNode) -> bool:
    """Does ``node`` call ``torch.cuda.is_available()`` (or a relative), or
    read a name assigned from such a call (``use_cuda``)?"""
    for sub in iter_subtree(node):
        if isinstance(sub, cst.Call) and ctx.names.qualified_name(sub.func) in CUDA_AVAILABILITY:
            return True
        if isinstance(sub, (cst.Name, cst.Attribute)) and dotted_name(sub) in ctx.facts.cuda_flag_names:
            return True
    return False


def branch_taken_on_cuda(ctx: "FileModel", branch: cst.If, child: cst.CSTNode) -> bool:
    """Is ``child`` the side of ``branch`` that runs whenever the code runs on
    CUDA: the body of ``if device == "cuda":`` (``"cuda" in device``,
    ``torch.cuda.is_available()``), or the ``else``/``elif`` side of a test
    for another device (``if device == "mps": … elif …``)?"""
    test = branch.test
    if child is branch.body:
        return mentions_cuda_availability(ctx, test) or _compares_device(test, cuda=True)
    if child is branch.orelse:
        return _compares_device(test, cuda=False)
    return False


def _compares_device(test: cst.BaseExpression, cuda: bool) -> bool:
    """``device == "cuda"`` / ``"cuda" in device_type`` (cuda=True), or
    ``device == "mps"``/``"cpu"`` (cuda=False)."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    operator = target.operator
    strings = [e for e in (test.left, target.comparator) if isinstance(e, cst.SimpleString)]
    if len(strings) != 1 or not isinstance(strings[0].evaluated_value, str):
        return False
    device = strings[0].evaluated_value.split(":", 1)[0]
    if cuda:
        return device == "cuda" and isinstance(operator, (cst.Equal, cst.In))
    return device in ("mps", "cpu", "xpu", "npu") and isinstance(operator, cst.Equal)


def is_periodic_test(test: cst.BaseExpression) -> bool:
    """``step % N == 0``, ``not i % k``, ``should_log(step)``, ``i == len(loader) - 1``…"""
    for sub in iter_subtree(test):
        if isinstance(sub, cst.BinaryOperation) and isinstance(sub.operator, cst.Modulo):
            return True
        if isinstance(sub, (cst.Name, cst.Attribute)):
            name = last_name(sub)
            if name and PERIODIC_NAME.search(name):
                return True
        if isinstance(sub, cst.Comparison) and _is_once_per_loop(sub):
            return True
    return False


def _accumulation_boundary(body: cst.BaseSuite) -> bool:
    """Does the block step an optimizer (``optimizer.step()``, ``scaler.step(opt)``)
    whose backward passes run outside it, on every micro-batch? Then the guard
    marks the end of a gradient-accumulation cycle. A block that runs its own
    backward too (``if i % n_critic == 0:`` training a GAN's generator) is a
    training step taken every N batches: periodic."""
    methods = [
        sub.func for sub in iter_subtree(body) if isinstance(sub, cst.Call) and isinstance(sub.func, cst.Attribute)
    ]
    return any(m.attr.value == "step" and steps_optimizer(m.value) for m in methods) and not any(
        m.attr.value == "backward" for m in methods
    )


def _lazy_initialization(branch: cst.If) -> bool:
    """``if not hasattr(self, "queue"):`` or ``if self.queue is None:`` whose
    body assigns that attribute: it runs on the first call only."""
    test = branch.test
    attribute: Optional[str] = None
    if (
        isinstance(test, cst.UnaryOperation)
        and isinstance(test.operator, cst.Not)
        and isinstance(test.expression, cst.Call)
        and dotted_name(test.expression.func) == "hasattr"
        and len(test.expression.args) == 2
    ):
        owner, name = (arg.value for arg in test.expression.args)
        if isinstance(name, cst.SimpleString) and isinstance(name.evaluated_value, str):
            attribute = f"{dotted_name(owner)}.{name.evaluated_value}"
    elif (
        isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and isinstance(test.comparisons[0].comparator, cst.Name)
        and test.comparisons[0].comparator.value == "None"
    ):
        attribute = dotted_name(test.left)
    if attribute is None or "." not in attribute:
        return False
    return any(
        isinstance(node, (cst.AssignTarget, cst.AnnAssign)) and dotted_name(node.target) == attribute
        for node in iter_subtree(branch.body)
    )


def _is_once_per_loop(comparison: cst.Comparison) -> bool:
    """``i == 0`` / ``step == len(loader) - 1``: true on one iteration only."""
    if len(comparison.comparisons) != 1 or not isinstance(comparison.comparisons[0].operator, cst.Equal):
        return False
    left, right = comparison.left, comparison.comparisons[0].comparator
    for index_side, other in ((left, right), (right, left)):
        name = last_name(index_side)
        if name and INDEX_NAME.search(name) and _is_fixed_point(other):
            return True
    return False


def _is_fixed_point(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Integer):
        return True
    if isinstance(node, cst.BinaryOperation):
        return _is_fixed_point(node.left) or _is_fixed_point(node.right)
    if isinstance(node, cst.Call):
        return last_name(node.func) == "len"
    name = last_name(node) if isinstance(node, (cst.Name, cst.Attribute)) else None
    return bool(name and re.search(r"(?i)(num_|total|max_|last|len)", name))


def _decorator_call_name(ctx: "FileModel", decorator: cst.Decorator) -> Optional[str]:
    expr = decorator.decorator
    if isinstance(expr, cst.Call):
        expr = expr.func
    return ctx.names.qualified_name(expr)


def is_no_grad_item(ctx: "FileModel", expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call):
        return False
    qname = ctx.names.qualified_name(expr.func)
    if qname in NO_GRAD_CONTEXTS:
        return True
    if qname in SET_GRAD_ENABLED and expr.args:
        value = expr.args[0].value
        return isinstance(value, cst.Name) and value.value == "False"
    return False


def is_no_grad_decorated(ctx: "FileModel", function: cst.FunctionDef) -> bool:
    for decorator in function.decorators:
        name = _decorator_call_name(ctx, decorator)
        if name in NO_GRAD_CONTEXTS:
            return True
        if (
            name is None
            and last_name(
                decorator.decorator if not isinstance(decorator.decorator, cst.Call) else decorator.decorator.func
            )
            in ctx.facts.no_grad_decorators
        ):
            return True
    return False


class ForeignLoop:
    """The batch loop, in another file, that makes a helper of this file hot:
    all a message needs is how to name it."""

    __slots__ = ("line_hint",)
    node = None

    def __init__(self, line_hint: str) -> None:
        self.line_hint = line_hint


def per_batch_anchor(loop, helper: Optional[FunctionInfo]) -> cst.CSTNode:
    """The node a finding's "runs once per batch" evidence points at: the
    batch loop of this file, else the function whose calls make the node hot
    (a training step function, or the helper a loop elsewhere calls)."""
    node = getattr(loop, "node", None)
    if node is not None:
        return node
    step = getattr(loop, "function", None)
    if step is not None:
        return step.node
    return helper.node  # type: ignore[union-attr]


class Site:
    """Where a node sits: its ancestors, function and loops, frozen at walk time."""

    __slots__ = ("ctx", "stack", "function", "loop", "bindings_seen")

    def __init__(
        self, ctx: "FileModel", stack: Sequence[cst.CSTNode], function: Optional[FunctionInfo], loop: Optional[LoopInfo]
    ) -> None:
        self.ctx = ctx
        self.stack = tuple(stack)
        self.function = function
        self.loop = loop
        self.bindings_seen = ctx.binding_count

    def value_of(self, name: str) -> Optional[cst.BaseExpression]:
        """The expression ``name`` holds at this site, in its function's scope:
        the last binding made before the site was taken, not one whose value
        the site is part of (``x = f(x)``). Valid at any time after the walk."""
        scope = id(self.function.node) if self.function is not None else 0
        for order, value in reversed(self.ctx.bindings.get(scope, {}).get(name, ())):
            if order <= self.bindings_seen and not any(ancestor is value for ancestor in self.stack):
                return value
        return None

    @property
    def node(self) -> cst.CSTNode:
        return self.stack[-1]

    @property
    def parent(self) -> Optional[cst.CSTNode]:
        return self.stack[-2] if len(self.stack) > 1 else None

    def ancestors(self) -> Iterator[Tuple[cst.CSTNode, cst.CSTNode]]:
        """(ancestor, child-on-the-path) pairs, innermost first."""
        for i in range(len(self.stack) - 2, -1, -1):
            yield self.stack[i], self.stack[i + 1]

    def statement(self) -> Optional[cst.CSTNode]:
        """The innermost statement holding the node."""
        for ancestor, _ in self.ancestors():
            if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
                return ancestor
        return None

    # -- loops ---------------------------------------------------------------
    def loops(self) -> List[LoopInfo]:
        """Loops whose body holds the node, innermost first (same function)."""
        result, loop = [], self.loop
        while loop is not None:
            result.append(loop)
            loop = loop.parent
        return result

    def batch_loop(self) -> Optional[LoopInfo]:
        for loop in self.loops():
            if loop.is_batch_loop:
                return loop
        return None

    def batch_context(self) -> Tuple[Optional[Union[LoopInfo, ForeignLoop]], Optional[FunctionInfo]]:
        """The batch loop the node runs in: directly, or because its function
        runs per batch (``ModuleFacts.functions_run_per_batch``: called from a
        batch loop's body, transitively, through ``self.`` methods, or passed
        as a callable into the loop). Returns (loop, helper function or None);
        the helper is what a message names, with the loop that makes it hot.

        Inside a generation loop (``while``, ``for … in range(…)``) that is not a
        batch loop, the answer is (None, None): such loops are per-token or
        per-sample and their control flow usually needs the value."""
        loop = self.batch_loop()
        if loop is not None:
            return loop, None
        if any(enclosing.is_generation_loop for enclosing in self.loops()):
            return None, None
        reached = self.ctx.facts.functions_run_per_batch()
        function = self.function
        while function is not None:
            found = reached.get(id(function))
            if found is not None:
                return found[0], function
            function = function.parent
        # called per batch from another file of the project (``MetricLogger.update``)
        analysis = self.ctx.analysis
        function = self.function
        while function is not None and function.parent is not None:
            function = function.parent
        if (
            analysis is not None
            and function is not None
            and function.class_name is not None
            and self._uses_argument(function)
        ):
            hint = analysis.hot_from_elsewhere(self.ctx, function)
            if hint is not None:
                return ForeignLoop(hint), function
        if (
            analysis is not None
            and function is not None
            and function is self.function  # not a nested function: it runs when its parent is called
            and function.class_name is None
            and not self._decodes(function)
        ):
            hint = analysis.function_hot_elsewhere(self.ctx, function)
            if hint is not None:
                return ForeignLoop(hint), function
        return None, None

    def _decodes(self, function: FunctionInfo) -> bool:
        """Does the function run a decoding or sampling loop (``while``, ``for … in
        range(…)`` that does not train)? Its reads steer the decoding on the host."""
        return any(loop.function is function and loop.is_generation_loop for loop in self.ctx.facts.loops.values())

    def forward_context(self) -> Tuple[Optional[FunctionInfo], Optional[FunctionInfo]]:
        """(the module's ``forward()``, the helper it calls or None) when the
        node runs on every forward pass: in ``forward()`` itself or in a
        method or module function it calls (``ModuleFacts.functions_run_per_forward``),
        and not under a periodic guard or on an exception path there.
        (None, None) otherwise."""
        if self.in_exception_path() or self.under_periodic_guard():
            return None, None
        reached = self.ctx.facts.functions_run_per_forward()
        function = self.function
        while function is not None:
            forward = reached.get(id(function))
            if forward is not None:
                return forward, (function if function is not forward else None)
            function = function.parent
        return None, None

    def forward_elsewhere(self) -> Tuple[Optional[str], Optional[FunctionInfo]]:
        """(where, the module-level function) when a ``forward()`` of another
        file of the project calls the node's module-level function on every
        pass ("`UNet.forward()` in unet.py:640"); (None, None) otherwise."""
        if self.in_exception_path() or self.under_periodic_guard():
            return None, None
        function = self.function
        while function is not None and function.parent is not None:
            function = function.parent
        analysis = self.ctx.analysis
        if function is None or analysis is None or function.class_name is not None:
            return None, None
        where = analysis.forward_caller_elsewhere(self.ctx, function)
        return (where, function) if where is not None else (None, None)

    def runs_every_step(self, within: Optional[LoopInfo] = None) -> bool:
        """Does the node run on every iteration of ``within``'s loop (every
        call of its function when None): not on an exception path, not under
        a periodic guard. The one filter of "hot" sites."""
        return not self.in_exception_path() and not self.under_periodic_guard(within=within)

    def per_step(self) -> Tuple[Optional[Union[LoopInfo, ForeignLoop]], Optional[FunctionInfo]]:
        """``batch_context()`` for a node that runs on every step: (None, None)
        on an exception path or under a periodic guard between the node and
        the loop (its function, when a helper makes it hot)."""
        if self.in_exception_path():
            return None, None
        loop, helper = self.batch_context()
        if loop is None or self.under_periodic_guard(within=loop if helper is None else None):
            return None, None
        return loop, helper

    def _uses_argument(self, function: FunctionInfo) -> bool:
        """Does the node read an argument of the method (``value.item()`` in
        ``update(self, value)``)? Only then can callers elsewhere make it hot
        by what they pass."""
        params = (function.argument_names | set(function.params[1:])) - set(function.params[:1])
        if not params:
            return False
        for sub in iter_subtree(self.node):
            if isinstance(sub, cst.Name) and sub.value in params:
                return True
        return False

    # -- guards --------------------------------------------------------------
    def in_exception_path(self) -> bool:
        for ancestor, child in self.ancestors():
            if isinstance(ancestor, (cst.ExceptHandler, cst.ExceptStarHandler)) and child is ancestor.body:
                return True
            if isinstance(ancestor, cst.Raise):
                return True
            if isinstance(ancestor, cst.Assert) and child is ancestor.msg:
                return True
            if isinstance(ancestor, (cst.FunctionDef, cst.Lambda)):
                return False
        return False

    def under_periodic_guard(
        self, within: Optional[Union[LoopInfo, ForeignLoop]] = None, accumulation_is_periodic: bool = False
    ) -> bool:
        """Inside ``if step % N == 0:`` (or an early ``continue`` on one), between
        the node and ``within``'s loop (the function body when None).

        A gradient-accumulation guard, one whose body steps the optimizer
        (``if (i + 1) % accum == 0: optimizer.step()``), runs once per training
        step: what it holds is per step, not periodic, unless the caller asks
        about micro-batches (``accumulation_is_periodic``, TL701)."""
        stop = within.node if within is not None else None
        for ancestor, child in self.ancestors():
            if ancestor is stop or isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                return False
            if (
                isinstance(ancestor, cst.If)
                and child is ancestor.body
                and is_periodic_test(ancestor.test)
                and (accumulation_is_periodic or not _accumulation_boundary(ancestor.body))
            ):
                return True
            if isinstance(ancestor, cst.If) and child is ancestor.body and _lazy_initialization(ancestor):
                return True  # runs once: the first call builds what later calls reuse
            if isinstance(ancestor, cst.IfExp) and child is ancestor.body and is_periodic_test(ancestor.test):
                return True
            if isinstance(ancestor, cst.IndentedBlock) and _skipped_unless_periodic(self.ctx, ancestor, child):
                return True
        return False

    def in_no_grad(self) -> bool:
        """Under ``with torch.no_grad()`` / ``inference_mode()`` or a function
        decorated with them (lexically; callers are TL601's business)."""
        for ancestor, child in self.ancestors():
            if isinstance(ancestor, cst.With) and child is ancestor.body:
                if any(is_no_grad_item(self.ctx, item.item) for item in ancestor.items):
                    return True
            if isinstance(ancestor, cst.FunctionDef) and is_no_grad_decorated(self.ctx, ancestor):
                return True
        return False

    def under_cuda_guard(self) -> bool:
        """Guarded by ``torch.cuda.is_available()`` (or a name holding it)."""
        for ancestor, child in self.ancestors():
            if isinstance(ancestor, (cst.If, cst.IfExp, cst.While)) and child is not ancestor.test:
                if mentions_cuda_availability(self.ctx, ancestor.test):
                    return True
            if isinstance(ancestor, cst.BooleanOperation) and child is ancestor.right:
                if mentions_cuda_availability(self.ctx, ancestor.left):
                    return True
        scope = self.function.node if self.function is not None else None
        return scope in self.ctx.facts.cuda_asserted_scopes or (
            scope is not None and None in self.ctx.facts.cuda_asserted_scopes
        )


def _skipped_unless_periodic(ctx: "FileModel", block: cst.IndentedBlock, child: cst.CSTNode) -> bool:
    """An earlier ``if not step % N == 0: continue`` in the same block.

    The statements after the first such guard are found once per block and
    kept for the file: rescanning the block for every finding made a loop of
    n findings cost n^2."""
    cache = ctx.__dict__.setdefault("_statements_after_periodic_skip", {})
    entry = cache.get(id(block))
    if entry is None or entry[0] is not block:
        body = block.body
        first = next(
            (
                i
                for i, s in enumerate(body)
                if isinstance(s, cst.If) and is_periodic_test(s.test) and _body_is_continue(s.body)
            ),
            None,
        )
        entry = cache[id(block)] = (block, frozenset(map(id, body[first + 1 :])) if first is not None else frozenset())
    return id(child) in entry[1]


def _body_is_continue(body: cst.BaseSuite) -> bool:
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        small = statement.body if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
        if any(isinstance(s, cst.Continue) for s in small):
            return True
    return False


# -- module modes (train/eval) ---------------------------------------------------
def module_mode_call(call: cst.Call) -> Optional[str]:
    """``x.eval()`` / ``x.train(False)`` -> "eval"; ``x.train()`` / ``x.train(mode)`` -> "train".

    Only calls on a dotted receiver count (``model.eval()``, ``self.net.train()``);
    the builtin ``eval(...)`` and calls on call results are not mode switches."""
    func = call.func
    if not isinstance(func, cst.Attribute) or dotted_name(func.value) is None:
        return None
    if func.attr.value == "eval" and not call.args:
        return "eval"
    if func.attr.value == "train" and len(call.args) <= 1:
        if call.args and isinstance(call.args[0].value, cst.Name) and call.args[0].value.value == "False":
            return "eval"
        return "train"
    return None


# -- training entry points -----------------------------------------------------
def is_main_guard(statement: cst.CSTNode) -> bool:
    """``if __name__ == "__main__":`` (either operand order)."""
    if not isinstance(statement, cst.If) or not isinstance(statement.test, cst.Comparison):
        return False
    test = statement.test
    if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = (test.left, test.comparisons[0].comparator)
    has_name = any(isinstance(s, cst.Name) and s.value == "__name__" for s in sides)
    has_main = any(isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__" for s in sides)
    return has_name and has_main


def loop_trains(ctx: "FileModel", loop: LoopInfo) -> bool:
    """The loop itself calls backward()/an optimizer step, or a function that
    does: of the module, or of another file of the project (``for epoch in
    …: train_one_epoch(…)`` with ``train_one_epoch`` from ``engine.py``)."""
    return (
        loop.trains
        or any(ctx.facts.function_trains(c) for c in loop.calls)
        or ctx.facts.trains_elsewhere(loop.imported_calls) is not None
    )


def training_entry_loop(ctx: "FileModel") -> Optional[LoopInfo]:
    """The first training loop of a module that is a *training entry point*.

    A training entry point is a module that runs as a script and trains:
    it contains a training loop (a loop that calls ``backward()`` or an
    optimizer's ``step()``, directly or through a function of the module),
    and either has an ``if __name__ == "__main__":`` block or top-level code
    that reaches that training (a training loop at module level, a
    module-level call of a module function that trains, or one that hands
    it to a launcher: ``mp.spawn(train, ...)``). Library modules
    that only define a training function are not entry points. Exact after
    the walk (ask in ``finish()``)."""
    training = [loop for loop in ctx.facts.loops.values() if loop_trains(ctx, loop)]
    if not training:
        return None
    runs_as_script = _has_main_block(ctx)
    if not runs_as_script:
        runs_as_script = any(loop.function is None for loop in training) or any(
            ctx.facts.function_trains(name) for name in ctx.facts.module_calls | ctx.facts.module_passed
        )
    if not runs_as_script:
        return None
    # Prefer the driving loop (``for epoch …: train_one_epoch(…)``) over the
    # loop inside the function it calls.
    for loop in training:
        if loop.function is None:
            return loop
        callers = ctx.facts.callers_of(loop.function)
        if not any(other is not loop and other.calls & callers for other in training):
            return loop
    return training[0]


def framework_training_run(ctx: "FileModel") -> Optional[TrainerRun]:
    """The first framework trainer a module that runs as a script builds and
    runs (``runner = Runner(...); runner.train()``, ``trainer.fit(model)``):
    the training loop is the framework's. The run must be reached: at module
    level, or in a function of a module with an ``if __name__ == "__main__":``
    block, or one the module calls or hands to a launcher. Exact after the walk."""
    runs = framework_training_runs(ctx)
    return runs[0] if runs else None


def framework_training_runs(ctx: "FileModel") -> List[TrainerRun]:
    """Every framework trainer run ``framework_training_run`` would accept, in order."""
    runs_as_script = _has_main_block(ctx)
    found = []
    for run in ctx.facts.trainer_runs:
        if _told_to_use_cpu(run.constructor):
            continue  # ``Trainer(..., device="cpu")``: no GPU to keep fed
        if _demo_sized(ctx, run):
            continue  # ``train_subset_num_batches=5``: a demonstration, nothing a speed-up would pay back
        function = run.function
        if function is None or runs_as_script or function.name in ctx.facts.module_calls | ctx.facts.module_passed:
            found.append(run)
    return found


# A run of this many training batches or fewer is a demonstration or a smoke test.
DEMO_BATCHES = 100
# Settings that bound a framework run's batches: composer, Lightning, Hugging Face.
_BATCH_LIMITS = ("train_subset_num_batches", "limit_train_batches", "max_steps")
_DURATION_IN_BATCHES = re.compile(r"^\s*(\d+)\s*ba\s*$")


def _demo_sized(ctx: "FileModel", run: TrainerRun) -> bool:
    """Is the run bounded to a handful of batches (``train_subset_num_batches=5``,
    ``max_duration="10ba"``, ``limit_train_batches=20``, ``fast_dev_run=True``,
    ``TrainingArguments(max_steps=10)``)? Its constructor, its run call and an
    arguments object given to it (``args=TrainingArguments(...)``) are read."""
    calls = [run.constructor, run.run] + ([run.arguments] if run.arguments is not None else [])
    for call in calls:
        for arg in call.args:
            key = arg.keyword.value if arg.keyword is not None else None
            value = ctx.constant(arg.value)
            if (
                key in _BATCH_LIMITS
                and isinstance(value, cst.Integer)
                and 0 < int(value.evaluated_value) <= DEMO_BATCHES
            ):
                return True
            if key == "fast_dev_run" and (
                (isinstance(value, cst.Name) and value.value == "True")
                or (isinstance(value, cst.Integer) and int(value.evaluated_value) > 0)
            ):
                return True
            if key in ("max_duration", "duration") and isinstance(value, cst.SimpleString):
                found = _DURATION_IN_BATCHES.match(str(value.evaluated_value))
                if found and int(found.group(1)) <= DEMO_BATCHES:
                    return True
    return False


def _told_to_use_cpu(constructor: cst.Call) -> bool:
    """A trainer told to train on the CPU: ``device="cpu"`` (composer, HF
    ``use_cpu=True``) or ``accelerator="cpu"`` (Lightning)."""
    for arg in constructor.args:
        key = arg.keyword.value if arg.keyword is not None else None
        if key in ("device", "accelerator") and isinstance(arg.value, cst.SimpleString):
            if arg.value.evaluated_value == "cpu":
                return True
        if key in ("use_cpu", "no_cuda") and isinstance(arg.value, cst.Name) and arg.value.value == "True":
            return True
    return False


def _has_main_block(ctx: "FileModel") -> bool:
    return any(is_main_guard(statement) for statement in ctx.module.body)


def outermost_loop_in_function(loop: LoopInfo) -> LoopInfo:
    """The outermost loop of the same function that encloses ``loop`` (itself if none)."""
    while loop.parent is not None and loop.parent.function is loop.function:
        loop = loop.parent
    return loop


_CONV_CLASS = re.compile(r"^(Lazy)?Conv(Transpose)?([123])d$")
_CONV_FUNCTION = re.compile(r"^conv(_transpose)?([123])d$")
_TORCHVISION_CONVNETS = re.compile(
    r"^(resnet|resnext|wide_resnet|vgg|densenet|efficientnet|mobilenet|convnext|regnet|alexnet|googlenet|"
    r"inception|mnasnet|shufflenet|squeezenet|fasterrcnn|maskrcnn|retinanet|fcn|deeplabv3|lraspp|r3d|r2plus1d|mc3)"
)


# timm architectures that are convolutional networks, by the start of their name
# (``create_model("resnet50d")``); hybrids and transformers (vit, deit, swin) are not.
_TIMM_CONVNETS = re.compile(
    r"^(resnet|resnext|seresnet|seresnext|wide_resnet|resnest|res2net|regnet|efficientnet|tf_efficientnet|"
    r"mobilenet|tf_mobilenet|convnext|densenet|dla|dpn|vgg|inception|xception|ghostnet|mixnet|mnasnet|rexnet|"
    r"hrnet|cspresnet|cspdarknet|darknet|nfnet|dm_nfnet|nf_resnet|ecaresnet|skresnet|selecsls|tresnet|repvgg|"
    r"gernet|hardcorenas|fbnet|lcnet|ese_vovnet|vovnet)"
)
_TIMM_FACTORIES = frozenset({"timm.create_model", "timm.models.create_model"})
# Convolutional networks of other libraries, by class: MONAI's (their spatial
# dims come from ``spatial_dims=``), diffusers' 2-D U-Nets and autoencoders,
# segmentation_models_pytorch's encoder-decoders. Transformer hybrids
# (MONAI's UNETR, SwinUNETR) are left out.
_MONAI_CONVNETS = re.compile(
    r"^(UNet|Unet|BasicUNet|BasicUnet|BasicUNetPlusPlus|AttentionUnet|DynUNet|SegResNet|SegResNetVAE|SegResNetDS|VNet|"
    r"HighResNet|AHNet|DenseNet|DenseNet121|DenseNet169|DenseNet201|DenseNet264|ResNet|SEResNet50|SEResNet101|"
    r"SEResNet152|SENet154|SEResNext50|SEResNext101|EfficientNetBN|FlexibleUNet|RegUNet|LocalNet|GlobalNet|"
    r"resnet(10|18|34|50|101|152|200))$"
)
_DIFFUSERS_CONVNETS = re.compile(r"^(UNet2DModel|UNet2DConditionModel|AutoencoderKL|VQModel|UNet3DConditionModel)$")
_SMP_CONVNETS = re.compile(r"^(Unet|UnetPlusPlus|FPN|PSPNet|DeepLabV3|DeepLabV3Plus|Linknet|MAnet|PAN)$")


def conv_dims(qualified: Optional[str], call: Optional[cst.Call] = None) -> Optional[int]:
    """Spatial dims of a convolution a call builds or runs: ``torch.nn.Conv2d`` -> 2,
    ``torch.nn.functional.conv3d`` -> 3, a torchvision CNN constructor
    (``torchvision.models.resnet50``) -> 2 (3 for video models), timm's
    ``create_model("resnet50d")`` of a convolutional architecture (``call``
    gives the name) -> 2; else None."""
    if not qualified:
        return None
    if qualified in _TIMM_FACTORIES:
        first = call.args[0].value if call is not None and call.args and call.args[0].keyword is None else None
        named = first.evaluated_value if isinstance(first, cst.SimpleString) else None
        return 2 if isinstance(named, str) and _TIMM_CONVNETS.match(named) else None
    module, _, last = qualified.rpartition(".")
    if module.startswith("torch.nn") or module.startswith("torch.ao.nn"):
        match = _CONV_CLASS.match(last) or _CONV_FUNCTION.match(last)
        if match:
            return int(match.groups()[-1])
    if module.startswith("torchvision.models") and _TORCHVISION_CONVNETS.match(last):
        return 3 if module.endswith("video") or last.startswith(("r3d", "r2plus1d", "mc3")) else 2
    if module.startswith("monai.networks") and _MONAI_CONVNETS.match(last):
        return _spatial_dims(call)
    if module.startswith("diffusers") and _DIFFUSERS_CONVNETS.match(last):
        return 3 if "3D" in last else 2
    if module.startswith("segmentation_models_pytorch") and _SMP_CONVNETS.match(last):
        return 2
    return None


def _spatial_dims(call: Optional[cst.Call]) -> Optional[int]:
    """A MONAI network's ``spatial_dims=2`` (``dimensions=`` in old releases,
    or its first positional argument), when it is a literal 2 or 3."""
    if call is None:
        return None
    given = next(
        (a.value for a in call.args if a.keyword is not None and a.keyword.value in ("spatial_dims", "dimensions")),
        call.args[0].value if call.args and call.args[0].keyword is None else None,
    )
    if isinstance(given, cst.Integer) and given.evaluated_value in (2, 3):
        return int(given.evaluated_value)
    return None
