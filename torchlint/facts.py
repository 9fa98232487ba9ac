"""Module-wide facts, gathered during the single walk of a file.

The engine (not the rules) records what several rules need to know about the
module as a whole: its functions and who calls them, its loops and whether
each one runs once per batch, its DataLoaders, dict literals passed as
``**kwargs``, and names that hold ``torch.cuda.is_available()``. The facts are
complete only when the walk ends, which is why rules that depend on them
collect candidates and decide in ``finish()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Set

import libcst as cst

from torchlint.names import ImportTable, dotted_name, last_name
from torchlint.tree import iter_subtree
from torchlint.vocabulary import (
    BATCH_PULL_METHODS,
    DATA_SOURCE_NAME,
    ITERATES_ARGUMENT,
    NOT_BATCHES,
    PER_ITEM_WORK,
    framework_of_base,
)

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.crossfile import ProjectAnalysis


@dataclass(eq=False)
class FunctionInfo:
    node: cst.FunctionDef
    name: str
    class_name: Optional[str]
    parent: Optional["FunctionInfo"]
    calls: Set[str] = field(default_factory=set)
    # functions imported from other modules that it calls, by imported name (``engine.train_one_epoch``)
    imported_calls: Set[str] = field(default_factory=set)
    trains: bool = False  # calls backward() or an optimizer/scaler step itself
    uses_no_grad: bool = False  # a no_grad()/inference_mode() anywhere inside
    has_inner_def: bool = False
    params: List[str] = field(default_factory=list)
    # names that hold what a caller passed: the parameters, ``*args``/``**kwargs``,
    # and the targets of loops over them (``for k, v in kwargs.items()``)
    argument_names: Set[str] = field(default_factory=set)
    # names whose ``.backward()`` the function calls (``loss.backward()``,
    # ``scaler.scale(loss).backward()``): tensors that carry autograd history
    backward_names: Set[str] = field(default_factory=set)
    # A backward()/optimizer step outside the function's own loops: one call
    # of the function is one training step.
    steps_per_call: bool = False
    # ``optimizer.step()`` / ``scaler.step(optimizer)`` outside its own loops:
    # every call of the function is one training step
    steps_optimizer: bool = False
    # (callee name, Site) for every call of a module function or method
    call_sites: List[tuple] = field(default_factory=list)
    # parameters called inside the function (``step_fn(batch)``)
    called_params: Set[str] = field(default_factory=set)
    # (the call that built the receiver, method name, Site, passes a tensor):
    # ``meter.update(x)`` where ``meter = AverageMeter()`` in scope, outside the function's loops
    method_calls: List[tuple] = field(default_factory=list)

    @property
    def qualname(self) -> str:
        return f"{self.class_name}.{self.name}" if self.class_name else self.name


@dataclass(eq=False)
class LoopInfo:
    node: cst.CSTNode  # cst.For or cst.While
    function: Optional[FunctionInfo]
    parent: Optional["LoopInfo"]
    iterates_data: bool = False
    trains: bool = False
    pulls_batches: bool = False  # next(<data source>) or <data source>.next_batch() in the body
    calls: Set[str] = field(default_factory=set)
    # functions imported from other modules that the body calls, by imported name
    imported_calls: Set[str] = field(default_factory=set)
    # callee name -> the sites (``torchlint.analysis.Site``) of its calls in the body
    call_sites: Dict[str, list] = field(default_factory=dict)
    # (the call that built the receiver, method name, Site, passes a tensor) for ``meter.update(x)`` in the body
    method_calls: List[tuple] = field(default_factory=list)
    _facts: Optional["ModuleFacts"] = field(default=None, repr=False)

    @property
    def is_generation_loop(self) -> bool:
        """``while`` or ``for … in range(…)`` without training: decoding, sampling,
        polling. Their control flow usually needs values on the host."""
        if self.is_batch_loop:
            return False
        if isinstance(self.node, cst.While):
            return True
        iterable = self.node.iter  # type: ignore[attr-defined]
        if isinstance(iterable, cst.NamedExpr):  # ``for _ in (pbar := trange(n))``
            iterable = iterable.value
        return isinstance(iterable, cst.Call) and dotted_name(iterable.func) in ("range", "trange", "tqdm.trange")

    @property
    def is_batch_loop(self) -> bool:
        """Runs once per batch: iterates a data source, pulls batches with
        ``next()``, trains in its own body, or calls a function that runs one
        training step per call. An epoch loop calling ``train_one_epoch()``
        (which loops over the data itself) is not one, nor is a sweep over a
        literal list of settings. The one definition every rule uses; exact
        only after the walk."""
        if isinstance(self.node, cst.For) and isinstance(self.node.iter, (cst.List, cst.Tuple, cst.Set)):
            return False
        if self.iterates_data or self.trains or self.pulls_batches:
            return True
        return self._facts is not None and any(self._facts.steps_per_call(c) for c in self.calls)

    @property
    def line_hint(self) -> str:
        """``for step, (x, y) in enumerate(loader)``: how a message names the loop."""
        if isinstance(self.node, cst.For):
            return f"`for {_short(self.node.target)} in {_short(self.node.iter)}`"
        return "`while` loop"


class TrainingStep:
    """Stands for the loop that makes code hot when the reason is a function
    that steps the optimizer once per call (``optimize()`` calling
    ``opt.step()``): every call of it is one training step."""

    __slots__ = ("function",)
    node = None
    parent = None

    def __init__(self, function: FunctionInfo) -> None:
        self.function = function

    @property
    def line_hint(self) -> str:
        return f"every training step (`{self.function.name}()` steps the optimizer once per call)"


class FrameworkStep:
    """Stands for the loop that makes code hot when a training framework
    calls the method once per batch (a ``LightningModule``'s
    ``training_step``, a basicsr model's ``feed_data``): the loop is the
    framework's, not in this code."""

    __slots__ = ("function", "framework", "base")
    node = None
    parent = None

    def __init__(self, function: FunctionInfo, framework: str, base: str) -> None:
        self.function = function
        self.framework = framework
        self.base = base

    @property
    def line_hint(self) -> str:
        return (
            f"`{self.function.name}()`, which {self.framework} calls once per batch "
            f"(`{self.function.class_name}` derives from `{self.base}`)"
        )


@dataclass(eq=False)
class LoaderInfo:
    """A ``DataLoader(...)`` call and where its result is stored."""

    call: Optional[cst.Call]  # None for a loader passed in from another file
    target: Optional[str]  # dotted name it is assigned to, if any
    pinned: Optional[bool]  # True / False / None when it can't be seen
    num_workers: Optional[cst.BaseExpression]
    sampler: Optional[cst.BaseExpression]
    function: Optional[FunctionInfo]
    # for a loader built in another file of the project: "main.py:12"
    where: Optional[str] = None
    # a loader passed in from another file (``call`` is None there): built without a ``collate_fn``
    default_collate: bool = False


def uses_default_collate(call: Optional[cst.Call]) -> bool:
    """``DataLoader(...)`` without a ``collate_fn`` (by keyword, by position,
    or possibly inside ``**kwargs``): its batches are torch tensors."""
    if call is None:
        return False
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    return len(positional) <= 6 and not any(
        arg.star or (arg.keyword is not None and arg.keyword.value == "collate_fn") for arg in call.args
    )


def _short(node: cst.CSTNode, depth: int = 0) -> str:
    """A compact rendering of a loop target or iterable for messages."""
    name = dotted_name(node)
    if name is not None:
        return name
    if isinstance(node, (cst.Tuple, cst.List)) and depth < 2:
        inner = ", ".join(_short(e.value, depth + 1) for e in node.elements)
        return f"({inner})" if depth else inner
    if isinstance(node, cst.Call) and depth < 2:
        func = dotted_name(node.func) or "..."
        first = _short(node.args[0].value, depth + 1) if node.args else ""
        more = ", ..." if len(node.args) > 1 else ""
        return f"{func}({first}{more})"
    return "..."


@dataclass(eq=False)
class TrainerRun:
    """A framework trainer built and run in this module: ``runner = Runner(...)``
    then ``runner.train()`` (mmengine), ``trainer.fit(model)`` (Lightning)."""

    framework: str  # "mmengine", "lightning"
    constructor: cst.Call
    run: cst.Call
    function: Optional[FunctionInfo]  # where the run is called (None: module level)
    # the arguments object the constructor is given (``args=TrainingArguments(...)``),
    # followed through the name it was assigned to; None when there is none or it cannot be seen
    arguments: Optional[cst.Call] = None


class ModuleFacts:
    def __init__(self, names: ImportTable, path: str = "", analysis: Optional["ProjectAnalysis"] = None) -> None:
        self.names = names
        self.path = path
        # the cross-file questions about the file's project (None: the file alone)
        self.analysis = analysis
        self.functions: Dict[str, List[FunctionInfo]] = {}
        self.loops: Dict[int, LoopInfo] = {}
        self.loaders: List[LoaderInfo] = []
        self.dict_literals: Dict[str, cst.CSTNode] = {}
        # module-level ``NAME = value`` assignments (the last one wins)
        self.module_constants: Dict[str, cst.BaseExpression] = {}
        # argparse: dest -> default (``action="store_true"`` -> False, ``set_defaults`` wins)
        self.argument_defaults: Dict[str, cst.BaseExpression] = {}
        self.set_defaults: Dict[str, cst.BaseExpression] = {}
        self.data_names: Set[str] = set()
        # (id(function node) or 0, name) -> the data source a name wraps whole
        # (``progress_bar = tqdm(train_loader)``, ``it = iter(loader)``)
        self.wrapped_sources: Dict[tuple, cst.BaseExpression] = {}
        self.cuda_flag_names: Set[str] = set()
        self.module_calls: Set[str] = set()
        # names whose ``.backward()`` the module's top level calls
        self.module_backward_names: Set[str] = set()
        # module functions handed to another call at the top level (a launcher:
        # ``mp.spawn(main_worker, ...)``, ``notebook_launcher(training_loop, ...)``)
        self.module_passed: Set[str] = set()
        self.trainer_runs: List[TrainerRun] = []
        # Functions whose whole body runs only with CUDA present (an early
        # ``if not torch.cuda.is_available(): raise``); None stands for the module.
        self.cuda_asserted_scopes: Set[Optional[cst.CSTNode]] = set()
        # Module functions used as decorators that wrap their target in no_grad.
        self.no_grad_decorators: Set[str] = set()
        # class name -> its bases' qualified (or dotted) names
        self.class_bases: Dict[str, List[str]] = {}
        self._trains_cache: Dict[str, bool] = {}
        self._step_cache: Dict[str, bool] = {}
        self._per_batch: Optional[Dict[int, tuple]] = None
        self._per_forward: Optional[Dict[int, FunctionInfo]] = None
        # dict values by (id(function node) or 0, name): key -> every value it is given
        self.dicts: Dict[tuple, Dict[str, List[cst.BaseExpression]]] = {}
        # batch data copied to the device (``x.to(device)`` of a batch, inside its loop)
        self.batch_copies: List = []
        # where each of batch_copies is copied (a Site), in the same order: a batch taken with
        # ``next()`` is copied once unless that place runs per step
        self.batch_copy_sites: List = []
        # calls of module functions: (callee, call node, caller FunctionInfo or None, resolved args)
        self.call_records: List["CallRecord"] = []
        # (id(function node) or 0, name) -> (call of a function imported from the
        # project, position in the returned tuple or None): ``a, loader = build(cfg)``
        self.returned: Dict[tuple, tuple] = {}
        # call_records by callee (the module's own calls), indexed as they come: see calls_of
        self._calls_by_callee: Dict[str, List["CallRecord"]] = {}
        self._calls_indexed = 0

    # -- queries ---------------------------------------------------------
    def function_trains(self, name: str) -> bool:
        """Does a module function of this name train, directly or through
        calls (of this module's functions, or of another file's of the project)?"""
        return self._transitively(
            name,
            lambda info: info.trains or self.trains_elsewhere(info.imported_calls) is not None,
            lambda info: info.calls,
            self._trains_cache,
        )

    def trains_in_module(self, name: str) -> bool:
        """``function_trains`` within this module alone (what another file asks of it)."""
        return self._transitively(name, lambda info: info.trains, lambda info: info.calls, {})

    def trains_elsewhere(self, imported: Set[str]) -> Optional[str]:
        """Where one of these functions of other files of the project trains
        (``engine.py:45``), if one does; None without a project to ask."""
        if self.analysis is None:
            return None
        for name in sorted(imported):
            where = self.analysis.imported_function_trains(self.path, name)
            if where is not None:
                return where
        return None

    def steps_per_call(self, name: str) -> bool:
        """Does one call of the module function ``name`` run one training step
        (backward or an optimizer step outside its own loops, directly or
        through such calls)?"""
        return self._transitively(
            name,
            lambda info: info.steps_per_call,
            lambda info: (callee for callee, site in info.call_sites if site.loop is None),
            self._step_cache,
        )

    def _transitively(self, name: str, holds, callees, cache: Dict[str, bool], seen: Optional[Set[str]] = None) -> bool:
        """Does ``holds`` hold for a module function of this name, or for one
        it reaches through ``callees``? Cached per top-level question."""
        cached = cache.get(name)
        if cached is not None:
            return cached
        top = seen is None
        seen = set() if seen is None else seen
        if name in seen:
            return False
        seen.add(name)
        result = any(
            holds(info) or any(self._transitively(c, holds, callees, cache, seen) for c in callees(info) if c != name)
            for info in self.functions.get(name, ())
        )
        if top:
            cache[name] = result
        return result

    def functions_run_per_batch(self) -> Dict[int, tuple]:
        """Module functions that run once per batch or more: called from a
        batch loop's body, or from such a function, or passed as a callable
        into one (``fit(loader, train_step)`` where ``fit`` calls its parameter
        in the loop), at call sites that are neither under a periodic guard
        nor on an exception path. Maps id(FunctionInfo) -> (loop, function).
        Exact after the walk; computed once."""
        if self._per_batch is not None:
            return self._per_batch
        reached: Dict[int, tuple] = {}
        frontier: List[tuple] = []
        queued: Set[str] = set()
        # function name -> (its parameters called per batch, the loop that makes them hot)
        hot_params: Dict[str, tuple] = {}
        for loop in self.loops.values():
            if not loop.is_batch_loop:
                continue
            for callee, sites in loop.call_sites.items():
                if any(s.runs_every_step(within=loop) for s in sites):
                    frontier.append((callee, loop))
            if loop.function is not None:
                called = {p for p in loop.function.called_params if p in loop.call_sites}
                if called:
                    hot_params[loop.function.name] = (called, loop)
        # A method a training framework calls once per batch, and its callees.
        for infos in self.functions.values():
            for info in infos:
                driven = self.framework_step(info)
                if driven is not None and id(info) not in reached:
                    reached[id(info)] = (driven, info)
                    for inner, site in info.call_sites:
                        if site.loop is None and site.runs_every_step():
                            frontier.append((inner, driven))
        # A function that takes one optimizer step per call runs once per
        # training step wherever it is called from, and so do its callees.
        for infos in self.functions.values():
            for info in infos:
                if info.steps_optimizer and id(info) not in reached and not self._entry_point(info):
                    step = TrainingStep(info)
                    reached[id(info)] = (step, info)
                    for inner, site in info.call_sites:
                        if site.loop is None and site.runs_every_step():
                            frontier.append((inner, step))
        while frontier:
            while frontier:
                callee, loop = frontier.pop()
                for info in self.functions.get(callee, ()):
                    if id(info) in reached or info is loop.function:
                        continue
                    reached[id(info)] = (loop, info)
                    for inner, site in info.call_sites:
                        if site.runs_every_step():
                            frontier.append((inner, loop))
                    if info.called_params and info.name not in hot_params:
                        hot_params[info.name] = (info.called_params, loop)
            # callables handed to a function that calls them per batch
            for record in self.call_records:
                entry = hot_params.get(record.callee)
                if entry is None or record.imported:
                    continue
                params, hot_loop = entry
                for info in self.functions.get(record.callee, ()):
                    for param, value in record.bind(info.params).items():
                        if param in params and isinstance(value, cst.Name) and value.value in self.functions:
                            if value.value not in queued:
                                queued.add(value.value)
                                frontier.append((value.value, hot_loop))
        self._per_batch = reached
        return reached

    def functions_run_per_forward(self) -> Dict[int, FunctionInfo]:
        """Functions that run on every forward pass of a module: a
        ``forward()`` method, and the methods of its class and module
        functions it calls (transitively) at sites that are neither under a
        periodic guard nor on an exception path. Maps id(FunctionInfo) -> the
        ``forward()`` that reaches it. Exact after the walk; computed once."""
        if self._per_forward is not None:
            return self._per_forward
        reached: Dict[int, FunctionInfo] = {}
        frontier: List[tuple] = []
        for info in self.functions.get("forward", ()):
            if info.class_name is not None and info.parent is None:
                reached[id(info)] = info
                frontier.extend((callee, site, info, info) for callee, site in info.call_sites)
        while frontier:
            callee, site, caller, forward = frontier.pop()
            if not site.runs_every_step():
                continue
            for info in self.functions.get(callee, ()):
                if id(info) in reached or info.parent is not None:
                    continue
                if info.class_name is not None and info.class_name != caller.class_name:
                    continue  # a method of another class that happens to share the name
                reached[id(info)] = forward
                frontier.extend((inner, inner_site, info, forward) for inner, inner_site in info.call_sites)
        self._per_forward = reached
        return reached

    def framework_step(self, info: FunctionInfo) -> Optional[FrameworkStep]:
        """The framework that calls this method once per batch, when its class
        derives (directly, or through classes of this module) from a base the
        framework drives and the method is one of its per-batch hooks."""
        if info.class_name is None or info.parent is not None:
            return None
        seen: Set[str] = set()
        classes = [info.class_name]
        while classes:
            name = classes.pop()
            if name in seen:
                continue
            seen.add(name)
            for base in self.class_bases.get(name, ()):
                known = framework_of_base(base)
                if known is not None:
                    framework, methods = known
                    return FrameworkStep(info, framework, base) if info.name in methods else None
                if base in self.class_bases:
                    classes.append(base)
        return None

    def _entry_point(self, info: FunctionInfo) -> bool:
        """``main()`` or a function the module calls at its top level: one call,
        however many steps it takes inside."""
        return info.name in ("main", "run", "cli") or (
            info.class_name is None and (info.name in self.module_calls or info.name in self.module_passed)
        )

    def callers_of(self, function: FunctionInfo) -> Set[str]:
        """Names of module functions that reach ``function`` through calls (itself included)."""
        callers = {function.name}
        frontier = [function.name]
        while frontier:
            name = frontier.pop()
            for infos in self.functions.values():
                for info in infos:
                    if name in info.calls and info.name not in callers:
                        callers.add(info.name)
                        frontier.append(info.name)
        return callers

    def is_data_source(self, node: cst.CSTNode) -> bool:
        """Is iterating ``node`` iterating batches?"""
        if isinstance(node, cst.IfExp):
            # ``for batch in (dl if streaming else distr_dl)``
            return self.is_data_source(node.body) or self.is_data_source(node.orelse)
        while isinstance(node, cst.Call):
            name = last_name(node.func)
            if name in ITERATES_ARGUMENT and node.args:
                if name == "zip":
                    return any(self.is_data_source(a.value) for a in node.args)
                node = node.args[0].value
                continue
            qname = self.names.qualified_name(node.func) or ""
            if name and (DATA_SOURCE_NAME.search(name) or name.endswith("DataLoader") or qname.endswith("DataLoader")):
                return True
            # ``metric_logger.log_every(loader, 10)``, ``prefetch(loader)``: a call
            # that receives the loader and is iterated yields its batches.
            if name not in NOT_BATCHES and any(
                not a.keyword and not a.star and self.is_data_source(a.value) for a in node.args[:2]
            ):
                return True
            return False
        if isinstance(node, cst.IfExp):
            # ``enumerate(dl if streaming else distr_dl)``
            return self.is_data_source(node)
        dotted = dotted_name(node)
        if dotted is None:
            return False
        if dotted in self.data_names:
            return True
        name = dotted.rsplit(".", 1)[-1]
        return bool(DATA_SOURCE_NAME.search(name))

    def pulls_batch(self, call: cst.Call) -> bool:
        """Does this call hand out one batch of a data source: ``next(loader_iter)``
        or ``train_loader.next_batch()``?"""
        func = call.func
        if isinstance(func, cst.Name):
            return func.value == "next" and bool(call.args) and self.is_data_source(call.args[0].value)
        return (
            isinstance(func, cst.Attribute)
            and func.attr.value in BATCH_PULL_METHODS
            and not call.args
            and self.is_data_source(func.value)
        )

    def loader_for(
        self, node: cst.CSTNode, function: Optional[FunctionInfo] = None, _depth: int = 0
    ) -> Optional[LoaderInfo]:
        """The DataLoader whose batches iterating ``node`` (in ``function``)
        yields, if visible: a loader bound in the same scope, a module-level
        one, one stored on ``self``, or, for a parameter, the loader every
        call of the function in this module passes for it."""
        while isinstance(node, cst.Call) and node.args and self.yields_first_argument(node):
            node = node.args[0].value
        if isinstance(node, cst.IfExp):
            # ``dl if streaming else distr_dl``: the loader either branch names
            return self.loader_for(node.body, function, _depth) or self.loader_for(node.orelse, function, _depth)
        if isinstance(node, cst.Call):
            for loader in self.loaders:
                if loader.call is node:
                    return loader
            return None
        dotted = dotted_name(node)
        if dotted is None:
            return None
        if dotted.startswith("self."):
            matches = [candidate for candidate in self.loaders if candidate.target == dotted]
            if not matches:
                matches = [
                    candidate
                    for candidate in self.loaders
                    if candidate.target and candidate.target.split(".")[-1] == dotted.split(".")[-1]
                ]
            return matches[-1] if matches else None
        wrapped = self.wrapped_sources.get((id(function.node) if function is not None else 0, dotted))
        if wrapped is not None and _depth < 4:
            return self.loader_for(wrapped, function, _depth + 1)
        same_scope = [
            candidate for candidate in self.loaders if candidate.target == dotted and candidate.function is function
        ]
        if same_scope:
            return same_scope[-1]
        returned = self.returned.get((id(function.node) if function is not None else 0, dotted))
        if returned is not None:
            if self.analysis is None:
                return None
            return self.analysis.returned_loader(self.path, self.names, returned[0], returned[1])
        if function is not None and dotted in function.params and _depth < 4:
            passed = self._loader_passed_for(function, dotted, _depth)
            if passed is not None or self._bound_by_a_call(function, dotted):
                return passed
            # No call in the module says what the parameter is: a loader that
            # another file of the project passes for it, else a loader of the
            # same name that a builder function of the module makes.
            passed = self.analysis.loader_passed(self.path, function, dotted) if self.analysis is not None else None
            if passed is not None:
                return passed
            built = [
                candidate for candidate in self.loaders if candidate.target == dotted and candidate.function is not None
            ]
            return built[-1] if built else None
        module_level = [
            candidate for candidate in self.loaders if candidate.target == dotted and candidate.function is None
        ]
        return module_level[-1] if module_level else None

    def calls_of(self, name: str) -> List["CallRecord"]:
        """This module's own (not imported) calls of ``name``, in order.

        Questions about one function's callers are asked for every function;
        scanning every call record for each would make a file of many
        functions quadratic, so records are indexed by callee as they come."""
        for record in self.call_records[self._calls_indexed :]:
            if not record.imported:
                self._calls_by_callee.setdefault(record.callee, []).append(record)
        self._calls_indexed = len(self.call_records)
        return self._calls_by_callee.get(name, [])

    def param_receives_tensor(self, function: Optional[FunctionInfo], param: str) -> bool:
        """Does a call of ``function`` in this module pass a tensor for
        ``param`` (``log_metrics(step, loss)`` with ``loss`` a model's loss)?"""
        if function is None:
            return False
        for record in self.calls_of(function.name):
            if not record.tensors:
                continue
            value = record.bind(function.params).get(param)
            if value is not None and id(value) in record.tensors:
                return True
        return False

    def _bound_by_a_call(self, function: FunctionInfo, param: str) -> bool:
        return any(param in record.bind(function.params) for record in self.calls_of(function.name))

    def _loader_passed_for(self, function: FunctionInfo, param: str, depth: int) -> Optional[LoaderInfo]:
        """The loader bound to ``param`` at the calls of ``function``, when all
        the calls that pass something visible agree."""
        found: List[LoaderInfo] = []
        for record in self.calls_of(function.name):
            value = record.bind(function.params).get(param)
            if value is None:
                continue
            loader = record.loaders.get(id(value))
            if loader is None:
                loader = self.loader_for(value, record.caller, depth + 1)
            if loader is not None:
                found.append(loader)
        if not found:
            return None
        pinned = [candidate for candidate in found if candidate.pinned]
        return pinned[0] if pinned else found[0]

    def yields_first_argument(self, call: cst.Call) -> bool:
        """Iterating ``call`` yields the items of its first argument:
        ``enumerate(loader)``, ``tqdm(loader)``, ``log_every(loader, 10)``."""
        name = last_name(call.func)
        if name in ITERATES_ARGUMENT:
            return True
        return (
            name not in NOT_BATCHES
            and not (name or "").endswith("DataLoader")
            and self.is_data_source(call.args[0].value)
        )


@dataclass(eq=False)
class CallRecord:
    """A call of a module function: its arguments, for binding to parameters."""

    callee: str
    call: cst.Call
    caller: Optional[FunctionInfo]
    # id(argument expression) -> the loader it evidently is, resolved at the call
    loaders: Dict[int, LoaderInfo] = field(default_factory=dict)
    method: bool = False  # ``self.fit(...)``: the first parameter is ``self``
    imported: bool = False  # ``engine.fit(...)``: a function of another module
    # ids of the arguments that are evidently tensors at the call
    tensors: Set[int] = field(default_factory=set)

    def bind(self, params: List[str]) -> Dict[str, cst.BaseExpression]:
        """Parameter name -> argument expression, positional and keyword alike
        (``*args``/``**kwargs`` arguments are not expanded)."""
        bound: Dict[str, cst.BaseExpression] = {}
        positional = params[1:] if self.method and params[:1] in (["self"], ["cls"]) else params
        index = 0
        for arg in self.call.args:
            if arg.star:
                if arg.star == "*":
                    index = len(positional)
                continue
            if arg.keyword is not None:
                bound[arg.keyword.value] = arg.value
            elif index < len(positional):
                bound[positional[index]] = arg.value
                index += 1
        return bound


def does_per_item_work(function: cst.FunctionDef) -> bool:
    """Does fetching one item (a ``__getitem__``) read, decode or transform a sample?"""

    return any(
        isinstance(sub, cst.Call) and last_name(sub.func) in PER_ITEM_WORK for sub in iter_subtree(function.body)
    )


# Loader classes that take a DataLoader's arguments: torch's, PyG's and the like
# (``*.DataLoader``), and torchdata's resumable ``StatefulDataLoader``.
_LOADER_CLASSES = ("DataLoader", "StatefulDataLoader")


def is_dataloader_call(names: ImportTable, call: cst.Call) -> bool:
    qname = names.qualified_name(call.func)
    if qname is not None:
        return qname.rpartition(".")[2] in _LOADER_CLASSES
    return last_name(call.func) in _LOADER_CLASSES


def keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def keyword_value(call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    found = keyword(call, name)
    return found.value if found is not None else None


def positional(call: cst.Call, index: int) -> Optional[cst.BaseExpression]:
    """The ``index``-th positional argument (``*args`` ends what can be known)."""
    plain = []
    for arg in call.args:
        if arg.star:
            break
        if arg.keyword is None:
            plain.append(arg)
    return plain[index].value if index < len(plain) else None


def literal_bool(node: Optional[cst.CSTNode]) -> Optional[bool]:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None
