"""Reading and writing source files without losing a byte of their form.

A file is decoded with its declared encoding (PEP 263 cookie or BOM) and its
line endings are kept as they are, so a fix changes only what it means to.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import re
import secrets
import signal
import stat
import threading
import tokenize
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional


class DecodeError(Exception):
    """The file's bytes do not decode; the message says why."""


@dataclass(frozen=True)
class SourceFile:
    text: str
    encoding: str  # as detected: "utf-8-sig" means a BOM is present

    def encode(self, text: str) -> bytes:
        return text.encode(self.encoding)


def _is_text_encoding(encoding: str) -> bool:
    try:
        return bool(getattr(codecs.lookup(encoding), "_is_text_encoding", True))
    except LookupError:
        return False


def decode(data: bytes) -> SourceFile:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # bad bytes in the first lines, or a bad coding cookie
        if "invalid or missing" in str(exc):
            encoding = "utf-8"
        else:
            raise DecodeError(str(exc)) from None
    if not _is_text_encoding(encoding):
        # rot13, hex, base64, zlib_codec...: codecs.lookup knows them, yet they
        # are not text encodings. CPython: "SyntaxError: encoding problem: rot13".
        raise DecodeError(f"encoding problem: {encoding} is not a text encoding")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"cannot decode as {encoding}: {exc.reason} at byte {exc.start}") from None
    return SourceFile(text=text, encoding=encoding)


class NotASourceFile(OSError):
    """The path is not a regular file (a FIFO, a device, a socket) or is over
    the size limit: it is not read at all. The message says why."""


DEFAULT_MAX_BYTES = 1024 * 1024  # libcst needs ~3 GB per MB on the worst shapes
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def describe_size(size: int) -> str:
    return f"{size / 1024 / 1024:.1f} MiB" if size >= 1024 * 1024 else f"{size / 1024:.1f} KiB"


