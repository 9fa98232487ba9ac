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
from torchlint.source import split_lines


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
        row = f"cell {fact.cell}:{fact.row}" if fact.cell is not None else str(fact.row)
        return f":{row}" if same_file else f"{self.display_path(fact.path)}:{row}"

    def source_line(self, d: Diagnostic) -> Optional[str]:
        """The finding's first line of code, for excerpts and fingerprints. A
        notebook's text here is the program of its code cells (torchlint.notebook),
        where the finding sits at ``noqa_row``."""
        row = (d.noqa_row or d.row) if d.cell is not None else d.row
        lines = split_lines(self.texts.get(d.path, ""))
        return lines[row - 1].rstrip("\r\n") if 0 < row <= len(lines) else None

    def evidence_json(self, d: Diagnostic) -> List[Dict[str, Any]]:
        """The ``evidence`` list of json and json-lines (paths absolute, like ``filename``)."""
        return [
            {
                "message": fact.text,
                "filename": self.absolute_path(fact.path),
                "location": {"row": fact.row, "column": fact.column},
                **({"cell": fact.cell} if fact.cell is not None else {}),
            }
            for fact in d.evidence
        ]

    def display_path(self, path: str) -> str:
        """The path as people read it, escaped (``printable_path``)."""
        if path == "-" or not os.path.isabs(path) and not path.startswith(".."):
            return printable_path(os.path.normpath(path) if path != "-" else path)
        relative = os.path.relpath(path, self.cwd)
        return printable_path(path if relative.startswith("..") else relative)

    def absolute_path(self, path: str) -> str:
        return path if path == "-" else os.path.abspath(os.path.join(self.cwd, path))


def printable_path(path: str) -> str:
    """A file name made safe for any text report: bytes that are not UTF-8
    (``\\udcff`` surrogates from the file system) and control characters
    (ESC, newline, DEL...) are written as ``\\xNN``, so a name can neither
    drive the terminal, split a line, nor make the report unencodable or its
    XML ill-formed. An ordinary name is returned unchanged."""
    if path.isprintable() and not any("\udc80" <= ch <= "\udcff" for ch in path):
        return path
    out = []
    for ch in path:
        if "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif not ch.isprintable() and ch != " ":
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


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
