"""Facts that cross files: which loader another module of the project passes
to a function.

The project is the folder tree under the file's project root, found upward
from the file as the config is (the nearest folder with ``pyproject.toml``,
``setup.py``, ``setup.cfg`` or ``.git``; the file's own folder when there is
none). The first time a rule needs a fact the file itself cannot give, the
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

import hashlib
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple, Union

import libcst as cst

from torchlint import source as sources

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.context import FileContext
    from torchlint.facts import FunctionInfo, LoaderInfo


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


_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_SKIPPED_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist", "site-packages", "venv", "env"})
_MAX_FILES = 5000
_INDEXES: Dict[str, ProjectIndex] = {}


def project_root(path: str) -> str:
    """The nearest folder up from ``path`` with a root marker; without one,
    the folder that holds the file's top-level package (``data/build.py`` in
    a package ``data/`` belongs with ``main.py`` beside ``data/``).

    Every question this module answers starts here, so while a file's lint is
    being recorded (``record_consulted``) the roots asked for are the projects
    its findings may depend on: the result cache checks them (``digest``)."""
    root = _find_root(path)
    if _consulted is not None:
        _consulted.add(root)
    return root


def _find_root(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    start = folder
    for _ in range(12):
        if any(os.path.exists(os.path.join(folder, marker)) for marker in _ROOT_MARKERS):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for _ in range(12):
        if not os.path.exists(os.path.join(start, "__init__.py")):
            break
        start = os.path.dirname(start)
    return start


_consulted: Optional[Set[str]] = None

# While `--fix` rewrites files, other files' facts are read from the contents
# the round started from (runner.fix_to_fixed_point), not from whatever the
# disk holds when a worker gets there: the fixes of a round never depend on
# which worker fixed which file first.
_frozen: Dict[str, bytes] = {}


def freeze(contents: Dict[str, bytes]) -> None:
    """Read these files (absolute path -> bytes) from ``contents`` instead of
    the disk, and forget every fact read so far; ``freeze({})`` ends it."""
    global _frozen
    clear_caches()
    _frozen = {os.path.abspath(path): data for path, data in contents.items()}


def read_text(path: str) -> str:
    data = _frozen.get(os.path.abspath(path)) if _frozen else None
    if data is None:
        with open(path, "rb") as handle:
            data = handle.read()
    return sources.decode(data).text


def record_consulted() -> None:
    """Start recording the project roots the next lint consults."""
    global _consulted
    _consulted = set()


def consulted() -> List[str]:
    """The project roots consulted since ``record_consulted``; stops recording."""
    global _consulted
    roots, _consulted = sorted(_consulted or ()), None
    return roots


def digest(root: str) -> str:
    """What the project's cross-file facts are computed from: every file this
    module would read there, by path, size and modification time."""
    hasher = hashlib.sha256()
    for path in project_files(root):
        try:
            stat = os.stat(path)
        except OSError:
            continue
        hasher.update(f"{os.path.relpath(path, root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode("utf-8", "surrogatepass"))
    return hasher.hexdigest()


def index_for(path: str) -> ProjectIndex:
    """The index of the project ``path`` belongs to, built once per process."""
    root = project_root(path)
    index = _INDEXES.get(root)
    if index is None:
        index = _INDEXES[root] = build(project_files(root))
    return index


def project_files(root: str) -> List[str]:
    found: List[str] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIPPED_DIRS)
        found.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
        if len(found) > _MAX_FILES:
            break
    return found


def build(paths: List[str]) -> ProjectIndex:
    from torchlint.context import FileContext
    from torchlint.walker import Walker

    index = ProjectIndex()
    files = set(paths)
    for path in paths:
        try:
            text = read_text(path)
        except (OSError, sources.DecodeError):
            continue  # the lint of the file reports it
        if "pin_memory" not in text or "DataLoader" not in text:
            continue
        try:
            module = cst.parse_module(text)
        except Exception:
            continue  # reported as a syntax error by the lint
        ctx = FileContext(path, text, module)
        try:
            Walker(ctx, {}, {}, lambda method, exc: None).walk(module)
        except RecursionError:
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
                row = _row(text, loader.call)
                index.add(callee, function, PassedLoader(key, loader.pinned, f"{os.path.basename(path)}:{row}", uses_default_collate(loader.call)))
    return index


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


def loader_passed(path: str, function: "FunctionInfo", param: str) -> Optional["LoaderInfo"]:
    """The loader other files of the project pass for ``param`` of the
    module-level ``function`` in ``path``: a pinned one if any call passes
    one (the copy then blocks on that path), else the first seen."""
    if function.class_name is not None or function.parent is not None:
        return None
    passed = index_for(path).passed.get((os.path.abspath(path), function.name))
    if not passed:
        return None
    from torchlint.facts import LoaderInfo

    matching = [
        p for p in passed if p.key == param or (isinstance(p.key, int) and p.key < len(function.params) and function.params[p.key] == param)
    ]
    if not matching:
        return None
    chosen = next((p for p in matching if p.pinned), matching[0])
    return LoaderInfo(
        call=None, target=param, pinned=chosen.pinned, num_workers=None, sampler=None, function=None,  # type: ignore[arg-type]
        where=chosen.where, default_collate=chosen.default_collate,
    )


def uses_default_collate(call: Optional[cst.Call]) -> bool:
    """``DataLoader(...)`` without a ``collate_fn`` (by keyword, by position,
    or possibly inside ``**kwargs``): its batches are torch tensors."""
    if call is None:
        return False
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    return len(positional) <= 6 and not any(arg.star or (arg.keyword is not None and arg.keyword.value == "collate_fn") for arg in call.args)


# -- the other direction: does the function a loader is passed to copy its batches?
_COPIES: Dict[str, Set[Tuple[str, str]]] = {}


def copied_elsewhere(ctx: "FileContext", loader: "LoaderInfo") -> Optional[str]:
    """Where another file of the project copies the batches of ``loader`` to
    the device: the loader is passed (as an argument resolved at the call)
    to a function imported from that file, which copies the batches of that
    parameter. Returns the file's name for the message, else None. The
    callee file is walked on demand, once per process."""
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
            files = set(project_files(project_root(ctx.path)))
        callee = resolve_module(os.path.abspath(ctx.path), module_name, files)
        if callee is None:
            continue
        copies = copies_in(callee)
        params = _params_of(callee, function)
        for key in keys:
            param = key if isinstance(key, str) else (params[key] if params and key < len(params) else None)
            if param is not None and (function, param) in copies:
                return os.path.basename(callee)
    return None


_PARAMS: Dict[Tuple[str, str], List[str]] = {}


def _params_of(path: str, function: str) -> Optional[List[str]]:
    copies_in(path)
    return _PARAMS.get((path, function))


def copies_in(path: str) -> Set[Tuple[str, str]]:
    """(function, parameter) pairs of the module-level functions of ``path``
    that copy the batches of that parameter to the device."""
    found = _COPIES.get(path)
    if found is not None:
        return found
    from torchlint.context import FileContext
    from torchlint.walker import Walker

    found = _COPIES[path] = set()
    try:
        text = read_text(path)
        module = cst.parse_module(text)
        ctx = FileContext(path, text, module)
        Walker(ctx, {}, {}, lambda method, exc: None).walk(module)
    except Exception:
        return found  # unreadable or unparsable: its own lint reports it
    for infos in ctx.facts.functions.values():
        for info in infos:
            if info.class_name is None and info.parent is None:
                _PARAMS[(path, info.name)] = info.params
    for origin in ctx.facts.batch_copies:
        function = origin.function
        source = origin.source
        if function is None or function.class_name is not None or function.parent is not None:
            continue
        if isinstance(source, cst.Name) and source.value in function.params:
            found.add((function.name, source.value))
    return found


def _row(text: str, node: cst.CSTNode) -> int:
    """The 1-based row of ``node`` without resolving positions for the whole
    file: the first line of the call's own code is found in the text."""
    from torchlint.names import dotted_name

    name = dotted_name(node.func) if isinstance(node, cst.Call) else None  # type: ignore[attr-defined]
    first = cst.Module(body=[]).code_for_node(node).splitlines()[0] if name else ""
    offset = text.find(first) if first else -1
    return text.count("\n", 0, offset) + 1 if offset >= 0 else 1


