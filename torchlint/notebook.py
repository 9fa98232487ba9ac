"""Jupyter notebooks: their code cells linted as one program, findings placed
in cells, fixes written back into the notebook's own JSON text.

A notebook's code cells run in one interpreter, in order, so a loader built
in one cell and iterated in another is one program: the cells are joined,
each after a marker line (``# torchlint: cell N``), into a *program* that the
ordinary engine lints. IPython syntax that is not Python (``%magic``,
``!shell``, ``x = !cmd``, ``obj?``) becomes ``pass`` at the same indentation,
one line for one line, so every other line and column stays where it was; a
cell whose cell magic runs another language (``%%bash``, ``%%writefile``) is
left out. Findings are mapped back to (cell, row in the cell): ``cell`` on a
``Diagnostic`` is the 1-based position of the cell in the notebook (markdown
cells count, as in ruff and in an editor's view), ``row`` and ``end_row`` are
rows in that cell, and ``noqa_row`` stays the row in the program (what
``# noqa`` and the report's excerpt read).

A fix edits the program; the edited cells' ``source`` values are then
replaced in the file's JSON text and nothing else is touched: outputs,
metadata, cell ids, key order, indentation and escapes stay byte for byte,
and each unchanged line of an edited cell keeps its original JSON string.

Entry points: ``lint_notebook`` (text in, findings with cell positions out;
what an editor integration calls) and ``runner.run_notebook`` (the runner's lint,
fix, diff and add-noqa modes).
"""

from __future__ import annotations

import difflib
import io
import json
import re
import tokenize
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from torchlint.rule import Diagnostic, ResolvedEdit, ResolvedFix
from torchlint.source import split_lines

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.linter import FileOptions, LintOutput

SUFFIX = ".ipynb"
MARKER = "# torchlint: cell {}"
_MARKER = re.compile(r"# torchlint: cell (\d+)\n")
PLACEHOLDER = "pass"
# Cell magics whose body is Python run by IPython (the rest run another
# language or write a file: their cells are not part of the program).
PYTHON_CELL_MAGICS = frozenset(
    {
        "time",
        "timeit",
        "capture",
        "prun",
        "debug",
        "pypy",
        "python",
        "python3",
        "gpu_sanitize",
    }
)


class NotebookError(Exception):
    """The file is not a notebook torchlint can read; the message says why."""


def is_notebook(path: str) -> bool:
    return path.endswith(SUFFIX)


@dataclass
class Cell:
    index: int  # 1-based position among all the notebook's cells
    source: str  # as stored: the lines joined
    lines: List[str]  # the program's lines for this cell (magics replaced), each ending "\n"
    magics: Dict[int, str] = field(default_factory=dict)  # line (0-based) -> the original line


@dataclass
class Program:
    """A notebook's code cells as one Python text, with the map back."""

    text: str
    cells: List[Cell]
    # program row (1-based) -> (cell index, row in cell); marker rows map to (cell, 0)
    rows: List[Tuple[int, int]]
    nbformat: int

    def place(self, row: int) -> Tuple[int, int]:
        if 1 <= row <= len(self.rows):
            cell, cell_row = self.rows[row - 1]
            return cell, max(cell_row, 1)
        return (self.cells[-1].index, max(len(self.cells[-1].lines), 1)) if self.cells else (1, 1)


