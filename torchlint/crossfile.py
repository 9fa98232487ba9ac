"""Facts that cross files: which loader another module of the project passes
to a function, and the other per-function summaries of ``ProjectAnalysis``.

The project is a ``torchlint.project.Project``: the folder tree under the
root ``project.find_root`` gives, nested projects left out. Its answers are
kept by the ``Project``, not by this module. The first time a rule needs a fact the file itself cannot give, the
project is indexed once per process: the files that can build a pinned
loader (their text mentions both ``DataLoader`` and ``pin_memory``) are
walked by the engine, without rules, and every call of a function imported
from another file of the project (``from engine import train_one_epoch``,
``from .engine import …``, ``engine.train_one_epoch(…)``) that passes a
loader built in the caller's scope is recorded as (callee file, function) ->
the argument's position or keyword, whether the loader is pinned, and where
it is built.

``loader_passed(path, function, param)`` then answers, for a parameter no
call inside the file binds, the loader the rest of the project passes for
it: the engine's ``loader_for`` asks it, so a loader built in ``main.py`` and
iterated in ``engine.py`` is one loader to every rule. The CLI, its workers
and the flake8 plugin all index the same tree, so they report the same.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from torchlint.analysis import conv_dims
from torchlint.collector import Collector
from torchlint.facts import FunctionInfo, LoaderInfo, does_per_item_work, uses_default_collate
from torchlint.model import FileModel
from torchlint.names import dotted_name
from torchlint.project import REMOVED_MODULES, Project, Projects, Version, api_ceiling, parse_source
from torchlint.tree import child_nodes, iter_subtree
from torchlint.vocabulary import LIBRARY_MODULES
from torchlint.walker import Walker


@dataclass(frozen=True)
class PassedLoader:
    """A loader one file passes to a function of another."""

    key: Union[int, str]  # the argument's position, or its keyword
    pinned: Optional[bool]
    where: str  # "main.py:12", for messages
    # batches come from torch's default collate (no ``collate_fn``): tensors,
    # not objects of the project's own classes (TL201's fix needs to know)
    default_collate: bool = False


class ProjectIndex:
    def __init__(self) -> None:
        # (absolute callee path, function name) -> loaders passed to it
        self.passed: Dict[Tuple[str, str], List[PassedLoader]] = {}

    def add(self, callee_path: str, function: str, passed: PassedLoader) -> None:
        self.passed.setdefault((callee_path, function), []).append(passed)


class ProjectAnalysis:
    """The cross-file questions about one project, answered from per-file
    summaries: another file's engine facts, built once per process through
    the linter's own parse path (``parse``) and kept by the ``Project``.
    Every question marks the project as consulted, so the result cache
    knows which results depend on other files (``Projects.consulted``)."""

    def __init__(
        self, projects: Projects, project: Project, parse: Callable[[str, str], Optional[Tuple[str, cst.Module]]]
    ) -> None:
        self.projects = projects
        self.project = project
        self._parse = parse

    def _consult(self) -> Project:
        self.projects.consult(self.project)
        return self.project

    def _paths(self) -> Set[str]:
        """The project's file paths as a set, made once per project (imports resolve against it)."""
        memo = self.project.memo("paths")
        if "set" not in memo:
            memo["set"] = set(self.project.texts())
        return memo["set"]

    def summary(self, path: str) -> Optional[FileModel]:
        """The engine's facts of another file of the project (walked without
        rules), once per process; None when it cannot be read or parsed."""
        summaries = self.project.memo("summaries")
        if path in summaries:
            return summaries[path]
        summaries[path] = None
        text = self.project.texts().get(path)
        parsed = self._parse(text, path) if text is not None else None
        if parsed is not None:
            parsed_text, module = parsed
            model = FileModel(path, parsed_text, module, analysis=self)
            try:
                Walker(Collector(model), {}, {}, lambda method, exc: None).walk(module)
            except Exception:
                return None  # too deep, or a file the engine cannot follow: its own lint reports it
            summaries[path] = model
        return summaries[path]

    def index(self) -> ProjectIndex:
        """Loaders passed across files, built once per project."""
        project = self._consult()
        memo = project.memo("index")
        if "index" not in memo:
            memo["index"] = self._build_index()
        return memo["index"]

    def _build_index(self) -> ProjectIndex:
        index = ProjectIndex()
        texts = self.project.texts()
        files = set(self.project.files())
        for path in self.project.files():
            text = texts.get(path)
            if text is None or "pin_memory" not in text or "DataLoader" not in text:
                continue
            ctx = self.summary(path)
            if ctx is None:
                continue
            for record in ctx.facts.call_records:
                if not record.loaders:
                    continue
                qualified = ctx.names.imported_name(record.call.func)
                if not qualified or "." not in qualified.lstrip("."):
                    continue
                module_name, _, function = qualified.rpartition(".")
                callee = resolve_module(path, module_name, files)
                if callee is None or callee == path:
                    continue
                for position, arg in enumerate(record.call.args):
                    loader = record.loaders.get(id(arg.value))
                    if loader is None or arg.star:
                        continue
                    key: Union[int, str] = arg.keyword.value if arg.keyword is not None else position
                    assert loader.call is not None  # a loader of this module
                    row = _row(ctx.source, loader.call)
                    index.add(
                        callee,
                        function,
                        PassedLoader(
                            key, loader.pinned, f"{os.path.basename(path)}:{row}", uses_default_collate(loader.call)
                        ),
                    )
        return index

    # -- a parameter no call in the file binds: the loader other files pass for it
    def loader_passed(self, path: str, function: "FunctionInfo", param: str) -> Optional["LoaderInfo"]:
        """The loader other files of the project pass for ``param`` of the
        module-level ``function`` in ``path``: a pinned one if any call passes
        one (the copy then blocks on that path), else the first seen."""
        if function.class_name is not None or function.parent is not None:
            return None
        passed = self.index().passed.get((os.path.abspath(path), function.name))
        if not passed:
            return None
        matching = [
            p
            for p in passed
            if p.key == param
            or (isinstance(p.key, int) and p.key < len(function.params) and function.params[p.key] == param)
        ]
        if not matching:
            return None
        chosen = next((p for p in matching if p.pinned), matching[0])
        return LoaderInfo(
            call=None,
            target=param,
            pinned=chosen.pinned,
            num_workers=None,
            sampler=None,
            function=None,
            where=chosen.where,
            default_collate=chosen.default_collate,
        )

    # -- the other direction: does the function a loader is passed to copy its batches?
    def copied_elsewhere(self, ctx: FileModel, loader: "LoaderInfo") -> Optional[str]:
        """Where another file of the project copies the batches of ``loader`` to
        the device: the loader is passed (as an argument resolved at the call)
        to a function imported from that file, which copies the batches of that
        parameter. Returns the file's name for the message, else None."""
        files: Optional[Set[str]] = None
        for record in ctx.facts.call_records:
            keys = [
                (arg.keyword.value if arg.keyword is not None else position)
                for position, arg in enumerate(record.call.args)
                if not arg.star and record.loaders.get(id(arg.value)) is loader
            ]
            if not keys:
                continue
            qualified = ctx.names.imported_name(record.call.func)
            if not qualified or "." not in qualified.lstrip("."):
                continue
            module_name, _, function = qualified.rpartition(".")
            if files is None:
                files = set(self._consult().files())
            callee = resolve_module(os.path.abspath(ctx.path), module_name, files)
            if callee is None:
                continue
            copies, params_of = self.copies_in(callee)
            params = params_of.get(function)
            for key in keys:
                param = key if isinstance(key, str) else (params[key] if params and key < len(params) else None)
                if param is not None and (function, param) in copies:
                    return os.path.basename(callee)
        return None

    def copies_in(self, path: str) -> Tuple[Set[Tuple[str, str]], Dict[str, List[str]]]:
        """(function, parameter) pairs of the module-level functions of ``path``
        that copy the batches of that parameter to the device, and the
        parameters of each module-level function."""
        memo = self.project.memo("copies")
        found = memo.get(path)
        if found is not None:
            return found
        copies: Set[Tuple[str, str]] = set()
        params: Dict[str, List[str]] = {}
        found = memo[path] = (copies, params)
        ctx = self.summary(path)
        if ctx is None:
            return found  # unreadable or unparsable: its own lint reports it
        for infos in ctx.facts.functions.values():
            for info in infos:
                if info.class_name is None and info.parent is None:
                    params[info.name] = info.params
        for origin in ctx.facts.batch_copies:
            function = origin.function
            source = origin.source
            if function is None or function.class_name is not None or function.parent is not None:
                continue
            if isinstance(source, cst.Name) and source.value in function.params:
                copies.add((function.name, source.value))
        return found

    # -- per batch from another file: ``metric_logger.update(...)`` in engine.py's batch loop
    def hot_from_elsewhere(self, ctx: FileModel, function: "FunctionInfo") -> Optional[str]:
        """Does another file of the project call ``function`` (a method of a
        module-level class of ``ctx``'s file) once per batch, passing it a tensor:
        ``metric_logger.update(acc=acc1)`` in a batch loop's body, not under a
        periodic guard, where ``metric_logger = utils.MetricLogger()``? Returns
        how to name that loop ("`for x in loader` in engine.py"), else None. Only
        the files whose text names both the class and this module are walked."""
        if function.parent is not None or function.class_name is None:
            return None
        path = os.path.abspath(ctx.path)
        memo = self._consult().memo("hot")
        key = (path, function.class_name, function.name)
        if key in memo:
            return memo[key]
        memo[key] = None
        texts = self.project.texts()
        stem = _module_stem(path)
        owner = function.class_name
        files = self._paths()
        for other, text in texts.items():
            if other == path or f"{owner}(" not in text or stem not in text or f".{function.name}(" not in text:
                continue
            other_ctx = self.summary(other)
            if other_ctx is None:
                continue
            found = _hot_call_in(other_ctx, other, path, function, files)
            if found is not None:
                memo[key] = found
                return found
        return None

    def function_hot_elsewhere(self, ctx: FileModel, function: "FunctionInfo") -> Optional[str]:
        """Does another file of the project import this module-level function
        and call it on every step of a batch loop, or from a function that
        runs once per batch there (``get_grad_norm(model.parameters())`` in
        ``main.py``'s training loop, defined in ``utils.py``)? Returns how to
        name that loop ("`for x in loader` in main.py"), else None. Only the
        files whose text names the function and this module are walked."""
        if function.class_name is not None or function.parent is not None:
            return None
        path = os.path.abspath(ctx.path)
        memo = self._consult().memo("hot functions")
        key = (path, function.name)
        if key in memo:
            return memo[key]
        memo[key] = None
        texts = self.project.texts()
        stem = _module_stem(path)
        files = self._paths()
        for other, text in texts.items():
            if other == path or f"{function.name}(" not in text or stem not in text:
                continue
            summary = self.summary(other)
            if summary is None:
                continue
            imported = summary.names.imported_name(cst.Name(function.name))
            if imported is None or resolve_module(other, imported.rpartition(".")[0], files) != path:
                continue  # a function of the same name from elsewhere
            where = os.path.basename(other)
            for loop in summary.facts.loops.values():
                if loop.is_batch_loop and any(
                    site.runs_every_step(within=loop) for site in loop.call_sites.get(function.name, ())
                ):
                    memo[key] = f"{loop.line_hint} in {where}"
                    return memo[key]
            reached = summary.facts.functions_run_per_batch()
            for infos in summary.facts.functions.values():
                for info in infos:
                    found = reached.get(id(info))
                    if found is None:
                        continue
                    if any(callee == function.name and site.runs_every_step() for callee, site in info.call_sites):
                        memo[key] = f"{found[0].line_hint} in {where}"
                        return memo[key]
        return None

    def forward_caller_elsewhere(self, ctx: FileModel, function: "FunctionInfo") -> Optional[str]:
        """Where a ``forward()`` of another file of the project calls this
        module-level function on every pass (``timestep_embedding`` of
        ``nn.py``, called by ``UNetModel.forward`` in ``unet.py``), as
        "unet.py:640"; None when no file is seen to. Only files whose text
        names the function and this module are walked."""
        if function.class_name is not None or function.parent is not None:
            return None
        path = os.path.abspath(ctx.path)
        memo = self._consult().memo("forward callers")
        key = (path, function.name)
        if key in memo:
            return memo[key]
        memo[key] = None
        texts = self.project.texts()
        stem = _module_stem(path)
        files = self._paths()
        for other, text in texts.items():
            if other == path or f"{function.name}(" not in text or stem not in text or "def forward" not in text:
                continue
            summary = self.summary(other)
            if summary is None:
                continue
            imported = summary.names.imported_name(cst.Name(function.name))
            if imported is None or resolve_module(other, imported.rpartition(".")[0], files) != path:
                continue  # a function of the same name from elsewhere
            reached = summary.facts.functions_run_per_forward()
            for infos in summary.facts.functions.values():
                for info in infos:
                    forward = reached.get(id(info))
                    if forward is None:
                        continue
                    for callee, site in info.call_sites:
                        if callee == function.name and site.runs_every_step():
                            place = f"{os.path.relpath(other, self.project.root)}:{_row(summary.source, site.node)}"
                            found = f"`{forward.class_name}.forward()` in {place}"
                            memo[key] = found
                            return found
        return None

    # -- the newest torch a file can run on, shown by what it imports
    def import_ceiling(self, path: str, text: str) -> Optional[Tuple[Version, str]]:
        """The newest torch the file can run on when it, or a module of the
        project it imports at its top level, imports unguarded a module torch
        removed (``from torch._six import inf`` in ``utils.py``, which
        ``engine.py`` imports): ((1, x), "torch._six (removed in torch 2.0) in utils.py")."""
        own = api_ceiling(text)
        if own is not None:
            return own
        texts = self._consult().texts()
        users = self.project.memo("removed-module users")
        if "paths" not in users:
            users["paths"] = {p for p, t in texts.items() if any(entry[0] in t for entry in REMOVED_MODULES)}
        if not users["paths"]:
            return None
        tree = parse_source(text)
        if tree is None:
            return None
        importer = os.path.abspath(path)
        for statement in tree.body:
            if isinstance(statement, ast.ImportFrom) and statement.module:
                names = ["." * statement.level + statement.module]
            elif isinstance(statement, ast.Import):
                names = [alias.name for alias in statement.names]
            else:
                continue
            for name in names:
                target = resolve_module(importer, name, self._paths())
                if target is None or target not in users["paths"]:
                    continue
                found = api_ceiling(texts[target])
                if found is not None:
                    return found[0], f"{found[1]} in {os.path.relpath(target, self.project.root)}"
        return None

    # -- a function of another file: does it train?
    def imported_function_trains(self, path: str, imported: str) -> Optional[str]:
        """Where the function ``imported`` (``engine.train_one_epoch``,
        ``.engine.fit``, as the file at ``path`` imports it) trains: calls
        ``backward()`` or steps an optimizer, itself or through its module's
        functions ("engine.py:45"); None when it does not, or cannot be found
        in the project. One level of files: what that file imports in turn
        is not followed."""
        module_name, _, function = imported.rpartition(".")
        if not module_name or not function:
            return None
        importer = os.path.abspath(path)
        texts = self._consult().texts()
        target = resolve_module(importer, module_name, self._paths())
        if target is None or target == importer:
            return None
        text = texts.get(target, "")
        if f"def {function}" not in text or not _TRAINS_TEXT.search(text):
            return None  # not defined there, or a file that never calls backward() or step(): no walk
        memo = self.project.memo("trains")
        key = (target, function)
        if key not in memo:
            memo[key] = None
            summary = self.summary(target)
            if summary is not None and summary.facts.trains_in_module(function):
                offset = summary.source.find(f"def {function}(")
                row = summary.source.count("\n", 0, offset) + 1 if offset >= 0 else 1
                memo[key] = f"{os.path.relpath(target, self.project.root)}:{row}"
        return memo[key]

    # -- a model class of another file: is it convolutional?
    def class_convolution(self, ctx: FileModel, func: cst.BaseExpression) -> Optional[Tuple[int, str]]:
        """(spatial dims, "file:row" of the class) when ``func`` is a class
        imported from another file of the project (through a package's
        ``__init__`` re-export too) whose own code builds 2-D or 3-D
        convolutions (``nn.Conv2d``, ``nn.ConvTranspose2d``, a torchvision
        CNN); None otherwise."""
        for qualified in self._project_classes(ctx, func):
            module_name, _, class_name = qualified.rpartition(".")
            importer = os.path.abspath(ctx.path)
            resolved = self._consult().memo("convolution of an import")
            if (importer, qualified) not in resolved:
                target = self._defining_file(importer, module_name, class_name, self.project.texts())
                resolved[(importer, qualified)] = self._convolution_in(target, class_name) if target else None
            if resolved[(importer, qualified)] is not None:
                return resolved[(importer, qualified)]
        return None

    @staticmethod
    def _project_classes(ctx: FileModel, func: cst.BaseExpression) -> List[str]:
        """The dotted names a called class may have in the project's other files:
        its import, or each star-imported module's (``from models import *``)
        when the file neither imports nor defines it. Library classes
        (``nn.Linear``) are never the project's, and give no reason to depend
        on its files."""
        found = []
        for qualified in ctx.names.candidates(func):
            if "." not in qualified.lstrip(".") or qualified.startswith(LIBRARY_MODULES):
                continue
            class_name = qualified.rpartition(".")[2]
            if class_name[:1].isupper() and class_name not in ctx.facts.class_bases:
                found.append(qualified)
        return found

    def _convolution_in(self, target: str, class_name: str) -> Optional[Tuple[int, str]]:
        memo = self.project.memo("convolutions")
        key = (target, class_name)
        if key not in memo:
            memo[key] = self._class_convolution(target, class_name)
        return memo[key]

    def _defining_file(self, importer: str, module_name: str, name: str, texts: Dict[str, str]) -> Optional[str]:
        """The file that defines ``name`` imported from ``module_name``,
        following a package ``__init__``'s ``from .x import name`` (twice at most)."""
        for _ in range(3):
            target = resolve_module(importer, module_name, self._paths())
            if target is None or target == importer:
                return None
            text = texts.get(target, "")
            if re.search(rf"^class {re.escape(name)}\b", text, re.MULTILINE):
                return target
            again = re.search(rf"^from\s+(\.*[\w.]*)\s+import\s+[^\n]*\b{re.escape(name)}\b", text, re.MULTILINE)
            if again is None:
                return None
            importer, module_name = target, again.group(1)
        return None

    def _class_convolution(self, path: str, class_name: str) -> Optional[Tuple[int, str]]:
        summary = self.summary(path)
        if summary is None:
            return None
        for statement in summary.module.body:
            if isinstance(statement, cst.ClassDef) and statement.name.value == class_name:
                dims = [
                    conv_dims(summary.names.qualified_name(sub.func), sub)
                    for sub in iter_subtree(statement)
                    if isinstance(sub, cst.Call)
                ]
                found = max((d for d in dims if d is not None and d >= 2), default=None)
                if found is None:
                    return None
                offset = summary.source.find(f"class {class_name}")
                row = summary.source.count("\n", 0, offset) + 1 if offset >= 0 else 1
                return found, f"{os.path.relpath(path, self.project.root)}:{row}"
        return None

    # -- a dataset class of another file: does fetching one item do real work?
    def class_loads_per_item(self, ctx: FileModel, func: cst.BaseExpression) -> bool:
        """Is ``func`` a class imported from another file of the project
        (``from pkg.loader import TextImageDataset``) whose ``__getitem__`` reads,
        decodes or transforms a sample (``facts.does_per_item_work``)? The class's
        file is parsed on demand, once per process, only when its text defines
        a ``__getitem__``."""
        path = os.path.abspath(ctx.path)
        for qualified in self._project_classes(ctx, func):
            module_name, _, class_name = qualified.rpartition(".")
            texts = self._consult().texts()
            target = resolve_module(path, module_name, self._paths())
            if target is None or target == path:
                continue
            memo = self.project.memo("loading")
            key = (target, class_name)
            found = memo.get(key)
            if found is None:
                found = memo[key] = self._getitem_loads(target, texts.get(target, ""), class_name)
            if found:
                return True
        return False

    def _getitem_loads(self, path: str, text: str, class_name: str) -> bool:
        if "__getitem__" not in text or f"class {class_name}" not in text:
            return False
        summary = self.summary(path)
        if summary is None:
            return False  # its own lint reports it
        for statement in summary.module.body:
            if isinstance(statement, cst.ClassDef) and statement.name.value == class_name:
                for item in statement.body.body:
                    if isinstance(item, cst.FunctionDef) and item.name.value == "__getitem__":
                        return does_per_item_work(item)
        return False

    # -- config attributes: ``config.DATA.PIN_MEMORY`` -> the project's ``_C.DATA.PIN_MEMORY = True``
    def config_default(self, expr: cst.Attribute) -> Optional[cst.BaseExpression]:
        """The literal default of an upper-case config key (``cfg.DATA.PIN_MEMORY``,
        two levels or more) set at module level by a config module of the
        project (``_C.DATA.PIN_MEMORY = True``, yacs style). None when no module,
        or more than one value, is found: the key is then unknown."""
        parts: List[str] = []
        node: cst.BaseExpression = expr
        while isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
            node = node.value
        if len(parts) < 2 or not isinstance(node, cst.Name) or not all(_CONFIG_KEY.match(p) for p in parts):
            return None
        key = ".".join(reversed(parts))
        memo = self._consult().memo("config")
        if "defaults" not in memo:
            memo["defaults"] = _config_defaults(self.project.texts())
        literal = memo["defaults"].get(key)
        return cst.parse_expression(literal) if literal else None

    # -- return values: ``a, b, train_loader, val_loader = build_loader(cfg)`` from another file
    def returned_loader(
        self, path: str, names, call: cst.Call, position: Optional[int], depth: int = 0
    ) -> Optional["LoaderInfo"]:
        """The loader a function imported from another file of the project
        returns (at ``position`` of a returned tuple, or as its whole value),
        followed through functions that return another imported function's
        result (``return _build_loader(config)``). The loader's ``where``
        names the file and line."""
        qualified = names.imported_name(call.func)
        if not qualified or "." not in qualified.lstrip(".") or depth > 3:
            return None
        module_name, _, function = qualified.rpartition(".")
        importer = os.path.abspath(path)
        self._consult()
        callee = resolve_module(importer, module_name, self._paths())
        if callee is None or callee == importer:
            return None
        memo = self.project.memo("returned")
        key = (callee, function, position)
        if key in memo:
            return memo[key]
        memo[key] = None
        callee_ctx = self.summary(callee)
        found = None if callee_ctx is None else self._loader_returned_by(callee_ctx, callee, function, position, depth)
        memo[key] = found
        return found

    def _loader_returned_by(
        self, ctx: FileModel, path: str, function: str, position: Optional[int], depth: int
    ) -> Optional["LoaderInfo"]:
        facts = ctx.facts
        for info in facts.functions.get(function, ()):
            if info.class_name is not None or info.parent is not None:
                continue
            for node in _own_returns(info.node.body):
                if node.value is None:
                    continue
                value = node.value
                if position is not None:
                    if not isinstance(value, cst.Tuple) or position >= len(value.elements):
                        if isinstance(value, cst.Call):  # forwarded: ``return _build_loader(config)``
                            forwarded = self.returned_loader(path, ctx.names, value, position, depth + 1)
                            if forwarded is not None:
                                return forwarded
                        continue
                    value = value.elements[position].value
                elif isinstance(value, cst.Call) and not facts.loader_for(value, info):
                    forwarded = self.returned_loader(path, ctx.names, value, None, depth + 1)
                    if forwarded is not None:
                        return forwarded
                    continue
                loader = facts.loader_for(value, info)
                if loader is not None and loader.call is not None:
                    where = (
                        loader.where or f"{os.path.relpath(path, self.project.root)}:{_row(ctx.source, loader.call)}"
                    )
                    return replace(loader, where=where)
        return None