# -- per batch from another file: ``metric_logger.update(...)`` in engine.py's batch loop
_TEXTS: Dict[str, Dict[str, str]] = {}
_WALKED: Dict[str, object] = {}
_HOT: Dict[Tuple[str, Optional[str], str], Optional[str]] = {}


def hot_from_elsewhere(ctx: "FileContext", function: "FunctionInfo") -> Optional[str]:
    """Does another file of the project call ``function`` (a method of a
    module-level class of ``ctx``'s file) once per batch, passing it a tensor:
    ``metric_logger.update(acc=acc1)`` in a batch loop's body, not under a
    periodic guard, where ``metric_logger = utils.MetricLogger()``? Returns
    how to name that loop ("`for x in loader` in engine.py"), else None. Only
    the files whose text names both the class and this module are walked."""
    if function.parent is not None or function.class_name is None:
        return None
    path = os.path.abspath(ctx.path)
    key = (path, function.class_name, function.name)
    if key in _HOT:
        return _HOT[key]
    _HOT[key] = None
    root = project_root(path)
    texts = _project_texts(root)
    stem = os.path.splitext(os.path.basename(path))[0]
    if stem == "__init__":
        stem = os.path.basename(os.path.dirname(path))
    owner = function.class_name
    files = set(texts)
    for other, text in texts.items():
        if other == path or f"{owner}(" not in text or stem not in text or f".{function.name}(" not in text:
            continue
        facts_ctx = _walk(other, text)
        if facts_ctx is None:
            continue
        found = _hot_call_in(facts_ctx, other, path, function, files)
        if found is not None:
            _HOT[key] = found
            return found
    return None


