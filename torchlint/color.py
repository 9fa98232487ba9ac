"""Colour on a terminal: `--color auto|always|never`, `NO_COLOR` and `FORCE_COLOR`.

The flag wins when it says `always` or `never`. Under `auto` (the default),
`NO_COLOR` set to anything non-empty turns colour off (no-color.org), then
`FORCE_COLOR` set to anything non-empty turns it on (as Python 3.13 and
pytest read them), and otherwise the stream decides: colour only on a
terminal that is not `TERM=dumb`. Output written to a file is a stream
that is not a terminal, so it stays plain.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, TextIO

CHOICES = ("auto", "always", "never")

_RESET = "\x1b[0m"
_STYLES = {
    "path": "\x1b[1m",  # bold
    "punctuation": "\x1b[36m",  # cyan, as ruff prints the `:` between path, row and column
    "code": "\x1b[1;31m",  # bold red
    "fixable": "\x1b[36m",
    "note": "\x1b[1;34m",  # bold blue
    "help": "\x1b[1;36m",
    "caret": "\x1b[1;31m",
    "dim": "\x1b[2m",
}


def use_color(choice: str, stream: TextIO, environ: Optional[Mapping[str, str]] = None) -> bool:
    environ = os.environ if environ is None else environ
    if choice == "always":
        return True
    if choice == "never":
        return False
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    if environ.get("TERM") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class Painter:
    """Wraps text in the ANSI style for its role, or leaves it plain."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def __call__(self, role: str, text: str) -> str:
        if not self.enabled or not text:
            return text
        return f"{_STYLES[role]}{text}{_RESET}"


PLAIN = Painter(False)