# A file that trains calls ``backward()`` or an optimizer's ``step()`` somewhere in its text.
_TRAINS_TEXT = re.compile(r"\.(backward|step)\(")


def _module_stem(path: str) -> str:
    """The name other files import the module at ``path`` by (its package's, for an ``__init__.py``)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(os.path.dirname(path)) if stem == "__init__" else stem


def _row(text: str, node: cst.CSTNode) -> int:
    """The 1-based row of ``node`` without resolving positions for the whole
    file: the first line of the call's own code is found in the text."""
    name = dotted_name(node.func) if isinstance(node, cst.Call) else None
    first = cst.Module(body=[]).code_for_node(node).splitlines()[0] if name else ""
    offset = text.find(first) if first else -1
    return text.count("\n", 0, offset) + 1 if offset >= 0 else 1


def _hot_call_in(
    other_ctx: FileModel, other: str, target: str, function: "FunctionInfo", files: Set[str]
) -> Optional[str]:
    facts = other_ctx.facts
    names = other_ctx.names

    def names_target(node: cst.CSTNode, wanted: Optional[str]) -> bool:
        qualified = names.imported_name(node)
        if not qualified or "." not in qualified.lstrip("."):
            return False
        module_name, _, last = qualified.rpartition(".")
        return last == wanted and resolve_module(other, module_name, files) == target

    where = os.path.basename(other)
    for loop in facts.loops.values():
        if not loop.is_batch_loop:
            continue
        for built_by, method, site, passes_tensor in loop.method_calls:
            if (
                passes_tensor
                and method == function.name
                and names_target(built_by.func, function.class_name)
                and site.runs_every_step(within=loop)
            ):
                return f"{loop.line_hint} in {where}"
    return None


_CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CONFIG_LINE = re.compile(
    r"^[A-Za-z_]\w*((?:\.[A-Z][A-Z0-9_]*)+)\s*=\s*(True|False|None|-?\d+(?:\.\d+)?)\s*(?:#.*)?$", re.M
)


def _config_defaults(texts: Dict[str, str]) -> Dict[str, str]:
    """Key -> literal over the project's module-level upper-case config
    assignments; a key given two different values is left out."""
    found: Dict[str, str] = {}
    conflicting: Set[str] = set()
    for text in texts.values():
        if "CfgNode" not in text and "ConfigDict" not in text and "EasyDict" not in text:
            continue
        for match in _CONFIG_LINE.finditer(text):
            key, literal = match.group(1)[1:], match.group(2)
            if found.get(key, literal) != literal:
                conflicting.add(key)
            found[key] = literal
    for key in conflicting:
        found.pop(key, None)
    return found


def _own_returns(body: cst.CSTNode):
    """The ``return`` statements of a function body, not of functions, classes
    or lambdas defined inside it."""
    stack = [body]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Return):
            yield current
        elif not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(reversed(child_nodes(current)))


def resolve_module(importer: str, module: str, files: Set[str]) -> Optional[str]:
    """The file of the run that ``module`` names, imported from ``importer``:
    relative (``.engine``) from the importer's package, absolute (``engine``,
    ``pkg.engine``) from the importer's folder or any folder above it."""
    level = len(module) - len(module.lstrip("."))
    parts = [p for p in module.lstrip(".").split(".") if p]
    if not parts:
        return None
    folder = os.path.dirname(importer)
    if level:
        for _ in range(level - 1):
            folder = os.path.dirname(folder)
        bases = [folder]
    else:
        bases = []
        while True:
            bases.append(folder)
            parent = os.path.dirname(folder)
            if parent == folder or len(bases) > 6:
                break
            folder = parent
    for base in bases:
        stem = os.path.join(base, *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if candidate in files:
                return candidate
    return None