def read_bytes(path: str, max_bytes: Optional[int] = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of a regular file, read once. A FIFO is opened without
    blocking and a device or a link to one (``/dev/zero``) is refused before
    a byte is read; a file over ``max_bytes`` is refused from its size (and
    the read stops there should it grow meanwhile)."""
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotASourceFile(f"not a regular file ({_kind(info.st_mode)}); not read")
        if max_bytes is not None and info.st_size > max_bytes:
            raise NotASourceFile(too_large(info.st_size, max_bytes))
        chunks = []
        left = (max_bytes + 1) if max_bytes is not None else -1
        while left != 0:
            chunk = os.read(fd, 1 << 20 if left < 0 else min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            if left > 0:
                left -= len(chunk)
        data = b"".join(chunks)
        if max_bytes is not None and len(data) > max_bytes:
            raise NotASourceFile(too_large(len(data), max_bytes))
        return data
    finally:
        os.close(fd)


def too_large(size: int, max_bytes: int) -> str:
    return f"file is {describe_size(size)}, over max-file-size ({describe_size(max_bytes)}); not linted"


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def read(path: str) -> SourceFile:
    return decode(read_bytes(path, None))


def is_writable(path: str) -> bool:
    """May ``--fix`` change this file? Not when it is read-only: by its mode
    bits (root may write anything, but a read-only file says "leave me"), or
    by access rights. The rename ``write_atomic`` does would otherwise
    replace it, read-only or not."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & 0o222) and os.access(path, os.W_OK)


class ChangedDuringRun(Exception):
    """The file no longer holds the bytes that were fixed: it is left as it is."""


def write_in_place(path: str, data: bytes, expected: Optional[bytes] = None) -> None:
    """Write a fixed file the way a user expects: through a symlink to its
    target (the link stays a link), keeping a hard link (written in place,
    since a rename would split it), otherwise atomically.

    With ``expected``, the write is a compare-and-replace: under an exclusive
    ``flock`` on the file (which another torchlint holds for its own write),
    the file is read again and replaced only if it still holds ``expected``;
    otherwise ``ChangedDuringRun``. An editor does not take the lock, so its
    save can only slip into the moment between that comparison and the rename.
    """
    target = os.path.realpath(path)
    with _locked(target if expected is not None else None) as current:
        if expected is not None and current != expected:
            raise ChangedDuringRun(path)
        if os.stat(target).st_nlink > 1:
            _overwrite(target, data)
        else:
            write_atomic(target, data)


@contextlib.contextmanager
def _locked(path: Optional[str]) -> Iterator[Optional[bytes]]:
    """Hold an exclusive lock on the file now at ``path`` and yield its bytes.
    A file replaced while we waited for the lock is opened and locked again."""
    if path is None:
        yield None
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: compare without a lock
        with open(path, "rb") as handle:
            yield handle.read()
        return
    while True:
        handle = open(path, "rb")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            if os.path.samestat(os.fstat(handle.fileno()), os.stat(path)):
                yield handle.read()
                return
        except FileNotFoundError:
            raise ChangedDuringRun(path) from None
        finally:
            handle.close()  # closing releases the lock


_HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP take effect after the block, never inside it
    (SIGKILL cannot be held off).

    Blocking them (``pthread_sigmask``) holds them off on this thread only: in
    a process with other threads the kernel may hand one to another thread,
    and CPython then runs the Python handler on the main thread wherever it
    is. So on the main thread each handler is swapped for one that notes the
    signal, and the noted signals are raised again, to the real handlers,
    once the block is done. The mask stays for the default actions.
    """
    noted: List[int] = []
    swapped: Dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for signum in _HELD_SIGNALS:
            previous = signal.getsignal(signum)
            if previous is not None:  # None: set outside Python, and it could not be put back
                signal.signal(signum, lambda number, frame: noted.append(number))
                swapped[signum] = previous
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS) if hasattr(signal, "pthread_sigmask") else None
    try:
        yield
    finally:
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # what was pending is noted here
        for signum, previous in swapped.items():
            signal.signal(signum, previous)
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


def _overwrite(path: str, data: bytes) -> None:
    """Rewrite a file's contents in its own inode. Not atomic, so a signal
    takes effect only once the bytes are down."""
    with _signals_deferred(), open(path, "r+b") as handle:
        handle.write(data)
        handle.truncate()
        handle.flush()
        os.fsync(handle.fileno())


_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


def write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` all at once, keeping its permissions
    (a new file gets 0o644).

    The bytes go to a temporary file in the same directory, which is flushed
    and then renamed over the original: a crash or a full disk leaves either
    the old file or the new one, never half of either. ``durable=False``
    skips the fsync (cache entries, which can always be rebuilt).
    """
    directory = os.path.dirname(os.path.abspath(path))
    before: Optional[os.stat_result]
    try:
        before = os.stat(path)
        mode = before.st_mode & 0o7777
    except FileNotFoundError:
        before, mode = None, 0o644
    tmp: Optional[str] = None
    try:
        # The name is known before the file exists: a worker ends through an
        # exception when its parent dies (SIGTERM, workers.die_with_parent),
        # and one raised while the file is being made must still find it to
        # remove it (with tempfile.mkstemp, the name came back only after).
        for _ in range(100):
            tmp = os.path.join(directory, f".torchlint-{secrets.token_hex(8)}.tmp")
            try:
                fd = os.open(tmp, _NEW_FILE_FLAGS, 0o600)
                break
            except FileExistsError:
                tmp = None
        else:
            raise FileExistsError(f"no free temporary name in {directory}")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        if (
            before is not None
            and hasattr(os, "chown")
            and (before.st_uid, before.st_gid) != (os.geteuid(), os.getegid())
        ):
            try:  # root fixing another user's file: it stays theirs
                os.chown(tmp, before.st_uid, before.st_gid)
            except OSError:
                pass
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        raise


_LINE_END = re.compile(r"\r\n|\r|\n")


def split_lines(text: str) -> list:
    """Lines with their endings, split only where Python (and libcst) split
    them; ``str.splitlines`` also splits on form feeds and other separators."""
    lines, start = [], 0
    for match in _LINE_END.finditer(text):
        lines.append(text[start : match.end()])
        start = match.end()
    if start < len(text):
        lines.append(text[start:])
    return lines
