"""Per-file state shared by all rules during the single walk.

The engine's own bookkeeping (imports, functions, loops, DataLoaders, dict
literals, CUDA-availability flags) happens here, in ``enter_*`` hooks the
walker calls before any rule sees the node.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

import libcst as cst

from torchlint.analysis import Site, is_no_grad_item, mentions_cuda_availability
from torchlint.batches import BatchFlow, target_names
from torchlint.facts import (
    CallRecord,
    FunctionInfo,
    LoaderInfo,
    LoopInfo,
    ModuleFacts,
    is_dataloader_call,
    keyword,
    literal_bool,
    optimizer_receiver,
)
from torchlint.names import ImportTable, dotted_name, last_name
from torchlint.project import ProjectFacts, TorchRange
from torchlint.rule import Edit, Evidence, Fix
from torchlint.tensors import device_move, tensor_evidence

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.rule import Rule

# Stands for "one element of an unpacked value": known to be assigned, not what.
_UNKNOWN_PART = cst.Name("__unpacked__")
_EXIT_CALLS = frozenset({"sys.exit", "exit", "quit", "os._exit"})
# Code that places tensors on a device or trains (prose in docstrings rarely matches).
_NAMES_A_DEVICE_OR_TRAINS = re.compile(r"\bcuda\b|\bdevice_map\b|\.to\(|\bdevice\s*=|\.(backward|step|prepare|setup)\(|\b(xpu|mps)\b")
# Builtins whose calls are not calls of module functions.
_BUILTIN_CALLS = frozenset({"print", "len", "range", "isinstance", "getattr", "hasattr", "setattr", "int", "float", "str", "bool", "list", "dict", "tuple", "set", "enumerate", "zip", "super", "min", "max", "sum", "abs", "round", "sorted", "iter", "next", "type", "format", "open", "repr", "any", "all", "map", "filter"})


class FileContext:
    def __init__(
        self,
        path: str,
        source: str,
        module: cst.Module,
        target_torch: Optional[Tuple[int, int]] = None,
        project: Optional[ProjectFacts] = None,
        torch_range: Optional[TorchRange] = None,
    ) -> None:
        self.path = path
        self.source = source
        self.module = module
        # The torch versions the code supports (torchlint.project); target_torch is its lower bound.
        self.project = project or ProjectFacts()
        self.torch_range = torch_range or TorchRange(target_torch, None)
        self.target_torch = self.torch_range.lower
        self.names = ImportTable()
        self.facts = ModuleFacts(self.names, path)
        self.stack: List[cst.CSTNode] = []
        self.function: Optional[FunctionInfo] = None
        self.loop: Optional[LoopInfo] = None
        self.class_names: List[str] = []
        # name -> the last expression assigned to it in the current scope, as
        # far as the walk has got: "what is x here?" for visit-time questions.
        self.values: Dict[str, cst.BaseExpression] = {}
        self.reports: List[Tuple["Rule", cst.CSTNode, str, Optional[Fix], Tuple[Evidence, ...]]] = []
        self._recorded_loaders: Dict[int, LoaderInfo] = {}
        self._mentions_availability = "is_available" in source or "device_count" in source
        self._host_only: Optional[bool] = None
        # which names hold batch data, per scope (TL201, TL202, TL206 ask it)
        self.batches = BatchFlow(self)
        # ids of the assignment values being walked: their targets are not bound yet
        self._assigning: set = set()

    @property
    def host_only(self) -> bool:
        """An inference client: the file never names a device and never trains,
        so a model fed host tensors runs on the host. Read once, when asked."""
        if self._host_only is None:
            self._host_only = _NAMES_A_DEVICE_OR_TRAINS.search(self.source) is None
        return self._host_only

    # -- for rules -------------------------------------------------------------
    def report(self, rule: "Rule", node: cst.CSTNode, message: str, fix: Optional[Fix] = None, evidence: Tuple[Evidence, ...] = ()) -> None:
        self.reports.append((rule, node, message, fix, evidence))

    def site(self) -> Site:
        """A snapshot of where the current node sits; see ``torchlint.analysis``."""
        return Site(self, self.stack, self.function, self.loop)

    def qualified_name(self, node: cst.CSTNode) -> Optional[str]:
        return self.names.qualified_name(node)

    def facts_batch_caller(
        self,
        function: FunctionInfo,
        callers: Optional[Set[str]] = None,
        is_batch_loop: Optional[Callable[[LoopInfo], bool]] = None,
    ) -> Optional[LoopInfo]:
        """A batch loop that calls ``function`` (perhaps through other module
        functions) at a site that runs every iteration. Exact after the walk.
        ``callers`` and ``is_batch_loop`` replace the defaults (every module
        function reaching ``function``; ``LoopInfo.is_batch_loop``). Rules
        that need no variation ask ``Site.batch_context()`` instead."""
        callers = self.facts.callers_of(function) if callers is None else callers
        for loop in self.facts.loops.values():
            if loop.function is function or not (loop.is_batch_loop if is_batch_loop is None else is_batch_loop(loop)):
                continue
            for name in callers & loop.calls:
                for site in loop.call_sites.get(name, ()):
                    if not site.in_exception_path() and not site.under_periodic_guard(within=loop):
                        return loop
        return None

    def torch_below(self, major: int, minor: int = 0) -> bool:
        """May the code run on a torch older than major.minor? False if unknown."""
        return self.target_torch is not None and self.target_torch < (major, minor)

    def torch_at_least(self, major: int, minor: int = 0) -> bool:
        """Does every torch the code supports have major.minor's APIs? False if unknown."""
        return self.target_torch is not None and self.target_torch >= (major, minor)

    def torch_all_below(self, major: int, minor: int = 0) -> bool:
        """Is every torch the code supports older than major.minor? False if unknown."""
        upper = self.torch_range.upper
        return upper is not None and upper < (major, minor)

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
            params=_parameter_names(node.params),
        )
        info.argument_names.update(info.params)
        for star in (node.params.star_arg, node.params.star_kwarg):
            if isinstance(star, cst.Param):
                info.argument_names.add(star.name.value)
        if self.function is not None:
            self.function.has_inner_def = True
        self.facts.functions.setdefault(info.name, []).append(info)
        self.batches.enter_scope()
        return info

    def leave_function(self, info: FunctionInfo) -> None:
        self.batches.leave_scope()
        if info.has_inner_def and info.uses_no_grad:
            self.facts.no_grad_decorators.add(info.name)

    def enter_loop(self, node: cst.CSTNode) -> LoopInfo:
        info = LoopInfo(node=node, function=self.function, parent=self.loop, _facts=self.facts)
        if isinstance(node, cst.For):
            info.iterates_data = self.facts.is_data_source(node.iter)
            self.batches.bind_loop(node)
            function = self.function
            if function is not None and _root_name(node.iter) in function.argument_names:
                # ``for k, v in kwargs.items()``: each ``v`` is an argument too
                function.argument_names.update(target_names(node.target))
            if isinstance(node.target, cst.Name):
                # ``for v in t``: each ``v`` is an element of ``t`` (a tensor's
                # elements are tensors on its device)
                self.values[node.target.value] = cst.Subscript(
                    value=node.iter, slice=[cst.SubscriptElement(cst.Index(cst.Integer("0")))]
                )
        self.facts.loops[id(node)] = info
        return info

    def enter_comprehension(self, node: cst.CSTNode) -> None:
        self.batches.bind_comprehension(node)

    def enter_lambda(self, node: cst.Lambda) -> None:
        # ``map(lambda t: t.cuda(), (text, images))``: the lambda's parameter is each batch part
        call = self.stack[-3] if len(self.stack) >= 3 else None
        if isinstance(call, cst.Call):
            self.batches.enter_mapped_lambda(call, node)

    def leave_lambda(self, node: cst.Lambda) -> None:
        self.batches.leave_mapped_lambda(node)

    def leave_assign(self, node: cst.Assign) -> None:
        # after the value: ``x = x.to(device)`` still sees the batch ``x`` in its value
        self._assigning.discard(id(node.value))
        self.batches.bind_assign(node)

    def enter_call(self, node: cst.Call) -> None:
        func = node.func
        callee = None
        method = False
        if isinstance(func, cst.Name):
            callee = func.value
        elif isinstance(func, cst.Attribute):
            if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
                callee = func.attr.value
                method = True
            attr = func.attr.value
            if is_training_step_call(func):
                self._mark_training()
                if self.function is not None and self.loop is None:
                    self.function.steps_per_call = True
                    if attr == "step":
                        self.function.steps_optimizer = True
            if isinstance(func.value, cst.Name) and (self.loop is not None or self.function is not None):
                built_by = self.values.get(func.value.value)
                # ``meter = AverageMeter()`` … ``meter.update(x)``: a method of a class instance
                if isinstance(built_by, cst.Call) and (last_name(built_by.func) or "")[:1].isupper():
                    passes_tensor = any(tensor_evidence(self, a.value) is True for a in node.args)
                    entry = (built_by, attr, self.site(), passes_tensor)
                    if self.loop is not None:
                        self.loop.method_calls.append(entry)
                    else:
                        self.function.method_calls.append(entry)  # type: ignore[union-attr]
            if attr in ("to", "cuda", "type") and device_move(self, node) == "device":
                self._record_batch_copy(func.value)
            if attr == "update" and node.args:
                self._record_dict_update(func.value, node)
            elif attr == "add_argument" and node.args:
                self._record_argument(node)
            elif attr == "set_defaults":
                for arg in node.args:
                    if arg.keyword is not None:
                        self.facts.set_defaults[arg.keyword.value] = arg.value
            elif callee is None and isinstance(func.value, cst.Name) and (func.value.value in self.names.aliases or func.value.value in self.names.relative):
                # ``engine.train_one_epoch(...)``: a function of an imported module
                if node.args:
                    self.facts.call_records.append(CallRecord(attr, node, self.function, self._argument_loaders(node), imported=True))
        if self.loop is not None and not self.loop.pulls_batches and self.facts.pulls_batch(node):
            self.loop.pulls_batches = True
        if callee is not None:
            function = self.function
            site = None
            if self.loop is not None:
                site = self.site()
                self.loop.calls.add(callee)
                self.loop.call_sites.setdefault(callee, []).append(site)
            if function is not None:
                function.calls.add(callee)
                function.call_sites.append((callee, site or self.site()))
                if not method and callee in function.params:
                    function.called_params.add(callee)
            else:
                self.facts.module_calls.add(callee)
            if node.args and callee not in _BUILTIN_CALLS:
                tensors = {
                    id(arg.value)
                    for arg in node.args
                    if isinstance(arg.value, cst.Name) and not arg.star and tensor_evidence(self, arg.value) is True
                }
                self.facts.call_records.append(
                    CallRecord(callee, node, function, self._argument_loaders(node), method=method, tensors=tensors)
                )
        if id(node) not in self._recorded_loaders and is_dataloader_call(self.names, node):
            self._record_loader(node, None)

    def _record_batch_copy(self, receiver: cst.BaseExpression) -> None:
        origin = self.batches.origin_of(receiver)
        if origin is None or origin.source is None:
            return
        if origin.loop_node is not None and not any(a is origin.loop_node for a in self.stack):
            return  # after the loop: the last batch, once
        self.facts.batch_copies.append(origin)

    def _argument_loaders(self, call: cst.Call) -> Dict[int, LoaderInfo]:
        """Arguments that are, at this point of the walk, evidently a loader
        built in this scope: resolved now, since the scope's values are gone
        by the time a rule asks."""
        found: Dict[int, LoaderInfo] = {}
        for arg in call.args:
            value = self.values.get(dotted_name(arg.value) or "") if isinstance(arg.value, cst.Name) else arg.value
            if isinstance(value, cst.Call):
                loader = self._recorded_loaders.get(id(value))
                if loader is not None:
                    found[id(arg.value)] = loader
        return found

    def enter_with(self, node: cst.With) -> None:
        if self.function is not None and any(is_no_grad_item(self, item.item) for item in node.items):
            function = self.function
            while function is not None:
                function.uses_no_grad = True
                function = function.parent

    def value_of(self, name: Optional[str]) -> Optional[cst.BaseExpression]:
        value = self.values.get(name) if name else None
        if value is not None and id(value) in self._assigning:
            return None  # inside ``x = f(x)``'s own value: the new binding is not in effect yet
        return value

    def enter_augassign(self, node: cst.AugAssign) -> None:
        target = dotted_name(node.target)
        if target is not None and target not in self.values:
            self.values[target] = node.value

    def enter_annassign(self, node: cst.AnnAssign) -> None:
        target = dotted_name(node.target)
        if target is not None and node.value is not None:
            self.values[target] = node.value

    def enter_assign(self, node: cst.Assign) -> None:
        self._assigning.add(id(node.value))
        for assign_target in node.targets:
            target_node = assign_target.target
            if isinstance(target_node, (cst.Tuple, cst.List)):
                for element in target_node.elements:
                    name = dotted_name(element.value)
                    if name is not None:
                        self.values[name] = _UNKNOWN_PART
            else:
                name = dotted_name(target_node)
                if name is not None and not self._none_on_other_branch(name, node.value):
                    self.values[name] = node.value
        if len(node.targets) != 1:
            return
        value = node.value
        target_node = node.targets[0].target
        if isinstance(value, cst.Call) and isinstance(target_node, (cst.Name, cst.Tuple)):
            self._record_returned(target_node, value)
        if isinstance(target_node, cst.Subscript):
            self._record_dict_item(target_node, value)
        target = dotted_name(target_node)
        if target is None:
            return
        if self.function is None and isinstance(target_node, cst.Name):
            self.facts.module_constants[target] = node.value
        if isinstance(value, (cst.Dict, cst.Call)):
            self._record_dict(target, value)
        if isinstance(value, cst.Call):
            if is_dataloader_call(self.names, value):
                self._record_loader(value, target)
                self.facts.data_names.add(target)
            elif last_name(value.func) == "dict":
                self.facts.dict_literals[target] = value
            elif last_name(value.func) in ("iter", "enumerate") and value.args and self.facts.is_data_source(value.args[0].value):
                self.facts.data_names.add(target)
        elif isinstance(value, cst.Dict):
            self.facts.dict_literals[target] = value
        if self._mentions_availability and mentions_cuda_availability(self, value):
            self.facts.cuda_flag_names.add(target)

    def _none_on_other_branch(self, name: str, value: cst.BaseExpression) -> bool:
        """``if a: x = tensor`` / ``else: x = None``: ``x`` keeps the tensor.

        A value that is absent on one branch is still the tensor on the other,
        and a sync on it is real there (``if x:`` on a CUDA tensor), so the
        ``None`` does not replace the value the ``if`` body gave the name."""
        if not (isinstance(value, cst.Name) and value.value == "None"):
            return False
        previous = self.values.get(name)
        if previous is None or previous is _UNKNOWN_PART:
            return False
        stack = self.stack
        for index in range(len(stack) - 1, 0, -1):
            block = stack[index]
            if isinstance(block, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.Lambda)):
                return False
            if isinstance(block, (cst.Else, cst.If)) and isinstance(stack[index - 1], cst.If) and stack[index - 1].orelse is block:
                body = stack[index - 1].body.body
                return any(
                    isinstance(line, cst.SimpleStatementLine)
                    and any(isinstance(small, cst.Assign) and small.value is previous for small in line.body)
                    for line in body
                )
        return False

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

    def _record_returned(self, target: cst.BaseExpression, call: cst.Call) -> None:
        """``a, b, train_loader, val_loader = build_loader(cfg)`` with
        ``build_loader`` imported from the project: each name is (call, position)
        so ``loader_for`` can follow the callee's return value across files."""
        if "." not in (self.names.imported_name(call.func) or "").lstrip("."):
            return
        scope = id(self.function.node) if self.function is not None else 0
        if isinstance(target, cst.Name):
            self.facts.returned[(scope, target.value)] = (call, None)
            return
        for position, element in enumerate(target.elements):  # type: ignore[attr-defined]
            if isinstance(element.value, cst.Name):
                self.facts.returned[(scope, element.value.value)] = (call, position)

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
            values = self.dict_values(starred.value, name)
            if values:
                return values[-1]
        return None

    def _loader_pinned(self, call: cst.Call) -> Optional[bool]:
        """``pin_memory=True``, directly or through ``**kwargs`` whose dict is
        built here (a literal, ``dict()``, ``.update()``, ``d[k] = v``,
        ``{**a, **b}``). A value set under a condition (``if use_cuda:
        kwargs.update(pin_memory=True)``) counts: the loader is pinned when
        it matters."""
        arg = keyword(call, "pin_memory")
        if arg is not None:
            return literal_bool(self.constant(arg.value))
        for starred in (a for a in call.args if a.star == "**"):
            key = self._dict_key(starred.value)
            if key is None or key not in self.facts.dicts:
                return None  # kwargs we cannot see
            answers = [literal_bool(self.constant(v)) for v in self.facts.dicts[key].get("pin_memory", ())]
            if True in answers:
                return True
            if answers and None in answers:
                return None
            if answers:
                return False
        return False

    # -- value flow: dicts, constants, argparse defaults ----------------------------
    def _record_argument(self, call: cst.Call) -> None:
        """``parser.add_argument("--pin-mem", action="store_true")`` -> pin_mem: False."""
        flags = [a.value.evaluated_value for a in call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
        dest_arg = keyword(call, "dest")
        if dest_arg is not None and isinstance(dest_arg.value, cst.SimpleString):
            dest = dest_arg.value.evaluated_value
        else:
            longs = [f for f in flags if isinstance(f, str) and f.startswith("--")]
            dest = longs[0][2:].replace("-", "_") if longs else None
        if not isinstance(dest, str) or dest in self.facts.argument_defaults:
            return
        default = keyword(call, "default")
        action = keyword(call, "action")
        if default is not None:
            self.facts.argument_defaults[dest] = default.value
        elif action is not None and isinstance(action.value, cst.SimpleString):
            kind = action.value.evaluated_value
            if kind in ("store_true", "store_false"):
                self.facts.argument_defaults[dest] = cst.Name("False" if kind == "store_true" else "True")

    def constant(self, expr: cst.BaseExpression) -> cst.BaseExpression:
        """Follow a name to the literal it holds (a module constant or a local
        assigned once before), and a ternary to the branch that holds one."""
        for _ in range(4):
            if isinstance(expr, cst.Name) and expr.value not in ("True", "False", "None"):
                value = self.values.get(expr.value) or self.facts.module_constants.get(expr.value)
                if value is None:
                    return expr
                expr = value
            elif isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Attribute):
                # ``config.DATA.PIN_MEMORY``: the default the project's config module
                # gives that key (a yacs ``_C.DATA.PIN_MEMORY = True``)
                from torchlint import crossfile

                value = crossfile.config_default(self.path, expr)
                if value is None:
                    return expr
                expr = value
            elif isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
                # ``args.pin_mem``: the default of the argparse option of that name
                dest = expr.attr.value
                value = self.facts.set_defaults.get(dest) or self.facts.argument_defaults.get(dest)
                if value is None:
                    return expr
                expr = value
            elif isinstance(expr, cst.IfExp):
                body, orelse = literal_bool(expr.body), literal_bool(expr.orelse)
                if body is True or orelse is True:
                    return cst.Name("True")
                return expr
            else:
                return expr
        return expr

    def _dict_key(self, expr: cst.BaseExpression) -> Optional[tuple]:
        name = dotted_name(expr)
        if name is None:
            return None
        scope = id(self.function.node) if self.function is not None else 0
        if (scope, name) in self.facts.dicts:
            return (scope, name)
        return (0, name) if (0, name) in self.facts.dicts else (scope, name)

    def dict_values(self, expr: cst.BaseExpression, key: str) -> List[cst.BaseExpression]:
        """Every value the dict ``expr`` is given for ``key`` in this scope."""
        dict_key = self._dict_key(expr)
        return list(self.facts.dicts.get(dict_key, {}).get(key, ())) if dict_key else []

    def _entries(self, value: cst.BaseExpression) -> Optional[Dict[str, List[cst.BaseExpression]]]:
        """The key -> values of a dict expression, or None if it is not one we can read."""
        entries: Dict[str, List[cst.BaseExpression]] = {}
        if isinstance(value, cst.Dict):
            for element in value.elements:
                if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                    key = element.key.evaluated_value
                    if isinstance(key, str):
                        entries.setdefault(key, []).append(element.value)
                elif isinstance(element, cst.StarredDictElement):
                    merged = self._entries(element.value) if not isinstance(element.value, cst.Name) else None
                    if merged is None:
                        dict_key = self._dict_key(element.value)
                        merged = self.facts.dicts.get(dict_key) if dict_key else None
                    if merged is None:
                        return None
                    for key, values in merged.items():
                        entries.setdefault(key, []).extend(values)
            return entries
        if isinstance(value, cst.Call) and last_name(value.func) == "dict":
            for arg in value.args:
                if arg.keyword is not None:
                    entries.setdefault(arg.keyword.value, []).append(arg.value)
                elif arg.star == "**" or not arg.star:
                    dict_key = self._dict_key(arg.value)
                    merged = self.facts.dicts.get(dict_key) if dict_key else self._entries(arg.value)
                    if merged is None:
                        return None
                    for key, values in merged.items():
                        entries.setdefault(key, []).extend(values)
            return entries
        return None

    def _record_dict(self, target: str, value: cst.BaseExpression) -> None:
        entries = self._entries(value)
        if entries is not None:
            scope = id(self.function.node) if self.function is not None else 0
            self.facts.dicts[(scope, target)] = entries

    def in_dead_branch(self) -> bool:
        """Under ``if False:`` (or the ``else`` of ``if True:``): code that cannot run."""
        stack = self.stack
        for i in range(len(stack) - 2, -1, -1):
            node = stack[i]
            if isinstance(node, cst.If) and isinstance(node.test, cst.Name) and node.test.value in ("True", "False"):
                child = stack[i + 1]
                if (node.test.value == "False") == (child is node.body):
                    return True
        return False

    def _record_dict_update(self, receiver: cst.BaseExpression, call: cst.Call) -> None:
        if self.in_dead_branch():
            return
        dict_key = self._dict_key(receiver)
        if dict_key is None or dict_key not in self.facts.dicts:
            return
        entries = self.facts.dicts[dict_key]
        for arg in call.args:
            if arg.keyword is not None:
                entries.setdefault(arg.keyword.value, []).append(arg.value)
                continue
            source = arg.value
            merged = self._entries(source)
            if merged is None:
                other = self._dict_key(source)
                merged = self.facts.dicts.get(other) if other else None
            for key, values in (merged or {}).items():
                entries.setdefault(key, []).extend(values)

    def _record_dict_item(self, target: cst.Subscript, value: cst.BaseExpression) -> None:
        if self.in_dead_branch():
            return
        dict_key = self._dict_key(target.value)
        if dict_key is None or dict_key not in self.facts.dicts or len(target.slice) != 1:
            return
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
            if isinstance(key, str):
                self.facts.dicts[dict_key].setdefault(key, []).append(value)


