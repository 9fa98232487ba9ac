from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst

from torchlint.model import Site, dotted_name, keyword, per_batch_evidence, tensor_evidence
from torchlint.rule import Invalid, Rule, Valid

# torch functions whose output size depends on the values of their input.
_SHAPE_FUNCTIONS = {
    "torch.nonzero": "nonzero",
    "torch.argwhere": "argwhere",
    "torch.masked_select": "masked_select",
    "torch.unique": "unique",
    "torch.unique_consecutive": "unique_consecutive",
    "torch.Tensor.nonzero": "nonzero",
}
# Tensor methods of the same kind. Those that numpy/pandas objects also have
# need evidence that the receiver is a tensor; the torch-only ones do not.
_TORCH_ONLY_METHODS = frozenset({"masked_select", "unique_consecutive", "nonzero_static"})
_SHARED_METHODS = frozenset({"nonzero", "unique", "argwhere"})
# Calls whose result is a boolean mask: the comparisons and tests, as tensor methods and as torch functions.
_MASK_NAMES = (
    "eq", "ne", "gt", "ge", "lt", "le", "isnan", "isinf", "isfinite",
    "logical_and", "logical_or", "logical_not", "logical_xor", "isin",
)  # fmt: skip
_MASK_METHODS = frozenset({"bool", *_MASK_NAMES})
_MASK_FUNCTIONS = frozenset("torch." + name for name in (*_MASK_NAMES, "isneginf", "isposinf"))


