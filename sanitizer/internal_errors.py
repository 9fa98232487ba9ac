"""One error policy for every check: the user's program never breaks, and nothing fails silently.

A check's own failure (a torch API that changed, a hook torch calls from a
thread, an allocator query inside the OOM observer) is caught where it
happens, because an exception there would surface inside the user's program
or be swallowed by torch. It is recorded here instead, warned about once at
the check's ``stop()`` ("the check may have missed findings"), and carried in
the check's summary (``internal_errors``), so a report is never silently
incomplete.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, List

KEPT = 20  # messages kept; the count goes on


class InternalErrors:
    def __init__(self, check: str) -> None:
        self.check = check
        self.count = 0
        self.messages: List[str] = []
        self._lock = threading.Lock()

    def record(self, where: str, error: BaseException) -> None:
        with self._lock:
            self.count += 1
            if len(self.messages) < KEPT:
                self.messages.append(f"{where}: {type(error).__name__}: {error}")

    def __bool__(self) -> bool:
        return self.count > 0

    def warn(self, stacklevel: int = 3) -> None:
        """Once, at the check's stop()."""
        if self.count:
            warnings.warn(
                f"torchlint {self.check} check: {self.count} internal error(s) (the check may have missed findings): "
                + "; ".join(self.messages[:5]),
                stacklevel=stacklevel,
            )

    def to_json(self) -> Dict[str, Any]:
        return {"count": self.count, "first": self.messages[:5]}
