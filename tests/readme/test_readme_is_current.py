"""The README's example outputs are what the code prints today.

Each ```console block that runs `$ torchlint ...` is run again, in the checkout, and must print
exactly what the README shows; the sanitizer summary must be what `torchlint-sanitize` prints
for the recorded runs it quotes (tests/sanitizer/data/reports/tour.json and lm-tutorial.json). When a change alters
these outputs, the README changes with it.
"""
import json
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from user_env import REPO, run

from torchlint.sanitizer.findings import Finding
from torchlint.sanitizer.report import render_summary

README = (REPO / "README.md").read_text(encoding="utf-8")
BIN = Path(sys.executable).parent
TOUR = REPO / "tests" / "sanitizer" / "data" / "reports" / "tour.json"
# yunjey/pytorch-tutorial's language model under the sanitizer on an H200 (bench/real_scripts/run.py lm-tutorial)
REAL_SCRIPT = REPO / "tests" / "sanitizer" / "data" / "reports" / "lm-tutorial.json"


def fenced(language: str):
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


def test_every_torchlint_console_example_prints_what_the_readme_shows(tmp_path):
    examples = [block for block in fenced("console") if block.startswith("$ torchlint ")]
    assert examples, "the README shows no `$ torchlint` example"
    env = {**os.environ, "TORCHLINT_CACHE_DIR": str(tmp_path / "cache")}
    for block in examples:
        command, _, shown = block.partition("\n")
        argv = shlex.split(command[len("$ "):])
        result = run([BIN / argv[0], *argv[1:]], cwd=REPO, env=env)
        # A terminal shows the report (stdout), then the summary torchlint writes to stderr.
        assert result.stdout + result.stderr == shown, f"README example `{command}` is stale"


@pytest.mark.parametrize("recorded, script", [(TOUR, "examples/sanitizer_tour.py"), (REAL_SCRIPT, "main.py")])
def test_the_sanitizer_summary_is_the_recorded_runs(recorded, script):
    report = json.loads(recorded.read_text())
    printed = render_summary([Finding.from_json(f) for f in report["findings"]], report["steps"],
                             title="torchlint-sanitize").splitlines()
    [block] = [b for b in fenced("text") if b.startswith("torchlint-sanitize: ") and f"\n  {script}:" in b]
    shown = [line for line in block.splitlines() if line.strip() != "…"]
    assert shown[0] == printed[0]
    for line in shown[1:]:
        if line.endswith(" …"):  # a line the README shortens: what it keeps is the start of a printed line
            assert any(p.startswith(line[:-2]) for p in printed[1:]), line
        else:
            assert line in printed[1:], line
