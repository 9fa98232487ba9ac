"""Reading and writing source files without losing a byte of their form.

A file is decoded with its declared encoding (PEP 263 cookie or BOM) and its
line endings are kept as they are, so a fix changes only what it means to.
"""
from __future__ import annotations

import io
import os
import re
import tempfile
import tokenize
from dataclasses import dataclass


class DecodeError(Exception):
    """The file's bytes do not decode; the message says why."""


@dataclass(frozen=True)
class SourceFile:
    text: str
    encoding: str  # as detected: "utf-8-sig" means a BOM is present

    def encode(self, text: str) -> bytes:
        return text.encode(self.encoding)


def decode(data: bytes) -> SourceFile:
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:  # bad bytes in the first lines, or a bad coding cookie
        if "invalid or missing" in str(exc):
            encoding = "utf-8"
        else:
            raise DecodeError(str(exc)) from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"cannot decode as {encoding}: {exc.reason} at byte {exc.start}") from None
    return SourceFile(text=text, encoding=encoding)


def read(path: str) -> SourceFile:
    with open(path, "rb") as handle:
        return decode(handle.read())


def write_atomic(path: str, data: bytes, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` all at once, keeping its permissions
    (a new file gets 0o644).

    The bytes go to a temporary file in the same directory, which is flushed
    and then renamed over the original: a crash or a full disk leaves either
    the old file or the new one, never half of either. ``durable=False``
    skips the fsync (cache entries, which can always be rebuilt).
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o644
    fd, tmp = tempfile.mkstemp(prefix=".torchlint-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
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
