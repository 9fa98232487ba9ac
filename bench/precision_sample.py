"""Draw a seeded sample of torchlint's findings on a corpus, show each in
context, and turn a reviewer's verdicts into true/false counts per rule.

    python bench/precision_sample.py                      # sample ../shared/corpus, 15 per rule, seed 0
    python bench/precision_sample.py --rules TL101,TL201  # some rules only
    python bench/precision_sample.py --context 12 --out /tmp/sample.md
    python bench/precision_sample.py --table              # counts from bench/precision/*.tsv

The sample is drawn per rule from the sorted findings with ``random.Random(seed)``,
so the same tree, rules and seed give the same sample on every machine.

Verdicts live in TSV files under ``bench/precision/`` (one per reviewer or
rule group), one row per sampled finding::

    code<TAB>path relative to the corpus<TAB>row<TAB>T|F<TAB>why

``--table`` joins them with the current findings: a verdict whose finding no
longer fires is counted under "gone" (a fixed false positive, or a lost true
one), and a sampled finding without a verdict under "unread".
"""
from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_CORPUS = HERE.parent.parent / "shared" / "corpus"
VERDICT_DIR = HERE / "precision"


def lint(corpus: Path, select: str) -> list:
    """Every finding on the corpus as json-lines records, sorted by place."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "findings.jsonl"
        command = [
            sys.executable, "-m", "torchlint", "check", "--select", select,
            "--output-format", "json-lines", "--exit-zero", "--no-respect-gitignore",
            "-o", str(out), str(corpus),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"torchlint failed ({done.returncode}): {done.stderr.strip()}")
        records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    for record in records:
        record["relpath"] = os.path.relpath(record["filename"], corpus)
    records.sort(key=lambda r: (r["code"], r["relpath"], r["location"]["row"], r["location"]["column"]))
    return records


def draw(records: list, per_rule: int, seed: int) -> dict:
    by_rule = collections.defaultdict(list)
    for record in records:
        by_rule[record["code"]].append(record)
    sample = {}
    for code in sorted(by_rule):
        found = by_rule[code]
        rng = random.Random(f"{seed}:{code}")
        sample[code] = sorted(rng.sample(found, min(per_rule, len(found))), key=lambda r: (r["relpath"], r["location"]["row"]))
    return sample


def enclosing_def(lines: list, row: int) -> str:
    """The nearest `def`/`class` line above ``row`` with less indentation."""
    target = lines[row - 1]
    indent = len(target) - len(target.lstrip())
    for index in range(row - 2, -1, -1):
        text = lines[index]
        stripped = text.lstrip()
        if stripped.startswith(("def ", "async def ", "class ")) and len(text) - len(stripped) < indent:
            return f"{index + 1}: {text.rstrip()}"
    return "(module level)"


def show(record: dict, context: int) -> str:
    lines = Path(record["filename"]).read_text(encoding="utf-8", errors="replace").splitlines()
    row = record["location"]["row"]
    head = f"### {record['code']} {record['relpath']}:{row}:{record['location']['column']}\n{record['message']}\n"
    body = [f"    in {enclosing_def(lines, row)}"]
    for number in range(max(1, row - context), min(len(lines), row + context) + 1):
        marker = ">>" if number == row else "  "
        body.append(f"{marker}{number:5d}  {lines[number - 1]}")
    return head + "\n".join(body) + "\n"


def read_verdicts(paths: list) -> dict:
    verdicts = {}
    for path in paths:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.reader(handle, delimiter="\t"):
                if not row or row[0].startswith("#"):
                    continue
                code, relpath, line, verdict = row[0], row[1], int(row[2]), row[3].strip().upper()
                verdicts[(code, relpath, line)] = (verdict, row[4] if len(row) > 4 else "")
    return verdicts


def table(sample: dict, verdicts: dict) -> str:
    current = {(code, r["relpath"], r["location"]["row"]) for code, found in sample.items() for r in found}
    rows = ["| rule | sampled | true | false | unread | precision | verdicts gone since |", "| --- | --- | --- | --- | --- | --- | --- |"]
    codes = sorted(set(sample) | {key[0] for key in verdicts})
    for code in codes:
        keys = [(code, r["relpath"], r["location"]["row"]) for r in sample.get(code, [])]
        true = sum(1 for key in keys if verdicts.get(key, ("",))[0] == "T")
        false = sum(1 for key in keys if verdicts.get(key, ("",))[0] == "F")
        unread = len(keys) - true - false
        gone = sum(1 for key in verdicts if key[0] == code and key not in current)
        read = true + false
        precision = f"{100 * true / read:.0f}%" if read else "—"
        rows.append(f"| {code} | {len(keys)} | {true} | {false} | {unread} | {precision} | {gone} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--select", default="ALL")
    parser.add_argument("--rules", default="", help="comma-separated codes to show (default: every rule that fires)")
    parser.add_argument("--per-rule", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=8, help="lines shown above and below each finding")
    parser.add_argument("--table", action="store_true", help="print true/false counts from the verdict files")
    parser.add_argument("--verdicts", nargs="*", type=Path, help="verdict TSV files (default: bench/precision/*.tsv)")
    parser.add_argument("--out", type=Path, help="write the sample here instead of stdout")
    args = parser.parse_args(argv)

    corpus = args.corpus.resolve()
    if not corpus.is_dir():
        sys.exit(f"{corpus}: no such corpus directory")
    records = lint(corpus, args.select)
    sample = draw(records, args.per_rule, args.seed)
    wanted = {code.strip() for code in args.rules.split(",") if code.strip()}
    if wanted:
        sample = {code: found for code, found in sample.items() if code in wanted}

    if args.table:
        paths = args.verdicts if args.verdicts is not None else sorted(VERDICT_DIR.glob("*.tsv"))
        counts = collections.Counter(r["code"] for r in records)
        print(f"{len(records)} findings on {corpus.name}; per rule: " + ", ".join(f"{c} {n}" for c, n in sorted(counts.items())))
        print(table(sample, read_verdicts(paths)))
        return 0

    text = []
    for code, found in sample.items():
        total = sum(1 for r in records if r["code"] == code)
        text.append(f"## {code}: {len(found)} of {total} findings (seed {args.seed})\n")
        text.extend(show(record, args.context) for record in found)
    output = "\n".join(text)
    if args.out:
        args.out.write_text(output, encoding="utf-8")
    else:
        sys.stdout.write(output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