def _hot_call_in(other_ctx, other: str, target: str, function: "FunctionInfo", files: Set[str]) -> Optional[str]:
    facts = other_ctx.facts
    names = other_ctx.names

    def names_target(node: cst.CSTNode, wanted: str) -> bool:
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
                and _runs_every_time(site, loop)
            ):
                return f"{loop.line_hint} in {where}"
    return None


def _runs_every_time(site, loop) -> bool:
    return not site.in_exception_path() and not site.under_periodic_guard(within=loop)


def _project_texts(root: str) -> Dict[str, str]:
    texts = _TEXTS.get(root)
    if texts is None:
        texts = _TEXTS[root] = {}
        for path in project_files(root):
            try:
                texts[path] = read_text(path)
            except (OSError, sources.DecodeError):
                continue
    return texts


def _walk(path: str, text: str):
    """The engine's facts of another file (walked without rules), once per process."""
    if path in _WALKED:
        return _WALKED[path]
    from torchlint.context import FileContext
    from torchlint.walker import Walker

    result = None
    try:
        module = cst.parse_module(text)
        ctx = FileContext(path, text, module)
        Walker(ctx, {}, {}, lambda method, exc: None).walk(module)
        result = ctx
    except Exception:
        result = None
    _WALKED[path] = result
    return result


# -- a dataset class of another file: does fetching one item do real work?
_LOADING: Dict[Tuple[str, str], bool] = {}


def class_loads_per_item(ctx: "FileContext", func: cst.BaseExpression) -> bool:
    """Is ``func`` a class imported from another file of the project
    (``from pkg.loader import TextImageDataset``) whose ``__getitem__`` reads,
    decodes or transforms a sample (``facts.does_per_item_work``)? The class's
    file is parsed on demand, once per process, only when its text defines
    a ``__getitem__``."""
    qualified = ctx.names.imported_name(func)
    if not qualified or "." not in qualified.lstrip("."):
        return False
    module_name, _, class_name = qualified.rpartition(".")
    path = os.path.abspath(ctx.path)
    texts = _project_texts(project_root(path))
    target = resolve_module(path, module_name, set(texts))
    if target is None or target == path:
        return False
    key = (target, class_name)
    found = _LOADING.get(key)
    if found is None:
        found = _LOADING[key] = _getitem_loads(texts.get(target, ""), class_name)
    return found


