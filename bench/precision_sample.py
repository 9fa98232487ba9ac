"""An honest measure of torchlint's precision: draw, judge blind, tabulate, promote.

1. Draw a fresh seeded sample after each change, over the whole corpus::

       python bench/precision_sample.py --out /tmp/measure           # 15 per rule, seed 0
       python bench/precision_sample.py --out /tmp/measure --for-promotion --seed 7

   Each project of the corpus is linted from inside its own folder, as a user
   would (``--select ALL --preview``; notebooks as soon as the linter reads
   them). Per rule, ``--per-rule`` findings (default 15) are drawn with
   ``random.Random(f"{seed}:{code}")``; ``--for-promotion`` draws at least 20
   for every rule that could meet the bar (>= 20 findings from >= 5 projects).
   ``OUT/sheet.md`` is the judging sheet (each finding with its evidence, the
   enclosing function and pointers across files; nothing of the rules' logic)
   and ``OUT/verdicts.tsv`` the blank verdict file, which records the commit,
   the seed and the corpus counts. The sheet quotes corpus code: keep it out
   of the repository.

2. A reader who did not write or read the change fills ``verdicts.tsv`` (``T``
   or ``F``, and for ``F`` a reason ``category: why``) with judging.md and the
   code in front of them.

3. Tabulate::

       python bench/precision_sample.py --table /tmp/measure/verdicts.tsv

   Per rule: findings in the corpus, sampled, TRUE, FALSE, precision with a 95%
   Wilson interval and projects; the same on the projects not listed in
   ``bench/precision/designed-on.txt``; and the FALSE reasons grouped.

4. Promote::

       python bench/precision_sample.py --promote /tmp/measure/verdicts.tsv

   Lints the corpus again and refuses verdicts whose sample the current
   findings no longer reproduce (same seed, same sizes). A rule that meets the
   bar (precision >= 0.90 on >= 20 judged findings from >= 5 projects) becomes
   stable; a fully judged rule below 0.90 returns to preview; the others keep
   their status. The result is written to ``torchlint/stable_rules.json``,
   which the registry reads, and the generated docs are refreshed.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import csv
import datetime
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import precision_sheet  # noqa: E402  (a helper module next to this script)



def _shared() -> Path:
    """The workplace's ``shared/`` folder, next to the checkout (``../shared``) or
    next to the folder of a worktree kept one level further down."""
    for parent in (REPO.parent, REPO.parent.parent):
        if (parent / "shared").is_dir():
            return parent / "shared"
    return REPO.parent / "shared"


DEFAULT_CORPUS = _shared() / "corpus"
JUDGING = _shared() / "reference" / "judging.md"
DESIGNED_ON = HERE / "precision" / "designed-on.txt"

MIN_PRECISION = 0.90
MIN_JUDGED = 20
MIN_PROJECTS = 5
Z95 = 1.959964
FALSE_CATEGORIES = (
    "claim wrong", "host needs the value", "periodic", "deliberate sync", "one-off", "not training code",
    "cpu tensor", "cuda-only by design", "device chosen elsewhere", "dead code", "nothing to gain", "version-blind",
)
COLUMNS = ("id", "code", "project", "path", "row", "column", "fingerprint", "verdict", "reason")


class MeasureError(Exception):
    """A one-line reason the measure cannot go on (printed, exit 1)."""


# -- linting the corpus ------------------------------------------------------------------

def projects_of(corpus: Path) -> List[str]:
    """The corpus's projects: the MANIFEST's repositories (owner+name folders)."""
    manifest = corpus / "MANIFEST.tsv"
    if manifest.is_file():
        with open(manifest, newline="", encoding="utf-8") as handle:
            names = [row["repo"].replace("/", "+") for row in csv.DictReader(handle, delimiter="\t")]
        missing = [name for name in names if not (corpus / name).is_dir()]
        if missing:
            raise MeasureError(f"{manifest}: no folder for {', '.join(missing)}")
        return sorted(names)
    return sorted(entry.name for entry in corpus.iterdir() if entry.is_dir() and not entry.name.startswith("."))


def lint_corpus(corpus: Path, projects: Sequence[str]) -> Tuple[List[dict], Dict[str, int], List[str]]:
    """(findings, files linted by kind, lint errors), every project linted from
    inside itself; projects run side by side, one worker process each."""
    findings: List[dict] = []
    files: Dict[str, int] = collections.Counter()
    errors: List[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for project, (found, shown, error) in zip(projects, pool.map(lambda p: _lint_project(corpus / p), projects)):
            findings += [_finding(record, project, corpus / project) for record in found]
            for path in shown:
                files[Path(path).suffix.lstrip(".") or "other"] += 1
            if error:
                errors.append(f"{project}: {error}")
    findings.sort(key=lambda f: (f["code"], f["project"], f["path"], f["row"], f["column"]))
    return findings, dict(files), errors


def _lint_project(root: Path) -> Tuple[List[dict], List[str], Optional[str]]:
    """(json-lines records, the files linted, the first error line or None)."""
    base = [sys.executable, "-m", "torchlint", "check", "--select", "ALL", "--preview", "--no-cache", "--exit-zero", "--jobs", "1"]
    shown = subprocess.run(base + ["--show-files", "."], cwd=root, capture_output=True, text=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "findings.jsonl"
        done = subprocess.run(base + ["--output-format", "json-lines", "-o", str(out), "."], cwd=root, capture_output=True, text=True)
        lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    error = None
    if done.returncode != 0:
        error = next((line for line in done.stderr.splitlines() if line.strip()), f"exit {done.returncode}")
    print(f"  linted {root.name}", file=sys.stderr)
    return [json.loads(line) for line in lines if line.strip()], shown.stdout.splitlines(), error


def _finding(record: dict, project: str, root: Path) -> dict:
    def relative(filename: str) -> str:
        return Path(os.path.relpath(filename, root)).as_posix()

    finding = {
        "code": record["code"],
        "project": project,
        "path": relative(record["filename"]),
        "row": record["location"]["row"],
        "column": record["location"]["column"],
        "cell": record.get("cell"),
        "message": record["message"],
        "evidence": [
            {"message": fact["message"], "path": relative(fact["filename"]), "row": fact["location"]["row"]}
            for fact in record.get("evidence") or []
        ],
    }
    key = "\0".join(str(finding[k]) for k in ("code", "project", "path", "row", "column", "message"))
    finding["fingerprint"] = hashlib.sha1(key.encode()).hexdigest()[:12]
    return finding


# -- drawing --------------------------------------------------------------------------

def population(findings: Iterable[dict]) -> Dict[str, Dict[str, int]]:
    """code -> project -> number of findings."""
    counts: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: collections.defaultdict(int))
    for finding in findings:
        counts[finding["code"]][finding["project"]] += 1
    return {code: dict(by_project) for code, by_project in sorted(counts.items())}


def sample_size(by_project: Dict[str, int], per_rule: int, for_promotion: int) -> int:
    total = sum(by_project.values())
    could_meet_bar = total >= MIN_JUDGED and len(by_project) >= MIN_PROJECTS
    size = max(per_rule, for_promotion) if could_meet_bar else per_rule
    return min(size, total)


def by_code(items: Iterable[dict]) -> Dict[str, List[dict]]:
    """Findings or verdict rows grouped by rule code."""
    grouped: Dict[str, List[dict]] = collections.defaultdict(list)
    for item in items:
        grouped[item["code"]].append(item)
    return grouped


def draw(findings: Sequence[dict], seed: int, per_rule: int, for_promotion: int) -> List[dict]:
    """The sample: per rule, a seeded draw from its findings in a fixed order; ids like TL101-03."""
    by_rule = by_code(findings)
    counts = population(findings)
    sample = []
    for code in sorted(by_rule):
        found = sorted(by_rule[code], key=lambda f: (f["project"], f["path"], f["row"], f["column"], f["fingerprint"]))
        picked = random.Random(f"{seed}:{code}").sample(found, sample_size(counts[code], per_rule, for_promotion))
        picked.sort(key=lambda f: (f["project"], f["path"], f["row"], f["column"]))
        for number, finding in enumerate(picked, start=1):
            sample.append({**finding, "id": f"{code}-{number:02d}"})
    return sample


def git_state() -> Tuple[str, bool]:
    """(HEAD commit, whether tracked files differ from it)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown", True
    return commit, bool(dirty)


