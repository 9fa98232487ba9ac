"""A progress line on the terminal while a large tree is linted.

Like pytest's and cargo's: one line on stderr, rewritten in place and erased
before the report is printed, so it never mixes with the findings. Nothing
is shown when stderr is not a terminal (CI logs, pipes), with ``-q``/``-s``,
or when a run is over before the first update is due.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, TextIO

_FIRST_AFTER_S = 0.5  # a run shorter than this shows nothing
_EVERY_S = 0.1


class Progress:
    def __init__(self, total: int, stream: Optional[TextIO]) -> None:
        self.total = total
        self.stream = stream  # None: shows nothing
        self.started = time.monotonic()
        self.next_at = self.started + _FIRST_AFTER_S
        self.shown = False

    @classmethod
    def for_run(cls, args, total: int, stream: Optional[TextIO] = None) -> "Progress":
        stream = stream or sys.stderr
        wanted = not (args.quiet or args.silent or args.show_files or args.show_settings) and _is_terminal(stream)
        return cls(total, stream if wanted and total > 1 else None)

    def update(self, done: int) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if now < self.next_at and done < self.total:
            return
        self.next_at = now + _EVERY_S
        width = len(str(self.total))
        percent = 100 * done // self.total
        self.stream.write(f"\r\x1b[Klinting: {done:>{width}}/{self.total} files ({percent:>3}%)")
        self.stream.flush()
        self.shown = True

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        if self.shown and self.stream is not None:
            self.stream.write("\r\x1b[K")  # erase the line: the report starts clean
            self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):
        return False
