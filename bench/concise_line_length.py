"""The length of the concise line on a corpus: the whole message (before) and the 100-column line (now).

    python bench/concise_line_length.py CORPUS [--jobs N]

Lints each top folder of CORPUS from inside it, as its user would
(`torchlint --preview --select ALL --output-format json-lines`), rebuilds
each finding, and prints the median and the max length in characters of
the concise line two ways: with the whole message (what the concise format
printed before it was shortened) and as the concise reporter prints it now;
plus how many lines are over 100 columns each way, and how many lines now
end in a cut (`…`) or show the rule's summary instead of the site's message.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import List

from torchlint.fixer import is_applicable
from torchlint.registry import all_rules
from torchlint.reporters import ReportContext
from torchlint.reporters.text import concise_line
from torchlint.rule import Diagnostic, ResolvedEdit, ResolvedFix


def findings(project: str, jobs: int) -> List[Diagnostic]:
    command = [
        sys.executable,
        "-m",
        "torchlint",
        "--preview",
        "--select",
        "ALL",
        "--exit-zero",
        "--no-cache",
        "--jobs",
        str(jobs),
        "--output-format",
        "json-lines",
        ".",
    ]
    output = subprocess.run(command, cwd=project, capture_output=True, text=True).stdout
    found = []
    for line in output.splitlines():
        item = json.loads(line)
        fix = item.get("fix")
        found.append(
            Diagnostic(
                code=item["code"],
                name=item["name"],
                message=item["message"],
                path=item["filename"],
                row=item["location"]["row"],
                column=item["location"]["column"],
                end_row=item["end_location"]["row"],
                end_column=item["end_location"]["column"],
                fix=ResolvedFix(
                    fix["applicability"],
                    fix["message"],
                    tuple(
                        ResolvedEdit(
                            e["content"],
                            (e["location"]["row"], e["location"]["column"] - 1),
                            (e["end_location"]["row"], e["end_location"]["column"] - 1),
                        )
                        for e in fix["edits"]
                    ),
                )
                if fix
                else None,
            )
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("corpus")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    before, now, cut, summarised = [], [], 0, 0
    summaries = {code: rule.summary for code, rule in all_rules().items()}
    for name in sorted(os.listdir(args.corpus)):
        project = os.path.join(args.corpus, name)
        if not os.path.isdir(project):
            continue
        ctx = ReportContext(cwd=project)
        for d in findings(project, args.jobs):
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