def write_draw(out: Path, corpus: Path, sample: List[dict], meta: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    verdicts = out / "verdicts.tsv"
    with open(verdicts, "w", newline="", encoding="utf-8") as handle:
        handle.write("# torchlint precision sample: judge each finding of sheet.md against judging.md; fill `verdict` (T or F)\n")
        handle.write("# and, for F, `reason` as `category: why` (categories in sheet.md). Keep the `# draw:` line: --table and --promote read it.\n")
        handle.write("# draw: " + json.dumps(meta, sort_keys=True) + "\n")
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n")
        writer.writerow(COLUMNS)
        for finding in sample:
            writer.writerow([finding[key] for key in COLUMNS[:7]] + ["", ""])
    counts = collections.Counter(f["code"] for f in sample)
    header = (
        f"# Judging sheet: {len(sample)} findings of torchlint on the development corpus\n\n"
        f"Drawn at commit `{meta['commit'][:12]}`{' (with uncommitted changes)' if meta['dirty'] else ''}, seed {meta['seed']}, "
        f"{meta['per_rule']} per rule" + (f" (at least {meta['for_promotion']} where the bar is within reach)" if meta["for_promotion"] else "")
        + ". Per rule: " + ", ".join(f"{code} {n}" for code, n in sorted(counts.items())) + "."
    )
    sheet = precision_sheet.render(sample, corpus, header, verdicts.name, str(JUDGING), FALSE_CATEGORIES)
    (out / "sheet.md").write_text(sheet, encoding="utf-8")


# -- verdicts -----------------------------------------------------------------------------

def read_verdicts(paths: Sequence[Path]) -> Tuple[dict, List[dict]]:
    """(the draw's record, one row per sampled finding). Several files must come from one draw."""
    meta: Optional[dict] = None
    rows: Dict[str, dict] = {}
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise MeasureError(f"{path}: cannot read: {exc.strerror or exc}") from None
        draws = [line[len("# draw: "):] for line in text.splitlines() if line.startswith("# draw: ")]
        if len(draws) != 1:
            raise MeasureError(f"{path}: expected one `# draw:` line (a verdict file written by this script)")
        this = json.loads(draws[0])
        if meta is not None and (this["commit"], this["seed"], this["per_rule"], this["for_promotion"]) != (
                meta["commit"], meta["seed"], meta["per_rule"], meta["for_promotion"]):
            raise MeasureError(f"{path}: drawn at another commit or seed than {paths[0]}")
        meta = this
        body = [line for line in text.splitlines() if line and not line.startswith("#")]
        for row in csv.DictReader(body, delimiter="\t"):
            rows[row["id"]] = _verdict_row(row, path, rows.get(row["id"]))
    assert meta is not None
    return meta, list(rows.values())


def _verdict_row(row: dict, path: Path, earlier: Optional[dict]) -> dict:
    raw = (row.get("verdict") or "").strip().upper()
    verdict = {"T": "T", "TRUE": "T", "F": "F", "FALSE": "F", "": ""}.get(raw)
    if verdict is None:
        raise MeasureError(f"{path}: {row['id']}: verdict must be T or F, got {row['verdict']!r}")
    entry = {**row, "row": int(row["row"]), "column": int(row["column"]), "verdict": verdict, "reason": (row.get("reason") or "").strip()}
    if earlier is not None and earlier["verdict"] and verdict and earlier["verdict"] != verdict:
        raise MeasureError(f"{path}: {row['id']}: judged {verdict} here and {earlier['verdict']} in another file")
    if earlier is not None and not verdict:
        return earlier
    return entry


def read_designed_on(path: Path = DESIGNED_ON) -> Dict[str, str]:
    """project -> the change(s) it served while rules were designed."""
    projects: Dict[str, str] = {}
    if not path.is_file():
        return projects
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            project, _, change = line.strip().partition("\t")
            projects[project.strip()] = change.strip()
    return projects


# -- figures -----------------------------------------------------------------------------

def wilson(true: int, judged: int, z: float = Z95) -> Tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default)."""
    if judged == 0:
        return 0.0, 1.0
    p = true / judged
    denominator = 1 + z * z / judged
    centre = (p + z * z / (2 * judged)) / denominator
    half = z * math.sqrt(p * (1 - p) / judged + z * z / (4 * judged * judged)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def measure(rows: Sequence[dict]) -> dict:
    judged = [r for r in rows if r["verdict"]]
    true = sum(1 for r in judged if r["verdict"] == "T")
    return {
        "sampled": len(rows), "judged": len(judged), "true": true, "false": len(judged) - true,
        "unjudged": len(rows) - len(judged),
        "precision": true / len(judged) if judged else None,
        "interval": wilson(true, len(judged)),
        "projects": len({r["project"] for r in judged}),
    }


def decision(figures: dict) -> str:
    """``meets`` the bar, ``below`` it (fully judged, precision < 0.90), or ``open`` (not enough to tell)."""
    if figures["unjudged"] or not figures["judged"]:
        return "open"
    if figures["precision"] < MIN_PRECISION:
        return "below"
    if figures["judged"] >= MIN_JUDGED and figures["projects"] >= MIN_PROJECTS:
        return "meets"
    return "open"


def false_category(reason: str) -> str:
    head = reason.split(":", 1)[0].strip().lower()
    return head if ":" in reason and head in FALSE_CATEGORIES else "other"


def table(meta: dict, rows: Sequence[dict], designed_on: Dict[str, str]) -> str:
    by_rule = by_code(rows)
    counts = meta["population"]
    codes = sorted(set(counts) | set(by_rule))
    out = [
        f"Drawn at {meta['commit'][:12]}{' (dirty)' if meta['dirty'] else ''}, seed {meta['seed']}, {meta['per_rule']} per rule"
        + (f", at least {meta['for_promotion']} for candidates" if meta["for_promotion"] else "")
        + f"; {sum(sum(p.values()) for p in counts.values())} findings in {len(meta['projects'])} projects"
        + f" (files linted: {', '.join(f'{n} .{kind}' for kind, n in sorted(meta['files'].items()))}).",
        f"Bar for the default set: precision >= {MIN_PRECISION:.2f} on >= {MIN_JUDGED} judged findings from >= {MIN_PROJECTS} projects.",
        "",
        "## All projects",
        "",
        _figures_table(codes, by_rule, counts, lambda project: True, with_decision=True),
        "",
        f"## Projects not designed on ({len(meta['projects']) - len([p for p in meta['projects'] if p in designed_on])} of {len(meta['projects'])}; "
        f"left out: {', '.join(sorted(p for p in meta['projects'] if p in designed_on)) or 'none'})",
        "",
        _figures_table(codes, by_rule, counts, lambda project: project not in designed_on, with_decision=False),
        "",
        "## FALSE reasons",
        "",
    ]
    for code in codes:
        false = [r for r in by_rule.get(code, []) if r["verdict"] == "F"]
        if not false:
            continue
        out.append(f"- **{code}** ({len(false)} FALSE)")
        grouped: Dict[str, List[dict]] = collections.defaultdict(list)
        for row in false:
            grouped[false_category(row["reason"])].append(row)
        for category, items in sorted(grouped.items(), key=lambda item: (-len(item[1]), item[0])):
            out.append(f"  - {category} ({len(items)}): " + "; ".join(f"{r['id']} {r['reason'] or '(no reason)'}" for r in items))
    if errors := meta.get("errors"):
        out += ["", "Lint errors while drawing: " + "; ".join(errors)]
    return "\n".join(out)


def _figures_table(codes, by_rule, counts, keep, with_decision: bool) -> str:
    head = "| rule | findings | projects | sampled | TRUE | FALSE | unjudged | precision | 95% interval | judged projects |"
    rows = [head + (" bar |" if with_decision else ""), "|" + " --- |" * (head.count("|") - 1 + with_decision)]
    for code in codes:
        by_project = {p: n for p, n in counts.get(code, {}).items() if keep(p)}
        figures = measure([r for r in by_rule.get(code, []) if keep(r["project"])])
        precision = f"{figures['precision']:.2f}" if figures["precision"] is not None else "—"
        low, high = figures["interval"]
        interval = f"[{low:.2f}, {high:.2f}]" if figures["judged"] else "—"
        line = (f"| {code} | {sum(by_project.values())} | {len(by_project)} | {figures['sampled']} | {figures['true']} | "
                f"{figures['false']} | {figures['unjudged']} | {precision} | {interval} | {figures['projects']} |")
        rows.append(line + (f" {decision(figures)} |" if with_decision else ""))
    return "\n".join(rows)


# -- promotion ----------------------------------------------------------------------------

def check_reproduced(meta: dict, rows: Sequence[dict], sample_now: Sequence[dict]) -> None:
    """Refuse verdicts whose sample the current findings no longer reproduce."""
    judged = {r["fingerprint"]: r for r in rows}
    now = {f["fingerprint"]: f for f in sample_now}
    gone = sorted({judged[k]["code"] for k in set(judged) - set(now)})
    new = sorted({now[k]["code"] for k in set(now) - set(judged)})
    if gone or new:
        changed = sorted(set(gone) | set(new))
        raise MeasureError(
            f"the findings changed since the sample was drawn at {meta['commit'][:12]} (seed {meta['seed']}): "
            f"the same draw now gives another sample for {', '.join(changed)}; draw a fresh sample and have it judged"
        )


def promote(meta: dict, rows: Sequence[dict], verdict_paths: Sequence[Path], current: Dict[str, dict]) -> Tuple[Dict[str, dict], List[str]]:
    """(the new stable rule list, one line per rule saying what happened)."""
    from torchlint import __version__

    by_rule = by_code(rows)
    stable = dict(current)
    report = []
    for code in sorted(by_rule):
        figures = measure(by_rule[code])
        verdict = decision(figures)
        was = "stable" if code in current else "preview"
        summary = (f"{figures['true']}/{figures['judged']} TRUE"
                   + (f" = {figures['precision']:.2f}" if figures["precision"] is not None else "")
                   + f" from {figures['projects']} projects" + (f", {figures['unjudged']} unjudged" if figures["unjudged"] else ""))
        if verdict == "meets":
            low, high = figures["interval"]
            stable[code] = {
                "since": current.get(code, {}).get("since", __version__),
                "commit": meta["commit"], "seed": meta["seed"], "judged": figures["judged"], "true": figures["true"],
                "precision": round(figures["precision"], 3), "interval": [round(low, 3), round(high, 3)],
                "projects": figures["projects"], "verdicts": [_shown(p) for p in verdict_paths],
            }
            report.append(f"{code}: {'stays stable' if was == 'stable' else 'promoted to stable'} ({summary})")
        elif verdict == "below":
            stable.pop(code, None)
            report.append(f"{code}: {'back to preview' if was == 'stable' else 'stays in preview'} ({summary}, below {MIN_PRECISION:.2f})")
        else:
            report.append(f"{code}: stays {was}: not enough judged to decide ({summary})")
    return stable, report


def _shown(path: Path) -> str:
    resolved = path.resolve()
    return resolved.relative_to(REPO).as_posix() if REPO in resolved.parents else str(resolved)


# -- command line -------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, help="folder for sheet.md and verdicts.tsv (outside the repository)")
    parser.add_argument("--per-rule", type=int, default=15, help="findings drawn per rule (default 15)")
    parser.add_argument("--for-promotion", type=int, nargs="?", const=MIN_JUDGED, default=0, metavar="N",
                        help=f"draw at least N (default {MIN_JUDGED}) for each rule whose corpus findings could meet the bar")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rules", default="",
                        help="comma-separated codes to draw (default: every rule that fires); with --promote, the rules "
                             "to decide (their samples must still be reproduced; other rules may have changed)")
    parser.add_argument("--table", type=Path, nargs="+", metavar="VERDICTS", help="tabulate filled verdict files of one draw")
    parser.add_argument("--promote", type=Path, nargs="+", metavar="VERDICTS", help="set rule status from filled verdict files of one draw")
    parser.add_argument("--dry-run", action="store_true", help="with --promote: say what would change, write nothing")
    parser.add_argument("--designed-on", type=Path, default=DESIGNED_ON)
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except MeasureError as exc:
        print(f"precision_sample: error: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.table:
        meta, rows = read_verdicts(args.table)
        print(table(meta, rows, read_designed_on(args.designed_on)))
        return 0
    if args.promote:
        return _promote(args)
    if args.out is None:
        raise MeasureError("give --out FOLDER for the sheet and the blank verdicts (or --table / --promote)")
    if args.out.resolve() == REPO or REPO in args.out.resolve().parents:
        raise MeasureError(f"{args.out}: the sheet quotes corpus code; write it outside the repository")
    corpus = args.corpus.resolve()
    if not corpus.is_dir():
        raise MeasureError(f"{corpus}: no such corpus folder")
    projects = projects_of(corpus)
    findings, files, errors = lint_corpus(corpus, projects)
    wanted = {code.strip().upper() for code in args.rules.split(",") if code.strip()}
    findings = [f for f in findings if not wanted or f["code"] in wanted]
    sample = draw(findings, args.seed, args.per_rule, args.for_promotion)
    commit, dirty = git_state()
    meta = {
        "commit": commit, "dirty": dirty, "seed": args.seed, "per_rule": args.per_rule, "for_promotion": args.for_promotion,
        "rules": sorted(wanted), "corpus": str(corpus), "projects": projects, "files": files, "errors": errors,
        "population": population(findings), "date": datetime.date.today().isoformat(),
    }
    write_draw(args.out, corpus, sample, meta)
    for error in errors:
        print(f"precision_sample: warning: lint error in {error}", file=sys.stderr)
    print(f"{len(sample)} findings of {len(findings)} drawn; sheet: {args.out / 'sheet.md'}; verdicts to fill: {args.out / 'verdicts.tsv'}")
    if not files.get("ipynb"):
        notebooks = sum(1 for _ in corpus.rglob("*.ipynb"))
        print(f"note: {notebooks} notebooks in the corpus, none linted (the linter does not read them yet)")
    return 0


def _promote(args: argparse.Namespace) -> int:
    from torchlint import docs, lifecycle

    if REPO not in Path(lifecycle.STABLE_RULES_FILE).resolve().parents:
        raise MeasureError(f"torchlint is imported from {lifecycle.STABLE_RULES_FILE}, not this checkout: `pip install -e .` first")
    meta, rows = read_verdicts(args.promote)
    wanted = {code.strip().upper() for code in args.rules.split(",") if code.strip()}
    if wanted:
        # Each rule's sample is drawn on its own (seeded by rule), so one rule's
        # verdicts stand for it whatever other rules changed since the draw.
        rows = [r for r in rows if r["code"] in wanted]
        meta = {**meta, "rules": sorted(set(meta["rules"]) & wanted) if meta["rules"] else sorted(wanted)}
    corpus = Path(meta["corpus"])
    commit, dirty = git_state()
    findings, _, _ = lint_corpus(corpus, meta["projects"])
    if meta["rules"]:
        findings = [f for f in findings if f["code"] in meta["rules"]]
    check_reproduced(meta, rows, draw(findings, meta["seed"], meta["per_rule"], meta["for_promotion"]))
    if commit != meta["commit"] or dirty:
        print(f"note: drawn at {meta['commit'][:12]}, now at {commit[:12]}{' with changes' if dirty else ''}; the sample is reproduced exactly")
    stable, report = promote(meta, rows, args.promote, dict(lifecycle.stable_rules()))
    print("\n".join(report))
    if args.dry_run:
        return 0
    lifecycle.write_stable_rules(stable)
    docs.write_generated_docs(str(REPO))
    print(f"wrote {_shown(Path(lifecycle.STABLE_RULES_FILE))} ({len(stable)} stable rule{'' if len(stable) == 1 else 's'}) "
          "and refreshed docs/rules.md and the README's rule table")
    outside = [str(p) for p in args.promote if REPO not in p.resolve().parents]
    if outside:
        print(f"note: commit the verdicts the list points at ({', '.join(outside)}) under bench/precision/verdicts/ "
              "and promote from there, so the measure stays with the change")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
