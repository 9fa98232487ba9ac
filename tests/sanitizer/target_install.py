"""``pip install --target`` of torchlint and pytest, offline, for the attribution tests.

The wheels are made on the spot: torchlint's from a copy of this checkout
(built without network or build isolation), pytest's and its dependencies'
repacked from the files their installed distributions list. pip then
installs them into a folder that is not named ``site-packages`` and is not
one of the interpreter's site directories, exactly as ``pip install --target``
does for a user.
"""
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import torchlint

REPO = Path(torchlint.__file__).resolve().parents[1]
PYTEST_DISTRIBUTIONS = ("pytest", "pluggy", "iniconfig", "packaging")


def repack_installed(name: str, folder: Path) -> Path:
    """A wheel of an installed distribution, from the files its RECORD lists."""
    dist = metadata.distribution(name)
    base = Path(dist.locate_file(""))
    files = [f for f in dist.files or () if f.parts[0] != ".." and "__pycache__" not in f.parts
             and (base / f).is_file()]
    record = next(f for f in files if f.name == "RECORD" and f.parts[0].endswith(".dist-info"))
    wheel = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for file in files:
            if file != record:
                archive.write(base / file, str(file))
        archive.writestr(str(record), "".join(f"{f},,\n" for f in files))
    return wheel


def build_torchlint(folder: Path, scratch: Path) -> Path:
    source = scratch / "torchlint-src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        if (REPO / name).exists():
            shutil.copy(REPO / name, source / name)
    for package in ("torchlint", "rules", "sanitizer"):
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(folder), str(source)], check=True, capture_output=True, text=True)
    return next(folder.glob("torchlint-*.whl"))


def install_target(target: Path, scratch: Path) -> Path:
    """``pip install --target TARGET`` torchlint, pytest and pytest's dependencies, offline."""
    wheels = scratch / "wheels"
    if not wheels.exists():
        wheels.mkdir(parents=True)
        build_torchlint(wheels, scratch)
        for name in PYTEST_DISTRIBUTIONS:
            repack_installed(name, wheels)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(target), *map(str, sorted(wheels.glob("*.whl")))],
                   check=True, capture_output=True, text=True)
    return target


def run_pytest_from(target: Path, project: Path, *args: str) -> subprocess.CompletedProcess:
    """``PYTHONPATH=TARGET python -m pytest ARGS`` in ``project``: pytest and torchlint come from the target."""
    env = dict(os.environ, PYTHONPATH=str(target), TORCHLINT_SANITIZER_FORCE="1")
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=project, env=env, capture_output=True, text=True)
