"""The editor's parse in pieces (torchlint.incremental) against a whole parse, on real files.

    python bench/incremental_parse.py [--preview] [--limit N] PATH...

For every ``.py`` file under the paths, as the language server lints it:

1. the lint with a ``ChunkedParser`` must give the same findings, in the same
   order and places, as the lint with a whole parse, and the joined module's
   code must be the text libcst read;
2. a keystroke is simulated (a comment appended to the last line of the
   file's middle top-level statement) and linted again with the same parser:
   the findings must again match a whole parse of the edited text, and the
   pieces parsed again are counted.

It prints the files checked, the mismatches (each named; the exit status is
1 if there is any), how many files were parsed in pieces, and, over the
files of at least 300 lines, the median time of a lint after the edit with
each parse and their ratio, taken in this one run.
"""

from __future__ import annotations

import argparse
import ast
import os
import statistics
import sys
import time
from typing import List, Tuple

from torchlint.cli import Settings, build_parser
from torchlint.incremental import ChunkedParser
from torchlint.linter import elide_large_literals, lint_text, parse_module, text_for_libcst


def files_under(paths: List[str]) -> List[str]:
    found = []
    for root in paths:
        if os.path.isfile(root):
            found.append(root)
            continue
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            found += [os.path.join(folder, name) for name in sorted(names) if name.endswith(".py")]
    return found


def findings(output) -> List[Tuple]:
    return [(d.code, d.row, d.column, d.end_row, d.end_column, d.message) for d in output.diagnostics]


def edited(text: str, tree: ast.Module) -> str:
    """A comment typed at the end of the middle top-level statement's last line."""
    statement = tree.body[len(tree.body) // 2]
    lines = text.splitlines(keepends=True)
    row = (statement.end_lineno or statement.lineno) - 1
    line = lines[row]
    body = line.rstrip("\n")
    if "#" in body or body.rstrip().endswith("\\"):
        return text  # a comment there already, or a continuation: leave the text as it is
    lines[row] = body + "  # typed" + line[len(body) :]
    return "".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--preview", action="store_true", help="lint with the preview rules too")
    parser.add_argument("--limit", type=int, default=0, help="check at most N files")
    options = parser.parse_args()
    settings = Settings(build_parser().parse_args(["--preview"] if options.preview else []))
    checked = chunked = 0
    mismatches: List[str] = []
    whole_times: List[float] = []
    piece_times: List[float] = []
    pieces_again: List[int] = []
    for path in files_under(options.paths)[: options.limit or None]:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        file_options = settings.file_options(path)
        incremental = ChunkedParser(parse_module)
        checked += 1
        whole = lint_text(text, path, file_options)
        pieces = lint_text(text, path, file_options, parser=incremental)
        if findings(whole) != findings(pieces) or len(pieces.errors) != len(whole.errors):
            mismatches.append(f"{path}: findings differ")
            continue
        libcst_text = text_for_libcst(elide_large_literals(text, tree))
        if incremental.parsed_pieces > 1:
            chunked += 1
            if incremental.parse(libcst_text, None).code != libcst_text:
                mismatches.append(f"{path}: the joined module's code is not the text")
                continue
        if not tree.body:
            continue
        after = edited(text, tree)
        started = time.perf_counter()
        again = lint_text(after, path, file_options, parser=incremental)
        piece_time = time.perf_counter() - started
        started = time.perf_counter()
        reference = lint_text(after, path, file_options)
        whole_time = time.perf_counter() - started
        if findings(again) != findings(reference):
            mismatches.append(f"{path}: findings differ after an edit")
            continue
        if text.count("\n") >= 300:
            whole_times.append(whole_time)
            piece_times.append(piece_time)
            pieces_again.append(incremental.parsed_pieces)
    print(f"{checked} files checked, {chunked} parsed in pieces, {len(mismatches)} mismatches")
    for line in mismatches:
        print(f"  {line}")
    if whole_times:
        whole_ms, piece_ms = statistics.median(whole_times) * 1000, statistics.median(piece_times) * 1000
        print(
            f"files of 300+ lines: {len(whole_times)}; a lint after one edit, median: whole parse {whole_ms:.0f} ms, "
            f"in pieces {piece_ms:.0f} ms ({whole_ms / piece_ms:.2f}x); pieces parsed again: "
            f"median {statistics.median(pieces_again):.0f}"
        )
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
