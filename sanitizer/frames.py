"""Which frame of the stack is the user's: attribution for every sanitizer finding.

torch's own warning locations point into torch (``_tensor_str.py`` for
``print(t)``, ``grad_scaler.py`` for ``GradScaler.step``), so each finding is
traced to the innermost frame of *user* code instead.

What counts as user code (``origin_of``) is decided from where a file's
module comes from, never from a path substring, once per file name (cached),
in this order:

1. Pseudo files (``<string>``, ``<frozen ...>``) are not user code.
2. torchlint itself (wherever it was imported from) is never user code.
3. Files registered with ``add_user_file`` are user code: the pytest plugin
   registers every collected test module, so a test's own frames are the
   user's however the project is laid out.
4. The file's *import root* is found: the longest ``sys.path`` entry that
   holds it, and its top-level package under that entry.
   - torch (and torchgen, functorch, triton) and pytest/pluggy are libraries
     wherever they come from;
   - a *user package* (found at the top of a user root or its ``src/``, or
     passed to ``add_user_package``) is user code even when installed, so the
     package under test still counts when it is not imported from the
     checkout;
   - an *installed* module is a library: its import root is one of the
     interpreter's site directories (``sysconfig``'s purelib/platlib for
     ``sys.prefix`` and ``sys.base_prefix``, ``site.getsitepackages()``, the
     user site), or the import root holds the distribution metadata
     (``*.dist-info``/``*.egg-info``) of the distribution that provides the
     top-level package (``pip install --target``, a vendored wheel, Bazel
     runfiles, a zipapp's bundled packages).
5. The standard library (``sysconfig``'s stdlib/platstdlib of the running and
   the base interpreter) is not user code.
6. A file under a *user root* is user code. User roots are pytest's rootdir,
   the directory of the script the runner runs, and anything passed to
   ``add_user_root``; without any, the current directory and the directory of
   a ``__main__`` script.
7. Anything else inside ``sys.prefix``/``sys.base_prefix`` (a conda
   environment's other folders) is not user code; the rest (a script in some
   other folder, a helper module a test imports from elsewhere) is user code.
   A checkout of a library put on ``PYTHONPATH`` without any metadata cannot
   be told from the user's own code: ``add_user_root``'s absence does not
   make it a library, so install it (or name the project with
   ``add_user_root`` and keep the checkout outside).

A wrapper torchlint installs in place of a torch function (the race check's
``torch.cuda.synchronize``, its collectives, its dispatch mode) forwards the
user's own call: it is registered with ``forwards_user_call`` and the walks
step over it, so a sync made through it is the user's, at the user's line.
Any other torchlint frame below the first user frame means torchlint's own
code made the event (``internal``), and the sync check leaves it out.

Test files (``test_*.py``, ``*_test.py``, ``conftest.py``) are user code, but
``user_stack`` attributes a sync to them only when a frame of the code under
test is on the stack *inside* the test frame: ``assert model(x).sum() == 3``
inside the model's code path is the model's sync, while a ``.item()`` written
in the test is the test's.
"""

from __future__ import annotations

import fnmatch
import os
import site
import sys
import sysconfig
import threading
from types import FrameType
from typing import Dict, Iterable, List, Optional, Set, Tuple

from .findings import Frame

# Libraries that are never the user's code, however they were installed.
_NEVER_USER_PACKAGES = ("torch", "torchgen", "functorch", "triton", "_pytest", "pytest", "pluggy", "torchlint")
_TEST_FILE_PATTERNS = ["test_*.py", "*_test.py", "conftest.py"]
_METADATA_SUFFIXES = (".dist-info", ".egg-info")
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x200  # CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR

_lock = threading.Lock()
# Code objects of torchlint's wrappers that forward a user's call to torch (forwards_user_call).
_FORWARDING_CODES: set = set()
_user_roots: List[str] = []
_user_files: set = set()
_user_packages: set = set()
_origin_cache: Dict[str, str] = {}
_test_cache: Dict[str, bool] = {}
_installed_cache: Dict[str, frozenset] = {}


def _norm(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _scheme_paths(keys: Tuple[str, ...]) -> List[str]:
    """``sysconfig`` paths for the running and the base interpreter (a venv has both)."""
    dirs: Set[str] = set()
    for base in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}:
        variables = {"base": base, "platbase": base, "installed_base": base, "installed_platbase": base}
        try:
            paths = sysconfig.get_paths(vars=variables)
        except Exception:
            continue
        dirs.update(_norm(paths[key]) for key in keys if key in paths)
    return sorted(dirs)


def _site_dirs() -> List[str]:
    dirs = set(_scheme_paths(("purelib", "platlib")))
    try:
        dirs.update(_norm(path) for path in site.getsitepackages())
    except Exception:  # some embedded interpreters lack it
        pass
    user_site = getattr(site, "USER_SITE", None)
    if user_site:
        dirs.add(_norm(user_site))
    return sorted(dirs)


