"""torchlint's runtime half: watch a real PyTorch program on a real GPU.

Importing this package does not import torch; the checks import it when a
session starts.

    from torchlint.sanitizer import sanitize, allow_sync

    with sanitize(checks={"sync", "memory"}) as session:
        train()
    print(session.report())
"""

from .findings import Finding, Frame
from .session import SanitizerSession, allow_sync, sanitize

__all__ = ["Finding", "Frame", "SanitizerSession", "allow_sync", "sanitize"]


def load_ipython_extension(shell) -> None:
    """``%load_ext torchlint.sanitizer``: the ``%%gpu_sanitize`` and ``%gpu_sanitize`` magics (jupyter.py)."""
    from .jupyter import load_ipython_extension as load

    load(shell)


def unload_ipython_extension(shell) -> None:
    from .jupyter import unload_ipython_extension as unload

    unload(shell)
