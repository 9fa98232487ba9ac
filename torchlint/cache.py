"""The result cache: a file that has not changed is not linted again.

As ruff does, each file's result is stored under a key made of the file's
path and content hash, everything that decides its findings (the selected
rules and their options, the supported torch versions and the other project
facts, noqa handling) and a fingerprint of torchlint itself (its version and
the sources of the engine and the rules, so a development checkout never
serves stale results). A project fact that changes (a manifest, a module
that becomes CUDA-only, an API floor) changes the key of every file it
applies to, so exactly the files that depend on it are linted again.

Cross-file facts (a loader built in ``main.py`` and iterated in
``engine.py``) are read from other files during a file's lint. The lint
records which projects it consulted (``Projects.record_consulted``), and the
entry keeps each one's digest (its files' paths, sizes and modification
times): when any file of such a project changes, the results that consulted
it are linted again; results that consulted no other file are not.

The cache lives in ``.torchlint_cache/`` under the current directory, or in
``--cache-dir`` / ``TORCHLINT_CACHE_DIR``, with one subdirectory per
torchlint version, a ``CACHEDIR.TAG`` and a ``.gitignore`` (ruff's layout);
``-n``/``--no-cache`` turns it off and ``torchlint clean`` removes it. Only checking is
cached (``--fix``, ``--diff`` and ``--add-noqa`` always lint). Entries are
written to a temporary file and renamed into place, so parallel runs never
read half an entry; an entry that cannot be read is a miss.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import pickle
import shutil
import sys
from collections import Counter
from typing import TYPE_CHECKING, Optional

from torchlint import __version__
from torchlint.project import Projects
from torchlint.source import write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.linter import FileOptions
    from torchlint.runner import FileResult

CACHE_DIR_ENV = "TORCHLINT_CACHE_DIR"
DEFAULT_DIR = ".torchlint_cache"
_FORMAT = 2  # bump when FileResult's pickled shape changes


def default_directory() -> str:
    return os.environ.get(CACHE_DIR_ENV) or os.path.join(os.getcwd(), DEFAULT_DIR)


def _code_fingerprint() -> str:
    """torchlint's version and the size and mtime of every module of the
    engine and the rules: an edited rule invalidates the cache."""
    import torchlint
    import torchlint.rules

    digest = hashlib.sha256(f"{__version__}:{_FORMAT}".encode())
    for package in (torchlint, torchlint.rules):
        directory = os.path.dirname(os.path.abspath(package.__file__ or ""))
        for name in sorted(os.listdir(directory)):
            if name.endswith(".py"):
                stat = os.stat(os.path.join(directory, name))
                digest.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()


def options_fingerprint(options: "FileOptions") -> str:
    """Everything in the options that decides a file's findings."""
    settings = {
        "rules": sorted(rule.code for rule in options.rules),
        "rule_options": options.rule_options,
        "target_torch": options.target_torch,
        "ignore_noqa": options.ignore_noqa,
        "project": dataclasses.asdict(options.project) if options.project is not None else None,
    }
    return json.dumps(settings, sort_keys=True, default=repr)


class ResultCache:
    def __init__(self, directory: Optional[str] = None) -> None:
        self.root = os.path.abspath(directory or default_directory())
        # One subdirectory per torchlint version, as ruff lays out its cache.
        self.directory = os.path.join(self.root, __version__)
        self._code = _code_fingerprint()
        self._options: dict = {}
        self.hits = 0
        self.stored = 0
        self._digests: dict = {}  # project root -> its cross-file digest, once per run
        self._projects = Projects()

    def key(self, path: str, data: bytes, options: "FileOptions") -> str:
        known = self._options.get(id(options))
        if known is None or known[0] is not options:
            # (the options object is kept alive with its fingerprint, so its id is not reused)
            known = self._options[id(options)] = (options, hashlib.sha256(options_fingerprint(options).encode()).hexdigest())
        fingerprint = known[1]
        digest = hashlib.sha256()
        # The path as given is in the stored findings; the absolute one names the file.
        for part in (self._code, fingerprint, path, os.path.abspath(path)):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\0")
        digest.update(data)
        return digest.hexdigest()

    def _entry(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key[2:])

    def get(self, key: str) -> Optional["FileResult"]:
        try:
            with open(self._entry(key), "rb") as handle:
                result, depended = pickle.load(handle)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
            return None
        # A result that used facts of other files holds only while those files are as they were.
        if any(self._digest(root) != known for root, known in depended.items()):
            return None
        self.hits += 1
        return result

    def put(self, key: str, result: "FileResult") -> None:
        """Store atomically; a cache that cannot be written is silently skipped."""
        entry = self._entry(key)
        depended = {root: self._digest(root) for root in result.depends_on}
        try:
            self._prepare()
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            write_atomic(entry, pickle.dumps((result, depended), protocol=pickle.HIGHEST_PROTOCOL), durable=False)
        except OSError:
            return
        self.stored += 1

    def consulted_roots(self) -> "Counter[str]":
        """Per project root, how many stored results consulted other files of it."""
        roots: "Counter[str]" = Counter()
        for folder, _, names in os.walk(self.directory):
            for name in names:
                try:
                    with open(os.path.join(folder, name), "rb") as handle:
                        _, depended = pickle.load(handle)
                except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, TypeError, ValueError):
                    continue  # CACHEDIR.TAG, .gitignore, an entry of another format
                roots.update(depended.keys())
        return roots

    def _digest(self, root: str) -> str:
        known = self._digests.get(root)
        if known is None:
            known = self._digests[root] = self._projects.for_path(root).digest()
        return known

    def _prepare(self) -> None:
        """The first write creates the directory, marked as a cache (CACHEDIR.TAG)
        and ignored by git, as ruff marks its own."""
        if os.path.isdir(self.directory):
            return
        os.makedirs(self.directory, exist_ok=True)
        for name, text in (
            ("CACHEDIR.TAG", "Signature: 8a477f597d28d172789f06886806bc55\n# torchlint's result cache\n"),
            (".gitignore", "# Automatically created by torchlint.\n*\n"),
        ):
            try:
                with open(os.path.join(self.root, name), "x", encoding="utf-8") as handle:
                    handle.write(text)
            except FileExistsError:
                pass


def clean_command(argv) -> int:
    """``torchlint clean [--cache-dir PATH]``: remove the result cache (as ``ruff clean``)."""
    parser = argparse.ArgumentParser(prog="torchlint clean", description="Remove the result cache.")
    parser.add_argument("--cache-dir", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    directory = os.path.abspath(args.cache_dir or default_directory())
    if os.path.isfile(os.path.join(directory, "CACHEDIR.TAG")):
        shutil.rmtree(directory, ignore_errors=True)
        print(f"Removed {directory}")
    elif os.path.exists(directory):
        print(f"torchlint: error: {directory} is not a torchlint cache (no CACHEDIR.TAG); left alone", file=sys.stderr)
        return 2
    return 0
