"""Build and load the race check's native op tap (``race_tap.cpp``).

The tap is a small C++ extension compiled against the torch in use the first
time the race check needs it, then cached per source, torch and Python version
under ``$TORCHLINT_CACHE_DIR`` (default ``~/.cache/torchlint``). Building
needs a C++ compiler and ninja; where either is missing, or the build fails,
``load`` raises ``TapUnavailable`` with a one-line reason and the race check
falls back to its Python dispatch mode.

``TORCHLINT_RACE_TAP`` chooses: ``auto`` (default: the tap where it builds),
``native`` (the tap, or an error note), ``python`` (the dispatch mode).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from typing import Any, Optional

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "race_tap.cpp")
CHOICES = ("auto", "native", "python")

_LOCK = threading.Lock()
_MODULE: Any = None
_FAILURE: Optional[str] = None


class TapUnavailable(RuntimeError):
    """The native tap cannot be built or loaded here; the message says why, in one line."""


def choice() -> str:
    value = os.environ.get("TORCHLINT_RACE_TAP", "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise TapUnavailable(f"TORCHLINT_RACE_TAP={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def cache_dir() -> str:
    root = os.environ.get("TORCHLINT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "torchlint")
    return os.path.join(root, "race_tap")


def _build_name(torch) -> str:
    digest = hashlib.sha256()
    with open(SOURCE, "rb") as handle:
        digest.update(handle.read())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    digest.update(str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", "")).encode())
    return f"torchlint_race_tap_{digest.hexdigest()[:16]}"


def _import_built(name: str, path: str):
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    if spec is None:
        raise ImportError(f"cannot load the native tap from {path}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def load(quiet: bool = False):
    """The tap module, built on first use; ``TapUnavailable`` when it cannot be had."""
    global _MODULE, _FAILURE
    with _LOCK:
        if _MODULE is not None:
            return _MODULE
        if _FAILURE is not None:
            raise TapUnavailable(_FAILURE)
        try:
            _MODULE = _load(quiet)
        except TapUnavailable as error:
            _FAILURE = str(error)
            raise
        return _MODULE


def _load(quiet: bool):
    import torch

    name = _build_name(torch)
    folder = os.path.join(cache_dir(), name)
    # The gpu_trace filter follows torch's private interpreter vtable: on a
    # torch whose vtable differs it does not compile, and the tap is built
    # without it (every allocation then costs the check a Python round trip).
    # Only a failure of the filter alone (the plain build then works) is
    # remembered, so it is not retried on every run; a missing compiler is not.
    failed_filter = os.path.join(folder, f"{name}.failed")
    error: Optional[TapUnavailable] = None
    if not os.path.exists(failed_filter):
        try:
            return _built_or_build(torch, name, folder, quiet, trace_filter=True)
        except TapUnavailable as filtered_error:
            error = filtered_error
    try:
        module = _built_or_build(torch, name + "_plain", folder, quiet, trace_filter=False)
    except TapUnavailable:
        if error is not None:
            raise error from None
        raise
    if error is not None:
        try:
            with open(failed_filter, "w", encoding="utf-8") as handle:
                handle.write(str(error))
        except OSError:
            pass
    return module


def _built_or_build(torch, name: str, folder: str, quiet: bool, trace_filter: bool):
    built = os.path.join(folder, f"{name}.so")
    if os.path.exists(built):
        try:
            return _import_built(name, built)
        except ImportError as error:
            raise TapUnavailable(f"cannot load {built}: {error}") from None
    try:
        from torch.utils import cpp_extension
    except ImportError as error:
        raise TapUnavailable(f"torch.utils.cpp_extension is missing: {error}") from None
    try:
        cpp_extension.verify_ninja_availability()
    except RuntimeError:
        raise TapUnavailable("ninja is not installed (pip install ninja), needed to build it") from None
    os.makedirs(folder, exist_ok=True)
    if not quiet:
        print(
            f"torchlint: building the race check's native tap in {folder} (once per torch version)...", file=sys.stderr
        )
    try:
        # NDEBUG as torch itself was built: RecordFunction's layout depends on it.
        return cpp_extension.load(
            name=name,
            sources=[SOURCE],
            build_directory=folder,
            extra_cflags=["-O2", "-DNDEBUG", f"-DTORCHLINT_TRACE_FILTER={int(trace_filter)}"],
            verbose=False,
        )
    except Exception as error:  # compiler missing, headers missing, compile errors
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TapUnavailable(f"build failed: {first}") from None
