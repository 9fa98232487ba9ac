from __future__ import annotations

import re
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import FunctionInfo, LoopInfo, Site, dotted_name, loop_trains, module_mode_call
from torchlint.rule import Evidence, Invalid, Rule, Valid

# Models that are evaluated but never trained: staying in eval mode is right.
_NOT_TRAINED = re.compile(
    r"(?i)(ema|teacher|target|frozen|shadow|swa|averaged|reference|ref_model|^ref$|critic_target)"
)


class TrainModeNotRestored(Rule):
    """## What it does
    Flags a call, inside a training loop, of an evaluation function of the
    same module that switches the model to evaluation mode (`model.eval()` or
    `model.train(False)`) and never switches it back, when nothing in that
    training loop calls `model.train()` again.

    The rule follows the model from the loop to the evaluation function: a
    parameter of the function is matched to the argument passed at the call
    site, and `self.model` or a global name to the same name in the loop; the
    model must be one the training loop itself uses. "Switches back" means
    any `.train(...)` call: in the evaluation function (including
    `model.train(was_training)`), in the training loop body or its nested
    loops, or in a module function the loop calls (a `train_one_epoch()` that
    starts with `model.train()`). The training loop is the innermost loop
    around the call that trains (calls `backward()` or an optimizer step,
    directly or through module functions), so an evaluation every N steps in
    the middle of an epoch is caught when `model.train()` only runs once per
    epoch.

    ## Why is this bad?
    `model.eval()` is sticky: it stays in effect until `model.train()` is
    called. After the first evaluation the rest of training runs with dropout
    disabled and with batch-norm layers normalising by their running
    statistics and no longer updating them. Nothing crashes; the model just
    trains worse, and the cause is hard to see.

    ## Example
    ```python
    import torch

    def evaluate(model, loader):
        model.eval()
        with torch.no_grad():
            return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader)

    model.train()
    for epoch in range(10):
        for x, y in train_loader:
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        evaluate(model, val_loader)
    ```

    Use instead:
    ```python
    import torch

    def evaluate(model, loader):
        model.eval()
        with torch.no_grad():
            return sum(model(x).argmax(1).eq(y).sum().item() for x, y in loader)

    for epoch in range(10):
        model.train()
        for x, y in train_loader:
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        evaluate(model, val_loader)
    ```

    ## Known problems
    Only functions of the same module are followed. Evaluation done by an
    imported function, or training done by one, is invisible, and the rule
    stays silent there.

    ## Fix safety
    There is no automatic fix: the right place for `model.train()` (the top
    of the epoch loop, the end of the evaluation function, or a
    `was_training` save-and-restore) is the author's choice.

    ## References
    - [`torch.nn.Module.train`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.train)
    - [`torch.nn.Module.eval`](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
    - [Autograd mechanics: evaluation mode (`nn.Module.eval()`)](https://pytorch.org/docs/stable/notes/autograd.html#evaluation-mode-nn-module-eval)
    """

    code = "TL602"
    name = "train-mode-not-restored"
    summary = "An evaluation function called from a training loop leaves the model in eval mode"
    requires_any = (".eval(", ".train(False")

    VALID = [
        Valid("""
            def evaluate(model, loader):
                model.eval()
                for x in loader:
                    model(x)

            for epoch in range(3):
                model.train()
                for x, y in train_loader:
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
                evaluate(model, val_loader)
        """),
        Valid("""
            def evaluate(model, loader):
                model.eval()
                for x in loader:
                    model(x)
                model.train()

            for epoch in range(3):
                for x, y in train_loader:
                    loss = model(x).sum()
                    loss.backward()
                    optimizer.step()
                evaluate(model, val_loader)
        """),
        Valid("""
            def evaluate(model, loader):
                was_training = model.training
                model.eval()
                for x in loader:
                    model(x)
                model.train(was_training)

            for epoch in range(3):
                for x, y in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(model, val_loader)
        """),
        Valid("""
            def train_one_epoch(model, loader, optimizer):
                model.train()
                for x, y in loader:
                    model(x).sum().backward()
                    optimizer.step()

            def evaluate(model, loader):
                model.eval()
                return [model(x) for x in loader]

            for epoch in range(3):
                train_one_epoch(model, train_loader, optimizer)
                evaluate(model, val_loader)
        """),
        Valid("""
            def evaluate(model, loader):
                model.eval()
                return [model(x) for x in loader]

            for x, y in train_loader:
                model(x).sum().backward()
                optimizer.step()
            evaluate(model, val_loader)
        """),
        Valid("""
            def evaluate(ema_model, loader):
                ema_model.eval()
                return [ema_model(x) for x in loader]

            for epoch in range(3):
                for x, y in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(ema_model, val_loader)
        """),
        Valid("""
            from helpers import evaluate
            for epoch in range(3):
                for x, y in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(model, val_loader)
        """),
        Valid("""
            def evaluate(model, loader):
                model.eval()
                return [model(x) for x in loader]

            for epoch in range(3):
                for x, y in train_loader:
                    model.train()
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(model, val_loader)
        """),
        Valid("""
            def report(results):
                print(eval(results))

            for x, y in train_loader:
                model(x).sum().backward()
                optimizer.step()
                report("1 + 1")
        """),
        Valid("""
            class Trainer:
                def validate(self):
                    self.model.eval()
                    for x in self.val_loader:
                        self.model(x)
                    self.model.train()

                def fit(self):
                    for epoch in range(3):
                        for x, y in self.train_loader:
                            self.model(x).sum().backward()
                            self.optimizer.step()
                        self.validate()
        """),
        Valid("""
            def freeze(teacher):
                teacher.eval()

            for x, y in train_loader:
                freeze(teacher)
                with torch.no_grad():
                    target = teacher(x)
                student(x).sub(target).pow(2).mean().backward()
                optimizer.step()
        """),
    ]

    INVALID = [
        Invalid(
            """
            def evaluate(model, loader):
                model.eval()
                return [model(x) for x in loader]

            model.train()
            for epoch in range(3):
                for x, y in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                evaluate(model, val_loader)
            """,
            line=10,
            message="`evaluate()` switches `model` to eval mode",
        ),
        Invalid(
            """
            def validate(net, loader):
                net.eval()
                return [net(x) for x in loader]

            for epoch in range(3):
                net.train()
                for step, (x, y) in enumerate(train_loader):
                    net(x).sum().backward()
                    optimizer.step()
                    if step % 500 == 0:
                        validate(net, val_loader)
            """,
            line=11,
        ),
        Invalid(
            """
            class Trainer:
                def evaluate(self):
                    self.model.eval()
                    return [self.model(x) for x in self.val_loader]

                def fit(self):
                    self.model.train()
                    for epoch in range(3):
                        for x, y in self.train_loader:
                            loss = self.model(x).sum()
                            loss.backward()
                            self.optimizer.step()
                        self.evaluate()
            """,
            line=13,
            message="`self.model`",
        ),
        Invalid(
            """
            def run_eval(model, loader):
                model.train(False)
                return [model(x) for x in loader]

            def train_step(model, batch, opt):
                model(batch).sum().backward()
                opt.step()

            for epoch in range(3):
                for batch in train_loader:
                    train_step(model, batch, opt)
                run_eval(model, val_loader)
            """,
            line=12,
        ),
        Invalid(
            """
            def evaluate(model, loader):
                model.eval()
                return [model(x) for x in loader]

            def log_and_eval(model):
                print("evaluating")
                return evaluate(model, val_loader)

            for epoch in range(3):
                for x, y in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                log_and_eval(model)
            """,
            line=13,
        ),
        Invalid(
            """
            def evaluate(loader):
                model.eval()
                return [model(x) for x in loader]

            step = 0
            while step < 1000:
                for x, y in train_loader:
                    model(x).sum().backward()
                    optimizer.step()
                    step += 1
                evaluate(val_loader)
            """,
            line=11,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # FunctionInfo -> receivers switched to eval mode in its own body
        self.evals: Dict[int, List[str]] = {}
        self.restores: Set[int] = set()  # functions / loops (by id) with a ``.train()`` call
        # per function / loop: (dotted name, used as a callee?, id of the call) for
        # every callee, call receiver and argument
        self.mentions: Dict[int, List[Tuple[str, bool, int]]] = {}
        # (site, callee name, the call) of every call of a plain or ``self.`` name inside a loop
        self.call_sites: List[Tuple[Site, str, cst.Call]] = []

    # -- collecting while walking ---------------------------------------------------
    def visit_Call(self, node: cst.Call) -> None:
        ctx = self.ctx
        scope = ctx.loop if ctx.loop is not None else ctx.function
        if scope is None:
            return
        mode = module_mode_call(node)
        if mode == "train":
            self.restores.update(id(s) for s in (ctx.loop, ctx.function) if s is not None)
        elif mode == "eval" and ctx.function is not None:
            self.evals.setdefault(id(ctx.function), []).append(self.ctx.code_for(node))
        uses = self.mentions.setdefault(id(scope), [])
        func = node.func
        callee = dotted_name(func)
        if callee is not None:
            uses.append((callee, True, id(node)))
        if isinstance(func, cst.Attribute):
            receiver = dotted_name(func.value)
            if receiver is not None:
                uses.append((receiver, False, id(node)))
        for arg in node.args:
            value = dotted_name(arg.value)
            if value is not None:
                uses.append((value, False, id(node)))
        if ctx.loop is not None and callee is not None:
            parts = callee.split(".")
            if len(parts) == 1 or (len(parts) == 2 and parts[0] in ("self", "cls")):
                self.call_sites.append((ctx.site(), parts[-1], node))

    # -- deciding ---------------------------------------------------------------------
    def finish(self) -> None:
        facts = self.ctx.facts
        if not self.evals:
            return
        children: Dict[int, List[LoopInfo]] = {}
        for child in facts.loops.values():
            if child.parent is not None:
                children.setdefault(id(child.parent), []).append(child)
        self._children = children
        self._restore_cache: Dict[int, bool] = {}
        reported: Set[int] = set()
        for site, callee, call in self.call_sites:
            evaluator = self._leaves_eval(callee, set())
            if evaluator is None:
                continue
            function, switch = evaluator
            receiver = switch.rsplit(".", 1)[0]
            model = self._model_at_call(function, receiver, call, callee)
            if model is None:
                continue
            loop = next((enclosing for enclosing in site.loops() if self._loop_trains(enclosing)), None)
            if loop is None or id(call) in reported:
                continue
            if _NOT_TRAINED.search(model.rsplit(".", 1)[-1]):
                continue
            if self._loop_restores(loop) or not self._loop_mentions(loop, model, id(call)):
                continue
            reported.add(id(call))
            self.report(
                call,
                f"`{callee}()` switches `{model}` to eval mode (`{switch}` in `{function.name}()`) and never back, "
                f"and nothing in the training loop {loop.line_hint} calls `{model}.train()`: "
                "the following steps train with dropout off and batch-norm statistics frozen",
                evidence=[
                    Evidence(f"`{function.name}()` calls `{switch}` and not `.train()`", node=function.node),
                    Evidence(f"the training loop: {loop.line_hint}", node=loop.node),
                ],
            )

    def _leaves_eval(self, name: str, seen: Set[str]) -> Optional[Tuple[FunctionInfo, str]]:
        """(function, receiver) when calling ``name`` leaves a model in eval mode."""
        if name in seen:
            return None
        seen.add(name)
        infos = self.ctx.facts.functions.get(name, ())
        if not infos or any(self._function_restores(info, set()) for info in infos):
            return None
        for info in infos:
            switches = self.evals.get(id(info), ())
            if switches:
                return info, switches[0]
            for called in sorted(info.calls):
                found = self._leaves_eval(called, seen)
                if found is not None:
                    return found
        return None

    def _function_restores(self, info: FunctionInfo, seen: Set[str]) -> bool:
        if not seen:
            cached = self._restore_cache.get(id(info))
            if cached is None:
                cached = self._restore_cache[id(info)] = self._function_restores(info, {""})
            return cached
        if id(info) in self.restores:
            return True
        if info.name in seen:
            return False
        seen.add(info.name)
        if any(
            id(own_loop) in self.restores for own_loop in self.ctx.facts.loops.values() if own_loop.function is info
        ):
            return True
        return any(
            self._function_restores(callee, seen)
            for name in info.calls
            for callee in self.ctx.facts.functions.get(name, ())
        )

    def _model_at_call(self, function: FunctionInfo, receiver: str, call: cst.Call, callee: str) -> Optional[str]:
        """The loop-side name of the model that ``function`` switches to eval."""
        head = receiver.split(".", 1)[0]
        params = function.node.params
        positional = [p.name.value for p in (*params.posonly_params, *params.params)]
        keyword_only = [p.name.value for p in params.kwonly_params]
        if head not in positional and head not in keyword_only:
            return receiver  # a global
        if function.class_name is not None and positional and head == positional[0]:
            return receiver  # ``self.model``
        if callee != function.name:
            # reached through another function: follow the model only when it
            # is passed on under the same name
            passed = {dotted_name(a.value) for a in call.args}
            return receiver if head in passed else None
        if function.class_name is not None and positional and positional[0] in ("self", "cls"):
            positional = positional[1:]
        argument = None
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == head:
                argument = arg.value
        if argument is None and head in positional:
            index = positional.index(head)
            plain = [a for a in call.args if a.keyword is None and not a.star]
            if index < len(plain):
                argument = plain[index].value
        name = dotted_name(argument) if argument is not None else None
        if name is None:
            return None
        rest = receiver[len(head) :]
        return name + rest

    def _descendants(self, loop: LoopInfo) -> List[LoopInfo]:
        result, stack = [], [loop]
        while stack:
            current = stack.pop()
            result.append(current)
            stack.extend(self._children.get(id(current), ()))
        return result

    def _loop_trains(self, loop: LoopInfo) -> bool:
        return any(loop_trains(self.ctx, inner) for inner in self._descendants(loop))

    def _loop_restores(self, loop: LoopInfo) -> bool:
        for current in self._descendants(loop):
            if id(current) in self.restores:
                return True
            for name in current.calls:
                if any(self._function_restores(info, set()) for info in self.ctx.facts.functions.get(name, ())):
                    return True
        return False

    def _loop_mentions(self, loop: LoopInfo, model: str, exclude_call: int) -> bool:
        """Does the training loop (or a module function it calls) use ``model``,
        other than by passing it to the evaluation call itself?"""
        uses: List[Tuple[str, bool, int]] = []
        functions: List[FunctionInfo] = []
        for current in self._descendants(loop):
            uses.extend(self.mentions.get(id(current), ()))
            for name in current.calls:
                functions.extend(self.ctx.facts.functions.get(name, ()))
        seen: Set[int] = set()
        while functions:
            info = functions.pop()
            if id(info) in seen:
                continue
            seen.add(id(info))
            uses.extend(self.mentions.get(id(info), ()))
            for own_loop in self.ctx.facts.loops.values():
                if own_loop.function is info:
                    uses.extend(self.mentions.get(id(own_loop), ()))
            for name in info.calls:
                functions.extend(self.ctx.facts.functions.get(name, ()))
        return any(call != exclude_call and _related(model, name, called) for name, called, call in uses)


def _related(model: str, name: str, called: bool) -> bool:
    """Is ``name`` a use of ``model``? ``model.module`` is used by calling
    ``model(x)``; ``model`` is used by ``model(x)``, ``model.parameters()`` or
    passing it on; ``model`` and ``model_ema`` are different networks."""
    if name == model or name.startswith(model + "."):
        return True
    return called and model.startswith(name + ".")