def is_training_step_call(func: cst.Attribute) -> bool:
    """``loss.backward()``, ``optimizer.step()``, ``scaler.step(opt)``: the one
    test for "this call trains" (schedulers' ``step()`` does not count)."""
    attr = func.attr.value
    if attr == "backward":
        return True
    return attr == "step" and steps_optimizer(func.value)


def _root_name(node: cst.BaseExpression) -> Optional[str]:
    """``kwargs`` of ``kwargs.items()`` / ``kwargs["x"]`` / ``kwargs``."""
    while True:
        if isinstance(node, cst.Call):
            node = node.func
        elif isinstance(node, (cst.Attribute, cst.Subscript)):
            node = node.value
        elif isinstance(node, cst.Name):
            return node.value
        else:
            return None


def _parameter_names(params: cst.Parameters) -> List[str]:
    names = [p.name.value for p in params.posonly_params]
    names += [p.name.value for p in params.params]
    return names + [p.name.value for p in params.kwonly_params]


def steps_optimizer(receiver: cst.BaseExpression) -> bool:
    """Is ``receiver`` an optimizer or a grad scaler (``opt.step()`` trains; a scheduler's does not)?"""
    if optimizer_receiver(receiver):
        return True
    name = last_name(receiver.value if isinstance(receiver, cst.Subscript) else receiver)
    return bool(name and "scaler" in name.lower() and "sched" not in name.lower())


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
