"""flake8 plugin: ``flake8 --select TL`` runs the same engine as ``torchlint``.

flake8 picks the plugin type from ``__init__``'s parameter names: ``tree``
makes it a once-per-file plugin, so it is accepted and ignored; ``lines`` is
joined and parsed once with libcst. flake8 owns selection and ``noqa``
(prefix-matched, unlike torchlint's exact codes), and never reads
pyproject.toml, so rule options come through flake8's own options. Preview
and opt-in rules are in flake8's default ignore list (flake8 has no preview
mode): name them in ``--select``/``--extend-select`` to run them.
Columns handed to flake8 are 0-based; it adds 1 when printing.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Dict, Iterator, List, Sequence, Tuple, Type

from torchlint import __version__
from torchlint.config import parse_version
from torchlint.lifecycle import in_default_set
from torchlint.linter import FileOptions, lint_text
from torchlint.project import ProjectFacts, Projects
from torchlint.registry import all_rules
from torchlint.source import DecodeError, decode, read_bytes


def _parse_rule_options(entries: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``TL201.assume-pinned=true`` -> {"TL201": {"assume-pinned": True}}."""
    rules = all_rules()
    result: Dict[str, Dict[str, Any]] = {}
    for entry in entries:
        key, sep, raw = entry.partition("=")
        code, dot, name = key.strip().partition(".")
        code = code.upper()
        if not sep or not dot or code not in rules or name not in rules[code].options:
            raise ValueError(f"--torchlint-rule-option: expected CODE.option=value for a known option, got {entry!r}")
        kind = rules[code].options[name].type
        value: Any = raw.strip()
        if kind is bool:
            value = value.lower() in ("1", "true", "yes", "on")
        elif kind is int:
            value = int(value)
        result.setdefault(code, {})[name] = value
    return result


class TorchlintChecker:
    name = "torchlint"
    version = __version__
    options = FileOptions(rules=[], ignore_noqa=True)
    # flake8 makes a checker per file: the projects of its process are kept here.
    projects = Projects()

    def __init__(self, tree: ast.AST, lines: List[str], filename: str = "(none)") -> None:
        self.lines = lines
        self.filename = filename

    @classmethod
    def add_options(cls, option_manager: Any) -> None:
        option_manager.add_option(
            "--torchlint-target-torch",
            default=None,
            parse_from_config=True,
            help='PyTorch version the code targets, e.g. "1.13" (torchlint\'s target-torch)',
        )
        option_manager.add_option(
            "--torchlint-rule-option",
            default=[],
            parse_from_config=True,
            comma_separated_list=True,
            help="torchlint rule options as CODE.option=value, e.g. TL201.assume-pinned=true",
        )
        # The same default set as `torchlint`: stable rules that are not opt-in.
        off_by_default = [code for code, rule in all_rules().items() if not in_default_set(rule)]
        if off_by_default:
            option_manager.extend_default_ignore(off_by_default)

    @classmethod
    def parse_options(cls, options: Any) -> None:
        target = getattr(options, "torchlint_target_torch", None)
        entries = getattr(options, "torchlint_rule_option", None) or []
        cls.options = FileOptions(
            rules=list(all_rules().values()),
            rule_options=_parse_rule_options(entries),
            target_torch=parse_version(target) if target else None,
            ignore_noqa=True,
        )

    def _undecodable(self) -> "str | None":
        """Why the file's own bytes do not decode as the CLI decodes them (None: they do)."""
        if self.filename in ("-", "stdin", "(none)"):
            return None
        try:
            data = read_bytes(self.filename, None)
        except OSError:
            return None  # flake8 read it somehow (stdin-display-name...): trust its lines
        try:
            decode(data)
        except DecodeError as exc:
            return str(exc)
        return None

    def run(self) -> Iterator[Tuple[int, int, str, Type["TorchlintChecker"]]]:
        options = (
            self.options if self.options.rules else FileOptions(rules=list(all_rules().values()), ignore_noqa=True)
        )
        # The same project facts (supported torch versions) as the CLI sees.
        facts = (
            self.projects.for_path(self.filename).facts() if self.filename and self.filename != "-" else ProjectFacts()
        )
        options = dataclasses.replace(options, project=facts)
        text = "".join(self.lines)
        undecodable = self._undecodable()
        if undecodable is not None:
            # flake8 falls back to latin-1 where the declared coding fails; the
            # CLI reports the file as undecodable, and so does the plugin.
            yield 1, 0, f"TL000 cannot decode file: {undecodable}", type(self)
            return
        output = lint_text(text, self.filename, options, self.projects)
        for d in output.diagnostics:
            yield d.row, d.column - 1, f"{d.code} {d.message}", type(self)
        for error in output.errors:
            # An exception would abort flake8's whole run: report it as a finding.
            yield 1, 0, f"TL000 internal error in rule {error.rule}; please report it", type(self)
