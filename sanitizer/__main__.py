"""``python -m torchlint.sanitizer [options] script.py [args...]``: the script runner."""

import sys

from .runner import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m torchlint.sanitizer"))
