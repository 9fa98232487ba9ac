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
import re
import sys
from collections import Counter
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from torchlint import __version__
from torchlint.project import Projects
from torchlint.source import write_atomic

if TYPE_CHECKING:  # pragma: no cover
    from torchlint.linter import FileOptions
    from torchlint.runner import FileResult

CACHE_DIR_ENV = "TORCHLINT_CACHE_DIR"
DEFAULT_DIR = ".torchlint_cache"
_FORMAT = 3  # bump when FileResult's pickled shape changes


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


_ENTRY_MAGIC = b"torchlint-cache\0"
_ENTRY_NAME = re.compile(r"^[0-9a-f]{62}$")
_TEMP_NAME = re.compile(r"^\.torchlint-[0-9a-f]{16}\.tmp$")
_SHARD_NAME = re.compile(r"^[0-9a-f]{2}$")
_VERSION_NAME = re.compile(r"^[0-9]+(\.[0-9A-Za-z+_-]+)*$")
_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# torchlint's result cache\n"
_GITIGNORE = "# Automatically created by torchlint.\n*\n"


def cache_folder(directory: Optional[str] = None) -> str:
    """The folder the cache owns. ``--cache-dir``/``TORCHLINT_CACHE_DIR`` name
    where it lives, not the folder itself: a shared place such as ``~/.cache``
    or the project gets a ``.torchlint_cache`` subfolder, and only that one is
    ever tagged or cleaned. A given folder already named ``.torchlint_cache``
    is the cache folder itself."""
    given = directory or os.environ.get(CACHE_DIR_ENV)
    if not given:
        return os.path.join(os.getcwd(), DEFAULT_DIR)
    given = os.path.abspath(given)
    return given if os.path.basename(given) == DEFAULT_DIR else os.path.join(given, DEFAULT_DIR)


def is_ours(folder: str) -> bool:
    """Does ``folder`` carry torchlint's own tag (the exact text it writes)?"""
    try:
        with open(os.path.join(folder, "CACHEDIR.TAG"), encoding="utf-8") as handle:
            return handle.read() == _TAG
    except (OSError, UnicodeDecodeError):
        return False


def _only_our_layout(folder: str) -> bool:
    """Is everything in ``folder`` something the cache itself makes?"""
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    return all(name in ("CACHEDIR.TAG", ".gitignore") or _VERSION_NAME.match(name) for name in names)


