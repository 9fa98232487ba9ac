"""``[tool.torchlint]`` in the nearest ``pyproject.toml``.

Keys use ruff's kebab-case spellings. An unknown key or a bad value is a
``ConfigError`` whose message names the file, the key and the reason; the CLI
prints it on one line and exits 2.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Type

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from torchlint.project import find_root
from torchlint.rule import Rule

OUTPUT_FORMATS = ("concise", "full", "json", "json-lines", "grouped", "github", "sarif", "junit", "pylint")


class ConfigError(Exception):
    pass


@dataclass
class Config:
    """One configuration file's settings (or the empty configuration)."""

    path: Optional[str] = None
    root: str = field(default_factory=os.getcwd)
    select: Optional[List[str]] = None
    extend_select: List[str] = field(default_factory=list)
    ignore: List[str] = field(default_factory=list)
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    fixable: Optional[List[str]] = None
    unfixable: List[str] = field(default_factory=list)
    unsafe_fixes: Optional[bool] = None
    preview: Optional[bool] = None  # run preview rules (torchlint.lifecycle)
    exclude: Optional[List[str]] = None
    extend_exclude: List[str] = field(default_factory=list)
    extend_include: List[str] = field(default_factory=list)  # file patterns linted beside *.py, *.pyi, *.ipynb
    respect_gitignore: bool = True
    force_exclude: bool = False
    output_format: Optional[str] = None
    target_torch: Optional[Tuple[int, int]] = None
    max_file_size: Optional[int] = None  # bytes; None: source.DEFAULT_MAX_BYTES
    rule_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)


_LIST_KEYS = {
    "select": "select",
    "extend-select": "extend_select",
    "ignore": "ignore",
    "fixable": "fixable",
    "unfixable": "unfixable",
    "exclude": "exclude",
    "extend-exclude": "extend_exclude",
    "extend-include": "extend_include",
}
_BOOL_KEYS = {
    "unsafe-fixes": "unsafe_fixes",
    "preview": "preview",
    "respect-gitignore": "respect_gitignore",
    "force-exclude": "force_exclude",
}
_TABLE_KEYS = {"per-file-ignores", "extend-per-file-ignores"}
_SELECTOR_KEYS = {"select", "extend-select", "ignore", "fixable", "unfixable"}
KNOWN_KEYS = sorted(
    set(_LIST_KEYS) | set(_BOOL_KEYS) | _TABLE_KEYS | {"output-format", "target-torch", "max-file-size", "rules"}
)


def parse_version(text: str) -> Tuple[int, int]:
    match = re.match(r"^\s*(\d+)\.(\d+)", str(text))
    if not match:
        raise ValueError(f'expected a version like "2.4", got {text!r}')
    return int(match.group(1)), int(match.group(2))


_SIZE = re.compile(r"^\s*(\d+)\s*(B|KB|KIB|MB|MIB|GB|GIB)?\s*$", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1000, "KIB": 1024, "MB": 1000**2, "MIB": 1024**2, "GB": 1000**3, "GIB": 1024**3}


def parse_size(value: Any) -> int:
    """A file size: a whole number of bytes, or a string such as "2MB" or "512KiB"."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.match(value) if isinstance(value, str) else None
        if match is None:
            raise ValueError(f'expected a number of bytes or a size such as "2MB", got {value!r}')
        size = int(match.group(1)) * _UNITS[(match.group(2) or "B").upper()]
    if size <= 0:
        raise ValueError(f"expected a size above zero, got {value!r}")
    return size


def load_toml(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML files are UTF-8 by definition
        raise ConfigError(f"{path}: not UTF-8: {exc.reason} at byte {exc.start}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None


def load_config(path: str, rules: Dict[str, Type[Rule]], data: Optional[Dict[str, Any]] = None) -> Config:
    """Validate the settings of ``path`` (a pyproject.toml or a torchlint.toml);
    ``data`` is the file's parsed TOML when the caller has it already."""
    if data is None:
        data = load_toml(path)
    if path.endswith("pyproject.toml"):
        table = torchlint_table(data, path) or {}
    elif "tool" in data:
        # ruff.toml's rule: a file of torchlint's own holds the keys themselves
        raise ConfigError(
            f"{path}: `[tool.torchlint]` is a pyproject.toml table; in this file, write its keys at the top level "
            "(or name a pyproject.toml with --config)"
        )
    else:
        table = data
    config = Config(path=path, root=os.path.dirname(os.path.abspath(path)))
    apply_table(config, table, path, rules)
    # Without `target-torch`, the supported versions come from torchlint.project.
    return config


def torchlint_table(pyproject: Dict[str, Any], path: str) -> Any:
    """``[tool.torchlint]`` of a parsed pyproject.toml (None when absent)."""
    tool = pyproject.get("tool", {})
    if not isinstance(tool, dict):
        raise ConfigError(f"{path}: tool: expected a table, got {tool!r}")
    return tool.get("torchlint")


