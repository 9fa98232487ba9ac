"""Output formats for lint findings.

Every reporter takes the sorted findings and a ``ReportContext`` and writes
to a stream. Rows and columns are 1-based everywhere (flake8's 0-based
columns are the flake8 plugin's business).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO

from torchlint.color import PLAIN, Painter
from torchlint.rule import Diagnostic, ResolvedEvidence


@dataclass
class ReportContext:
    cwd: str = field(default_factory=os.getcwd)
    unsafe_fixes: bool = False
    texts: Dict[str, str] = field(default_factory=dict)  # path -> source, for excerpts
    runtime: Optional[Any] = None  # a runtime_join.RuntimeJoin with --runtime-report
    paint: Painter = PLAIN  # ANSI colour for the text formats (torchlint.color)

    def measured(self, d: Diagnostic) -> Optional[Dict[str, Any]]:
        """What the run measured at this finding (None: not measured, or no runtime report)."""
        return self.runtime.of(d) if self.runtime is not None else None

    def measured_suffix(self, d: Diagnostic) -> str:
        from torchlint.runtime_join import describe

        measured = self.measured(d)
        return f" ({describe(measured)})" if measured else ""

    def write_runtime_section(self, out: TextIO) -> None:
        """The findings only the run saw, and one summary line (text formats)."""
        if self.runtime is None:
            return
        from torchlint.runtime_join import runtime_only_line, summary_line

        for entry in self.runtime.runtime_only:
            out.write(runtime_only_line(entry, self.display_path) + "\n")
        out.write(summary_line(self.runtime) + "\n")

    def evidence_notes(self, d: Diagnostic) -> List[str]:
        """Each fact the finding rests on, with its place: "`model` moved to the
        GPU at train.py:40"; a fact in the finding's own file gives ":40" alone."""
        return [f"{fact.text} at {self.evidence_place(d, fact)}" for fact in d.evidence]

    def evidence_place(self, d: Diagnostic, fact: ResolvedEvidence) -> str:
        same_file = self.absolute_path(fact.path) == self.absolute_path(d.path)
        return f":{fact.row}" if same_file else f"{self.display_path(fact.path)}:{fact.row}"

    def evidence_json(self, d: Diagnostic) -> List[Dict[str, Any]]:
        """The ``evidence`` list of json and json-lines (paths absolute, like ``filename``)."""
        return [
            {"message": fact.text, "filename": self.absolute_path(fact.path), "location": {"row": fact.row, "column": fact.column}}
            for fact in d.evidence
        ]

    def display_path(self, path: str) -> str:
        if path == "-" or not os.path.isabs(path) and not path.startswith(".."):
            return os.path.normpath(path) if path != "-" else path
        relative = os.path.relpath(path, self.cwd)
        return path if relative.startswith("..") else relative

    def absolute_path(self, path: str) -> str:
        return path if path == "-" else os.path.abspath(os.path.join(self.cwd, path))


Reporter = Callable[[Sequence[Diagnostic], ReportContext, TextIO], None]


def reporters() -> Dict[str, Reporter]:
    from torchlint.reporters import ci, machine, text

    return {
        "concise": text.concise,
        "full": text.full,
        "grouped": text.grouped,
        "pylint": text.pylint,
        "json": machine.json_array,
        "json-lines": machine.json_lines,
        "junit": machine.junit,
        "github": ci.github,
        "sarif": ci.sarif,
    }


# Formats whose output is data; the CLI adds no summary lines to them.
MACHINE_FORMATS = frozenset({"json", "json-lines", "junit", "sarif", "github"})