class DataDependentShapeInLoop(Rule):
    """## What it does
    Flags operations whose output *size* depends on the values in a tensor,
    when they run in the body of a training or evaluation loop: `nonzero()`,
    `argwhere()`, `masked_select()`, `unique()`, `unique_consecutive()`,
    single-argument `torch.where(mask)`, boolean-mask indexing (`x[mask]`,
    `x[x > 0]`), and `repeat_interleave` with a tensor of repeats and no
    `output_size=`.

    It complements TL101 (`host-sync-in-loop`): these calls never mention the
    host, yet each one synchronizes to learn how large its result is.

    The rule stays silent for boolean-mask *assignment* (`x[mask] = 0`, which
    PyTorch turns into a masked fill), for `repeat_interleave` with an integer
    repeat count or `output_size=`, for numpy arrays, under periodic guards,
    on exception paths, and outside batch loops.

    Test modules (`test_*.py`, `*_test.py`, `conftest.py`, files under
    `test/`, `tests/` or `testing/`) are skipped: a test that reads data-dependent results inside its loops
    checks a result on purpose, and its speed is not the training run's.
    Set the `check-tests` option to check them too.

    ## Why is this bad?
    The size of the result is known only after the GPU has computed the
    input, so PyTorch copies a count back to the host and waits for it before
    it can allocate the output. The host stops queueing work, the GPU drains,
    and every batch pays that round trip. Fixed-size formulations keep the
    pipeline full: `torch.where(mask, x, 0)`, `x.masked_fill(~mask, 0)`,
    multiplying by `mask`, weighting a reduction by the mask, or passing
    `output_size=` to `repeat_interleave`. Data-dependent shapes also break
    CUDA graphs and cause graph breaks under `torch.compile`.

    ## Example
    ```python
    for images, labels in loader:
        logits = model(images)
        valid = labels != -100
        loss = criterion(logits[valid], labels[valid])
        loss.backward()
    ```

    Use instead:
    ```python
    for images, labels in loader:
        logits = model(images)
        loss = criterion(logits, labels)  # CrossEntropyLoss(ignore_index=-100)
        loss.backward()
    ```

    ## Fix safety
    There is no automatic fix: a fixed-size rewrite changes the shape of the
    result, and the code that consumes it has to change with it.

    ## References
    - [`torch.cuda.set_sync_debug_mode` (reports these syncs at run time)](https://pytorch.org/docs/stable/generated/torch.cuda.set_sync_debug_mode.html)
    - [`torch.nonzero`: the note on synchronization](https://pytorch.org/docs/stable/generated/torch.nonzero.html)
    - [`torch.repeat_interleave`: `output_size` avoids a synchronization](https://pytorch.org/docs/stable/generated/torch.repeat_interleave.html)
    - [`torch.where`](https://pytorch.org/docs/stable/generated/torch.where.html)
    - [Performance tuning guide: avoid unnecessary CPU-GPU synchronization](https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html#avoid-unnecessary-cpu-gpu-synchronization)
    """

    code = "TL103"
    name = "data-dependent-shape-in-loop"
    summary = "An operation with a data-dependent output size syncs on every batch"
    fix_availability = "none"
    # No text pre-filter: a helper without loops runs per batch when a loop in
    # another file of the project calls it.

    VALID = [
        # Masked assignment is a masked fill: no sync.
        Valid("""
            for x, y in loader:
                out = model(x)
                out[out < 0] = 0
                loss = criterion(out, y)
        """),
        # torch.where with three arguments is fixed-size.
        Valid("""
            import torch
            for x, y in loader:
                out = model(x)
                out = torch.where(out > 0, out, 0.0)
        """),
        # repeat_interleave with an int count or with output_size.
        Valid("""
            import torch
            for batch in loader:
                keys = model(batch)
                keys = keys.repeat_interleave(n_rep, dim=1)
                idx = torch.repeat_interleave(ids, counts, output_size=total)
        """),
        # numpy arrays.
        Valid("""
            import numpy as np
            for batch in loader:
                arr = np.asarray(batch)
                kept = arr[arr > 0]
                idx = arr.nonzero()
        """),
        # Outside any batch loop.
        Valid("""
            import torch
            def select(x):
                return x[x > 0]
            classes = torch.unique(targets)
        """),
        # Periodic guard.
        Valid("""
            import torch
            for step, batch in enumerate(loader):
                logits = model(batch)
                if step % 100 == 0:
                    seen = torch.unique(logits.argmax(-1))
        """),
        # A generation loop, not a batch loop.
        Valid("""
            import torch
            for t in range(max_len):
                logits = model(tokens)
                finished = torch.nonzero(logits.argmax(-1) == eos)
        """),
        # Indexing with integers, slices or lists.
        Valid("""
            for x, y in loader:
                out = model(x)
                first = out[0]
                head = out[:, :10]
                picked = out[[0, 2]]
                last = out[idx]
        """),
        # Pandas-style unique on something that is not a tensor.
        Valid("""
            for batch in loader:
                names = frame["label"].unique()
                loss = model(batch)
                loss.backward()
        """),
    ]

    INVALID = [
        Invalid(
            """
            for images, labels in loader:
                logits = model(images)
                valid = labels != -100
                loss = criterion(logits[valid], labels[valid])
                loss.backward()
            """,
            line=4,
            message="boolean-mask indexing",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                out = model(batch)
                idx = torch.nonzero(out > 0.5)
            """,
            message="`nonzero()`",
        ),
        Invalid(
            """
            for batch in loader:
                out = model(batch)
                positive = out[out > 0]
            """,
        ),
        Invalid(
            """
            import torch as T
            for batch in train_loader:
                logits = model(batch)
                kept = T.masked_select(logits, logits > 0)
                loss = kept.mean()
                loss.backward()
            """,
            message="`masked_select()`",
        ),
        Invalid(
            """
            for batch in loader:
                preds = model(batch).argmax(-1)
                classes = preds.unique()
            """,
            message="`unique()`",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                logits = model(batch)
                rows, cols = torch.where(logits > 0)
            """,
            message="`torch.where(condition)`",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                counts = model(batch)
                idx = torch.repeat_interleave(counts)
                ids = batch.ids.repeat_interleave(counts, dim=0)
            """,
            count=2,
            message="`repeat_interleave()`",
        ),
        Invalid(
            """
            import torch
            def masked_loss(logits, mask):
                keep = mask.bool()
                return logits[keep].mean()

            for batch in loader:
                loss = masked_loss(model(batch), batch.mask)
                loss.backward()
            """,
            line=4,
            message="called from",
        ),
        Invalid(
            """
            import torch
            for batch in loader:
                out = model(batch)
                bad = torch.isnan(out)
                clean = out[~bad]
                where = out.nonzero()
            """,
            count=2,
        ),
    ]

    def __init__(self, ctx, options) -> None:
        super().__init__(ctx, options)
        self.candidates: List[Tuple[Site, cst.CSTNode, str]] = []

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.loop is None and self.ctx.function is None:
            return
        what = self._call_kind(node)
        if what is not None:
            self._candidate(node, what)

    def visit_Subscript(self, node: cst.Subscript) -> None:
        ctx = self.ctx
        if ctx.loop is None and ctx.function is None:
            return
        if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
            return
        parent = ctx.current_parent()
        if isinstance(parent, (cst.AssignTarget, cst.AugAssign)) or (
            isinstance(parent, cst.AnnAssign) and parent.target is node
        ):
            return  # masked assignment: a masked fill, no sync
        if isinstance(parent, (cst.Element, cst.StarredElement)) and _in_assign_target(ctx.ancestry()):
            return
        mask = node.slice[0].slice.value
        is_mask, mask_evidence = self._mask_evidence(mask)
        if not is_mask:
            return
        value_evidence = tensor_evidence(ctx, node.value)
        if value_evidence is False or mask_evidence is False:
            return
        if value_evidence is True or mask_evidence is True:
            self._candidate(node, "boolean-mask indexing")

    def _mask_evidence(self, mask: cst.BaseExpression, depth: int = 0) -> Tuple[bool, Optional[bool]]:
        """(is ``mask`` evidently boolean, its tensor evidence)."""
        ctx = self.ctx
        expr = mask
        if depth > 4:  # ``mask = ~mask``, ``m = m & other``: names that refer to themselves
            return False, None
        depth += 1
        if isinstance(expr, (cst.Name, cst.Attribute)):
            value = ctx.value_of(dotted_name(expr))
            if value is None:
                return False, None
            expr = value
        if isinstance(expr, cst.Comparison):
            if any(isinstance(t.operator, (cst.Is, cst.IsNot, cst.In, cst.NotIn)) for t in expr.comparisons):
                return False, None
            return True, tensor_evidence(ctx, expr)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.BitInvert):
            return self._mask_evidence(expr.expression, depth)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, (cst.BitAnd, cst.BitOr)):
            left, right = self._mask_evidence(expr.left, depth), self._mask_evidence(expr.right, depth)
            if not (left[0] or right[0]):
                return False, None
            answers = (left[1], right[1])
            return True, (True if True in answers else (False if False in answers else None))
        if isinstance(expr, cst.Call):
            qname = ctx.qualified_name(expr.func)
            if qname in _MASK_FUNCTIONS:
                return True, True
            if (
                isinstance(expr.func, cst.Attribute)
                and expr.func.attr.value in _MASK_METHODS
                and not (qname or "").startswith(("numpy.", "np."))
            ):
                if expr.func.attr.value == "bool":
                    if expr.args:
                        return False, None
                    # ``.bool()`` is a tensor method (numpy arrays have none)
                    return True, tensor_evidence(ctx, expr.func.value) is not False or None
                return True, tensor_evidence(ctx, expr.func.value)
        return False, None

    def _call_kind(self, node: cst.Call) -> Optional[str]:
        ctx = self.ctx
        qname = ctx.qualified_name(node.func)
        if qname in _SHAPE_FUNCTIONS:
            if keyword(node, "size") is not None:
                return None  # torch.nonzero_static-style fixed size
            return f"`{_SHAPE_FUNCTIONS[qname]}()`"
        if qname == "torch.where" and len([a for a in node.args if not a.keyword]) == 1 and len(node.args) == 1:
            return "`torch.where(condition)`"
        if qname == "torch.repeat_interleave":
            return self._repeat_interleave(node, positional_repeats=1)
        func = node.func
        if not isinstance(func, cst.Attribute) or (qname or "").startswith("torch."):
            return None
        method = func.attr.value
        if method == "repeat_interleave":
            if tensor_evidence(ctx, func.value) is False:
                return None
            return self._repeat_interleave(node, positional_repeats=0)
        if method in _TORCH_ONLY_METHODS and method != "nonzero_static":
            if tensor_evidence(ctx, func.value) is False:
                return None
            return f"`{method}()`"
        if method in _SHARED_METHODS and tensor_evidence(ctx, func.value) is True:
            return f"`{method}()`"
        return None

    def _repeat_interleave(self, node: cst.Call, positional_repeats: int) -> Optional[str]:
        if keyword(node, "output_size") is not None:
            return None
        positional = [a for a in node.args if a.keyword is None and not a.star]
        repeats_arg = keyword(node, "repeats")
        if repeats_arg is not None:
            repeats = repeats_arg.value
        elif len(positional) > positional_repeats:
            repeats = positional[positional_repeats].value
        elif positional_repeats == 1 and len(positional) == 1:
            return "`repeat_interleave()`"  # torch.repeat_interleave(repeats): repeats is a tensor
        else:
            return None
        if tensor_evidence(self.ctx, repeats) is True or _named_like_counts(repeats):
            return "`repeat_interleave()` with a tensor of repeats"
        return None

    def _candidate(self, node: cst.CSTNode, what: str) -> None:
        self.candidates.append((self.ctx.site(), node, what))

    def finish(self) -> None:
        for site, node, what in self.candidates:
            loop, helper = site.per_step()
            if loop is None:
                continue
            advice = (
                "pass `output_size=`"
                if "repeat_interleave" in what
                else "use a fixed-size form such as `torch.where(mask, x, 0)` or `masked_fill`, or weight by the mask"
            )
            if helper is None:
                message = (
                    f"{what} has a data-dependent output size and syncs with the host on every iteration of "
                    f"{loop.line_hint}; {advice}"
                )
            else:
                message = (
                    f"{what} in `{helper.name}()` has a data-dependent output size "
                    "and syncs with the host once per batch: "
                    f"it is called from {loop.line_hint}; {advice}"
                )
            self.report(node, message, evidence=[per_batch_evidence(loop, helper)])


def _named_like_counts(expr: cst.BaseExpression) -> bool:
    """``counts``/``lengths``/``seq_lens`` passed as repeats: a per-item tensor."""
    name = dotted_name(expr)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1].lower()
    return last.endswith(("counts", "lengths", "lens", "sizes", "repeats"))


def _in_assign_target(stack) -> bool:
    for ancestor in reversed(stack[:-1]):
        if isinstance(ancestor, (cst.AssignTarget, cst.AugAssign)):
            return True
        if isinstance(ancestor, (cst.BaseSmallStatement, cst.BaseCompoundStatement)):
            return False
    return False
