"""Which frame of the stack is the user's: attribution for every sanitizer finding.

torch's own warning locations point into torch (``_tensor_str.py`` for
``print(t)``, ``grad_scaler.py`` for ``GradScaler.step``), so each finding is
traced to the innermost frame of *user* code instead.

What counts as user code (``is_user_file``), decided once per file name and
cached, in this order:

1. Pseudo files (``<string>``, ``<frozen ...>``) are not user code.
2. torchlint itself is never user code.
3. The standard library is never user code (checked before the roots, so a
   root of ``/`` cannot make it user code).
4. A file under a *user root* counts as user code, unless it lies inside a
   ``site-packages``/``dist-packages`` folder under that root (a virtual
   environment inside the project). User roots are the pytest rootdir, the
   directory of the script the runner runs, and anything passed to
   ``add_user_root``; the current directory is the default root.
5. A file inside ``site-packages``/``dist-packages`` counts as user code only
   when its top-level package is a *user package*: the packages found at the
   top of each user root or its ``src/`` folder (so the package under test
   still counts when it is installed, not only when it is imported from the
   checkout), plus anything passed to ``add_user_package``.
6. torch (and its companions: torchgen, functorch,
   triton) and pytest/pluggy are not user code, wherever they are installed.
7. Anything else (a script in some other folder) is user code.

Test files (``test_*.py``, ``*_test.py``, ``conftest.py``) are user code, but
``user_stack`` attributes a sync to them only when no frame of the code under
test is on the stack: ``assert model(x).sum() == 3`` inside the model's code
path is the model's sync, while a ``.item()`` written in the test is the
test's.
"""
from __future__ import annotations

import fnmatch
import os
import sys
import sysconfig
import threading
from typing import Dict, Iterable, List, Optional, Tuple

from .findings import Frame

_THIRD_PARTY_DIRS = ("site-packages", "dist-packages")
# Libraries that are never the user's code even outside site-packages
# (a source checkout of torch on PYTHONPATH, say).
_NEVER_USER_PACKAGES = ("torch", "torchgen", "functorch", "triton", "_pytest", "pytest", "pluggy", "torchlint")
_TEST_FILE_PATTERNS = ["test_*.py", "*_test.py", "conftest.py"]

_lock = threading.Lock()
_user_roots: List[str] = []
_user_packages: set = set()
_origin_cache: Dict[str, str] = {}
_test_cache: Dict[str, bool] = {}


def _norm(path: str) -> str:
    return os.path.normcase(os.path.realpath(path))


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def _stdlib_dirs() -> List[str]:
    dirs = set()
    for key in ("stdlib", "platstdlib"):
        try:
            dirs.add(_norm(sysconfig.get_paths()[key]))
        except KeyError:
            pass
    for prefix in {sys.base_prefix, sys.base_exec_prefix}:
        dirs.add(_norm(os.path.join(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")))
    return sorted(dirs)


def _torchlint_dirs() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = {_norm(here)}
    package = sys.modules.get("torchlint")
    if package is not None and getattr(package, "__file__", None):
        dirs.add(_norm(os.path.dirname(package.__file__)))
    return sorted(dirs)


_STDLIB_DIRS = _stdlib_dirs()
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


def add_user_root(path: str) -> None:
    """Count every file under ``path`` (and its top-level packages, wherever installed) as user code."""
    root = _norm(path)
    with _lock:
        if root in _user_roots:
            return
        _user_roots.append(root)
        _user_packages.update(p for p in _packages_at(root) if p not in _NEVER_USER_PACKAGES)
        _origin_cache.clear()


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
    """Forget configured roots and packages (tests use this)."""
    with _lock:
        _user_roots.clear()
        _user_packages.clear()
        _TEST_FILE_PATTERNS[:] = ["test_*.py", "*_test.py", "conftest.py"]
        _origin_cache.clear()
        _test_cache.clear()


def _roots() -> List[str]:
    return _user_roots or [_norm(os.getcwd())]


def _third_party_top(path: str) -> Optional[str]:
    """The top-level package name of a file inside site-packages, else None."""
    parts = path.split(os.sep)
    for index in range(len(parts) - 1, -1, -1):
        if parts[index] in _THIRD_PARTY_DIRS and index + 1 < len(parts):
            top = parts[index + 1]
            return top[:-3] if top.endswith(".py") else top
    return None


# Where a file comes from; only USER frames are sites.
USER, LIBRARY, STDLIB, TORCHLINT, PSEUDO = "user", "library", "stdlib", "torchlint", "pseudo"


def _decide(filename: str) -> str:
    if not filename or filename.startswith("<"):
        return PSEUDO
    path = _norm(filename)
    if any(_under(path, d) for d in _TORCHLINT_DIRS):
        return TORCHLINT
    top = _third_party_top(path)
    if top is not None:
        return USER if top in _user_packages and top not in _NEVER_USER_PACKAGES else LIBRARY
    if any(_under(path, d) for d in _STDLIB_DIRS):
        return STDLIB
    if any(_under(path, root) for root in _roots()):
        return USER
    parts = path.split(os.sep)
    if any(name in parts for name in _NEVER_USER_PACKAGES):
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
    return _select(_live_frames(sys._getframe(skip + 1)), limit)


def user_frames_of(entries: Iterable[Tuple[str, int, str]], limit: int = 8) -> List[Tuple[str, int, str]]:
    """The user frames among ``(file, line, function)`` entries, innermost first.

    The same selection as ``raw_user_stack``, for stacks captured earlier
    (``torch._C._profiler.gather_traceback``) and symbolized only when needed.
    """
    return _select(((file, line, name, name) for file, line, name in entries), limit)[0]


def _live_frames(frame):
    while frame is not None:
        code = frame.f_code
        yield code.co_filename, frame.f_lineno, code.co_name, code
        frame = frame.f_back


def _select(entries, limit: int):
    """Pick the user frames out of ``(file, line, name, code_or_qualname)`` entries, innermost first."""
    user: List[Tuple[str, int, str]] = []
    library: Optional[Tuple[str, int, str]] = None
    internal = False
    first_non_test = -1
    cache = _origin_cache
    for filename, line, name, code in entries:
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
            if origin == TORCHLINT:
                internal = True
            elif origin == LIBRARY and library is None:
                qualname = code if isinstance(code, str) else getattr(code, "co_qualname", name)
                library = (filename, line, qualname)
    if first_non_test > 0:
        # Code under test is on the stack: the test frames inside it (a test
        # callback called by the library under test) are not the site.
        user = user[first_non_test:]
    return user[:limit], library, internal


def user_stack(limit: int = 8, skip: int = 0) -> List[Frame]:
    """The user's frames at the caller's point, innermost first (at most ``limit``).

    ``skip`` drops that many extra frames of the caller's own before the walk
    starts. An empty list means no user frame was on the stack.
    """
    frames, _, _ = raw_user_stack(limit=limit, skip=skip + 1)
    return [Frame(file, line, function) for file, line, function in frames]
