"""The length of the concise line on a corpus: the whole message (before) and the 100-column line (now).

    python bench/concise_line_length.py CORPUS

Lints each top folder of CORPUS from inside it, as its user would
(`torchlint --preview --select ALL .`, in this process), and prints the median and the max length in characters of
the concise line two ways: with the whole message (what the concise format
printed before it was shortened) and as the concise reporter prints it now;
plus how many lines are over 100 columns each way, and how many lines now
end in a cut (`…`) or show the rule's summary instead of the site's message.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import List

from torchlint.discovery import discover
from torchlint.fixer import is_applicable
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext
from torchlint.reporters.text import concise_line
from torchlint.rule import Diagnostic


def findings(project: str) -> List[Diagnostic]:
    """`torchlint --preview --select ALL .` from inside ``project``, in this process
    (the same files, settings and lint; no worker processes)."""
    from torchlint.cli import Settings, build_parser
    from torchlint.runner import Job, run_file

    here = os.getcwd()
    os.chdir(project)
    try:
        settings = Settings(build_parser().parse_args(["--preview", "--select", "ALL"]))
        files, _ = discover(["."], settings.discovery())
        found: List[Diagnostic] = []
        for path in files:
            found.extend(run_file(Job(path, settings.file_options(path))).diagnostics)
        return found
    finally:
        os.chdir(here)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus")
    args = parser.parse_args()
    before, now, cut, summarised = [], [], 0, 0
    summaries = {code: rule.summary for code, rule in all_rules().items()}
    for name in sorted(os.listdir(args.corpus)):
        project = os.path.join(args.corpus, name)
        if not os.path.isdir(project):
            continue
        ctx = ReportContext(cwd=os.path.abspath(project))
        print(f"{name} ...", file=sys.stderr, flush=True)
        for d in findings(project):
            marker = " [*]" if is_applicable(d.fix, unsafe_fixes=False) else ""
            before.append(len(f"{ctx.display_path(d.path)}:{d.row}:{d.column}: {d.code}{marker} {d.message}"))
            line = concise_line(d, ctx)
            now.append(len(line))
            cut += line.endswith("…")
            summarised += line.endswith(summaries.get(d.code, "\0")) or line.endswith(
                summaries.get(d.code, "\0").split(" (")[0]
            )
    print(f"corpus: {args.corpus}, {len(before)} findings (torchlint --preview --select ALL, per project)")
    for label, lengths in (("whole message (before)", before), ("concise line (now)", now)):
        over = sum(length > 100 for length in lengths)
        print(
            f"{label:<24} median {statistics.median(lengths):>5.0f}   max {max(lengths):>4}   over 100: {over} ({over / len(lengths):.1%})"
        )
    print(
        f"now cut with an ellipsis: {cut} ({cut / len(now):.1%}); the rule's summary instead: {summarised} ({summarised / len(now):.1%})"
    )


if __name__ == "__main__":
    main()
