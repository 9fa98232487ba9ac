"""Module-wide facts, gathered during the single walk of a file.

The engine (not the rules) records what several rules need to know about the
module as a whole: its functions and who calls them, its loops and whether
each one runs once per batch, its DataLoaders, dict literals passed as
``**kwargs``, and names that hold ``torch.cuda.is_available()``. The facts are
complete only when the walk ends, which is why rules that depend on them
collect candidates and decide in ``finish()``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set

import libcst as cst

from torchlint.names import ImportTable, dotted_name, last_name

# Names whose iteration yields batches. Matched against the last identifier.
_DATA_SOURCE = re.compile(
    r"(?i)(loader|(^|_)dl$|batches|batch_iter|data_?iter|prefetch|batch_gen|dataiter|feeder|minibatches)"
)
# Wrappers that pass their first argument's items through.
_PASS_THROUGH = {"enumerate", "tqdm", "iter", "islice", "zip", "progress", "track", "progress_bar", "chain"}

OPTIMIZER_NAME = re.compile(r"(?i)(optim|opt$|^opt|optimizer)")


@dataclass(eq=False)
class FunctionInfo:
    node: cst.FunctionDef
    name: str
    class_name: Optional[str]
    parent: Optional["FunctionInfo"]
    calls: Set[str] = field(default_factory=set)
    trains: bool = False  # calls backward() or an optimizer/scaler step itself
    uses_no_grad: bool = False  # a no_grad()/inference_mode() anywhere inside
    has_inner_def: bool = False

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
    pulls_batches: bool = False  # next(<data source>) in the body
    calls: Set[str] = field(default_factory=set)
    # callee name -> the sites (``torchlint.analysis.Site``) of its calls in the body
    call_sites: Dict[str, list] = field(default_factory=dict)
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
        return isinstance(iterable, cst.Call) and last_name(iterable.func) in ("range", "trange")

    @property
    def is_batch_loop(self) -> bool:
        """Runs once per batch: iterates a data source, or trains, directly or
        through a module function it calls. Exact only after the walk."""
        if self.iterates_data or self.trains or self.pulls_batches:
            return True
        return self._facts is not None and any(self._facts.function_trains(c) for c in self.calls)

    @property
    def line_hint(self) -> str:
        """``for step, (x, y) in enumerate(loader)``: how a message names the loop."""
        if isinstance(self.node, cst.For):
            return f"`for {_short(self.node.target)} in {_short(self.node.iter)}`"
        return "`while` loop"


@dataclass(eq=False)
class LoaderInfo:
    """A ``DataLoader(...)`` call and where its result is stored."""

    call: cst.Call
    target: Optional[str]  # dotted name it is assigned to, if any
    pinned: Optional[bool]  # True / False / None when it can't be seen
    num_workers: Optional[cst.BaseExpression]
    sampler: Optional[cst.BaseExpression]
    function: Optional[FunctionInfo]


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


class ModuleFacts:
    def __init__(self, names: ImportTable) -> None:
        self.names = names
        self.functions: Dict[str, List[FunctionInfo]] = {}
        self.loops: Dict[int, LoopInfo] = {}
        self.loaders: List[LoaderInfo] = []
        self.dict_literals: Dict[str, cst.CSTNode] = {}
        self.data_names: Set[str] = set()
        self.cuda_flag_names: Set[str] = set()
        self.module_calls: Set[str] = set()
        # Functions whose whole body runs only with CUDA present (an early
        # ``if not torch.cuda.is_available(): raise``); None stands for the module.
        self.cuda_asserted_scopes: Set[Optional[cst.CSTNode]] = set()
        # Module functions used as decorators that wrap their target in no_grad.
        self.no_grad_decorators: Set[str] = set()
        self._trains_cache: Dict[str, bool] = {}

    # -- queries ---------------------------------------------------------
    def function_trains(self, name: str, _seen: Optional[Set[str]] = None) -> bool:
        """Does a module function of this name train, directly or through calls?"""
        cached = self._trains_cache.get(name)
        if cached is not None:
            return cached
        seen = _seen if _seen is not None else set()
        if name in seen:
            return False
        seen.add(name)
        result = False
        for info in self.functions.get(name, ()):
            if info.trains or any(self.function_trains(c, seen) for c in info.calls):
                result = True
                break
        if _seen is None:
            self._trains_cache[name] = result
        return result

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
        while isinstance(node, cst.Call):
            name = last_name(node.func)
            if name in _PASS_THROUGH and node.args:
                if name == "zip":
                    return any(self.is_data_source(a.value) for a in node.args)
                node = node.args[0].value
                continue
            qname = self.names.qualified_name(node.func) or ""
            if name and (_DATA_SOURCE.search(name) or name.endswith("DataLoader") or qname.endswith("DataLoader")):
                return True
            return False
        dotted = dotted_name(node)
        if dotted is None:
            return False
        if dotted in self.data_names:
            return True
        name = dotted.rsplit(".", 1)[-1]
        return bool(_DATA_SOURCE.search(name))

    def loader_for(self, node: cst.CSTNode) -> Optional[LoaderInfo]:
        """The DataLoader whose batches iterating ``node`` yields, if visible."""
        while isinstance(node, cst.Call) and last_name(node.func) in _PASS_THROUGH and node.args:
            node = node.args[0].value
        if isinstance(node, cst.Call):
            for loader in self.loaders:
                if loader.call is node:
                    return loader
            return None
        dotted = dotted_name(node)
        if dotted is None:
            return None
        matches = [l for l in self.loaders if l.target == dotted]
        if not matches and dotted.startswith("self."):
            matches = [l for l in self.loaders if l.target and l.target.split(".")[-1] == dotted.split(".")[-1]]
        return matches[-1] if matches else None


def is_dataloader_call(names: ImportTable, call: cst.Call) -> bool:
    qname = names.qualified_name(call.func)
    if qname is not None:
        return qname.endswith(".DataLoader") or qname == "DataLoader"
    return last_name(call.func) == "DataLoader"


def keyword(call: cst.Call, name: str) -> Optional[cst.Arg]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg
    return None


def literal_bool(node: Optional[cst.CSTNode]) -> Optional[bool]:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None
