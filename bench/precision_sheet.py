"""The judging sheet: each sampled finding as a blind reader needs it.

For every finding: its message, the evidence it shows (each fact with its
place), the enclosing function in full (or a generous window around the line),
and pointers to follow across files: the evidence's files, the project
modules the file imports, the places that call the enclosing function, and
the files that declare the project's torch version. Nothing about how the rule
decides: the reader judges the code against judging.md, not the rule's logic.

Notebook findings (``.ipynb``) show their cell: the record's ``cell`` when the
linter gives one (rows within the cell), else the cell that holds the row of
the notebook's code cells read one after another.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterator, List, Optional, Sequence, Tuple

WHOLE_FUNCTION_LIMIT = 200  # lines: a longer function is shown as a window
WINDOW = 60  # lines above and below the finding when the function is too long
MODULE_WINDOW = 40  # lines above and below a finding at module level
MAX_CALLERS = 12
VERSION_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "Dockerfile")
VERSION_PATTERNS = ("requirements*.txt", "environment*.yml", "environment*.yaml")

INSTRUCTIONS = """\
Judge each finding below against judging.md ({judging}): TRUE only when its claim is right
(follow the loader, the model, the device and the loop to where they are set up, across files),
a performance-minded reviewer would change the line, and the code runs on a GPU in work someone
times. Anything else is FALSE. Judge by the code, not by the message's reasoning.

