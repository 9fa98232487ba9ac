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

    def batches(n):
        for index in range(n):
            warnings.warn("%s", UserWarning)
            yield index
''' % (SYNC_TEXT, SYNC_TEXT))


def write_distribution(folder, name, source=LIBRARY_SOURCE):
    """Install package ``name`` into ``folder`` the way pip does: the package plus its ``.dist-info``.

    The sanitizer tells library code from user code by where a module comes
    from (an import root holding the distribution's metadata), so a fake
    library must be installed, not merely placed in a folder.
    """
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text(source)
    info = folder / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "top_level.txt").write_text(name + "\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return folder


def install_fake_library(tmp_path, name="fakecuda"):
    """Install ``<name>`` into a folder on ``sys.path`` and import it (library code, not user code).

    The folder stays on ``sys.path`` (at its end, shadowing nothing): an
    import root that is gone could no longer say where the module came from.
    """
    site = write_distribution(tmp_path / "libs", name)
    sys.path.append(str(site))
    return __import__(name)


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
