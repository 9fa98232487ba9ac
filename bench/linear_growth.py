"""Does linting time and memory grow linearly with file size?

    python bench/linear_growth.py [--sizes 1000,10000,100000] [--shapes ...]

For each shape of generated file and each size (in lines), one fresh
process lints one file with every rule (``torchlint --isolated -j 1``) and
reports its CPU seconds and peak RSS. Printed per row: lines, seconds,
microseconds per line, peak RSS in MB, and the growth ratios against the
smallest size: ``time x`` is (seconds / smallest seconds) / (lines /
smallest lines), so 1.0 means linear and 10 means ten times worse than
linear over the range; ``mem x`` is the same for RSS above the bare
interpreter's (measured once, with an empty file).

Shapes:
  findings   one batch loop holding n `x = batch.item()` lines (n findings)
  clean      n lines of ordinary training code with no findings
  functions  many small functions, each with a batch loop and a finding
  literal    one data literal spanning the file (a 5 MB one is ~130k lines)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

TORCHLINT = os.path.join(os.path.dirname(sys.executable), "torchlint")


def findings(lines: int) -> str:
    head = "import torch\nfor batch in loader:\n    batch = batch.cuda()\n"
    return head + "    x = batch.item()\n" * (lines - 3)


_CLEAN_FUNCTION = '''\
def block_{i}(model, values, scale=2.0):
    """A helper with no finding."""
    total = 0.0
    for value in values:
        if value > scale:
            total += value * scale
        else:
            total -= value / scale
    result = [v + total for v in values if v]
    return {{"total": total, "result": result, "name": model.name}}

'''


def clean(lines: int) -> str:
    per = _CLEAN_FUNCTION.count("\n")
    return "import torch\n\n" + "".join(_CLEAN_FUNCTION.format(i=i) for i in range(max(1, lines // per)))


_FUNCTION_WITH_FINDING = '''\
def train_{i}(model, loader, optimizer):
    model.train()
    for batch in loader:
        batch = batch.cuda()
        loss = model(batch)
        loss.backward()
        optimizer.step()
        print(loss.item())

'''


def functions(lines: int) -> str:
    per = _FUNCTION_WITH_FINDING.count("\n")
    return "import torch\n\n" + "".join(_FUNCTION_WITH_FINDING.format(i=i) for i in range(max(1, lines // per)))


def literal(lines: int) -> str:
    """One data literal of n lines: a single statement as large as the file."""
    rows = "".join(f'    [{i}, {i * 0.5}, "name_{i}", {{"k": {i}}}],\n' for i in range(max(1, lines - 3)))
    return "import torch\nWEIGHTS = [\n" + rows + "]\n"


SHAPES = {"findings": findings, "clean": clean, "functions": functions, "literal": literal}


def measure(path: str) -> tuple:
    """(CPU seconds, peak RSS in MB) of one torchlint process on ``path``."""
    process = subprocess.Popen(
        [TORCHLINT, "--isolated", "-j", "1", "-s", "--preview", "--select", "ALL", path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(process.pid, 0)
    stderr = process.stderr.read().decode() if process.stderr else ""
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        raise SystemExit(f"torchlint exited {code} on {path}:\n{stderr}")
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,30000,100000")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as directory:
        empty = os.path.join(directory, "empty.py")
        open(empty, "w").close()
        base_seconds, base_rss = measure(empty)
        print(f"bare process: {base_seconds:.2f} s CPU, {base_rss:.0f} MB peak RSS (subtracted below)")
        print(f"{'shape':<10} {'lines':>7} {'bytes':>9} {'s':>7} {'us/line':>8} {'MB':>7} {'time x':>7} {'mem x':>7}")
        for shape in args.shapes.split(","):
            first = None
            for size in sizes:
                text = SHAPES[shape](size)
                path = os.path.join(directory, f"{shape}_{size}.py")
                with open(path, "w") as handle:
                    handle.write(text)
                lines = text.count("\n")
                seconds, rss = measure(path)
                seconds, extra_rss = max(seconds - base_seconds, 1e-3), max(rss - base_rss, 0.1)
                if first is None:
                    first = (lines, seconds, extra_rss)
                growth = lines / first[0]
                print(
                    f"{shape:<10} {lines:>7} {len(text):>9} {seconds:>7.2f} {seconds / lines * 1e6:>8.1f} {rss:>7.0f}"
                    f" {seconds / first[1] / growth:>7.2f} {extra_rss / first[2] / growth:>7.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
