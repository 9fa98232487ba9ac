"""What the flake8 plugin adds to a flake8 run, against torchlint alone.

    python bench/flake8_overhead.py DIR

Times, in one run and on one process each (``--jobs 1``):
  a. ``flake8 --select TL DIR`` with the plugin;
  b. the same flake8 run with the plugin's ``run`` made a no-op (flake8's own
     per-file work: reading, tokenizing, ``ast``);
  c. ``torchlint DIR``.
The plugin's cost is a - b; the target is that it is no more than c.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

BIN = os.path.dirname(sys.executable)
NOOP = (
    "import sys, torchlint.flake8_plugin as p; p.TorchlintChecker.run = lambda self: iter(());"
    "from flake8.main.cli import main; sys.exit(main(sys.argv[1:]))"
)


def timed(command) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    root = sys.argv[1]
    flake8_args = ["--jobs", "1", "--select", "TL", root]
    with_plugin = timed([os.path.join(BIN, "flake8"), *flake8_args])
    without = timed([sys.executable, "-c", NOOP, *flake8_args])
    torchlint = timed([os.path.join(BIN, "torchlint"), "--jobs", "1", "--preview", "--exit-zero", "-q", "--no-respect-gitignore", root])
    plugin = with_plugin - without
    print(f"flake8 --select TL (plugin)   {with_plugin:8.2f} s")
    print(f"flake8, plugin a no-op        {without:8.2f} s")
    print(f"plugin cost inside flake8     {plugin:8.2f} s")
    print(f"torchlint alone               {torchlint:8.2f} s")
    print(f"ratio plugin cost / torchlint {plugin / torchlint:8.3f}  (target: <= 1.0)")


if __name__ == "__main__":
    main()