def _getitem_loads(text: str, class_name: str) -> bool:
    from torchlint.facts import does_per_item_work

    if "__getitem__" not in text or f"class {class_name}" not in text:
        return False
    try:
        module = cst.parse_module(text)
    except Exception:
        return False  # its own lint reports it
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == class_name:
            for item in statement.body.body:
                if isinstance(item, cst.FunctionDef) and item.name.value == "__getitem__":
                    return does_per_item_work(item)
    return False


# -- config attributes: ``config.DATA.PIN_MEMORY`` -> the project's ``_C.DATA.PIN_MEMORY = True``
_CONFIG_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
_CONFIG_DEFAULTS: Dict[str, Dict[str, str]] = {}
_CONFIG_LINE = re.compile(r"^[A-Za-z_]\w*((?:\.[A-Z][A-Z0-9_]*)+)\s*=\s*(True|False|None|-?\d+(?:\.\d+)?)\s*(?:#.*)?$", re.M)


def config_default(path: str, expr: cst.Attribute) -> Optional[cst.BaseExpression]:
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
    root = project_root(os.path.abspath(path))
    defaults = _CONFIG_DEFAULTS.get(root)
    if defaults is None:
        defaults = _CONFIG_DEFAULTS[root] = _config_defaults(_project_texts(root))
    literal = defaults.get(key)
    return cst.parse_expression(literal) if literal else None


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


# -- return values: ``a, b, train_loader, val_loader = build_loader(cfg)`` from another file
_RETURNED: Dict[Tuple[str, str, Optional[int]], Optional["LoaderInfo"]] = {}


def returned_loader(path: str, names, call: cst.Call, position: Optional[int], depth: int = 0) -> Optional["LoaderInfo"]:
    """The loader a function imported from another file of the project
    returns (at ``position`` of a returned tuple, or as its whole value),
    followed through functions that return another imported function's
    result (``return _build_loader(config)``). Each callee file is walked
    once per process; the loader's ``where`` names the file and line."""
    qualified = names.imported_name(call.func)
    if not qualified or "." not in qualified.lstrip(".") or depth > 3:
        return None
    module_name, _, function = qualified.rpartition(".")
    importer = os.path.abspath(path)
    texts = _project_texts(project_root(importer))
    callee = resolve_module(importer, module_name, set(texts))
    if callee is None or callee == importer:
        return None
    key = (callee, function, position)
    if key in _RETURNED:
        return _RETURNED[key]
    _RETURNED[key] = None
    callee_ctx = _walk(callee, texts.get(callee, ""))
    found = None if callee_ctx is None else _loader_returned_by(callee_ctx, callee, function, position, depth)
    _RETURNED[key] = found
    return found


def _loader_returned_by(ctx, path: str, function: str, position: Optional[int], depth: int) -> Optional["LoaderInfo"]:
    from dataclasses import replace

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
                        forwarded = returned_loader(path, ctx.names, value, position, depth + 1)
                        if forwarded is not None:
                            return forwarded
                    continue
                value = value.elements[position].value
            elif isinstance(value, cst.Call) and not facts.loader_for(value, info):
                forwarded = returned_loader(path, ctx.names, value, None, depth + 1)
                if forwarded is not None:
                    return forwarded
                continue
            loader = facts.loader_for(value, info)
            if loader is not None and loader.call is not None:
                where = loader.where or f"{os.path.relpath(path, project_root(path))}:{_row(ctx.source, loader.call)}"
                return replace(loader, where=where)
    return None


def _own_returns(body: cst.CSTNode):
    """The ``return`` statements of a function body, not of functions, classes
    or lambdas defined inside it."""
    from torchlint.walker import child_nodes

    stack = [body]
    while stack:
        current = stack.pop()
        if isinstance(current, cst.Return):
            yield current
        elif not isinstance(current, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            stack.extend(reversed(child_nodes(current)))


def clear_caches() -> None:
    """Forget every project read so far (a long-lived process whose files changed; tests)."""
    for cache in (_INDEXES, _COPIES, _PARAMS, _TEXTS, _WALKED, _HOT, _LOADING, _CONFIG_DEFAULTS, _RETURNED):
        cache.clear()
