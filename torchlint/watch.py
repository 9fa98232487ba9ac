"""`torchlint --watch`: lint, then lint again whenever a Python file or a config changes.

As `ruff check --watch`: each change reruns the whole check, and the result
cache makes that cost only the changed files (the others are cache hits).
Changes come from `watchfiles` (the `watch` extra) when it is installed, else
from polling the modification times of the watched tree twice a second.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import datetime
from typing import Callable, Dict, Iterable, Iterator, Optional, Sequence, Set, TextIO, Tuple

WATCHED_SUFFIXES = (".py", ".pyi", ".ipynb")
WATCHED_NAMES = ("pyproject.toml", ".gitignore")
POLL_INTERVAL_S = 0.5
_SKIPPED_DIRS = {
    ".git",
    ".venv",
    "venv",
    "__pycache__",
    ".torchlint_cache",
    ".mypy_cache",
    ".ruff_cache",
    "node_modules",
}


def is_watched(path: str) -> bool:
    name = os.path.basename(path)
    return name.endswith(WATCHED_SUFFIXES) or name in WATCHED_NAMES


def changes(paths: Sequence[str], stop: Optional[threading.Event] = None) -> Iterator[Set[str]]:
    """Each batch of changed watched files under ``paths``, until ``stop`` is set."""
    try:
        import watchfiles
    except ImportError:
        return poll_changes(paths, stop)
    return _watchfiles_changes(watchfiles, paths, stop)


def _watchfiles_changes(watchfiles, paths: Sequence[str], stop: Optional[threading.Event]) -> Iterator[Set[str]]:
    for batch in watchfiles.watch(
        *paths, watch_filter=lambda _change, path: is_watched(path), stop_event=stop, raise_interrupt=False
    ):
        yield {path for _change, path in batch}


def poll_changes(
    paths: Sequence[str], stop: Optional[threading.Event] = None, interval: float = POLL_INTERVAL_S
) -> Iterator[Set[str]]:
    """``changes`` without watchfiles: compare the tree's modification times
    with those at this call (taken now, not at the first ``next``)."""
    return _poll(paths, stop or threading.Event(), interval, _snapshot(paths))


def _poll(
    paths: Sequence[str], stop: threading.Event, interval: float, before: Dict[str, Tuple[int, int]]
) -> Iterator[Set[str]]:
    while not stop.wait(interval):
        after = _snapshot(paths)
        changed = {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}
        before = after
        if changed:
            yield changed


def _snapshot(paths: Iterable[str]) -> Dict[str, Tuple[int, int]]:
    seen: Dict[str, Tuple[int, int]] = {}
    for root in paths:
        if os.path.isfile(root):
            _stat_into(seen, root)
            continue
        for directory, subdirs, files in os.walk(root):
            subdirs[:] = [d for d in subdirs if d not in _SKIPPED_DIRS]
            for name in files:
                if is_watched(name):
                    _stat_into(seen, os.path.join(directory, name))
    return seen


def _stat_into(seen: Dict[str, Tuple[int, int]], path: str) -> None:
    try:
        stat = os.stat(path)
    except OSError:
        return
    seen[path] = (stat.st_mtime_ns, stat.st_size)


def watch(
    check: Callable[[], int],
    paths: Sequence[str],
    out: TextIO = sys.stdout,
    change_batches: Optional[Iterable[Set[str]]] = None,
) -> int:
    """Run ``check`` now and after every batch of changes; returns when the changes end."""
    batches = iter(change_batches if change_batches is not None else changes(paths))
    _clear(out)
    out.write(f"[{_now()}] Starting linter in watch mode...\n")
    _run(check, out)
    for changed in batches:
        _clear(out)
        out.write(f"[{_now()}] File change detected: {_describe(changed)}\n")
        _run(check, out)
    return 0


def _run(check: Callable[[], int], out: TextIO) -> None:
    out.flush()
    check()
    sys.stderr.flush()
    out.write(f"[{_now()}] Watching for file changes.\n")
    out.flush()


def _describe(changed: Set[str]) -> str:
    names = sorted(os.path.relpath(path) if os.path.isabs(path) else path for path in changed)
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _clear(out: TextIO) -> None:
    if getattr(out, "isatty", lambda: False)():
        out.write("\x1b[2J\x1b[H")


def _now() -> str:
    return datetime.fromtimestamp(time.time()).strftime("%H:%M:%S")
