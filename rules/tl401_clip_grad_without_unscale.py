from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.model import (
    FunctionInfo,
    dotted_name,
    exclusive_branches,
    iter_subtree,
    keyword,
    last_name,
    literal_bool,
)
from torchlint.rule import DISPLAY_ONLY, SAFE, Evidence, Invalid, Rule, Valid

_CLIPS = frozenset(
    {
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
        "torch.nn.utils.clip_grad_norm",
        "torch.nn.utils.clip_grad.clip_grad_norm_",
        "torch.nn.utils.clip_grad.clip_grad_value_",
        "torch.nn.utils.clip_grad.clip_grad_norm",
    }
)
_SCALER_CONSTRUCTORS = frozenset(
    {
        "torch.amp.GradScaler",
        "torch.amp.grad_scaler.GradScaler",
        "torch.cuda.amp.GradScaler",
        "torch.cuda.amp.grad_scaler.GradScaler",
        "torch.cpu.amp.GradScaler",
        "torch.GradScaler",
        "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
        "torch.distributed.fsdp.ShardedGradScaler",
    }
)
# A receiver named like this is taken for a GradScaler even when it is a
# parameter (``def train_one_epoch(..., scaler)``): ``x.scale(loss)`` plus
# ``x.step(optimizer)`` on such a name is a GradScaler in practice.
_SCALER_NAME = re.compile(r"(?i)scaler")

SCALE, UNSCALE, STEP, CLIP = "scale", "unscale", "step", "clip"


@dataclass(eq=False)
class _Event:
    kind: str
    scaler: Optional[str]  # the scaler's dotted name; None for a clip
    call: cst.Call
    stack: Tuple[cst.CSTNode, ...]
    clip_name: str = ""


