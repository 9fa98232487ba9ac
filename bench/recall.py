"""Recall by reading: how many of the real problems a reader found does torchlint report?

The reading comes first and blind: a reviewer reads whole training scripts and the
helpers they call per step, without torchlint's output, and lists every real
problem of the catalogue's kinds (``bench/precision/recall-*.tsv``: script,
``project/path:line``, kind, why). This script then lints each project the
reading touched, from inside the project as a user would (``--preview --select
ALL``), and counts a problem as reported when a finding of the same code sits
in the same file within ``NEAR`` lines of it (a reader cites the forward pass,
the rule the ``.eval()`` call above it: one problem), or anywhere in the file
for the script-wide settings (TL801-TL803: the flag belongs to the script, not
to a line). A finding of another code there is listed apart ("reported under
another code"), never counted.

    python bench/recall.py bench/precision/recall-2026-11.tsv
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from precision_sample import DEFAULT_CORPUS, lint_corpus  # noqa: E402

Place = Tuple[str, str]  # project, path inside it
NEAR = 3
SCRIPT_WIDE = {"TL801", "TL802", "TL803"}


def read_problems(path: Path) -> List[dict]:
    """The reading's rows: each with its project, path, line and kind."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle, delimiter="\t"))
    problems = []
    for row in rows[1:]:
        if len(row) < 4 or not row[1].strip():
            continue
        where, line = row[1].rsplit(":", 1)
        project, _, inner = where.partition("/")
        problems.append({"project": project, "path": inner, "line": int(line), "code": row[2].split()[0], "why": row[3]})
    return problems


def notebook_places(path: Path) -> Dict[int, Tuple[int, int]]:
    """A notebook's raw JSON line -> (cell, row in the cell's source), both
    1-based, cells numbered among all cells as the linter names them. A reader
    cites the line of the ``.ipynb`` file; findings name the cell and its row."""
    raw = path.read_text(encoding="utf-8").splitlines()
    cells = json.loads("\n".join(raw)).get("cells", [])
    places: Dict[int, Tuple[int, int]] = {}
    at = 0
    for number, cell in enumerate(cells, start=1):
        source = cell.get("source", [])
        lines = source if isinstance(source, list) else source.splitlines(keepends=True)
        for row, line in enumerate(lines, start=1):
            encodings = {json.dumps(line)[1:-1], json.dumps(line, ensure_ascii=False)[1:-1]}
            for index in range(at, len(raw)):
                if any(encoded and encoded in raw[index] for encoded in encodings):
                    places[index + 1] = (number, row)
                    at = index + 1
                    break
    return places


def match(
    problems: Sequence[dict], findings: Sequence[dict], corpus: Optional[Path] = None
) -> Tuple[List[dict], List[dict], List[dict]]:
    """(reported, reported under another code, missed)."""
    in_file: Dict[Place, List[Tuple[Tuple[int, int], str]]] = {}
    for finding in findings:
        place = (finding.get("cell") or 0, finding["row"])
        in_file.setdefault((finding["project"], finding["path"]), []).append((place, finding["code"]))
    reported, elsewhere, missed = [], [], []
    for problem in problems:
        found = in_file.get((problem["project"], problem["path"]), [])
        if problem["code"] in SCRIPT_WIDE and any(code == problem["code"] for _, code in found):
            reported.append(problem)
            continue
        cell, line = 0, problem["line"]
        if problem["path"].endswith(".ipynb") and corpus is not None:
            cell, line = notebook_places(corpus / problem["project"] / problem["path"]).get(line, (-1, line))
        near: Set[str] = {code for (at_cell, row), code in found if at_cell == cell and abs(row - line) <= NEAR}
        if problem["code"] in near:
            reported.append(problem)
        elif near:
            elsewhere.append(dict(problem, found=", ".join(sorted(near))))
        else:
            missed.append(problem)
    return reported, elsewhere, missed


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reading", type=Path, help="a recall-*.tsv reading")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    args = parser.parse_args(argv)
    problems = read_problems(args.reading)
    projects = sorted({problem["project"] for problem in problems})
    findings, _, errors = lint_corpus(args.corpus, projects)
    for error in errors:
        print(f"lint error: {error}", file=sys.stderr)
    reported, elsewhere, missed = match(problems, findings, args.corpus)
    total = len(problems)
    print(f"recall: {len(reported)}/{total} = {len(reported) / total:.2f} "
          f"({len({p['project'] for p in problems})} projects, {args.reading.name})")
    for title, rows in (("reported under another code", elsewhere), ("missed", missed)):
        if rows:
            print(f"\n{title}:")
            for row in rows:
                extra = f" (found {row['found']})" if "found" in row else ""
                print(f"  {row['code']} {row['project']}/{row['path']}:{row['line']}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