def _prefixes() -> List[str]:
    prefixes = {_norm(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix) if p}
    return sorted(p for p in prefixes if p != _norm(os.sep))


def _torchlint_dirs() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = {_norm(here)}
    package = sys.modules.get("torchlint")
    package_file = getattr(package, "__file__", None)
    if package_file:
        dirs.add(_norm(os.path.dirname(package_file)))
    return sorted(dirs)


_STDLIB_DIRS = _scheme_paths(("stdlib", "platstdlib"))
_SITE_DIRS = _site_dirs()
_PREFIXES = _prefixes()
_TORCHLINT_DIRS = _torchlint_dirs()


def _packages_at(root: str) -> Iterable[str]:
    for base in (root, os.path.join(root, "src")):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            full = os.path.join(base, name)
            if name.endswith(".py") and name != "setup.py":
                yield name[:-3]
            elif os.path.isfile(os.path.join(full, "__init__.py")):
                yield name


def forwards_user_call(function):
    """Mark a torchlint wrapper as one that forwards the user's own call; returns ``function``.

    Before this, the race check's wrapper of ``torch.cuda.synchronize`` (put
    in place after the sync check's) sat between the user's line and the
    sync, so every explicit synchronize looked like torchlint's own: a
    script calling ``torch.cuda.synchronize()`` in its loop reported nothing
    whenever the race check ran beside the sync check (the default).
    """
    _FORWARDING_CODES.add(function.__code__)
    return function


def add_user_root(path: str) -> None:
    """Count every file under ``path`` (and its top-level packages, wherever installed) as user code."""
    root = _norm(path)
    with _lock:
        if root in _user_roots:
            return
        _user_roots.append(root)
        _user_packages.update(p for p in _packages_at(root) if p not in _NEVER_USER_PACKAGES)
        _origin_cache.clear()


def add_user_file(path: str) -> None:
    """Count one file as user code wherever it lives (the pytest plugin registers each test module)."""
    with _lock:
        _user_files.add(_norm(path))
        _origin_cache.pop(path, None)


def add_user_package(name: str) -> None:
    """Count an installed top-level package as user code even inside site-packages."""
    with _lock:
        _user_packages.add(name.split(".")[0])
        _origin_cache.clear()


def set_test_file_patterns(patterns: Iterable[str]) -> None:
    """Use pytest's ``python_files`` patterns (plus conftest.py) to recognise test files."""
    with _lock:
        _TEST_FILE_PATTERNS[:] = list(patterns) + ["conftest.py"]
        _test_cache.clear()


def reset() -> None:
    """Forget configured roots, files and packages (tests use this)."""
    with _lock:
        _user_roots.clear()
        _user_files.clear()
        _user_packages.clear()
        _TEST_FILE_PATTERNS[:] = ["test_*.py", "*_test.py", "conftest.py"]
        _origin_cache.clear()
        _test_cache.clear()
        _installed_cache.clear()


