"""Per-file state shared by all rules during the single walk.

The engine's own bookkeeping (imports, functions, loops, DataLoaders, dict
literals, CUDA-availability flags) happens here, in ``enter_*`` hooks the
walker calls before any rule sees the node.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import libcst as cst

from torchlint.analysis import Site, is_no_grad_item, mentions_cuda_availability
from torchlint.facts import (
    OPTIMIZER_NAME,
    FunctionInfo,
    LoaderInfo,
    LoopInfo,
    ModuleFacts,
    is_dataloader_call,
    keyword,
    literal_bool,
)
from torchlint.names import ImportTable, dotted_name, last_name
from torchlint.rule import Edit, Fix

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.rule import Rule

# Stands for "one element of an unpacked value": known to be assigned, not what.
_UNKNOWN_PART = cst.Name("__unpacked__")
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})


class FileContext:
    def __init__(self, path: str, source: str, module: cst.Module, target_torch: Optional[Tuple[int, int]] = None) -> None:
        self.path = path
        self.source = source
        self.module = module
        self.target_torch = target_torch
        self.names = ImportTable()
        self.facts = ModuleFacts(self.names)
        self.stack: List[cst.CSTNode] = []
        self.function: Optional[FunctionInfo] = None
        self.loop: Optional[LoopInfo] = None
        self.class_names: List[str] = []
        # name -> the last expression assigned to it in the current scope, as
        # far as the walk has got: "what is x here?" for visit-time questions.
        self.values: Dict[str, cst.BaseExpression] = {}
        self.reports: List[Tuple["Rule", cst.CSTNode, str, Optional[Fix]]] = []
        self._recorded_loaders: Dict[int, LoaderInfo] = {}
        self._mentions_availability = "is_available" in source or "device_count" in source

    # -- for rules -------------------------------------------------------------
    def report(self, rule: "Rule", node: cst.CSTNode, message: str, fix: Optional[Fix] = None) -> None:
        self.reports.append((rule, node, message, fix))

    def site(self) -> Site:
        """A snapshot of where the current node sits; see ``torchlint.analysis``."""
        return Site(self, self.stack, self.function, self.loop)

    def qualified_name(self, node: cst.CSTNode) -> Optional[str]:
        return self.names.qualified_name(node)

    def facts_batch_caller(self, function: FunctionInfo) -> Optional[LoopInfo]:
        """A batch loop that calls ``function`` (perhaps through other module
        functions) at a site that runs every iteration. Exact after the walk."""
        callers = self.facts.callers_of(function)
        for loop in self.facts.loops.values():
            if loop.function is function or not loop.is_batch_loop:
                continue
            for name in callers & loop.calls:
                for site in loop.call_sites.get(name, ()):
                    if not site.in_exception_path() and not site.under_periodic_guard(within=loop):
                        return loop
        return None

    def torch_below(self, major: int, minor: int = 0) -> bool:
        """Does the project target a torch older than major.minor? False if unknown."""
        return self.target_torch is not None and self.target_torch < (major, minor)

    def code_for(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)

    @staticmethod
    def replace(node: cst.CSTNode, new: Any) -> Edit:
        """An edit replacing ``node`` with ``new`` (a node or source text).

        A node's position excludes its own parentheses, which stay in the
        text; so the replacement's parentheses are dropped when the old node
        had some (rules usually build ``new`` with ``node.with_changes``)."""
        if isinstance(new, str):
            return Edit(content=new, node=node)
        if getattr(node, "lpar", None) and getattr(new, "lpar", None):
            new = new.with_changes(lpar=[], rpar=[])
        return Edit(content=cst.Module(body=[]).code_for_node(new), node=node, new_node=new)

    @staticmethod
    def insert_line_before(node: cst.CSTNode, line: str) -> Edit:
        """An edit inserting ``line`` above the line where ``node`` starts, indented like it."""
        return Edit(content=line, node=node, mode="line-before")

    @staticmethod
    def fix(applicability: str, message: str, *edits: Edit) -> Fix:
        return Fix(applicability, message, tuple(edits))

    # -- engine hooks, called by the walker --------------------------------------
    def enter_import(self, node: cst.CSTNode) -> None:
        self.names.add(node)  # type: ignore[arg-type]

    def enter_function(self, node: cst.FunctionDef) -> FunctionInfo:
        info = FunctionInfo(
            node=node,
            name=node.name.value,
            class_name=self.class_names[-1] if self.class_names and self.function is None else None,
            parent=self.function,
        )
        if self.function is not None:
            self.function.has_inner_def = True
        self.facts.functions.setdefault(info.name, []).append(info)
        return info

    def leave_function(self, info: FunctionInfo) -> None:
        if info.has_inner_def and info.uses_no_grad:
            self.facts.no_grad_decorators.add(info.name)

    def enter_loop(self, node: cst.CSTNode) -> LoopInfo:
        info = LoopInfo(node=node, function=self.function, parent=self.loop, _facts=self.facts)
        if isinstance(node, cst.For):
            info.iterates_data = self.facts.is_data_source(node.iter)
        self.facts.loops[id(node)] = info
        return info

    def enter_call(self, node: cst.Call) -> None:
        func = node.func
        callee = None
        if isinstance(func, cst.Name):
            callee = func.value
        elif isinstance(func, cst.Attribute):
            if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
                callee = func.attr.value
            attr = func.attr.value
            if attr == "backward" or (attr == "step" and _steps_optimizer(func.value)):
                self._mark_training()
        if callee is not None:
            if self.loop is not None:
                self.loop.calls.add(callee)
                self.loop.call_sites.setdefault(callee, []).append(self.site())
            if self.function is not None:
                self.function.calls.add(callee)
            else:
                self.facts.module_calls.add(callee)
            if callee == "next" and self.loop is not None and node.args and self.facts.is_data_source(node.args[0].value):
                self.loop.pulls_batches = True
        if id(node) not in self._recorded_loaders and is_dataloader_call(self.names, node):
            self._record_loader(node, None)

    def enter_with(self, node: cst.With) -> None:
        if self.function is not None and any(is_no_grad_item(self, item.item) for item in node.items):
            function = self.function
            while function is not None:
                function.uses_no_grad = True
                function = function.parent

    def value_of(self, name: Optional[str]) -> Optional[cst.BaseExpression]:
        return self.values.get(name) if name else None

    def enter_augassign(self, node: cst.AugAssign) -> None:
        target = dotted_name(node.target)
        if target is not None and target not in self.values:
            self.values[target] = node.value

    def enter_annassign(self, node: cst.AnnAssign) -> None:
        target = dotted_name(node.target)
        if target is not None and node.value is not None:
            self.values[target] = node.value

    def enter_assign(self, node: cst.Assign) -> None:
        for assign_target in node.targets:
            target_node = assign_target.target
            if isinstance(target_node, (cst.Tuple, cst.List)):
                for element in target_node.elements:
                    name = dotted_name(element.value)
                    if name is not None:
                        self.values[name] = _UNKNOWN_PART
            else:
                name = dotted_name(target_node)
                if name is not None:
                    self.values[name] = node.value
        if len(node.targets) != 1:
            return
        target = dotted_name(node.targets[0].target)
        if target is None:
            return
        value = node.value
        if isinstance(value, cst.Call):
            if is_dataloader_call(self.names, value):
                self._record_loader(value, target)
            elif last_name(value.func) == "dict":
                self.facts.dict_literals[target] = value
            elif last_name(value.func) in ("iter", "enumerate") and value.args and self.facts.is_data_source(value.args[0].value):
                self.facts.data_names.add(target)
        elif isinstance(value, cst.Dict):
            self.facts.dict_literals[target] = value
        if self._mentions_availability and mentions_cuda_availability(self, value):
            self.facts.cuda_flag_names.add(target)

    def enter_if(self, node: cst.If) -> None:
        """``if not torch.cuda.is_available(): raise …`` guards the rest of the scope."""
        if not self._mentions_availability:
            return
        test = node.test
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            if mentions_cuda_availability(self, test.expression) and _body_exits(self, node.body):
                self.facts.cuda_asserted_scopes.add(self.function.node if self.function else None)

    def enter_assert(self, node: cst.Assert) -> None:
        if self._mentions_availability and mentions_cuda_availability(self, node.test):
            self.facts.cuda_asserted_scopes.add(self.function.node if self.function else None)

    def _mark_training(self) -> None:
        if self.loop is not None:
            self.loop.trains = True
        if self.function is not None:
            self.function.trains = True

    def _record_loader(self, call: cst.Call, target: Optional[str]) -> None:
        info = LoaderInfo(
            call=call,
            target=target,
            pinned=self._loader_pinned(call),
            num_workers=self._loader_kwarg(call, "num_workers"),
            sampler=self._loader_kwarg(call, "sampler"),
            function=self.function,
        )
        self._recorded_loaders[id(call)] = info
        self.facts.loaders.append(info)

    def _loader_kwarg(self, call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
        arg = keyword(call, name)
        if arg is not None:
            return arg.value
        for starred in (a for a in call.args if a.star == "**"):
            value = _dict_entry(self.facts.dict_literals.get(dotted_name(starred.value) or ""), name)
            if value is not None:
                return value
        return None

    def _loader_pinned(self, call: cst.Call) -> Optional[bool]:
        arg = keyword(call, "pin_memory")
        if arg is not None:
            return literal_bool(arg.value)
        for starred in (a for a in call.args if a.star == "**"):
            literal = self.facts.dict_literals.get(dotted_name(starred.value) or "")
            if literal is None:
                return None  # kwargs we cannot see
            value = _dict_entry(literal, "pin_memory")
            if value is not None:
                return literal_bool(value)
        return False


def _steps_optimizer(receiver: cst.BaseExpression) -> bool:
    name = last_name(receiver)
    if isinstance(receiver, cst.Subscript):
        name = last_name(receiver.value)
    return bool(name and (OPTIMIZER_NAME.search(name) or "scaler" in name.lower()) and "sched" not in name.lower())


def _dict_entry(literal: Optional[cst.CSTNode], key: str) -> Optional[cst.BaseExpression]:
    if isinstance(literal, cst.Dict):
        for element in literal.elements:
            if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                if element.key.evaluated_value == key:
                    return element.value
    elif isinstance(literal, cst.Call):
        found = keyword(literal, key)
        return found.value if found is not None else None
    return None


def _body_exits(ctx: FileContext, body: cst.BaseSuite) -> bool:
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        smalls = statement.body if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
        for small in smalls:
            if isinstance(small, (cst.Raise, cst.Return)):
                return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                if (ctx.names.qualified_name(small.value.func) or dotted_name(small.value.func)) in _EXIT_CALLS:
                    return True
    return False
