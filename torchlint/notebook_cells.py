"""A notebook's code cells as one Python source, and positions mapped back to cells.

The language server lints an open notebook as the concatenation of its code
cells, in order, through the engine's in-memory API, then places each finding
and each fix in the cell it came from. This module is the whole mapping, kept
small so that the linter's own notebook support can replace it.

IPython syntax is blanked into comments of the same length, so the cell
parses and columns stay where they were: a line magic (`%time x`), a shell
escape (`!pip install`), a help request (`x?`) and every line of a cell magic
(`%%bash`) become `#...`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

_IPYTHON_LINE = re.compile(r"^\s*(?:[%!]|\?\S|\S.*\?$)")


@dataclass(frozen=True)
class Cell:
    uri: str
    text: str


@dataclass(frozen=True)
class CellSpan:
    uri: str
    first_row: int  # the cell's first line in the concatenated source (1-based)
    rows: int


@dataclass
class ConcatenatedCells:
    source: str
    spans: List[CellSpan]

    def locate(self, row: int) -> Optional[Tuple[str, int]]:
        """The cell uri and 1-based row in it of the concatenated source's ``row``."""
        for span in self.spans:
            if span.first_row <= row < span.first_row + span.rows:
                return span.uri, row - span.first_row + 1
        return None

    def row_in_source(self, uri: str, row: int) -> Optional[int]:
        """The concatenated source's row of ``row`` (1-based) of cell ``uri``."""
        for span in self.spans:
            if span.uri == uri:
                return span.first_row + row - 1
        return None


def concatenate(cells: Sequence[Cell]) -> ConcatenatedCells:
    """The cells joined by newlines; each cell starts on a line of its own."""
    lines: List[str] = []
    spans: List[CellSpan] = []
    for cell in cells:
        cell_lines = cell.text.splitlines() or [""]
        spans.append(CellSpan(cell.uri, len(lines) + 1, len(cell_lines)))
        lines.extend(_as_python(cell_lines))
    return ConcatenatedCells("\n".join(lines) + "\n", spans)


def _as_python(lines: List[str]) -> List[str]:
    if lines and lines[0].lstrip().startswith("%%"):  # a cell magic: the cell is not Python
        return [_comment(line) for line in lines]
    return [
        _comment(line) if _IPYTHON_LINE.match(line) and not line.lstrip().startswith("#") else line for line in lines
    ]


def _comment(line: str) -> str:
    indent = len(line) - len(line.lstrip())
    body = line[indent:]
    return line[:indent] + "#" + body[1:] if body else line
