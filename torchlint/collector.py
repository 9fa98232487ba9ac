"""The collector: the one writer of a file's facts.

The walker calls its ``enter_*``/``leave_*`` hooks before (after) any rule
sees a node; each hook records what the node means for the module (imports,
functions, loops and their call sites, loaders, dicts, constants, argparse
defaults, batch provenance, CUDA-availability guards) into the file's
``FileModel`` and ``ModuleFacts``. Rules never write facts; they query the
model (``torchlint.model``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Union

import libcst as cst

from torchlint.analysis import is_no_grad_item, mentions_cuda_availability
from torchlint.batches import target_names
from torchlint.facts import (
    CallRecord,
    FunctionInfo,
    LoaderInfo,
    LoopInfo,
    TrainerRun,
    is_dataloader_call,
    keyword,
    keyword_value,
    literal_bool,
)
from torchlint.names import dotted_name, last_name
from torchlint.tensors import device_move, tensor_evidence
from torchlint.vocabulary import (
    BUILTIN_CALLS,
    EXIT_CALLS,
    FRAMEWORK_ARGUMENTS,
    FRAMEWORK_TRAINERS,
    KEEPS_ITEMS,
    LIBRARY_MODULES,
    UNKNOWN_PART,
    is_training_step_call,
)

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.model import FileModel


class Collector:
    """Records the facts of one file while the walker goes through it."""

    def __init__(self, model: "FileModel") -> None:
        self.model = model
        self.facts = model.facts
        self.names = model.names
        self.batches = model.batches
        self._recorded_loaders: Dict[int, LoaderInfo] = {}
        self._mentions_availability = "is_available" in model.source or "device_count" in model.source

    # The walk's position lives on the model (its ``site()`` snapshots it);
    # the walker moves it, the hooks read it.
    @property
    def function(self) -> Optional[FunctionInfo]:
        return self.model.function

    @property
    def loop(self) -> Optional[LoopInfo]:
        return self.model.loop

    @property
    def values(self) -> Dict[str, cst.BaseExpression]:
        return self.model.values

    @property
    def stack(self) -> List[cst.CSTNode]:
        return self.model.stack

    @property
    def class_names(self) -> List[str]:
        return self.model.class_names

    @property
    def _assigning(self) -> set:
        return self.model.assigning

    def _bind(self, name: str, value: cst.BaseExpression) -> None:
        """``name`` is given ``value`` in the current scope: the walk's view
        (``values``) and the record kept per scope for later questions."""
        self.values[name] = value
        model = self.model
        model.binding_count += 1
        scope = id(self.function.node) if self.function is not None else 0
        model.bindings.setdefault(scope, {}).setdefault(name, []).append((model.binding_count, value))

    def enter_import(self, node: cst.CSTNode) -> None:
        self.names.add(node)  # type: ignore[arg-type]

    def enter_class(self, node: cst.ClassDef) -> None:
        """The class's bases, by qualified name where the imports say it
        (``pl.LightningModule`` -> ``pytorch_lightning.LightningModule``)."""
        bases = []
        for base in node.bases:
            if base.keyword is None and not base.star:
                name = self.names.qualified_name(base.value) or dotted_name(base.value)
                if name is not None:
                    bases.append(name)
        self.facts.class_bases.setdefault(node.name.value, []).extend(bases)

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
                self._bind(
                    node.target.value,
                    cst.Subscript(value=node.iter, slice=[cst.SubscriptElement(cst.Index(cst.Integer("0")))]),
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
        if self.loop is not None or self.function is not None:
            imported = self.names.imported_name(func)
            if imported is not None and "." in imported.lstrip(".") and not imported.startswith(LIBRARY_MODULES):
                # ``train_one_epoch(...)`` from ``engine``: a function another file may define
                for scope in (self.loop, self.function):
                    if scope is not None:
                        scope.imported_calls.add(imported)
        if isinstance(func, cst.Name):
            callee = func.value
        elif isinstance(func, cst.Attribute):
            if isinstance(func.value, cst.Name) and func.value.value in ("self", "cls"):
                callee = func.attr.value
                method = True
            attr = func.attr.value
            if is_training_step_call(func):
                self._mark_training()
                if attr == "backward":
                    self._record_backward(node)
                if self.function is not None and self.loop is None:
                    self.function.steps_per_call = True
                    if attr == "step":
                        self.function.steps_optimizer = True
            if isinstance(func.value, cst.Name) and (self.loop is not None or self.function is not None):
                built_by = self.values.get(func.value.value)
                # ``meter = AverageMeter()`` … ``meter.update(x)``: a method of a class instance
                if isinstance(built_by, cst.Call) and (last_name(built_by.func) or "")[:1].isupper():
                    passes_tensor = any(tensor_evidence(self.model, a.value) is True for a in node.args)
                    entry = (built_by, attr, self.model.site(), passes_tensor)
                    if self.loop is not None:
                        self.loop.method_calls.append(entry)
                    else:
                        self.function.method_calls.append(entry)  # type: ignore[union-attr]
            if attr in ("train", "fit"):
                self._record_trainer_run(func.value, attr, node)
            if attr in ("to", "cuda", "type", "type_as") and device_move(self.model, node) == "device":
                self._record_batch_copy(func.value)
            if attr == "update" and node.args:
                self._record_dict_update(func.value, node)
            elif attr == "add_argument" and node.args:
                self._record_argument(node)
            elif attr == "set_defaults":
                for arg in node.args:
                    if arg.keyword is not None:
                        self.facts.set_defaults[arg.keyword.value] = arg.value
            elif (
                callee is None
                and isinstance(func.value, cst.Name)
                and (func.value.value in self.names.aliases or func.value.value in self.names.relative)
            ):
                # ``engine.train_one_epoch(...)``: a function of an imported module
                if node.args:
                    self.facts.call_records.append(
                        CallRecord(attr, node, self.function, self._argument_loaders(node), imported=True)
                    )
        if self.loop is not None and not self.loop.pulls_batches and self.facts.pulls_batch(node):
            self.loop.pulls_batches = True
        if callee is not None:
            function = self.function
            site = None
            if self.loop is not None:
                site = self.model.site()
                self.loop.calls.add(callee)
                self.loop.call_sites.setdefault(callee, []).append(site)
            if function is not None:
                function.calls.add(callee)
                function.call_sites.append((callee, site or self.model.site()))
                if not method and callee in function.params:
                    function.called_params.add(callee)
            else:
                self.facts.module_calls.add(callee)
            if node.args and callee not in BUILTIN_CALLS:
                tensors = {
                    id(arg.value)
                    for arg in node.args
                    if isinstance(arg.value, cst.Name)
                    and not arg.star
                    and tensor_evidence(self.model, arg.value) is True
                }
                self.facts.call_records.append(
                    CallRecord(callee, node, function, self._argument_loaders(node), method=method, tensors=tensors)
                )
        if self.function is None:
            # a module function handed to a launcher at the top level runs, as if called
            self.facts.module_passed.update(
                arg.value.value for arg in node.args if isinstance(arg.value, cst.Name) and not arg.star
            )
        if id(node) not in self._recorded_loaders and is_dataloader_call(self.names, node):
            self._record_loader(node, None)

    def _record_backward(self, call: cst.Call) -> None:
        """``loss.backward()``, ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``:
        ``loss`` is a tensor. With a positional argument, the argument is the tensor
        (``accelerator.backward(loss)``; ``out.backward(grad)``'s gradient is one too)."""
        positional = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
        receiver = positional[0] if positional else call.func.value  # type: ignore[attr-defined]
        if isinstance(receiver, cst.Call) and receiver.args and last_name(receiver.func) == "scale":
            receiver = receiver.args[0].value
        name = dotted_name(receiver)
        if name is None:
            return
        names = self.function.backward_names if self.function is not None else self.facts.module_backward_names
        names.add(name)

    def _record_trainer_run(self, receiver: cst.BaseExpression, method: str, node: cst.Call) -> None:
        """``runner.train()`` / ``trainer.fit(...)`` on a framework trainer built in this module."""
        constructor = self.values.get(receiver.value) if isinstance(receiver, cst.Name) else receiver
        if not isinstance(constructor, cst.Call):
            return
        trainer = FRAMEWORK_TRAINERS.get(self.names.qualified_name(constructor.func) or "")
        if trainer is not None and trainer[1] == method:
            arguments = self._trainer_arguments(trainer[0], constructor)
            self.facts.trainer_runs.append(TrainerRun(trainer[0], constructor, node, self.function, arguments))

    def _trainer_arguments(self, framework: str, constructor: cst.Call) -> Optional[cst.Call]:
        """The arguments object a trainer is built with, by keyword or position,
        through the name it holds at this point of the walk (``args =
        TrainingArguments(...)``). Resolved now: the scope's values are gone by
        the time a rule asks."""
        where = FRAMEWORK_ARGUMENTS.get(framework)
        if where is None:
            return None
        keyword, position = where
        value = keyword_value(constructor, keyword)
        if value is None:
            given = [arg.value for arg in constructor.args if arg.keyword is None and not arg.star]
            value = given[position] if len(given) > position else None
        if isinstance(value, cst.Name):
            value = self.values.get(value.value)
        return value if isinstance(value, cst.Call) else None

    def _record_batch_copy(self, receiver: cst.BaseExpression) -> None:
        origin = self.batches.origin_of(receiver)
        if origin is None or origin.source is None:
            return
        if origin.loop_node is not None and not any(a is origin.loop_node for a in self.stack):
            return  # after the loop: the last batch, once
        self.facts.batch_copies.append(origin)
        self.facts.batch_copy_sites.append(self.model.site())

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
        if self.function is not None and any(is_no_grad_item(self.model, item.item) for item in node.items):
            function: Optional[FunctionInfo] = self.function
            while function is not None:
                function.uses_no_grad = True
                function = function.parent

    def enter_augassign(self, node: cst.AugAssign) -> None:
        target = dotted_name(node.target)
        if target is None:
            return
        if target not in self.values:
            self._bind(target, node.value)
        elif isinstance(self.values[target], (cst.Integer, cst.Float)) and (
            tensor_evidence(self.model, node.value) is not False
        ):
            # ``running_loss = 0`` then ``running_loss += loss``: ``0 + loss``, a tensor when
            # ``loss`` is one (asked later, when the scope's facts are known)
            self._bind(target, cst.BinaryOperation(left=self.values[target], operator=cst.Add(), right=node.value))

    def enter_annassign(self, node: cst.AnnAssign) -> None:
        target = dotted_name(node.target)
        if target is not None and node.value is not None:
            self._bind(target, node.value)

    def enter_assign(self, node: cst.Assign) -> None:
        self._assigning.add(id(node.value))
        for assign_target in node.targets:
            target_node = assign_target.target
            if isinstance(target_node, (cst.Tuple, cst.List)):
                for element in target_node.elements:
                    name = dotted_name(element.value)
                    if name is not None:
                        self._bind(name, UNKNOWN_PART)
            else:
                name = dotted_name(target_node)
                if name is not None and not self._none_on_other_branch(name, node.value):
                    self._bind(name, node.value)
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
            elif (
                last_name(value.func) in KEEPS_ITEMS
                and value.args
                and not value.args[0].keyword
                and self.facts.is_data_source(value.args[0].value)
            ):
                # ``progress_bar = tqdm(train_loader)``: iterating the name iterates the loader
                self.facts.data_names.add(target)
                scope = id(self.function.node) if self.function is not None else 0
                self.facts.wrapped_sources[(scope, target)] = value.args[0].value
        elif isinstance(value, cst.Dict):
            self.facts.dict_literals[target] = value
        if self._mentions_availability and mentions_cuda_availability(self.model, value):
            self.facts.cuda_flag_names.add(target)

    def _none_on_other_branch(self, name: str, value: cst.BaseExpression) -> bool:
        """``if a: x = tensor`` / ``else: x = None``: ``x`` keeps the tensor.

        A value that is absent on one branch is still the tensor on the other,
        and a sync on it is real there (``if x:`` on a CUDA tensor), so the
        ``None`` does not replace the value the ``if`` body gave the name."""
        if not (isinstance(value, cst.Name) and value.value == "None"):
            return False
        previous = self.values.get(name)
        if previous is None or previous is UNKNOWN_PART:
            return False
        stack = self.stack
        for index in range(len(stack) - 1, 0, -1):
            block = stack[index]
            if isinstance(block, (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.Lambda)):
                return False
            parent = stack[index - 1]
            if isinstance(block, (cst.Else, cst.If)) and isinstance(parent, cst.If) and parent.orelse is block:
                body = parent.body.body
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
            if mentions_cuda_availability(self.model, test.expression) and _body_exits(self.model, node.body):
                self.facts.cuda_asserted_scopes.add(self.function.node if self.function else None)

    def enter_assert(self, node: cst.Assert) -> None:
        if self._mentions_availability and mentions_cuda_availability(self.model, node.test):
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
            values = self.model.dict_values(starred.value, name)
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
            return literal_bool(self.model.constant(arg.value))
        for starred in (a for a in call.args if a.star == "**"):
            key = self.model.dict_key(starred.value)
            if key is None or key not in self.facts.dicts:
                return None  # kwargs we cannot see
            answers = [literal_bool(self.model.constant(v)) for v in self.facts.dicts[key].get("pin_memory", ())]
            if True in answers:
                return True
            if answers and None in answers:
                return None
            if answers:
                return False
        return False

    def _record_argument(self, call: cst.Call) -> None:
        """``parser.add_argument("--pin-mem", action="store_true")`` -> pin_mem: False."""
        flags = [
            a.value.evaluated_value for a in call.args if a.keyword is None and isinstance(a.value, cst.SimpleString)
        ]
        dest_arg = keyword(call, "dest")
        dest: Union[str, bytes, None]
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
                        dict_key = self.model.dict_key(element.value)
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
                    dict_key = self.model.dict_key(arg.value)
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

    def _record_dict_update(self, receiver: cst.BaseExpression, call: cst.Call) -> None:
        if self.model.in_dead_branch():
            return
        dict_key = self.model.dict_key(receiver)
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
                other = self.model.dict_key(source)
                merged = self.facts.dicts.get(other) if other else None
            for key, values in (merged or {}).items():
                entries.setdefault(key, []).extend(values)

    def _record_dict_item(self, target: cst.Subscript, value: cst.BaseExpression) -> None:
        if self.model.in_dead_branch():
            return
        dict_key = self.model.dict_key(target.value)
        if dict_key is None or dict_key not in self.facts.dicts or len(target.slice) != 1:
            return
        index = target.slice[0].slice
        if isinstance(index, cst.Index) and isinstance(index.value, cst.SimpleString):
            key = index.value.evaluated_value
            if isinstance(key, str):
                self.facts.dicts[dict_key].setdefault(key, []).append(value)


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


def _body_exits(ctx: "FileModel", body: cst.BaseSuite) -> bool:
    statements = body.body if isinstance(body, cst.IndentedBlock) else [body]
    for statement in statements:
        smalls = statement.body if isinstance(statement, (cst.SimpleStatementLine, cst.SimpleStatementSuite)) else ()
        for small in smalls:
            if isinstance(small, (cst.Raise, cst.Return)):
                return True
            if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                if (ctx.names.qualified_name(small.value.func) or dotted_name(small.value.func)) in EXIT_CALLS:
                    return True
    return False
