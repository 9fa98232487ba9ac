"""Helpers for the CPU sync tests: a fake "library" that raises torch's sync warning.

On a CPU machine nothing really syncs, so the tests make the warning the way
torch does (from library code, below the user's line) and check everything
from the hook on: attribution, classification, counting, steps, the allowlist.
"""
import sys
import textwrap

SYNC_TEXT = "called a synchronizing CUDA operation (Triggered internally at fake/CUDAFunctions.cpp:1.)"

LIBRARY_SOURCE = textwrap.dedent('''
    import warnings

    def read_back(value=None, times=1):
        for _ in range(times):
            warnings.warn("%s", UserWarning)
        return value

    def call(fn, *args):
        return fn(*args)
''' % SYNC_TEXT)


def install_fake_library(tmp_path, name="fakecuda"):
    """Write ``site-packages/<name>`` under tmp_path and import it (library code, not user code)."""
    site = tmp_path / "site-packages"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text(LIBRARY_SOURCE)
    sys.path.insert(0, str(site))
    try:
        module = __import__(name)
    finally:
        sys.path.remove(str(site))
    return module


def write_user_module(tmp_path, name, source):
    """Write a user module (outside site-packages) and import it fresh."""
    folder = tmp_path / "proj"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    sys.path.insert(0, str(folder))
    try:
        sys.modules.pop(name, None)
        module = __import__(name)
    finally:
        sys.path.remove(str(folder))
    return module


def line_of(path, marker):
    """1-based line number of the first line containing ``marker``."""
    for number, text in enumerate(open(path).read().splitlines(), 1):
        if marker in text:
            return number
    raise AssertionError(f"{marker!r} not in {path}")
