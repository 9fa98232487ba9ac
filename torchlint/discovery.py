"""Which files to lint: ruff's discovery rules.

Directories are walked for ``*.py``, ``*.pyi`` and ``*.ipynb`` (plus what
``extend-include`` adds), skipping the default
excludes, ``--exclude``/``--extend-exclude`` patterns and, unless turned off,
what ``.gitignore`` files ignore. A file named on the command line is always
linted, unless ``--force-exclude`` is given (pre-commit passes every file by
name, which is why its hook uses that flag).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

from torchlint import gitignore

DEFAULT_EXCLUDES = (
    ".bzr",
    ".direnv",
    ".eggs",
    ".git",
    ".git-rewrite",
    ".hg",
    ".ipynb_checkpoints",
    ".mypy_cache",
    ".nox",
    ".pants.d",
    ".pyenv",
    ".pytest_cache",
    ".pytype",
    ".ruff_cache",
    ".svn",
    ".tox",
    ".torchlint_cache",
    ".venv",
    ".vscode",
    "__pypackages__",
    "__pycache__",
    "_build",
    "buck-out",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
)
EXTENSIONS = (".py", ".pyi", ".ipynb")


@dataclass
class DiscoveryOptions:
    exclude: Optional[Sequence[str]] = None  # replaces the defaults when given
    extend_exclude: Sequence[str] = field(default_factory=list)
    extend_include: Sequence[str] = field(default_factory=list)  # ruff's: patterns of more files to lint
    respect_gitignore: bool = True
    force_exclude: bool = False
    root: str = field(default_factory=os.getcwd)  # exclude patterns with a slash are relative to it

    @property
    def patterns(self) -> List[str]:
        base = list(DEFAULT_EXCLUDES) if self.exclude is None else list(self.exclude)
        return base + list(self.extend_exclude)


def _excluded(path: str, options: DiscoveryOptions) -> bool:
    """Does this one path (not its parents) match an exclude pattern? A
    pattern without a slash matches the name; one with a slash, the path
    relative to the root (or the absolute path)."""
    name = os.path.basename(path)
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, options.root).replace(os.sep, "/")
    for pattern in options.patterns:
        pattern = pattern.rstrip("/")
        if "/" not in pattern:
            if fnmatch.fnmatchcase(name, pattern):
                return True
        elif fnmatch.fnmatchcase(relative, pattern.lstrip("/")) or fnmatch.fnmatchcase(
            absolute.replace(os.sep, "/"), pattern
        ):
            return True
    return False


def _included(path: str, options: DiscoveryOptions) -> bool:
    """Does an ``extend-include`` pattern take this file? Patterns match as excludes do."""
    return bool(options.extend_include) and _excluded(
        path, DiscoveryOptions(exclude=list(options.extend_include), root=options.root)
    )


def _force_excluded(path: str, options: DiscoveryOptions) -> bool:
    """For a path named explicitly: is it, or a directory above it (up to the
    root), excluded or ignored by git?"""
    absolute = os.path.abspath(path)
    directory = absolute if os.path.isdir(absolute) else os.path.dirname(absolute)
    stack = gitignore.for_root(directory).child(directory) if options.respect_gitignore else None
    current = absolute
    root = os.path.abspath(options.root)
    while current != root and current.startswith(root + os.sep):
        if _excluded(current, options):
            return True
        if stack is not None and stack.ignored(current, is_dir=os.path.isdir(current)):
            return True
        current = os.path.dirname(current)
    return False


def os_reason(exc: OSError) -> str:
    """ruff's wording: "Permission denied (os error 13)"."""
    return f"{exc.strerror or exc} (os error {exc.errno})" if exc.errno else str(exc)


def discover(paths: Sequence[str], options: DiscoveryOptions) -> Tuple[List[str], List[Tuple[str, str]]]:
    """(files to lint in a stable order, [(path, reason)] for what could not be
    searched: a path that does not exist, an unreadable directory)."""
    files: List[str] = []
    missing: List[Tuple[str, str]] = []
    seen = set()

    def add(path: str) -> None:
        key = os.path.abspath(path)
        if key not in seen:
            seen.add(key)
            files.append(path)

    for given in paths:
        if os.path.isfile(given):
            if not (options.force_exclude and _force_excluded(given, options)):
                add(given)
        elif os.path.isdir(given):
            if options.force_exclude and given not in (".", "./") and _force_excluded(given, options):
                continue
            for path in _walk(given, options, missing):
                add(path)
        elif os.path.lexists(given):  # a dangling link, a link loop, a FIFO, a device: reading it says why
            add(given)
        else:
            missing.append((given, "No such file or directory (os error 2)"))
    return files, missing


def _walk(root: str, options: DiscoveryOptions, unreadable: List[Tuple[str, str]]) -> List[str]:
    """Depth first, entries in name order, with an explicit stack: a tree
    thousands of folders deep costs no recursion."""
    found: List[str] = []
    base_stack = gitignore.for_root(root) if options.respect_gitignore else gitignore.IgnoreStack()
    pending: List[Tuple[Iterator[os.DirEntry], gitignore.IgnoreStack]] = []

    def enter(directory: str, stack: gitignore.IgnoreStack) -> None:
        if options.respect_gitignore:
            stack = stack.child(directory)
        try:
            with os.scandir(directory) as scan:
                entries = sorted(scan, key=lambda e: e.name)
        except OSError as exc:
            unreadable.append((directory, f"cannot read directory: {os_reason(exc)}"))
            return
        pending.append((iter(entries), stack))

    enter(root, base_stack)
    while pending:
        entries, stack = pending[-1]
        entry = next(entries, None)
        if entry is None:
            pending.pop()
            continue
        path = entry.path
        try:
            is_dir = entry.is_dir(follow_symlinks=True)
        except OSError:  # a symlink loop: a *.py one is reported when it is read
            is_dir = False
        if _excluded(path, options):
            continue
        if options.respect_gitignore and stack.ignored(os.path.abspath(path), is_dir):
            continue
        if is_dir:
            if not entry.is_symlink():
                enter(path, stack)
        elif entry.name.endswith(EXTENSIONS) or _included(path, options):
            # FIFOs, devices and sockets are listed too: reading refuses them on one line.
            found.append(path)
    return found
