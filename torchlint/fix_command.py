"""The sanitizer's closing hint: the one ``torchlint`` command that fixes
what a run measured. It lints the files the run's findings point at, as the
CLI would, so it sits above the CLI (``runtime_join`` stays below it)."""

from __future__ import annotations

import os
import shlex
from typing import Any, Dict, Optional, Sequence

from torchlint.cli import Settings, build_parser
from torchlint.fixer import is_applicable
from torchlint.lifecycle import is_preview
from torchlint.registry import all_rules
from torchlint.runner import CHECK, Job, run
from torchlint.runtime_join import SYNC_RULES, join


def fix_command(findings: Sequence[Dict[str, Any]], cwd: Optional[str] = None) -> Optional[str]:
    """The one ``torchlint`` command that fixes what a run found, or None when no fix exists.

    Lints the user files the findings point at with the findings' rules, and
    keeps only the rules whose static findings at those measured lines carry a fix.
    """
    cwd = cwd or os.getcwd()
    codes = sorted(
        {f["rule"] for f in findings if f.get("rule")}
        | (SYNC_RULES if any(f.get("kind") == "sync" for f in findings) else set())
    )
    files = sorted({f["file"] for f in findings if f.get("file") and os.path.isfile(os.path.join(cwd, f["file"]))})
    files = [path for path in files if path.endswith(".py")]
    if not codes or not files:
        return None
    # Preview rules take part; the command says `--preview` when it needs one.
    args = build_parser().parse_args(["--preview", "--select", ",".join(codes), *files])
    settings = Settings(args)
    jobs = []
    for path in files:
        config = settings.config_for(path)
        jobs.append(Job(path, settings.file_options(path), CHECK, True, settings.fixable(config), None))
    diagnostics = [d for result in run(jobs, 1) for d in result.diagnostics]
    joined = join(diagnostics, [{"findings": list(findings)}])
    fixes = [d for d in diagnostics if joined.of(d) is not None and d.fix is not None and is_applicable(d.fix, True)]
    if not fixes:
        return None
    unsafe = any(not is_applicable(d.fix, False) for d in fixes)
    fix_codes = sorted({d.code for d in fixes})
    fix_files = sorted({_shown(d.path, cwd) for d in fixes})
    preview = ["--preview"] if any(is_preview(all_rules()[code]) for code in fix_codes) else []
    command = (
        ["torchlint", "--fix"]
        + (["--unsafe-fixes"] if unsafe else [])
        + preview
        + ["--select", ",".join(fix_codes)]
        + fix_files
    )
    return " ".join(shlex.quote(part) for part in command)


def _shown(path: str, cwd: str) -> str:
    """A path as the user types it from ``cwd``: relative when inside it."""
    relative = os.path.relpath(os.path.abspath(os.path.join(cwd, path)), cwd)
    return path if relative.startswith("..") else relative


def closing_hint(findings: Sequence[Dict[str, Any]], cwd: Optional[str] = None) -> Optional[str]:
    """The last line of the sanitizer's summary: ``fix what it found: torchlint --fix ...``, or None.

    Never raises: a run's summary must not fail because the lint of its files did.
    """
    try:
        command = fix_command(findings, cwd)
    except Exception:
        return None
    return f"fix what it found: {command}" if command else None
