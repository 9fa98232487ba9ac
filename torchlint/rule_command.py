"""``torchlint rule CODE`` / ``torchlint rule --all``: the rule documentation."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

from torchlint import docs
from torchlint.registry import all_rules, rule_by_name_or_code


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="torchlint rule", description="Explain a rule, or list every rule.")
    parser.add_argument("rule", nargs="?", help="a code (TL101) or a name (host-sync-in-loop)")
    parser.add_argument("--all", action="store_true", help="every rule")
    parser.add_argument("--output-format", "--format", choices=("text", "markdown", "json"), default="text")
    args = parser.parse_args(argv)
    if args.all == bool(args.rule):
        parser.error("give either a rule code or --all")
    rules = all_rules()
    if args.all:
        selected = list(rules.values())
    else:
        try:
            selected = [rule_by_name_or_code(args.rule)]
        except KeyError:
            print(f"torchlint: error: unknown rule `{args.rule}`; `torchlint rule --all` lists them", file=sys.stderr)
            return 2
    if args.output_format == "json":
        data = [docs.rule_json(rule) for rule in selected]
        json.dump(data if args.all else data[0], sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.all and args.output_format == "markdown":
        sys.stdout.write(docs.render_all_markdown(selected))
    elif args.all:
        for rule in selected:
            status = docs.table_status(rule)
            print(f"{rule.code}  {rule.name:<40} {rule.summary}{'' if status == 'on' else f'  ({status})'}")
    else:
        sys.stdout.write(docs.render_markdown(selected[0]))
    return 0