Write your verdicts in `{verdicts}`: `T` or `F` in the `verdict` column of the finding's row
(matched by its id), and for every `F` a one-line `reason` that starts with a category and a
colon, e.g. `periodic: logged under if step % 50 == 0`. Categories (judging.md): {categories}.
"""


def render(findings: Sequence[dict], corpus: Path, header: str, verdicts_name: str, judging: str, categories: Sequence[str]) -> str:
    parts = [header, "", INSTRUCTIONS.format(judging=judging, verdicts=verdicts_name, categories=", ".join(categories))]
    for finding in findings:
        parts.append(render_finding(finding, corpus / finding["project"]))
    return "\n".join(parts)


def render_finding(finding: dict, root: Path) -> str:
    place = f"{finding['project']}/{finding['path']}:{finding['row']}:{finding['column']}"
    lines = [f"## {finding['id']}  {finding['code']}  `{place}`", "", f"**Finding:** {finding['message']}", ""]
    if finding["evidence"]:
        lines.append("**Evidence it shows:**")
        lines += [f"- {fact['message']} (`{fact['path']}:{fact['row']}`)" for fact in finding["evidence"]]
        lines.append("")
    path = root / finding["path"]
    try:
        title, code = excerpt(path, finding)
    except (OSError, ValueError) as exc:
        title, code = "the file cannot be read", f"({exc})"
    pointers = list(follow(root, path, finding))
    if pointers:
        lines.append("**To follow:**")
        lines += [f"- {text}" for text in pointers]
        lines.append("")
    lines += [f"**Code** ({title}):", "", "```python", code, "```", ""]
    return "\n".join(lines)


# -- the code around the finding ------------------------------------------------

def excerpt(path: Path, finding: dict) -> Tuple[str, str]:
    """(what is shown, numbered lines with the finding's row marked): the
    innermost function in full, else the top-level statement in full; when
    that is too long, a window around the row under the lines that open the
    blocks it starts inside (the def, the loops, the withs)."""
    if path.suffix == ".ipynb":
        return _notebook_excerpt(path, finding)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    row = finding["row"]
    chain = enclosing_blocks(text, row)
    if not chain:
        first, last = max(1, row - MODULE_WINDOW), min(len(lines), row + MODULE_WINDOW)
        return f"module level, lines {first}-{last} of {path.name}", numbered(lines, first, last, row)
    functions = [block for block in chain if block[0]]
    name, start, end = functions[-1] if functions else chain[0]
    what = f"`{name}`" if functions else "the top-level statement"
    if end - start + 1 <= WHOLE_FUNCTION_LIMIT:
        return f"{what}, lines {start}-{end} of {path.name}, in full", numbered(lines, start, end, row)
    first, last = max(start, row - WINDOW), min(end, row + WINDOW)
    openers = [numbered(lines, opens, opens, row) for _, opens, _ in chain if start <= opens < first]
    head = "".join(opener + "\n  ...\n" for opener in openers)
    return f"{what}, lines {first}-{last} of its {start}-{end} in {path.name}", head + numbered(lines, first, last, row)


def enclosing_blocks(text: str, row: int) -> List[Tuple[Optional[str], int, int]]:
    """(qualified name for a function else None, first line with decorators,
    last line) of each statement holding ``row``, outermost first. Empty at
    module level outside any statement, or when the file does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    chain: List[Tuple[Optional[str], int, int]] = []
    node: ast.AST = tree
    prefix = ""
    while True:
        holder = next((child for child in _child_statements(node) if _span(child)[0] <= row <= _span(child)[1]), None)
        if holder is None:
            return chain
        is_function = isinstance(holder, (ast.FunctionDef, ast.AsyncFunctionDef))
        chain.append((prefix + holder.name if is_function else None, *_span(holder)))
        if is_function or isinstance(holder, ast.ClassDef):
            prefix += holder.name + "."
        node = holder


def _child_statements(node: ast.AST) -> List[ast.stmt]:
    """The statements directly under ``node``, those of its except and case clauses included."""
    found: List[ast.stmt] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            found.append(child)
        elif isinstance(child, ast.excepthandler) or type(child).__name__ == "match_case":
            found.extend(grandchild for grandchild in ast.iter_child_nodes(child) if isinstance(grandchild, ast.stmt))
    return found


def _span(node: ast.stmt) -> Tuple[int, int]:
    decorators = getattr(node, "decorator_list", None) or []
    return min([node.lineno] + [d.lineno for d in decorators]), node.end_lineno or node.lineno


def enclosing_function(text: str, row: int) -> Optional[Tuple[str, int, int]]:
    """(qualified name, first line, last line) of the innermost function holding ``row``."""
    functions = [block for block in enclosing_blocks(text, row) if block[0]]
    return functions[-1] if functions else None  # type: ignore[return-value]


def numbered(lines: List[str], first: int, last: int, mark: int) -> str:
    return "\n".join(f"{'>>' if number == mark else '  '}{number:5d}  {lines[number - 1]}" for number in range(first, last + 1))


def _notebook_excerpt(path: Path, finding: dict) -> Tuple[str, str]:
    import nbformat

    notebook = nbformat.read(str(path), as_version=4)
    # Cells are numbered as the linter numbers them: from 1, markdown cells included.
    cells = [(index, cell.source.splitlines()) for index, cell in enumerate(notebook.cells, start=1) if cell.cell_type == "code"]
    if not cells:
        raise ValueError("the notebook has no code cell")
    if finding.get("cell") is not None:  # the linter's row is within this cell
        wanted = int(finding["cell"])
        index, lines = next(((i, c) for i, c in cells if i == wanted), cells[0])
        row = finding["row"]
    else:  # the row counts the code cells' lines one after another
        row, index, lines = finding["row"], cells[-1][0], cells[-1][1]
        for index, lines in cells:
            if row <= len(lines):
                break
            row -= len(lines)
    return f"notebook cell {index} of {path.name}, in full", numbered(lines, 1, len(lines), row) if lines else "(empty cell)"


# -- pointers across files ----------------------------------------------------------

def follow(root: Path, path: Path, finding: dict) -> Iterator[str]:
    seen = {finding["path"]}
    for fact in finding["evidence"]:
        if fact["path"] not in seen:
            seen.add(fact["path"])
            yield f"evidence in `{fact['path']}`"
    if path.suffix == ".py" and path.is_file():
        text = path.read_text(encoding="utf-8", errors="replace")
        imported = [rel for rel in project_imports(root, path, text) if rel not in seen]
        if imported:
            yield "project modules this file imports: " + ", ".join(f"`{rel}`" for rel in imported)
        span = enclosing_function(text, finding["row"])
        if span is not None:
            name = span[0].rsplit(".", 1)[-1]
            calls = callers(root, name, (finding["path"], span[1]))
            if calls:
                more = f" (first {MAX_CALLERS})" if len(calls) == MAX_CALLERS else ""
                yield f"calls of `{name}(` in the project{more}: " + ", ".join(f"`{c}`" for c in calls)
            else:
                yield f"no call of `{name}(` elsewhere in the project"
    declared = version_files(root, path)
    if declared:
        yield "the torch version is declared in: " + ", ".join(f"`{rel}`" for rel in declared)
    else:
        yield "no file of the project declares the torch version"


def project_imports(root: Path, path: Path, text: str) -> List[str]:
    """Files of the project that ``path`` imports (absolute and relative imports)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    found: List[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            bases = [root, path.parent]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = path.parent
                for _ in range(node.level - 1):
                    base = base.parent
                bases = [base]
            else:
                bases = [root, path.parent] + _source_roots(root, path)
            names = [module] + [f"{module}.{alias.name}" if module else alias.name for alias in node.names]
        else:
            continue
        for name in names:
            target = _module_file(bases, name)
            if target is not None:
                rel = target.relative_to(root).as_posix()
                if rel not in found and target != path:
                    found.append(rel)
    return found


def _source_roots(root: Path, path: Path) -> List[Path]:
    """Directories between the project root and the file (``src/``-style layouts)."""
    roots, current = [], path.parent
    while current != root and root in current.parents:
        roots.append(current)
        current = current.parent
    return roots


def _module_file(bases: Sequence[Path], dotted: str) -> Optional[Path]:
    if not dotted:
        return None
    parts = dotted.split(".")
    for base in bases:
        candidate = base.joinpath(*parts)
        for option in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if option.is_file():
                return option
    return None


def callers(root: Path, name: str, definition: Tuple[str, int]) -> List[str]:
    """``path:row`` of each call ``name(`` in the defining file, or in a project
    file whose imports name the defining module or the function."""
    pattern = re.compile(rf"(?<![\w]){re.escape(name)}\s*\(")
    definition_line = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(name)}\b")
    defining = Path(definition[0])
    module = defining.parent.name if defining.stem == "__init__" else defining.stem
    imports_it = re.compile(rf"^\s*(from|import)\s.*\b({re.escape(module)}|{re.escape(name)})\b", re.M)
    found: List[str] = []
    for file in sorted(root.rglob("*.py")):
        rel = file.relative_to(root).as_posix()
        try:
            text = file.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if rel != definition[0] and not imports_it.search(text):
            continue
        for number, line in enumerate(text.splitlines(), start=1):
            if pattern.search(line) and not definition_line.match(line) and (rel, number) != definition:
                found.append(f"{rel}:{number}")
                if len(found) == MAX_CALLERS:
                    return found
    return found


def version_files(root: Path, path: Path) -> List[str]:
    """The manifests nearest to the file (its folder, then up to the project root)."""
    directory = path.parent
    while True:
        found = [directory / name for name in VERSION_FILES if (directory / name).is_file()]
        for pattern in VERSION_PATTERNS:
            found += sorted(directory.glob(pattern))
        if found:
            return [f.relative_to(root).as_posix() for f in found]
        if directory == root or root not in directory.parents:
            return []
        directory = directory.parent