def _main_script_dir() -> Optional[str]:
    """The directory of a ``python script.py`` program (not of ``python -m`` or an installed entry point)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or getattr(main, "__spec__", None) is not None:
        return None
    folder = _norm(os.path.dirname(os.path.abspath(path)))
    if any(_under(folder, d) for d in _PREFIXES + _SITE_DIRS):
        return None  # an entry-point script in the environment's bin/
    return folder


def _roots() -> List[str]:
    if _user_roots:
        return _user_roots
    script = _main_script_dir()
    return [_norm(os.getcwd())] + ([script] if script else [])


def _import_root(path: str) -> Tuple[Optional[str], Optional[str]]:
    """``(sys.path entry, top-level name)`` the file is importable as; the longest entry wins."""
    best = None
    for entry in sys.path:
        folder = _norm(entry or os.getcwd())
        if _under(path, folder) and path != folder and (best is None or len(folder) > len(best)):
            best = folder
    if best is None:
        return None, None
    top = path[len(best) :].lstrip(os.sep).split(os.sep, 1)[0]
    return best, (top[:-3] if top.endswith(".py") else top)


def _installed_tops(entry: str) -> frozenset:
    """Top-level names provided by the distributions whose metadata sits in ``entry``."""
    cached = _installed_cache.get(entry)
    if cached is not None:
        return cached
    tops: Set[str] = set()
    try:
        names = os.listdir(entry)
    except OSError:
        names = []
    if any(name.endswith(_METADATA_SUFFIXES) for name in names):
        from importlib import metadata

        for dist in metadata.distributions(path=[entry]):
            listed = dist.read_text("top_level.txt")
            if listed:
                tops.update(line.strip() for line in listed.splitlines() if line.strip())
            for file in dist.files or ():
                parts = file.parts
                if parts and parts[0] != ".." and not parts[0].endswith(_METADATA_SUFFIXES):
                    tops.add(parts[0][:-3] if parts[0].endswith(".py") else parts[0])
    result = frozenset(tops)
    _installed_cache[entry] = result
    return result


def short_path(path: str) -> str:
    """A library file as its import path shows it (``torch/_tensor_str.py``), else the path unchanged."""
    entry, top = _import_root(_norm(path))
    return os.path.relpath(_norm(path), entry) if entry is not None else path


# Where a file comes from; only USER frames are sites.
USER, LIBRARY, STDLIB, TORCHLINT, PSEUDO = "user", "library", "stdlib", "torchlint", "pseudo"


def _decide(filename: str) -> str:
    if not filename or filename.startswith("<"):
        return PSEUDO
    path = _norm(filename)
    if any(_under(path, d) for d in _TORCHLINT_DIRS):
        return TORCHLINT
    if path in _user_files:
        return USER
    entry, top = _import_root(path)
    if top is not None:
        if top in _NEVER_USER_PACKAGES:
            return LIBRARY
        if top in _user_packages:
            return USER
        if entry is not None and (entry in _SITE_DIRS or top in _installed_tops(entry)):
            return LIBRARY
    elif any(_under(path, d) for d in _SITE_DIRS):
        return LIBRARY
    if any(_under(path, d) for d in _STDLIB_DIRS):
        return STDLIB
    roots = _roots()
    if any(_under(path, root) for root in roots):
        return USER
    if any(_under(path, prefix) for prefix in _PREFIXES):
        return LIBRARY
    return USER


def _origin(filename: str) -> str:
    origin = _decide(filename)
    _origin_cache[filename] = origin
    return origin


def origin_of(path: str) -> str:
    """``"user"``, ``"library"``, ``"stdlib"``, ``"torchlint"`` or ``"pseudo"``."""
    origin = _origin_cache.get(path)
    return origin if origin is not None else _origin(path)


def site_origin(filename: str) -> int:
    """For the native tap's stack walk, once per code object: 0 not the user's code,
    1 a user's test file, 2 other user code (what ``_select`` tells apart)."""
    if origin_of(filename) != USER:
        return 0
    return 1 if is_test_file(filename) else 2


def is_user_file(path: str) -> bool:
    """True when ``path`` is the user's code (see the module docstring for the rules)."""
    return origin_of(path) == USER


def is_test_file(path: str) -> bool:
    try:
        return _test_cache[path]
    except KeyError:
        name = os.path.basename(path)
        decision = any(fnmatch.fnmatch(name, pattern) for pattern in _TEST_FILE_PATTERNS)
        _test_cache[path] = decision
        return decision


def raw_user_stack(limit: int = 8, skip: int = 0):
    """The walk behind ``user_stack``, kept cheap for hooks that fire per sync.

    Returns ``(user, library, internal)``:

    - ``user``: ``(file, line, function)`` tuples of user frames, innermost first;
    - ``library``: ``(file, line, qualname)`` of the innermost non-user,
      non-stdlib frame below the first user frame (the torch function that did
      the work, e.g. ``_tensor_str.py:_str``), or None;
    - ``internal``: True when torchlint's own code sits below the first user
      frame, i.e. the sanitizer itself caused the event (callers drop those).

    One walk over ``f_back`` with a cached per-file decision; no source lookup
    and no string formatting.
    """
    return _select(_live_frames(sys._getframe(skip + 1)), limit)[:3]


def sync_site_stack(limit: int = 8, skip: int = 0):
    """``raw_user_stack`` plus the *callee*: the frame the innermost user line called.

    The callee is the outermost non-user frame below the first user frame
    (``torch.save``'s frame for ``torch.save(model.state_dict())``), or None
    when the user line itself triggered the event or the callee is a
    generator (a generator frame lives across iterations). Every sync inside
    one call of the callee is one *run* of the user's line: the sync check
    holds the callee to tell a second sync of the same call from the line
    running again.
    """
    return _select(_live_frames(sys._getframe(skip + 1)), limit)


