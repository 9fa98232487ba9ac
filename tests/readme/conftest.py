"""The README works as written. Fixtures for installing torchlint as a user does, from a copy of the checkout.

The install tests need pip to reach a package index (libcst for the linter, setuptools for the build,
pre-commit's own hook environments). Where none answers they skip, and say so.
"""
import os
import shutil
import sys

import pytest

# user_env.py is a plain helper module next to the tests.
sys.path.insert(0, os.path.dirname(__file__))

from user_env import REPO, run  # noqa: E402

# What a user's clone does not hold: this checkout's environments, caches and build outputs.
_NOT_IN_A_CLONE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                         ".hypothesis", ".torchlint_cache", ".mypy_cache", ".ruff_cache")


@pytest.fixture(scope="session")
def package_index(tmp_path_factory):
    """Skip unless pip can fetch from its configured index (libcst, the linter's one dependency)."""
    folder = tmp_path_factory.mktemp("index-probe")
    probe = run([sys.executable, "-m", "pip", "download", "--no-deps", "--dest", folder, "libcst>=1.1"])
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no package index reachable through pip ({last})")


@pytest.fixture(scope="session")
def source_tree(tmp_path_factory):
    """A copy of the checkout as a fresh clone has it, so the builds write nothing into this one."""
    copy = tmp_path_factory.mktemp("clone") / "torchlint"
    shutil.copytree(REPO, copy, ignore=_NOT_IN_A_CLONE)
    return copy