def apply_table(config: Config, table: Dict[str, Any], where: str, rules: Dict[str, Type[Rule]]) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: [tool.torchlint] must be a table")
    for key, value in table.items():
        if key in _LIST_KEYS:
            setattr(config, _LIST_KEYS[key], _string_list(value, where, key))
            if key in _SELECTOR_KEYS:
                _check_selectors(value, where, key, rules)
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {key}: expected true or false, got {value!r}")
            setattr(config, _BOOL_KEYS[key], value)
        elif key in _TABLE_KEYS:
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: {key}: expected a table of pattern = [codes]")
            for pattern, codes in value.items():
                codes = _string_list(codes, where, f"{key}.{pattern}")
                _check_selectors(codes, where, f"{key}.{pattern}", rules)
                config.per_file_ignores.setdefault(pattern, []).extend(codes)
        elif key == "output-format":
            if value not in OUTPUT_FORMATS:
                raise ConfigError(
                    f"{where}: output-format: unknown format {value!r}; expected one of {', '.join(OUTPUT_FORMATS)}"
                )
            config.output_format = value
        elif key == "target-torch":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                # TOML reads 2.10 as the number 2.1: the minor version would be lost.
                raise ConfigError(
                    f"{where}: target-torch: {value!r} is a TOML number, which cannot tell 2.1 from 2.10; "
                    f'write the version as a string, e.g. target-torch = "2.10"'
                )
            try:
                config.target_torch = parse_version(value)
            except ValueError as exc:
                raise ConfigError(f"{where}: target-torch: {exc}") from None
        elif key == "max-file-size":
            try:
                config.max_file_size = parse_size(value)
            except ValueError as exc:
                raise ConfigError(f"{where}: max-file-size: {exc}") from None
        elif key == "rules":
            config.rule_options = parse_rule_options(value, where, rules)
        else:
            raise ConfigError(f"{where}: unknown key `{key}` in [tool.torchlint]; known keys: {', '.join(KNOWN_KEYS)}")


def parse_rule_options(value: Any, where: str, rules: Dict[str, Type[Rule]]) -> Dict[str, Dict[str, Any]]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: rules: expected tables such as [tool.torchlint.rules.TL201]")
    by_name = {rule.name: code for code, rule in rules.items()}
    result: Dict[str, Dict[str, Any]] = {}
    for key, options in value.items():
        code = key.upper() if key.upper() in rules else by_name.get(key)
        if code is None:
            raise ConfigError(f"{where}: rules.{key}: unknown rule")
        if not isinstance(options, dict):
            raise ConfigError(f"{where}: rules.{key}: expected a table of options")
        declared = rules[code].options
        for name, setting in options.items():
            if name not in declared:
                known = ", ".join(declared) or "none"
                raise ConfigError(f"{where}: rules.{key}: unknown option `{name}` (options of {code}: {known})")
            expected = declared[name].type
            if not isinstance(setting, expected) or (expected is int and isinstance(setting, bool)):
                raise ConfigError(f"{where}: rules.{key}.{name}: expected {expected.__name__}, got {setting!r}")
        result.setdefault(code, {}).update(options)
    return result


def _string_list(value: Any, where: str, key: str) -> List[str]:
    if isinstance(value, str) or not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key}: expected a list of strings, got {value!r}")
    return list(value)


def _check_selectors(selectors: List[str], where: str, key: str, rules: Dict[str, Type[Rule]]) -> None:
    from torchlint.selection import SelectorError, normalize

    try:
        normalize(selectors, rules)
    except SelectorError as exc:
        raise ConfigError(f"{where}: {key}: {exc}") from None


class ConfigFinder:
    """Finds the configuration that applies to each file, upward from it."""

    def __init__(self, rules: Dict[str, Type[Rule]], explicit: Optional[str] = None, isolated: bool = False) -> None:
        self.rules = rules
        self.isolated = isolated
        self.explicit = load_config(explicit, rules) if explicit else None
        self._by_dir: Dict[str, Config] = {}

    def for_path(self, path: str) -> Config:
        if self.explicit is not None:
            return self.explicit
        if self.isolated:
            return self._by_dir.setdefault("", Config())
        directory = os.path.dirname(os.path.abspath(path)) if not os.path.isdir(path) else os.path.abspath(path)
        return self._lookup(directory)

    def _lookup(self, directory: str) -> Config:
        cached = self._by_dir.get(directory)
        if cached is not None:
            return cached
        # The project the folder belongs to (the one root finder), then the
        # projects around it: the nearest pyproject.toml with a
        # [tool.torchlint] table is the config, as ruff finds its own.
        root = find_root(directory)
        config = None
        if root is not None:
            candidate = os.path.join(root, "pyproject.toml")
            if os.path.isfile(candidate):
                data = load_toml(candidate)
                if torchlint_table(data, candidate) is not None:
                    config = load_config(candidate, self.rules, data)
            if config is None:
                parent = os.path.dirname(root)
                config = Config() if parent == root else self._lookup(parent)
        self._by_dir[directory] = config if config is not None else Config()
        return self._by_dir[directory]