def sync_site_top(skip: int = 0):
    """What a sync at an already-known site needs, without the stack: ``(top, library, internal, callee)``.

    ``top`` is the site's ``(file, line)`` (the frame ``sync_site_stack``
    would put first, test frames handled alike) or None without a user frame;
    ``library`` the qualname of the innermost library frame below the first
    user frame, or None; ``internal`` and ``callee`` as in ``sync_site_stack``.

    Why a second walk: a repeated sync (``GradScaler.step`` every step) runs
    this after the step's other work has evicted the sanitizer's code and data
    from the CPU's caches, where every line number decoded and every tuple
    built costs a cache miss or more (measured: a cold ``sync_site_stack`` plus
    bookkeeping ~65 µs against ~7 µs warm). Only the top frame's line is
    decoded here; the full stack is walked once, when a site is new.
    """
    frame: Optional[FrameType] = sys._getframe(skip + 1)
    cache = _origin_cache
    library = None
    internal = False
    callee = None
    first_user = None
    top = None
    while frame is not None:
        code = frame.f_code
        filename = code.co_filename
        origin = cache.get(filename)
        if origin is None:
            origin = _origin(filename)
        if origin == USER:
            if not is_test_file(filename):
                top = frame
                break
            if first_user is None:
                first_user = frame
        elif first_user is None:
            if origin == TORCHLINT and code in _FORWARDING_CODES:
                frame = frame.f_back  # a wrapper passing the user's call through
                continue
            callee = frame
            if origin == TORCHLINT:
                internal = True
            elif origin == LIBRARY and library is None:
                library = getattr(code, "co_qualname", code.co_name)
        frame = frame.f_back
    if top is None:
        top = first_user
    if callee is not None and callee.f_code.co_flags & _GENERATOR_FLAGS:
        callee = None
    return (None if top is None else (top.f_code.co_filename, top.f_lineno)), library, internal, callee


_COMPILER_PARTS = (
    os.sep + os.path.join("torch", "_inductor") + os.sep,
    os.sep + os.path.join("torch", "_dynamo") + os.sep,
    os.sep + "triton" + os.sep,
)
_compiler_cache: Dict[str, bool] = {}


def through_compiler(skip: int = 0) -> bool:
    """Whether torch.compile's own machinery (Dynamo, Inductor, Triton's autotuner) sits between
    the caller and the first user frame: a sync made there is compilation work, not the program's.

    Walked once per new sync site, not per sync.
    """
    frame: Optional[FrameType] = sys._getframe(skip + 1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if origin_of(filename) == USER and not is_test_file(filename):
            return False
        compiler = _compiler_cache.get(filename)
        if compiler is None:
            path = _norm(filename)
            compiler = _compiler_cache[filename] = any(part in path for part in _COMPILER_PARTS)
        if compiler:
            return True
        frame = frame.f_back
    return False


def user_frames_of(entries: Iterable[Tuple[str, int, str]], limit: int = 8) -> List[Tuple[str, int, str]]:
    """The user frames among ``(file, line, function)`` entries, innermost first.

    The same selection as ``raw_user_stack``, for stacks captured earlier
    (``torch._C._profiler.gather_traceback``) and symbolized only when needed.
    """
    return _select(((file, line, name, name) for file, line, name in entries), limit)[0]


def _live_frames(frame):
    while frame is not None:
        code = frame.f_code
        yield code.co_filename, frame.f_lineno, code.co_name, frame
        frame = frame.f_back


def _select(entries, limit: int):
    """Pick the user frames out of ``(file, line, name, frame_or_qualname)`` entries, innermost first.

    Returns ``(user, library, internal, callee)``; ``callee`` is a frame object
    only for live walks (see ``sync_site_stack``).
    """
    user: List[Tuple[str, int, str]] = []
    library: Optional[Tuple[str, int, str]] = None
    internal = False
    callee = None
    first_non_test = -1
    cache = _origin_cache
    for filename, line, name, frame in entries:
        origin = cache.get(filename)
        if origin is None:
            origin = _origin(filename)
        if origin == USER:
            if first_non_test < 0 and not is_test_file(filename):
                first_non_test = len(user)
            user.append((filename, line, name))
            if first_non_test >= 0 and len(user) - first_non_test >= limit:
                break
        elif not user:
            if origin == TORCHLINT and not isinstance(frame, str) and frame.f_code in _FORWARDING_CODES:
                continue  # a wrapper passing the user's call through
            callee = frame
            if origin == TORCHLINT:
                internal = True
            elif origin == LIBRARY and library is None:
                qualname = frame if isinstance(frame, str) else getattr(frame.f_code, "co_qualname", name)
                library = (filename, line, qualname)
    if first_non_test > 0:
        # Code under test is on the stack: the test frames inside it (a test
        # callback called by the library under test) are not the site.
        user = user[first_non_test:]
    if isinstance(callee, str) or (callee is not None and callee.f_code.co_flags & _GENERATOR_FLAGS):
        callee = None
    return user[:limit], library, internal, callee


def user_stack(limit: int = 8, skip: int = 0) -> List[Frame]:
    """The user's frames at the caller's point, innermost first (at most ``limit``).

    ``skip`` drops that many extra frames of the caller's own before the walk
    starts. An empty list means no user frame was on the stack.
    """
    frames = raw_user_stack(limit=limit, skip=skip + 1)[0]
    return [Frame(file, line, function) for file, line, function in frames]
