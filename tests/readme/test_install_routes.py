"""The README's install routes, run as written in a copy of the checkout: `make dist` and its wheel, `pip install .[flake8]`.

Each installs into a fresh virtual environment that has no torch, as a user's would.
"""
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from user_env import SAMPLE, SAMPLE_FINDING, explain, fresh_venv, run

import torchlint

VERSION = torchlint.__version__
# setuptools' `WARNING ... is deprecated` lines and SetuptoolsDeprecationWarning, not a file name such as TL402's.
DEPRECATION = re.compile(r"^.*(?:warning.*deprecated|DeprecationWarning).*$", re.IGNORECASE | re.MULTILINE)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_dist_builds_a_checked_wheel_that_lints_in_a_venv_without_torch(package_index, source_tree, tmp_path):
    # This interpreter's environment already has build and twine (the dev extra); the stamp stays out of it.
    built = run(["make", "dist", f"VENV={Path(sys.prefix)}", f"DIST_TOOLS_STAMP={tmp_path / 'dist-tools'}"],
                cwd=source_tree)
    assert built.returncode == 0, explain(built)
    # No warning from our own packaging metadata (setuptools warned about the licence table three times).
    assert not DEPRECATION.findall(built.stdout + built.stderr), explain(built)
    assert built.stdout.count("PASSED") == 2, explain(built)  # twine check --strict, sdist and wheel
    dist = source_tree / "dist"
    wheel = dist / f"torchlint-{VERSION}-py3-none-any.whl"
    assert sorted(p.name for p in dist.iterdir()) == [wheel.name, f"torchlint-{VERSION}.tar.gz"]
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    # rules/ and sanitizer/ install inside torchlint; the race check's C++ source ships for the user's build.
    assert {"torchlint/rules/__init__.py", "torchlint/sanitizer/races/race_tap.cpp",
            f"torchlint-{VERSION}.dist-info/licenses/LICENSE"} <= names

    bin_dir = fresh_venv(tmp_path / "venv")
    installed = run([bin_dir / "python", "-m", "pip", "install", wheel])
    assert installed.returncode == 0, explain(installed)
    no_torch = run([bin_dir / "python", "-c", "import torch"])
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr, explain(no_torch)

    version = run([bin_dir / "torchlint", "--version"])
    assert version.stdout.strip() == f"torchlint {VERSION}", explain(version)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SAMPLE)
    linted = run([bin_dir / "torchlint", "--preview", "train.py"], cwd=project)
    assert linted.returncode == 1 and linted.stdout.startswith(SAMPLE_FINDING), explain(linted)
    explained = run([bin_dir / "torchlint", "rule", "TL101"])
    assert explained.returncode == 0 and "host-sync-in-loop" in explained.stdout, explain(explained)


def test_pip_install_from_a_clone_with_the_flake8_extra(package_index, source_tree, tmp_path):
    bin_dir = fresh_venv(tmp_path / "venv")
    installed = run([bin_dir / "python", "-m", "pip", "install", f"{source_tree}[flake8]"])
    assert installed.returncode == 0, explain(installed)
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(SAMPLE)
    # flake8 prints 1-based columns: the same place torchlint names.
    flake8 = run([bin_dir / "flake8", "--select", "TL", "train.py"], cwd=project)
    assert flake8.returncode == 1 and flake8.stdout.startswith(SAMPLE_FINDING), explain(flake8)