class ClipGradWithoutUnscale(Rule):
    """## What it does
    Flags `torch.nn.utils.clip_grad_norm_` and `clip_grad_value_` calls that
    run after `scaler.scale(loss).backward()` and before `scaler.step(optimizer)`
    with no `scaler.unscale_(optimizer)` between them on that path, where
    `scaler` is a `GradScaler` (`torch.amp.GradScaler`,
    `torch.cuda.amp.GradScaler`, `torch.GradScaler`, FSDP's
    `ShardedGradScaler`, under any import alias, held in a local, a
    parameter named `*scaler*`, or an attribute such as `self.scaler`).

    It also flags, with its own message, clipping placed after
    `scaler.step(...)` and before the next `scaler.scale(...)`: the optimizer
    has already applied the gradients, so the clip changes nothing.

    Statements are taken in source order within one function (or the
    module's top level); two statements in different branches of one
    `if`/`else`, `try`/`except` or `match` are never on the same path. When
    the backward pass and the step live in different methods, a clip that
    comes before `scaler.step(...)` in its method, with no `unscale_` before
    it there, is flagged if the scaler is one the module creates.

    ## Why is this bad?
    Under mixed precision the gradients that `scaler.scale(loss).backward()`
    produces are multiplied by the loss scale (65536 by default). Clipping
    them to `max_norm` compares the scaled norm with the threshold, so the
    clip either does nothing useful or crushes the update by the scale
    factor, and the effective threshold drifts as the scaler adapts.
    `scaler.unscale_(optimizer)` divides the gradients back in place first;
    `scaler.step` then knows not to unscale them twice.

    ## Known problems
    The path analysis is per function and in source order; a clip in a
    helper function called between backward and step is not followed. A
    scaler created with a literal `enabled=False` is ignored; one whose
    `enabled=` is a variable is treated as possibly enabled.

    ## Example
    ```python
    import torch
    from torch.nn.utils import clip_grad_norm_

    scaler = torch.amp.GradScaler("cuda")
    for batch in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = model(batch)
        scaler.scale(loss).backward()
        clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    ```

    Use instead:
    ```python
    import torch
    from torch.nn.utils import clip_grad_norm_

    scaler = torch.amp.GradScaler("cuda")
    for batch in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda"):
            loss = model(batch)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    ```

    ## Fix safety
    The fix inserts `scaler.unscale_(optimizer)` on the line before the clip,
    with the optimizer taken from the matching `scaler.step(...)`. It is safe
    when that optimizer is unambiguous (one simple name stepped by that
    scaler) and every run of the clip is followed by that step in the same
    block (no loop around the clip, no `continue`/`break`/`return` between
    them, no other `unscale_` before the step): `unscale_` may then be called
    exactly once per `update()`, which is what GradScaler requires, and the
    result is what `scaler.step` would have done anyway, plus a correct clip.
    Otherwise (several optimizers, a clip on every micro-batch of gradient
    accumulation while the step runs every N, a clip inside a one-line
    compound statement) the fix is display-only: calling `unscale_` twice
    before `update()` raises, and unscaling before more scaled gradients are
    accumulated mixes scales. So is a fix in a function that passes the
    scaler or the optimizer to another call (`unscale_for_clipping(scaler,
    optimizer)`), which may unscale already: a second `unscale_` raises. Clipping after the step has no fix: the clip
    must be moved, which only the author can decide.

    ## References
    - [Automatic Mixed Precision examples: working with unscaled gradients (gradient clipping)](https://pytorch.org/docs/stable/notes/amp_examples.html#gradient-clipping)
    - [`torch.amp.GradScaler.unscale_`](https://pytorch.org/docs/stable/amp.html#torch.amp.GradScaler.unscale_)
    - [`torch.nn.utils.clip_grad_norm_`](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
    """

    code = "TL401"
    name = "clip-grad-without-unscale"
    summary = "Gradient clipping under AMP runs on scaled gradients (no `scaler.unscale_` before the clip)"
    fix_availability = "sometimes"
    requires_any = ("clip_grad",)

    VALID = [
        # explicit unscale_
        Valid("""
            import torch
            scaler = torch.cuda.amp.GradScaler()
            for batch in loader:
                scaler.scale(model(batch)).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
        """),
        # no scaler at all
        Valid("""
            import torch
            for batch in loader:
                loss = model(batch)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
        """),
        # a scaler that is disabled by a literal
        Valid("""
            import torch
            amp_scaler = torch.amp.GradScaler("cuda", enabled=False)
            for batch in loader:
                amp_scaler.scale(model(batch)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                amp_scaler.step(optimizer)
                amp_scaler.update()
        """),
        # AMP branch unscales; the fp32 branch clips the true gradients
        Valid("""
            import torch
            scaler = torch.amp.GradScaler()
            def step(loss):
                if use_amp:
                    scaler.scale(loss).backward()
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
        """),
        # unscale_ under the same condition as the clip
        Valid("""
            from torch.nn.utils import clip_grad_value_
            from torch.cuda.amp import GradScaler
            scaler = GradScaler()
            for batch in loader:
                scaler.scale(model(batch)).backward()
                if args.clip:
                    scaler.unscale_(optimizer)
                    clip_grad_value_(model.parameters(), args.clip)
                scaler.step(optimizer)
                scaler.update()
        """),
        # a clip that is not torch's
        Valid("""
            import torch
            scaler = torch.amp.GradScaler()
            for batch in loader:
                scaler.scale(model(batch)).backward()
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
        """),
        # the clip runs in another function, before any scaling
        Valid("""
            import torch
            def clip(model):
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """),
        # the scaler unscales inside a method of self
        Valid("""
            import torch
            class Trainer:
                def __init__(self):
                    self.scaler = torch.amp.GradScaler()
                def step(self, loss):
                    self.scaler.scale(loss).backward()
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
        """),
        # the clip is in the except branch of a try whose body steps
        Valid("""
            import torch
            scaler = torch.amp.GradScaler()
            scaler.scale(loss).backward()
            try:
                scaler.step(optimizer)
            except RuntimeError:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        """),
        # next iteration's clip after unscale_; the earlier step closes the cycle
        Valid("""
            import torch
            scaler = torch.amp.GradScaler()
            for batch in loader:
                scaler.scale(model(batch)).backward()
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                scaler.scale(model(batch)).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
        """),
    ]

    INVALID = [
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for batch in loader:
                scaler.scale(model(batch)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler("cuda")
            for batch in loader:
                scaler.scale(model(batch)).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            """,
            line=5,
            message="scaled gradients",
        ),
        # torch.cuda.amp alias, from-import of the clip under an alias
        Invalid(
            """
            from torch.cuda.amp import GradScaler as GS
            from torch.nn.utils import clip_grad_value_ as clip
            gs = GS()
            def train_step(loss, opt):
                gs.scale(loss).backward()
                clip(params, 0.5)
                gs.step(opt)
                gs.update()
            """,
            fixed="""
            from torch.cuda.amp import GradScaler as GS
            from torch.nn.utils import clip_grad_value_ as clip
            gs = GS()
            def train_step(loss, opt):
                gs.scale(loss).backward()
                gs.unscale_(opt)
                clip(params, 0.5)
                gs.step(opt)
                gs.update()
            """,
        ),
        # torch.GradScaler and the nn.utils alias; result assigned
        Invalid(
            """
            import torch
            from torch import nn
            scaler = torch.GradScaler()
            scaler.scale(loss).backward()
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            """,
            fixed="""
            import torch
            from torch import nn
            scaler = torch.GradScaler()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            """,
        ),
        # scaler on self, step in the same method
        Invalid(
            """
            import torch
            class Trainer:
                def __init__(self):
                    self.scaler = torch.amp.GradScaler()
                def training_step(self, loss):
                    self.scaler.scale(loss).backward()
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
            fixed="""
            import torch
            class Trainer:
                def __init__(self):
                    self.scaler = torch.amp.GradScaler()
                def training_step(self, loss):
                    self.scaler.scale(loss).backward()
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_norm)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
        ),
        # a scaler passed in as a parameter
        Invalid(
            """
            import torch
            def train_one_epoch(model, loader, optimizer, scaler):
                for x, y in loader:
                    scaler.scale(model(x, y)).backward()
                    if max_norm > 0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                    scaler.step(optimizer)
                    scaler.update()
            """,
            fixed="""
            import torch
            def train_one_epoch(model, loader, optimizer, scaler):
                for x, y in loader:
                    scaler.scale(model(x, y)).backward()
                    if max_norm > 0:
                        scaler.unscale_(optimizer)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                    scaler.step(optimizer)
                    scaler.update()
            """,
        ),
        # gradient accumulation: clip every micro-batch, step every N: display-only
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler()
            for i, batch in enumerate(loader):
                scaler.scale(model(batch)).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if (i + 1) % accum == 0:
                    scaler.step(optimizer)
                    scaler.update()
            """,
            fixed=None,
        ),
        # two optimizers stepped: the optimizer to unscale is ambiguous
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler()
            scaler.scale(loss).backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            scaler.step(opt_g)
            scaler.step(opt_d)
            scaler.update()
            """,
            fixed=None,
        ),
        # clipping after the step: separate message, no fix
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler()
            for batch in loader:
                scaler.scale(model(batch)).backward()
                scaler.step(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.update()
            """,
            message="after `scaler.step",
            line=6,
        ),
        # the scaled loss is kept in a variable before backward
        Invalid(
            """
            import torch.amp
            scaler = torch.amp.GradScaler()
            scaled = scaler.scale(loss)
            scaled.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            """,
            fixed="""
            import torch.amp
            scaler = torch.amp.GradScaler()
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            """,
        ),
        # backward in one method, clip and step in another (self.scaler)
        Invalid(
            """
            import torch
            class Engine:
                def __init__(self):
                    self.scaler = torch.cuda.amp.GradScaler(enabled=self.use_amp)
                def backward(self, loss):
                    self.scaler.scale(loss).backward()
                def step(self):
                    torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
            fixed="""
            import torch
            class Engine:
                def __init__(self):
                    self.scaler = torch.cuda.amp.GradScaler(enabled=self.use_amp)
                def backward(self, loss):
                    self.scaler.scale(loss).backward()
                def step(self):
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
            """,
        ),
        # a skip-step `continue` between clip and step: display-only
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler()
            for batch in loader:
                scaler.scale(model(batch)).backward()
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if not torch.isfinite(norm):
                    continue
                scaler.step(optimizer)
                scaler.update()
            """,
            fixed=None,
        ),
        # unscale_ only on the other branch does not cover the clip
        Invalid(
            """
            import torch
            scaler = torch.amp.GradScaler()
            scaler.scale(loss).backward()
            if fancy:
                scaler.unscale_(optimizer)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            """,
            fixed="""
            import torch
            scaler = torch.amp.GradScaler()
            scaler.scale(loss).backward()
            if fancy:
                scaler.unscale_(optimizer)
            else:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            """,
            line=7,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        # scope (function node or None) -> events in source order
        self.events: Dict[Optional[cst.CSTNode], List[_Event]] = {}
        self.handed_to_calls: Set[Tuple[Optional[cst.CSTNode], str]] = set()  # (scope, name passed to a call)
        self.scope_info: Dict[Optional[cst.CSTNode], Optional[FunctionInfo]] = {}
        # (scope, dotted name) holding an enabled-or-unknown GradScaler / a GradScaler(enabled=False)
        self.scalers: Set[Tuple[Optional[cst.CSTNode], str]] = set()
        self.disabled: Set[Tuple[Optional[cst.CSTNode], str]] = set()
        # local name of a scaled loss -> the scaler that scaled it
        self.scaled_values: Dict[Tuple[Optional[cst.CSTNode], str], str] = {}

    # -- walk ------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        if len(node.targets) != 1:
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        constructor = self._scaler_constructor(node.value)
        if constructor is not None:
            # a plain name is local to its function; an attribute (self.scaler) is module-wide
            key = (self._scope() if "." not in target else None, target)
            enabled = keyword(constructor, "enabled")
            if enabled is not None and literal_bool(enabled.value) is False:
                self.disabled.add(key)
            else:
                self.scalers.add(key)
            return
        value = node.value
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value == "scale":
            scaler = dotted_name(value.func.value)
            if scaler is not None:
                self.scaled_values[(self._scope(), target)] = scaler

    def _scaler_constructor(self, value: cst.BaseExpression) -> Optional[cst.Call]:
        if isinstance(value, cst.IfExp):
            return self._scaler_constructor(value.body) or self._scaler_constructor(value.orelse)
        if isinstance(value, cst.Call) and self.ctx.qualified_name(value.func) in _SCALER_CONSTRUCTORS:
            return value
        return None

    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        if (
            last_name(func) not in ("scale", "unscale_", "step", "update")
            and self.ctx.qualified_name(func) not in _CLIPS
        ):
            for arg in node.args:
                name = dotted_name(arg.value)
                if name is not None:  # ``unscale_for_clipping(scaler, optimizer)`` may unscale
                    self.handed_to_calls.add((self._scope(), name))
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in ("scale", "unscale_", "step"):
                receiver = dotted_name(func.value)
                if receiver is not None:
                    kind = {"scale": SCALE, "unscale_": UNSCALE, "step": STEP}[method]
                    self._add(kind, receiver, node)
                return
            if method == "backward" and isinstance(func.value, cst.Name):
                scaler = self.scaled_values.get((self._scope(), func.value.value))
                if scaler is not None:
                    self._add(SCALE, scaler, node)
                return
        qname = self.ctx.qualified_name(func)
        if qname in _CLIPS:
            self._add(CLIP, None, node, qname.rsplit(".", 1)[-1])

    def _scope(self) -> Optional[cst.CSTNode]:
        return self.ctx.function.node if self.ctx.function is not None else None

    def _add(self, kind: str, scaler: Optional[str], call: cst.Call, clip_name: str = "") -> None:
        scope = self._scope()
        self.scope_info[scope] = self.ctx.function
        self.events.setdefault(scope, []).append(_Event(kind, scaler, call, self.ctx.ancestry(), clip_name))

    # -- decide ------------------------------------------------------------------
    def _lookup(self, table: Set[Tuple[Optional[cst.CSTNode], str]], scope: Optional[cst.CSTNode], name: str) -> bool:
        if "." in name:
            return (None, name) in table
        if (scope, name) in table:
            return True
        # a module-level scaler is visible in functions that do not bind the name
        return (None, name) in table and not any((scope, name) in t for t in (self.scalers, self.disabled))

    def _is_scaler(self, scope: Optional[cst.CSTNode], name: Optional[str]) -> bool:
        if name is None or self._lookup(self.disabled, scope, name):
            return False
        return self._lookup(self.scalers, scope, name) or bool(_SCALER_NAME.search(name.rsplit(".", 1)[-1]))

    def finish(self) -> None:
        scaled_anywhere = {e.scaler for events in self.events.values() for e in events if e.kind == SCALE}
        for scope, events in self.events.items():
            events = [e for e in events if e.kind == CLIP or self._is_scaler(scope, e.scaler)]
            for index, clip in enumerate(events):
                if clip.kind == CLIP:
                    self._judge(scope, clip, events[:index], events[index + 1 :], scaled_anywhere)

    def _judge(
        self,
        scope: Optional[cst.CSTNode],
        clip: _Event,
        before: List[_Event],
        after: List[_Event],
        scaled_anywhere: Set[Optional[str]],
    ) -> None:
        on_path_before = [e for e in before if e.kind != CLIP and not exclusive_branches(e.stack, clip.stack)]
        on_path_after = [e for e in after if e.kind != CLIP and not exclusive_branches(e.stack, clip.stack)]
        last = on_path_before[-1] if on_path_before else None
        next_step = next((e for e in on_path_after if e.kind == STEP), None)
        if last is not None and last.kind == SCALE:
            scaler = last.scaler
            assert scaler is not None  # a SCALE event names its scaler
            step = next((e for e in on_path_after if e.kind == STEP and e.scaler == scaler), None)
            if step is None or any(e.kind == SCALE for e in on_path_after[: on_path_after.index(step)]):
                return
            since_scale = before[next(i for i in range(len(before) - 1, -1, -1) if before[i] is last) + 1 :]
            self._report_before_step(clip, scaler, step, on_path_after, _earlier_clip_on_path(clip, since_scale), scope)
        elif last is not None and last.kind == STEP:
            scaler = last.scaler
            following = [e for e in on_path_after if e.scaler == scaler]
            if following and following[0].kind == STEP:
                return  # a second step follows: the clip sits between two cycles
            self.report(
                clip.call,
                f"`{clip.clip_name}` runs after `{scaler}.step(...)` has already applied the gradients, so it has no "
                "effect on this update; clip before the step, after `" + f"{scaler}.unscale_(optimizer)`",
                evidence=[Evidence(f"`{scaler}` steps the optimizer before the clip", node=last.call)],
            )
        elif last is None and next_step is not None:
            # backward lives in another function: judge only scalers the module creates
            scaler = next_step.scaler
            if scaler is not None and self._lookup(self.scalers, scope, scaler) and scaler in scaled_anywhere:
                if any(e.kind == SCALE for e in on_path_after[: on_path_after.index(next_step)]):
                    return
                self._report_before_step(
                    clip, scaler, next_step, on_path_after, _earlier_clip_on_path(clip, before), scope
                )

    def _report_before_step(
        self,
        clip: _Event,
        scaler: str,
        step: _Event,
        after: List[_Event],
        earlier_clip: bool,
        scope: Optional[cst.CSTNode] = None,
    ) -> None:
        steps = [e for e in after if e.kind == STEP and e.scaler == scaler]
        cycle_end = next((i for i, e in enumerate(after) if e.kind == SCALE), len(after))
        cycle_steps = [e for e in after[:cycle_end] if e.kind == STEP and e.scaler == scaler] or steps[:1]
        optimizers = {self._optimizer(e.call) for e in cycle_steps}
        optimizer = next(iter(optimizers)) if len(optimizers) == 1 else None
        message = (
            f"`{clip.clip_name}` clips the scaled gradients of `{scaler}.scale(loss).backward()`; "
            f"call `{scaler}.unscale_(optimizer)` before clipping"
        )
        line = f"{scaler}.unscale_({optimizer or 'optimizer'})"
        statement = self._statement_line(clip)
        # GradScaler allows one unscale_ per optimizer per step: when an earlier
        # clip of this cycle gets the unscale_, this one is covered by it (the
        # fixer's next pass sees that) and must not insert a second one.
        safe = (
            not earlier_clip
            and optimizer is not None
            and statement is not None
            and not any(e.kind == UNSCALE for e in after[: after.index(step)])
            and self._step_always_follows(clip, statement, step)
            # a helper given the scaler or the optimizer may call unscale_ itself:
            # a second one raises "unscale_() has already been called"
            and not any((scope, name) in self.handed_to_calls for name in (scaler, optimizer))
        )
        fix = self.ctx.fix(
            SAFE if safe else DISPLAY_ONLY,
            f"Insert `{line}` before the clip",
            self.ctx.insert_line_before(statement or clip.call, line),
        )
        self.report(
            clip.call,
            message,
            fix,
            evidence=[
                Evidence(
                    f"`{scaler}.step(...)` applies these gradients next, with no `unscale_` between", node=step.call
                )
            ],
        )

    def _optimizer(self, step_call: cst.Call) -> Optional[str]:
        args = [a for a in step_call.args if a.star == ""]
        if len(args) != 1 or (args[0].keyword is not None and args[0].keyword.value != "optimizer"):
            return None
        return dotted_name(args[0].value)

    @staticmethod
    def _statement_line(clip: _Event) -> Optional[cst.SimpleStatementLine]:
        """The clip's statement line, when it stands on its own line in a block."""
        stack = clip.stack
        for i in range(len(stack) - 1, 0, -1):
            node = stack[i]
            if isinstance(node, cst.SimpleStatementSuite):
                return None
            if isinstance(node, cst.SimpleStatementLine):
                return node if isinstance(stack[i - 1], (cst.IndentedBlock, cst.Module)) else None
        return None

    @staticmethod
    def _step_always_follows(clip: _Event, statement: cst.CSTNode, step: _Event) -> bool:
        """Is the step a later statement of a block that holds the clip, with no
        loop in between and no jump between them?"""
        clip_stack, step_stack = clip.stack, step.stack
        depth = 0
        for x, y in zip(clip_stack, step_stack):
            if x is not y:
                break
            depth += 1
        block = clip_stack[depth - 1] if depth else None
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return False
        clip_holder, step_holder = clip_stack[depth], step_stack[depth]
        # the step itself must run unconditionally in that block
        for node in step_stack[depth:]:
            if isinstance(node, (cst.If, cst.For, cst.While, cst.Try, cst.With, cst.FunctionDef, cst.Match)):
                if not isinstance(node, cst.With):
                    return False
        for node in clip_stack[depth:]:
            if isinstance(node, (cst.For, cst.While, cst.FunctionDef, cst.Lambda, cst.ListComp, cst.GeneratorExp)):
                return False
        body: List[cst.CSTNode] = list(block.body)
        start, end = body.index(clip_holder), body.index(step_holder)
        for between in body[start + 1 : end]:
            for sub in iter_subtree(between):
                if isinstance(sub, (cst.Continue, cst.Break, cst.Return, cst.Raise)):
                    return False
        return True


def _earlier_clip_on_path(clip: _Event, earlier: List[_Event]) -> bool:
    return any(e.kind == CLIP and not exclusive_branches(e.stack, clip.stack) for e in earlier)