def read(text: str) -> Tuple[object, int]:
    """The notebook as nbformat reads it (converted to v4 for reading), and
    the file's own major version. Raises NotebookError with one clear reason."""
    import nbformat

    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise NotebookError(f"not a notebook: invalid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise NotebookError("not a notebook: the JSON is not an object")
    version = raw.get("nbformat")
    if version not in (3, 4):
        raise NotebookError(f"unknown nbformat {version!r} (torchlint reads nbformat 3 and 4)")
    try:
        notebook = nbformat.reads(text, as_version=4)
    except Exception as exc:  # nbformat's readers raise several kinds for a malformed notebook
        raise NotebookError(
            f"not a valid nbformat {version} notebook: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    return notebook, version


def program_of(text: str) -> Program:
    notebook, version = read(text)
    cells: List[Cell] = []
    for position, cell in enumerate(getattr(notebook, "cells", []), start=1):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list):  # nbformat joins these; a hand-made dict may not be
            source = "".join(source)
        converted = _python_lines(source)
        if converted is not None:
            lines, magics = converted
            cells.append(Cell(position, source, lines, magics))
    program: List[str] = []
    rows: List[Tuple[int, int]] = []
    for cell in cells:
        program.append(MARKER.format(cell.index) + "\n")
        rows.append((cell.index, 0))
        program.extend(cell.lines)
        rows.extend((cell.index, row) for row in range(1, len(cell.lines) + 1))
    return Program("".join(program), cells, rows, version)


_LINE_MAGIC = re.compile(r"[ \t]*(?:[%!]|\?)")
_ASSIGNED_MAGIC = re.compile(r"[ \t]*[\w.]+(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[ \t]*[%!]")
_HELP = re.compile(r"[ \t]*[\w.\[\]()]+\?{1,2}[ \t]*$")


def _python_lines(source: str) -> Optional[Tuple[List[str], Dict[int, str]]]:
    """The cell's lines with IPython-only lines as ``pass`` (same indentation),
    and the originals; None when a cell magic makes the cell another language."""
    lines = [line.rstrip("\r\n") + "\n" for line in split_lines(source)]
    magics: Dict[int, str] = {}
    first = lines[0].strip() if lines else ""
    if first.startswith("%%"):
        name = first[2:].split(None, 1)[0] if first[2:].strip() else ""
        if name not in PYTHON_CELL_MAGICS:
            return None
        magics[0] = lines[0]
    # A magic continued with a backslash is one statement over several lines:
    # each of its lines becomes a `pass` at the indentation of its first.
    indents: Dict[int, str] = {}
    continued: Optional[str] = None
    for number, line in enumerate(lines):
        if (
            number in magics
            or continued is not None
            or _LINE_MAGIC.match(line)
            or _ASSIGNED_MAGIC.match(line)
            or _HELP.match(line)
        ):
            magics[number] = line
            indent = continued if continued is not None else line[: len(line) - len(line.lstrip(" \t"))]
            indents[number] = indent
            continued = indent if line.rstrip("\n").endswith("\\") else None
    if magics:
        candidate = list(lines)
        for number in magics:
            candidate[number] = indents[number] + PLACEHOLDER + "\n"
        for number in _inside_strings("".join(candidate)):
            magics.pop(number, None)  # a "%" line inside a triple-quoted string is text
        for number in magics:
            lines[number] = indents[number] + PLACEHOLDER + "\n"
    return lines, magics


def _inside_strings(text: str) -> List[int]:
    """0-based lines that lie inside a multi-line string token (after its first line)."""
    inside: List[int] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING and token.end[0] > token.start[0]:
                inside.extend(range(token.start[0], token.end[0]))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass  # the lint reports what does not parse
    return inside


def lint_notebook(text: str, path: str, options: "FileOptions") -> "LintOutput":
    """Lint a notebook's JSON text: findings carry ``cell`` and rows in the
    cell. A broken notebook is one TL000 finding that says why."""
    from torchlint.linter import LintOutput, lint_text, syntax_error

    try:
        program = program_of(text)
    except NotebookError as exc:
        return LintOutput([syntax_error(path, str(exc))], [], False)
    output = lint_text(program.text, path, options)
    return LintOutput([to_cells(d, program) for d in output.diagnostics], output.errors, output.parsed)


def to_cells(d: Diagnostic, program: Program) -> Diagnostic:
    """A finding on the program placed in its cell (``noqa_row`` stays the program's row)."""
    cell, row = program.place(d.row)
    end_cell, end_row = program.place(d.end_row)
    if end_cell != cell:
        end_row = row
    fix = d.fix
    if fix is not None:
        fix = ResolvedFix(
            fix.applicability,
            fix.message,
            tuple(
                ResolvedEdit(
                    e.content, (program.place(e.start[0])[1], e.start[1]), (program.place(e.end[0])[1], e.end[1])
                )
                for e in fix.edits
            ),
        )
    evidence = tuple(
        replace(fact, row=program.place(fact.row)[1], cell=program.place(fact.row)[0]) if fact.path == d.path else fact
        for fact in d.evidence
    )
    return replace(d, cell=cell, row=row, end_row=end_row, fix=fix, evidence=evidence, noqa_row=d.noqa_row or d.row)


def cells_after(program: Program, new_program: str) -> Dict[int, str]:
    """The new source of each cell the edited program changed. Raises
    NotebookError when the cell markers or magic lines did not survive."""
    found: Dict[int, List[str]] = {}
    order = [cell.index for cell in program.cells]
    current: Optional[int] = order[0] if order else None
    pending: List[str] = []  # lines a fix put above the first marker belong to the first cell
    for line in split_lines(new_program):
        marker = _MARKER.fullmatch(line)
        if marker:
            current = int(marker.group(1))
            if current in found or current not in order:
                raise NotebookError("a fix moved a cell boundary; notebook left unchanged")
            found[current] = pending
            pending = []
            continue
        (found[current] if current in found else pending).append(line)
    if list(found) != order:
        raise NotebookError("a fix moved a cell boundary; notebook left unchanged")
    changed: Dict[int, str] = {}
    for cell in program.cells:
        lines = found[cell.index]
        if lines == cell.lines:
            continue
        magic_rows = [number for number, line in enumerate(cell.lines) if number in cell.magics]
        placeholders = [number for number, line in enumerate(lines) if line.strip() == PLACEHOLDER]
        if len(placeholders) < len(magic_rows):
            raise NotebookError(f"a fix touched an IPython magic in cell {cell.index}; notebook left unchanged")
        # Magic lines come back in order, onto the placeholders that line up with them.
        matcher = difflib.SequenceMatcher(a=cell.lines, b=lines, autojunk=False)
        restored = list(lines)
        mapped = 0
        for tag, a0, a1, b0, _ in matcher.get_opcodes():
            if tag == "equal":
                for offset in range(a1 - a0):
                    if a0 + offset in cell.magics:
                        restored[b0 + offset] = cell.magics[a0 + offset]
                        mapped += 1
        if mapped != len(cell.magics):
            raise NotebookError(f"a fix touched an IPython magic in cell {cell.index}; notebook left unchanged")
        new_source = "".join(restored)
        if not cell.source.endswith("\n") and new_source.endswith("\n"):
            new_source = new_source[:-1]  # the program added a final newline the cell did not have
        if new_source != cell.source:
            changed[cell.index] = new_source
    return changed


def cell_diff(path: str, program: Program, changed: Dict[int, str]) -> str:
    """A unified diff per edited cell, headed ``a/train.ipynb:cell 4``."""
    sources = {cell.index: cell.source for cell in program.cells}
    parts = []
    for index in sorted(changed):
        parts.append(
            "".join(
                difflib.unified_diff(
                    _diff_lines(sources[index]),
                    _diff_lines(changed[index]),
                    f"a/{path}:cell {index}",
                    f"b/{path}:cell {index}",
                )
            )
        )
    return "".join(parts)


def _diff_lines(source: str) -> List[str]:
    lines = split_lines(source)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of cell\n"
    return lines


# ---- writing the edited sources back into the JSON text ------------------


def write_sources(text: str, changed: Dict[int, str]) -> str:
    """``text`` (a notebook's JSON) with the ``source`` of each changed cell
    (1-based index) replaced, and every other byte as it was."""
    if not changed:
        return text
    document = _Spans(text)
    root = document.parse()
    if not isinstance(root, _Object) or "cells" not in root.members:
        raise NotebookError(
            "cannot write back an nbformat 3 notebook (`jupyter nbconvert --to notebook --inplace` converts it)"
        )
    cells = root.members["cells"]
    assert isinstance(cells, _Array)
    edits = []
    for index, new_source in changed.items():
        cell = cells.items[index - 1]
        assert isinstance(cell, _Object)
        edits.append((cell.members["source"], new_source))
    result = text
    for value, new_source in sorted(edits, key=lambda item: item[0].start, reverse=True):
        result = result[: value.start] + _source_json(text, value, new_source) + result[value.end :]
    return result


def _source_json(text: str, value: "_Node", new_source: str) -> str:
    """The new ``source`` value in the layout of the old: a list of line
    strings indented like the old one's (an unchanged line keeps its exact
    JSON string), or one string if it was one."""
    ascii_only = "\\u" in text and not any(ord(ch) > 127 for ch in text)
    if not isinstance(value, _Array):
        return json.dumps(new_source, ensure_ascii=ascii_only)
    old_literals = [text[item.start : item.end] for item in value.items]
    old_lines = [json.loads(literal) for literal in old_literals]
    new_lines = split_lines(new_source)
    literals: List[str] = []
    matcher = difflib.SequenceMatcher(a=old_lines, b=new_lines, autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            literals.extend(old_literals[a0:a1])
        else:
            literals.extend(json.dumps(line, ensure_ascii=ascii_only) for line in new_lines[b0:b1])
    if not literals:
        return "[]"
    if len(value.items) >= 1:
        opening = text[value.start + 1 : value.items[0].start]  # "\n     " before the first line
        separator = text[value.items[0].end : value.items[1].start] if len(value.items) >= 2 else "," + opening
        closing = text[value.items[-1].end : value.end - 1]
    else:
        line_start = text.rfind("\n", 0, value.start) + 1
        indent = text[line_start : line_start + len(text[line_start:]) - len(text[line_start:].lstrip(" "))]
        opening, closing = "\n" + indent + " ", "\n" + indent
        separator = "," + opening
    return "[" + opening + separator.join(literals) + closing + "]"


@dataclass
class _Node:
    start: int
    end: int


@dataclass
class _Object(_Node):
    members: Dict[str, _Node] = field(default_factory=dict)


@dataclass
class _Array(_Node):
    items: List[_Node] = field(default_factory=list)


class _Spans:
    """Where each JSON value lies in the text (the standard library's
    decoder gives values, not places)."""

    _WS = re.compile(r"[ \t\n\r]*")

    def __init__(self, text: str) -> None:
        self.text = text
        self.decoder = json.JSONDecoder()

    def parse(self) -> _Node:
        node, _ = self._value(self._skip(0))
        return node

    def _skip(self, at: int) -> int:
        match = self._WS.match(self.text, at)
        return match.end() if match else at

    def _value(self, at: int) -> Tuple[_Node, int]:
        ch = self.text[at]
        if ch == "{":
            node = _Object(at, at)
            at = self._skip(at + 1)
            if self.text[at] == "}":
                node.end = at + 1
                return node, at + 1
            while True:
                key, at = self.decoder.raw_decode(self.text, at)
                at = self._skip(self._skip(at) + 1)  # past ":"
                node.members[key], at = self._value(at)
                at = self._skip(at)
                if self.text[at] == "}":
                    node.end = at + 1
                    return node, at + 1
                at = self._skip(at + 1)  # past ","
        if ch == "[":
            array = _Array(at, at)
            at = self._skip(at + 1)
            if self.text[at] == "]":
                array.end = at + 1
                return array, at + 1
            while True:
                item, at = self._value(at)
                array.items.append(item)
                at = self._skip(at)
                if self.text[at] == "]":
                    array.end = at + 1
                    return array, at + 1
                at = self._skip(at + 1)
        _, end = self.decoder.raw_decode(self.text, at)
        return _Node(at, end), end
