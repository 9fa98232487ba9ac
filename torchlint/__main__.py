"""``python -m torchlint``: the same as the ``torchlint`` command."""

from torchlint.cli import main

raise SystemExit(main())