def content_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ResultCache:
    def __init__(self, directory: Optional[str] = None) -> None:
        self.root = cache_folder(directory)
        # One subdirectory per torchlint version, as ruff lays out its cache.
        self.directory = os.path.join(self.root, __version__)
        self._code = _code_fingerprint()
        self._options: dict = {}
        self.hits = 0
        self.stored = 0
        self._usable: Optional[bool] = None  # None: not yet prepared
        self._digests: dict = {}  # project root -> its cross-file digest, once per run
        self._projects = Projects()

    def key(self, path: str, digest_of_content: str, options: "FileOptions") -> str:
        """The key of one file's result: torchlint's code, the options, the path
        and the SHA-256 of the exact bytes that were linted."""
        known = self._options.get(id(options))
        if known is None or known[0] is not options:
            # (the options object is kept alive with its fingerprint, so its id is not reused)
            known = self._options[id(options)] = (
                options,
                hashlib.sha256(options_fingerprint(options).encode()).hexdigest(),
            )
        fingerprint = known[1]
        digest = hashlib.sha256()
        # The path as given is in the stored findings; the absolute one names the file.
        for part in (self._code, fingerprint, path, os.path.abspath(path), digest_of_content):
            digest.update(part.encode("utf-8", "surrogatepass"))
            digest.update(b"\0")
        return digest.hexdigest()

    def _entry(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key[2:])

    def get(self, key: str) -> Optional["FileResult"]:
        """The stored result, or None for a miss. An entry whose checksum, key
        or shape is not what this cache writes is a miss, never an error."""
        try:
            with open(self._entry(key), "rb") as handle:
                blob = handle.read()
        except OSError:
            return None
        loaded = _unpack(blob, key)
        if loaded is None:
            return None
        result, depended = loaded
        # A result that used facts of other files holds only while those files are as they were.
        if any(self._digest(root) != known for root, known in depended.items()):
            return None
        self.hits += 1
        return result

    def put(self, key: str, result: "FileResult") -> None:
        """Store atomically; a cache that cannot be written is silently skipped."""
        if not self._prepare():
            return
        entry = self._entry(key)
        depended = {root: self._digest(root) for root in result.depends_on}
        payload = pickle.dumps((key, result, depended), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            write_atomic(entry, _ENTRY_MAGIC + hashlib.sha256(payload).digest() + payload, durable=False)
        except OSError:
            return
        self.stored += 1

    def consulted_roots(self) -> "Counter[str]":
        """Per project root, how many stored results consulted other files of it."""
        roots: "Counter[str]" = Counter()
        for folder, _, names in os.walk(self.directory):
            for name in names:
                if not _ENTRY_NAME.match(name):
                    continue
                try:
                    with open(os.path.join(folder, name), "rb") as handle:
                        loaded = _unpack(handle.read(), os.path.basename(folder) + name)
                except OSError:
                    continue
                if loaded is not None:
                    roots.update(loaded[1].keys())
        return roots

    def _digest(self, root: str) -> str:
        known = self._digests.get(root)
        if known is None:
            known = self._digests[root] = self._projects.for_path(root).digest()
        return known

    def _prepare(self) -> bool:
        """The first write creates the cache folder and tags it (CACHEDIR.TAG,
        and a .gitignore, as ruff marks its own). A folder of that name that
        holds anything else is not ours: nothing is written into it."""
        if self._usable is None:
            self._usable = self._claim()
        return self._usable

    def _claim(self) -> bool:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError:
            return False
        if not is_ours(self.root):
            if not _only_our_layout(self.root):
                return False
            for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", _GITIGNORE)):
                try:
                    with open(os.path.join(self.root, name), "x", encoding="utf-8") as handle:
                        handle.write(text)
                except FileExistsError:
                    pass  # a parallel run tagged it first
                except OSError:
                    return False
            if not is_ours(self.root):
                return False
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError:
            return False
        return True


def _unpack(blob: bytes, key: str) -> Optional[Tuple["FileResult", Dict[str, str]]]:
    """(result, depended) from an entry's bytes, or None when the entry is not
    exactly what ``put`` wrote for ``key``: wrong magic, checksum, key or shape."""
    header = len(_ENTRY_MAGIC) + 32
    if len(blob) < header or not blob.startswith(_ENTRY_MAGIC):
        return None
    payload = blob[header:]
    if hashlib.sha256(payload).digest() != blob[len(_ENTRY_MAGIC) : header]:
        return None
    try:
        loaded = pickle.loads(payload)
    except Exception:  # the checksum held, so this is another build's entry: a miss
        return None
    from torchlint.runner import FileResult

    if not (isinstance(loaded, tuple) and len(loaded) == 3):
        return None
    stored_key, result, depended = loaded
    if stored_key != key or not isinstance(result, FileResult) or not isinstance(depended, dict):
        return None
    if not all(isinstance(root, str) and isinstance(known, str) for root, known in depended.items()):
        return None
    return result, depended


def clean_command(argv) -> int:
    """``torchlint clean [--cache-dir PATH]``: remove the result cache (as
    ``ruff clean``). Only a folder carrying torchlint's own tag is touched,
    and in it only the files of the cache's own layout are removed: anything
    else found there is left and named."""
    parser = argparse.ArgumentParser(prog="torchlint clean", description="Remove the result cache.")
    parser.add_argument("--cache-dir", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    folder = cache_folder(args.cache_dir)
    if not os.path.lexists(folder):
        return 0
    if os.path.islink(folder) or not os.path.isdir(folder) or not is_ours(folder):
        print(
            f"torchlint: error: {folder} is not a torchlint cache (no torchlint CACHEDIR.TAG); left alone",
            file=sys.stderr,
        )
        return 2
    foreign = _remove_layout(folder)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        print(f"torchlint: warning: {folder}: left what the cache did not write: {shown}", file=sys.stderr)
        return 0
    print(f"Removed {folder}")
    return 0


def _remove_layout(folder: str) -> List[str]:
    """Remove the cache's own files under ``folder`` (version/shard/entry),
    then the tag and the folder once nothing else is left. Returns the paths
    of anything else, which stays."""
    foreign: List[str] = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name in ("CACHEDIR.TAG", ".gitignore"):
            continue
        if _VERSION_NAME.match(name) and os.path.isdir(path) and not os.path.islink(path):
            for shard in sorted(os.listdir(path)):
                shard_path = os.path.join(path, shard)
                if not (_SHARD_NAME.match(shard) and os.path.isdir(shard_path) and not os.path.islink(shard_path)):
                    foreign.append(shard_path)
                    continue
                for entry in os.listdir(shard_path):
                    entry_path = os.path.join(shard_path, entry)
                    if (
                        (_ENTRY_NAME.match(entry) or _TEMP_NAME.match(entry))
                        and os.path.isfile(entry_path)
                        and not os.path.islink(entry_path)
                    ):
                        _unlink(entry_path)
                    else:
                        foreign.append(entry_path)
                _rmdir(shard_path)
            _rmdir(path)
        else:
            foreign.append(path)
    if not foreign:
        for name in (".gitignore", "CACHEDIR.TAG"):
            _unlink(os.path.join(folder, name))
        _rmdir(folder)
    return foreign


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _rmdir(path: str) -> None:
    try:
        os.rmdir(path)
    except OSError:  # not empty: something foreign is in it, and it stays
        pass
