"""Enough of git's ignore rules to skip what a project keeps out of git.

Supports ``.gitignore`` files in every directory (patterns relative to that
directory), ``.ignore`` files, ``.git/info/exclude``, negation with ``!``,
directory-only patterns (``build/``), anchored patterns (``/dist``,
``a/b``), ``*``, ``?``, ``[...]`` and ``**``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import List, Optional, Pattern

IGNORE_FILES = (".gitignore", ".ignore")


@dataclass(frozen=True)
class _Rule:
    regex: Pattern[str]
    negated: bool
    directory_only: bool
    base: str  # directory the pattern is relative to


def _translate(pattern: str) -> str:
    """A gitignore glob (already stripped of ``!`` and trailing ``/``) as a regex
    over a path relative to the pattern's base."""
    anchored = "/" in pattern.rstrip("/")
    pattern = pattern.lstrip("/")
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("/**", i) and i + 3 == len(pattern):
            out.append("/.*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            end = pattern.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1 : end].replace("\\", "\\\\")
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append(f"[{body}]")
                i = end + 1
        elif c == "\\" and i + 1 < len(pattern):
            out.append(re.escape(pattern[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    body = "".join(out)
    prefix = "" if anchored else "(?:.*/)?"
    # The path itself, not its descendants: the walk prunes an ignored
    # directory, and a directory named on the command line is still linted.
    return f"^{prefix}{body}$"


def parse(text: str, base: str) -> List[_Rule]:
    rules = []
    for raw in text.splitlines():
        line = raw.rstrip("\n\r")
        if not line.strip() or line.startswith("#"):
            continue
        line = re.sub(r"(?<!\\)\s+$", "", line)
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        elif line.startswith("\\!") or line.startswith("\\#"):
            line = line[1:]
        directory_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        rules.append(_Rule(re.compile(_translate(line)), negated, directory_only, base))
    return rules


class IgnoreStack:
    """Ignore rules collected from the root down to the current directory."""

    def __init__(self, rules: Optional[List[_Rule]] = None) -> None:
        self.rules = rules or []

    def child(self, directory: str) -> "IgnoreStack":
        added: List[_Rule] = []
        for name in IGNORE_FILES:
            path = os.path.join(directory, name)
            if os.path.isfile(path):
                try:
                    with open(path, encoding="utf-8", errors="replace") as handle:
                        added.extend(parse(handle.read(), directory))
                except OSError:
                    pass
        return IgnoreStack(self.rules + added) if added else self

    def ignored(self, path: str, is_dir: bool) -> bool:
        verdict = False
        for rule in self.rules:
            if rule.directory_only and not is_dir:
                continue
            relative = os.path.relpath(path, rule.base).replace(os.sep, "/")
            if relative.startswith(".."):
                continue
            if rule.regex.match(relative):
                verdict = not rule.negated
        return verdict


def for_root(root: str) -> IgnoreStack:
    """Rules that apply at ``root``: those of its enclosing git repository and
    of every directory between the repository top and ``root``."""
    root = os.path.abspath(root)
    chain: List[str] = []
    directory = root
    top: Optional[str] = None
    while True:
        chain.append(directory)
        if os.path.exists(os.path.join(directory, ".git")):
            top = directory
            break
        parent = os.path.dirname(directory)
        if parent == directory:
            break
        directory = parent
    if top is None:
        chain = [root]
    stack = IgnoreStack()
    if top is not None:
        exclude = os.path.join(top, ".git", "info", "exclude")
        try:
            with open(exclude, encoding="utf-8", errors="replace") as handle:
                stack = IgnoreStack(parse(handle.read(), top))
        except OSError:  # absent (the usual case) or unreadable, like a .gitignore
            pass
    for directory in reversed(chain[1:] if top is None else chain):
        stack = stack.child(directory) if directory != root else stack
    return stack
