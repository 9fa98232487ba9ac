"""Project facts: which torch versions the code supports, and whether it is
CUDA-only by design.

Version-dependent rules ask one question, "does this claim hold on every torch
version the code supports?", and stay silent when the answer is not a proven
yes. The supported versions come from, in this order:

1. an explicit ``target-torch`` (``--target-torch``, ``[tool.torchlint]`` or
   flake8's ``--torchlint-target-torch``): the lower bound, nothing else;
2. otherwise the project's manifests, found upward from the linted file up to
   the project root (the nearest directory with a ``pyproject.toml``,
   ``setup.py``, ``setup.cfg`` or ``.git``): ``pyproject.toml`` (PEP 621
   dependencies and optional dependencies, Poetry), ``setup.py``
   (``install_requires`` and any other literal requirement), ``setup.cfg``,
   ``requirements*.txt`` (also ``requirements/*.txt``), ``environment.yml``
   (conda ``pytorch=1.13`` and its pip section) and Dockerfiles (an NGC
   ``nvcr.io/nvidia/pytorch:YY.MM`` base image, the official
   ``pytorch/pytorch:X.Y.Z-…`` image, or ``pip install torch==X.Y``).
   Several sources are joined as a union: the code supports every version
   that one of them admits;
3. the APIs the code uses raise the lower bound: ``torch.accelerator`` exists
   from 2.6, ``torch.amp.GradScaler`` from 2.3, ``torch.compile`` from 2.0.
   A file's own API use raises its floor; the whole project's API use raises
   the project's floor only when no manifest declares a lower bound (a
   declared bound stands for the package, whose examples and tests may use
   newer APIs). A file that tests the torch version or probes with
   ``hasattr(torch, …)`` does not count (it adapts to older versions). When
   the API floor is above a manifest's upper bound, the code wins and the
   upper bound is dropped.

Versions are ``(major, minor)`` tuples; bounds are inclusive.
"""

from __future__ import annotations

import ast
import configparser
import hashlib
import os
import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

Version = Tuple[int, int]
_NO_MINOR_LIMIT = 999

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# NGC PyTorch container release (YY.MM) -> the torch its image is built on.
# NVIDIA builds from a pre-release of the next torch ("2.3.0a0"), which has
# that release's APIs; the table records that version. 22.12-23.02 ship
# "1.14.0a0", the pre-release that became 2.0 (it has torch.compile): 2.0.
#
# Checked (2026-11) against what NVIDIA publishes:
# - the release notes, docs.nvidia.com/deeplearning/frameworks/pytorch-release-notes/:
#   rel_20-02.html "version 20.02 is based on PyTorch 1.4.0a0+a5b4d78",
#   rel-25-12.html "version 25.12 is based on 2.10.0a0+b4e4ee81d3"; their text
#   for 25.02 ("2.7.0a0+6c54963f75") and 25.10 ("2.9.0a0+145a3a7bda") as quoted
#   in github.com/foundation-model-stack/fms-hf-tuning/pull/675;
# - the banner each container prints at start ("NVIDIA Release YY.MM (build …)
#   PyTorch Version …"), as recorded in public repositories: 20.08 1.7.0a0,
#   20.12 1.8.0a0, 21.07 1.10.0a0, 21.10 1.10.0a0, 22.03 1.12.0a0, 22.12 1.14.0a0,
#   23.05 2.0.0, 23.10 2.1.0a0, 24.01 2.2.0a0, 24.02 2.3.0a0, 24.03 2.3.0a0,
#   24.10 2.5.0a0, 24.12 2.6.0a0, 25.01 2.6.0a0, 25.03 2.7.0a0, 25.06 2.8.0a0,
#   25.09 2.9.0a0; and 23.03 2.0.0a0+1767026 (a Dockerfile citing
#   rel-23-03.html), 23.04 2.1.0a0+fe05266f, 22.04 1.12.0, 23.01 1.14.0a0.
# Every entry checked agreed with the table; the others are not yet checked
# against a source. A tag not in the table (no source found for 25.07, and no
# container found for 20.04, 20.05 or 21.01) says nothing about the version.
NGC_PYTORCH: Dict[str, Version] = {
    "20.01": (1, 4),
    "20.02": (1, 4),
    "20.03": (1, 5),
    "20.06": (1, 6),
    "20.07": (1, 6),
    "20.08": (1, 7),
    "20.09": (1, 7),
    "20.10": (1, 7),
    "20.11": (1, 8),
    "20.12": (1, 8),
    "21.02": (1, 8),
    "21.03": (1, 9),
    "21.04": (1, 9),
    "21.05": (1, 9),
    "21.06": (1, 9),
    "21.07": (1, 10),
    "21.08": (1, 10),
    "21.09": (1, 10),
    "21.10": (1, 10),
    "21.11": (1, 11),
    "21.12": (1, 11),
    "22.01": (1, 11),
    "22.02": (1, 11),
    "22.03": (1, 12),
    "22.04": (1, 12),
    "22.05": (1, 12),
    "22.06": (1, 13),
    "22.07": (1, 13),
    "22.08": (1, 13),
    "22.09": (1, 13),
    "22.10": (1, 13),
    "22.11": (1, 13),
    "22.12": (2, 0),
    "23.01": (2, 0),
    "23.02": (2, 0),
    "23.03": (2, 0),
    "23.04": (2, 1),
    "23.05": (2, 0),
    "23.06": (2, 1),
    "23.07": (2, 1),
    "23.08": (2, 1),
    "23.09": (2, 1),
    "23.10": (2, 1),
    "23.11": (2, 2),
    "23.12": (2, 2),
    "24.01": (2, 2),
    "24.02": (2, 3),
    "24.03": (2, 3),
    "24.04": (2, 3),
    "24.05": (2, 4),
    "24.06": (2, 4),
    "24.07": (2, 4),
    "24.08": (2, 5),
    "24.09": (2, 5),
    "24.10": (2, 5),
    "24.11": (2, 6),
    "24.12": (2, 6),
    "25.01": (2, 6),
    "25.02": (2, 7),
    "25.03": (2, 7),
    "25.04": (2, 7),
    "25.05": (2, 8),
    "25.06": (2, 8),
    "25.08": (2, 8),
    "25.09": (2, 9),
    "25.10": (2, 9),
    "25.11": (2, 10),
    "25.12": (2, 10),
}

# API use -> the first torch that has it.
API_FLOORS: Tuple[Tuple[re.Pattern, Version, str], ...] = (
    (re.compile(r"\btorch\.accelerator\b"), (2, 6), "torch.accelerator"),
    (re.compile(r"\btorch\.amp\.GradScaler\b"), (2, 3), "torch.amp.GradScaler"),
    (re.compile(r"\btorch\.compile\b"), (2, 0), "torch.compile"),
)
# A file that checks the version or probes for an API adapts to older torch.
_VERSION_PROBE = re.compile(
    r"__version__|hasattr\(\s*torch\b|version\.parse|is_torch_version|TORCH_VERSION|torch_version"
)

_ROOT_MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
_SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        "build",
        "dist",
        "node_modules",
        "site-packages",
        "__pycache__",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".torchlint_cache",
        ".eggs",
    }
)
_SCAN_LIMIT = 20000
EXPLICIT = "target-torch"  # files scanned for API use; beyond it the floor is left where it is


@dataclass(frozen=True)
class TorchRange:
    """The torch versions the code supports: inclusive bounds, None when open."""

    lower: Optional[Version] = None
    upper: Optional[Version] = None
    sources: Tuple[str, ...] = ()

    @property
    def known(self) -> bool:
        return self.lower is not None or self.upper is not None

    def describe(self) -> str:
        low = ".".join(map(str, self.lower)) if self.lower else "?"
        high = (
            ".".join(map(str, self.upper))
            if self.upper and self.upper[1] != _NO_MINOR_LIMIT
            else (f"{self.upper[0]}.x" if self.upper else "")
        )
        if self.lower is None and high:
            return f"<={high}"
        return f">={low}" + (f",<={high}" if high else "")


@dataclass(frozen=True)
class ProjectFacts:
    root: Optional[str] = None
    torch: TorchRange = field(default_factory=TorchRange)
    # CUDA extension modules the project builds (setup.py ``CUDAExtension(name)``).
    cuda_extensions: Tuple[str, ...] = ()
    # The project's own modules that require CUDA (see ``requires_cuda``), as dotted names.
    cuda_only_modules: Tuple[str, ...] = ()

    @property
    def cuda_only_imports(self) -> Tuple[str, ...]:
        """Importing one of these makes a module CUDA-only by design."""
        return self.cuda_extensions + self.cuda_only_modules


# -- requirement specifiers ------------------------------------------------------
_REQUIREMENT = re.compile(r"^\s*(?P<name>torch|pytorch)\s*(\[[^\]]*\])?\s*(?P<spec>[^;#]*)", re.IGNORECASE)
_CLAUSE = re.compile(r"(===|==|~=|>=|<=|!=|>|<|=)\s*v?(\d+)(?:\.(\d+|\*))?(?:\.(\d+|\*))?")


def parse_specifier(spec: str) -> Optional[Tuple[Optional[Version], Optional[Version]]]:
    """``>=1.8,<2.2`` -> ((1, 8), (2, 1)); None when it bounds nothing."""
    lower: Optional[Version] = None
    upper: Optional[Version] = None
    for match in _CLAUSE.finditer(spec):
        op, major_text, minor_text, patch_text = match.groups()
        major = int(major_text)
        minor = int(minor_text) if minor_text and minor_text != "*" else None
        patch = int(patch_text) if patch_text and patch_text != "*" else 0
        if op in ("==", "===", "="):
            low = (major, minor or 0)
            high = (major, minor) if minor is not None else (major, _NO_MINOR_LIMIT)
        elif op == "~=":
            low = (major, minor or 0)
            # minor is None here only for "~=1.*.2", a wildcard that PEP 440 forbids with ~=.
            high = (major, minor) if patch_text else (major, _NO_MINOR_LIMIT)  # type: ignore[assignment]
        elif op in (">=", ">"):
            low, high = (major, minor or 0), None
        elif op == "<=":
            low, high = None, (major, minor if minor is not None else _NO_MINOR_LIMIT)
        elif op == "<":
            low = None
            if minor is None:
                high = (major - 1, _NO_MINOR_LIMIT)
            elif patch > 0:
                high = (major, minor)
            else:
                high = (major, minor - 1) if minor > 0 else (major - 1, _NO_MINOR_LIMIT)
        else:  # != excludes one version: no bound
            continue
        if low is not None:
            lower = low if lower is None else max(lower, low)
        if high is not None:
            upper = high if upper is None else min(upper, high)
    if lower is None and upper is None:
        return None
    return lower, upper


def requirement_range(requirement: str) -> Optional[Tuple[Optional[Version], Optional[Version]]]:
    """The bounds a ``torch…`` requirement line puts on torch (not torchvision)."""
    match = _REQUIREMENT.match(requirement)
    if not match:
        return None
    rest = requirement[match.end("name") :]
    if rest[:1] and (rest[0].isalnum() or rest[0] in "-_."):
        return None  # torchvision, torch-geometric, pytorch-lightning, …
    return parse_specifier(match.group("spec").split("+")[0] if "+" in match.group("spec") else match.group("spec"))


# -- manifests -------------------------------------------------------------------
def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def from_pyproject(text: str) -> Tuple[List[str], Optional[Version]]:
    """Requirement strings, and the explicit ``[tool.torchlint] target-torch``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return [], None
    explicit = _table(_table(data.get("tool")).get("torchlint")).get("target-torch")
    match = re.match(r"^\s*(\d+)\.(\d+)", str(explicit)) if explicit is not None else None
    return _pyproject_requirements(data), (int(match.group(1)), int(match.group(2))) if match else None


def _table(value: Any) -> Dict[str, Any]:
    """A TOML table, or an empty one where the file has something else
    (``project = "x"``): validating pyproject.toml is the packaging tools' job."""
    return value if isinstance(value, dict) else {}


def _array(value: Any) -> List[Any]:
    return value if isinstance(value, list) else []


def _pyproject_requirements(data: Dict[str, Any]) -> List[str]:
    project = _table(data.get("project"))
    requirements = list(_array(project.get("dependencies")))
    for extra in _table(project.get("optional-dependencies")).values():
        requirements.extend(_array(extra))
    poetry = _table(_table(data.get("tool")).get("poetry"))
    groups = [_table(group).get("dependencies") for group in _table(poetry.get("group")).values()]
    for table in [poetry.get("dependencies")] + groups:
        value = _table(table).get("torch")
        if isinstance(value, dict):
            value = value.get("version")
        if isinstance(value, str):
            requirements.append("torch" + _poetry_spec(value))
    return [r for r in requirements if isinstance(r, str)]


def _poetry_spec(value: str) -> str:
    value = value.strip()
    if value.startswith("^"):
        major, _, minor = value[1:].partition(".")
        minor = minor.split(".")[0] or "0"
        return f">={major}.{minor},<{int(major) + 1}" if major != "0" else f">={major}.{minor}"
    if value[:1].isdigit():
        return f"=={value}"
    return value


def from_setup_py(text: str) -> Tuple[List[str], List[str]]:
    """Requirement strings and CUDAExtension names found in a setup.py."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return [], []
    requirements, extensions = [], []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _REQUIREMENT.match(node.value):
            requirements.append(node.value)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "CUDAExtension":
                first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    extensions.append(first.value)
    return requirements, extensions


def from_setup_cfg(text: str) -> List[str]:
    parser = configparser.ConfigParser()
    try:
        parser.read_string(text)
    except configparser.Error:
        return []
    lines: List[str] = []
    if parser.has_option("options", "install_requires"):
        lines.extend(parser.get("options", "install_requires").splitlines())
    if parser.has_section("options.extras_require"):
        for _, value in parser.items("options.extras_require"):
            lines.extend(value.splitlines())
    return [line.strip() for line in lines if line.strip()]


def from_requirements(text: str) -> List[str]:
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if not line.lstrip().startswith(("-", "#"))]


def from_environment_yml(text: str) -> List[str]:
    """conda ``pytorch=1.13.1`` / ``pytorch>=2.0`` and pip ``torch==…`` entries."""
    found = []
    for line in text.splitlines():
        item = line.strip()
        if not item.startswith("-"):
            continue
        item = item.lstrip("-").strip().strip("'\"")
        item = item.split("::", 1)[-1]  # pytorch::pytorch=2.1
        if _REQUIREMENT.match(item):
            found.append(item)
    return found


_NGC_IMAGE = re.compile(r"nvcr\.io/nvidia/pytorch:(\d\d\.\d\d)")
_OFFICIAL_IMAGE = re.compile(r"\bpytorch/pytorch:(\d+\.\d+)")
_PIP_TORCH = re.compile(r"\btorch\s*(==|>=|~=)\s*\d+\.\d+[\w.*+]*")


def from_dockerfile(text: str) -> Tuple[List[Tuple[Version, Version]], List[str]]:
    """(version ranges from base images, requirement strings from pip installs)."""
    images: List[Tuple[Version, Version]] = []
    requirements: List[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.upper().startswith("FROM"):
            ngc = _NGC_IMAGE.search(stripped)
            if ngc and ngc.group(1) in NGC_PYTORCH:
                version = NGC_PYTORCH[ngc.group(1)]
                images.append((version, version))
            official = _OFFICIAL_IMAGE.search(stripped)
            if official:
                major, minor = official.group(1).split(".")
                images.append(((int(major), int(minor)), (int(major), int(minor))))
        elif "pip" in stripped and "install" in stripped:
            requirements.extend(m.group(0).replace(" ", "") for m in _PIP_TORCH.finditer(stripped))
    return images, requirements


# -- discovery: the one root finder ------------------------------------------------
_PACKAGING_MARKERS = ("pyproject.toml", "setup.cfg", "setup.py")


def find_root(path: str) -> Optional[str]:
    """The project ``path`` (a file or a folder) belongs to: the nearest folder
    at or above it with a ``pyproject.toml``, ``setup.cfg`` or packaging
    ``setup.py``; without one, the nearest with ``.git``; else None. The
    config, the result cache and the analysis all ask this one function."""
    absolute = os.path.abspath(path)
    start = absolute if os.path.isdir(absolute) else os.path.dirname(absolute)
    found = _nearest(start, _PACKAGING_MARKERS)
    return found if found is not None else _nearest(start, (".git",))


def _nearest(folder: str, markers: Tuple[str, ...]) -> Optional[str]:
    while True:
        if any(_is_root_marker(os.path.join(folder, marker)) for marker in markers):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def _is_root_marker(path: str) -> bool:
    """A marker file exists; a ``setup.py`` must be a packaging script (a
    package may have a module of that name, ``pkg/eval/setup.py``)."""
    if not os.path.exists(path):
        return False
    if not path.endswith("setup.py"):
        return True
    text = _read(path) or ""
    return "setuptools" in text or "distutils" in text or "setup(" in text and "install_requires" in text


def is_project_root(folder: str) -> bool:
    """Does ``folder`` start a project of its own (a nested one is skipped by
    the project around it)?"""
    return any(_is_root_marker(os.path.join(folder, marker)) for marker in _ROOT_MARKERS)


def _manifest_paths(root: str) -> Iterable[Tuple[str, str]]:
    """(kind, path) of every manifest directly in the root (and requirements/, docker/)."""
    places = [root] + [os.path.join(root, d) for d in ("requirements", "docker", ".devcontainer")]
    for place in places:
        try:
            names = sorted(os.listdir(place))
        except OSError:
            continue
        nested = place != root
        for name in names:
            path = os.path.join(place, name)
            lower = name.lower()
            if not nested and name == "pyproject.toml":
                yield "pyproject", path
            elif not nested and name == "setup.py":
                yield "setup.py", path
            elif not nested and name == "setup.cfg":
                yield "setup.cfg", path
            elif lower.endswith(".txt") and (lower.startswith("requirements") or place.endswith("requirements")):
                yield "requirements", path
            elif lower in ("environment.yml", "environment.yaml", "conda.yml", "conda.yaml"):
                yield "environment", path
            elif lower.startswith("dockerfile") or lower.endswith(".dockerfile"):
                yield "dockerfile", path


def declared_range(root: str, read_config: bool = True) -> Tuple[TorchRange, Tuple[str, ...]]:
    """The union of the torch ranges the project's manifests declare, and the
    CUDA extensions its setup.py builds."""
    ranges: List[Tuple[Optional[Version], Optional[Version], str]] = []
    extensions: List[str] = []
    for kind, path in _manifest_paths(root):
        text = _read(path)
        if text is None:
            continue
        requirements: List[str] = []
        if kind == "pyproject":
            requirements, explicit = from_pyproject(text)
            if explicit is not None and read_config:
                return TorchRange(explicit, None, (EXPLICIT,)), tuple(extensions)
        elif kind == "setup.py":
            requirements, built = from_setup_py(text)
            extensions.extend(built)
        elif kind == "setup.cfg":
            requirements = from_setup_cfg(text)
        elif kind == "requirements":
            requirements = from_requirements(text)
        elif kind == "environment":
            requirements = from_environment_yml(text)
        elif kind == "dockerfile":
            images, requirements = from_dockerfile(text)
            ranges.extend((low, high, os.path.relpath(path, root)) for low, high in images)
        for requirement in requirements:
            bounds = requirement_range(requirement)
            if bounds is not None:
                ranges.append((bounds[0], bounds[1], os.path.relpath(path, root)))
    return union(ranges), tuple(extensions)


def union(ranges: List[Tuple[Optional[Version], Optional[Version], str]]) -> TorchRange:
    if not ranges:
        return TorchRange()
    lowers = [low for low, _, _ in ranges]
    uppers = [high for _, high, _ in ranges]
    lower = None if any(low is None for low in lowers) else min(lowers)  # type: ignore[type-var]
    upper = None if any(high is None for high in uppers) else max(uppers)  # type: ignore[type-var]
    sources = tuple(dict.fromkeys(source for _, _, source in ranges))
    return TorchRange(lower, upper, sources)


def api_floor(text: str, tree: Optional[ast.Module] = None) -> Optional[Tuple[Version, str]]:
    """The newest torch API an (unguarded) source text uses in its code, and
    its name. The text is searched first; only a file that mentions an API is
    parsed (unless the caller has CPython's ``tree`` of it already), to tell
    code (``torch.compile(model)``) from strings and comments that merely name it."""
    if "torch" not in text or _VERSION_PROBE.search(text):
        return None
    mentioned = [
        (version, name) for pattern, version, name in API_FLOORS if name in text and pattern.search(text)
    ]  # the name first: 10x cheaper
    if not mentioned:
        return None
    tree = tree or parse_source(text)
    if tree is None:
        return None
    used = {_dotted(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found = [(version, name) for version, name in mentioned if name in used]
    return max(found) if found else None


# Modules that torch removed: importing one unguarded (not under ``try``) shows
# that the code runs only on the torch versions before the removal.
REMOVED_MODULES = (("torch._six", (1, _NO_MINOR_LIMIT), "torch._six (removed in torch 2.0)"),)


def api_ceiling(text: str, tree: Optional[ast.Module] = None) -> Optional[Tuple[Version, str]]:
    """The newest torch a source text can run on, when it imports, at module
    level and outside any ``try``, a module torch has removed
    (``from torch._six import inf``), and what shows it."""
    mentioned = [entry for entry in REMOVED_MODULES if entry[0] in text]
    if not mentioned:
        return None
    tree = tree or parse_source(text)
    if tree is None:
        return None
    imported = set()
    for statement in tree.body:  # module level only: a ``try`` or a function is a guard
        if isinstance(statement, ast.ImportFrom) and statement.module and statement.level == 0:
            imported.add(statement.module)
        elif isinstance(statement, ast.Import):
            imported.update(alias.name for alias in statement.names)
    found = [(ceiling, why) for module, ceiling, why in mentioned if module in imported]
    return min(found) if found else None


def lower_ceiling(torch: TorchRange, ceiling: Optional[Tuple[Version, str]]) -> TorchRange:
    """Bound the range from above by what the code shows, when nothing else
    does (no manifest's upper bound, no explicit ``target-torch``), and the
    declared oldest torch does not contradict it."""
    if ceiling is None or torch.upper is not None or EXPLICIT in torch.sources:
        return torch
    if torch.lower is not None and torch.lower > ceiling[0]:
        return torch
    return TorchRange(torch.lower, ceiling[0], torch.sources + (ceiling[1],))


def parse_source(text: str) -> Optional[ast.Module]:
    """CPython's tree of a source text, or None when it does not parse."""
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


_REQUIRES_CUDA_HINT = re.compile(r"set_device|nccl|Trainer")


def requires_cuda(text: str) -> bool:
    """Does the module, unconditionally, call ``torch.cuda.set_device(...)``,
    set up an NCCL process group (``init_process_group(backend="nccl")``,
    ``args.dist_backend = "nccl"``), or build a Lightning ``Trainer`` that
    asks for GPUs (``accelerator="gpu"``, ``gpus=1``, ``devices=[0]``)? Each
    fails without CUDA, as an assertion would, and the Trainer then places
    the batches itself. Inside a function counts (it runs whenever the
    function does); under an ``if``/``try``/conditional expression does not,
    except the ``if __name__ == "__main__":`` guard."""
    if not _REQUIRES_CUDA_HINT.search(text):
        return False
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return False
    lightning = any(
        (isinstance(node, ast.Import) and any(a.name.split(".")[0] in _LIGHTNING for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in _LIGHTNING)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    )
    return _requires_cuda(tree.body, lightning)


_LIGHTNING = ("lightning", "pytorch_lightning")


def _requires_cuda(body: List[ast.stmt], lightning: bool = False) -> bool:
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if _requires_cuda(statement.body, lightning):
                return True
        elif isinstance(statement, ast.If):
            test = statement.test
            if isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__":
                if _requires_cuda(statement.body, lightning):
                    return True
        elif isinstance(statement, (ast.Expr, ast.Assign)) and (
            _needs_cuda(statement) or (lightning and _builds_gpu_trainer(statement))
        ):
            return True
    return False


def _builds_gpu_trainer(statement: ast.stmt) -> bool:
    """``trainer = pl.Trainer(devices=[0])`` or ``Trainer(accelerator="gpu").fit(model)``."""
    call = statement.value  # type: ignore[attr-defined]
    while isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Call):
        call = call.func.value  # ``Trainer(...).fit(...)``
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) != "Trainer":
        return False
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    accelerator = keywords.get("accelerator")
    if isinstance(accelerator, ast.Constant):
        if accelerator.value in ("gpu", "cuda"):
            return True
        if accelerator.value not in ("auto", None):
            return False  # "cpu", "mps", "tpu": not CUDA
    gpus = keywords.get("gpus")
    if isinstance(gpus, ast.Constant) and isinstance(gpus.value, int) and not isinstance(gpus.value, bool):
        return gpus.value != 0
    devices = keywords.get("devices", gpus)
    # A list of device indices: no CPU accelerator takes one.
    return (
        isinstance(devices, (ast.List, ast.Tuple))
        and bool(devices.elts)
        and all(isinstance(e, ast.Constant) and isinstance(e.value, int) for e in devices.elts)
    )


def _needs_cuda(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Assign):
        target = statement.targets[0]
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        return name.endswith("backend") and _is_nccl(statement.value)
    call = statement.value  # type: ignore[attr-defined]
    if not isinstance(call, ast.Call):
        return False
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name == "set_device":
        owner = func.value if isinstance(func, ast.Attribute) else None
        return isinstance(owner, ast.Attribute) and owner.attr == "cuda"
    if name == "init_process_group":
        backend = next((k.value for k in call.keywords if k.arg == "backend"), call.args[0] if call.args else None)
        return backend is not None and _is_nccl(backend)
    return False


def _is_nccl(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value == "nccl"


def _module_name(relpath: str) -> str:
    parts = relpath[:-3].replace(os.sep, "/").split("/")
    if parts and parts[0] == "src":
        parts = parts[1:]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def scan_sources(root: str) -> Tuple[Optional[Tuple[Version, str]], Tuple[str, ...]]:
    """One pass over the project's Python files: the newest API they use
    (unguarded), and the modules that require CUDA."""
    best: Optional[Tuple[Version, str]] = None
    cuda_only: List[str] = []
    scanned = 0
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(
            d
            for d in dirs
            if d not in _SKIP_DIRS and not d.startswith(".") and not is_project_root(os.path.join(directory, d))
        )
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            scanned += 1
            if scanned > _SCAN_LIMIT:
                return best, tuple(cuda_only)
            text = _read(os.path.join(directory, name))
            if not text:
                continue
            relpath = os.path.relpath(os.path.join(directory, name), root)
            found = api_floor(text)
            if found is not None and (best is None or found[0] > best[0]):
                best = (found[0], f"{found[1]} in {relpath}")
            if requires_cuda(text):
                cuda_only.append(_module_name(relpath))
    return best, tuple(m for m in cuda_only if m)


def raise_floor(torch: TorchRange, floor: Optional[Tuple[Version, str]]) -> TorchRange:
    if floor is None or (torch.lower is not None and torch.lower >= floor[0]):
        return torch
    upper = torch.upper if torch.upper is None or torch.upper >= floor[0] else None
    return TorchRange(floor[0], upper, torch.sources + (floor[1],))


def facts_for_root(root: Optional[str], read_config: bool = True) -> ProjectFacts:
    """What the manifests in ``root`` declare, raised by the API use of the
    project's own files (nested projects left out)."""
    if root is None:
        return ProjectFacts()
    declared, extensions = declared_range(root, read_config)
    floor, cuda_only = scan_sources(root)
    if declared.lower is None:
        # Nothing declares the oldest torch: the project's own API use shows it.
        # (A declared bound stands for the package; an example or a test that
        # uses a newer API raises the floor of that file only, see for_file.)
        declared = raise_floor(declared, floor)
    return ProjectFacts(root=root, torch=declared, cuda_extensions=extensions, cuda_only_modules=cuda_only)


_SKIPPED_SOURCE_DIRS = frozenset({"__pycache__", "node_modules", "build", "dist", "site-packages", "venv", "env"})
_MAX_FILES = 5000


class Project:
    """One project: its root, its files, its facts, and what the analysis of
    its files learnt, kept for the process that made it (``memo``).

    A folder without a root marker (scripts beside a package, no manifest)
    is a project for the analysis (its imports resolve against its tree) but
    declares nothing: its facts are empty."""

    def __init__(self, root: str, marked: bool, frozen: Optional[Mapping[str, bytes]] = None) -> None:
        self.root = root
        self.marked = marked
        # absolute path -> the bytes to read instead of the disk (``Projects.freeze``)
        self._frozen = frozen or {}
        self._facts: Dict[bool, ProjectFacts] = {}
        self._files: Optional[List[str]] = None
        self._texts: Optional[Dict[str, str]] = None
        self._memo: Dict[str, Dict[Any, Any]] = {}

    def facts(self, read_config: bool = True) -> ProjectFacts:
        """The supported torch range and the CUDA-only modules; ``read_config=False``
        (``--isolated``) ignores ``[tool.torchlint] target-torch``."""
        found = self._facts.get(read_config)
        if found is None:
            found = self._facts[read_config] = facts_for_root(self.root if self.marked else None, read_config)
        return found

    def files(self) -> List[str]:
        """The project's Python files, without those of projects nested in it."""
        if self._files is None:
            found: List[str] = []
            for folder, dirs, names in os.walk(self.root):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if not d.startswith(".")
                    and d not in _SKIPPED_SOURCE_DIRS
                    and not is_project_root(os.path.join(folder, d))
                )
                found.extend(os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))
                if len(found) > _MAX_FILES:
                    break
            self._files = found
        return self._files

    def texts(self) -> Dict[str, str]:
        """Path -> decoded text of every file of ``files()`` that can be read."""
        if self._texts is None:
            from torchlint import source as sources

            self._texts = {}
            for path in self.files():
                try:
                    data = self._frozen.get(os.path.abspath(path))
                    if data is None:
                        with open(path, "rb") as handle:
                            data = handle.read()
                    self._texts[path] = sources.decode(data).text
                except (OSError, sources.DecodeError):
                    continue  # the lint of the file reports it
        return self._texts

    def memo(self, table: str) -> Dict[Any, Any]:
        """A table of answers about this project, kept as long as the project is."""
        return self._memo.setdefault(table, {})

    def digest(self) -> str:
        """What the project's cross-file facts are computed from: every file
        of it, by path, size and modification time (the result cache's
        dependency record)."""
        hasher = hashlib.sha256()
        for path in self.files():
            try:
                stat = os.stat(path)
            except OSError:
                continue
            hasher.update(
                f"{os.path.relpath(path, self.root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode(
                    "utf-8", "surrogatepass"
                )
            )
        return hasher.hexdigest()


class Projects:
    """The projects of one run (the CLI, a flake8 process, one ``lint_text``
    call): each root found once, each project made once. Also records which
    projects a lint consulted beyond its own file, for the result cache."""

    def __init__(self) -> None:
        self._by_folder: Dict[str, Project] = {}
        self._by_root: Dict[str, Project] = {}
        self._consulted: Optional[set] = None
        self._frozen: Dict[str, bytes] = {}

    def freeze(self, contents: Mapping[str, bytes]) -> None:
        """Read these files (path -> bytes) from ``contents`` instead of the
        disk, and forget every project and fact learnt so far; ``freeze({})``
        ends it. While ``--fix`` rewrites files, other files' facts are read
        from the contents the round started from (``runner.fix_to_fixed_point``),
        not from whatever the disk holds when a worker gets there: the fixes
        of a round never depend on which worker fixed which file first."""
        self._by_folder.clear()
        self._by_root.clear()
        self._frozen = {os.path.abspath(path): data for path, data in contents.items()}

    def for_path(self, path: str) -> Project:
        absolute = os.path.abspath(path)
        folder = absolute if os.path.isdir(absolute) else os.path.dirname(absolute)
        project = self._by_folder.get(folder)
        if project is None:
            root = find_root(folder)
            marked = root is not None
            if root is None:
                root = _package_folder(folder)
            project = self._by_root.get(root)
            if project is None:
                project = self._by_root[root] = Project(root, marked, self._frozen)
            self._by_folder[folder] = project
        return project

    def consult(self, project: Project) -> None:
        """A lint read facts of other files of ``project``."""
        if self._consulted is not None:
            self._consulted.add(project.root)

    def record_consulted(self) -> None:
        """Start recording the project roots the next lint consults."""
        self._consulted = set()

    def consulted(self) -> List[str]:
        """The project roots consulted since ``record_consulted``; stops recording."""
        roots, self._consulted = sorted(self._consulted or ()), None
        return roots

    def digest(self, root: str) -> str:
        return self.for_path(root).digest()


def _package_folder(folder: str) -> str:
    """Without a root marker: the folder that holds the file's top-level
    package (``data/build.py`` of a package ``data/`` and the ``main.py``
    beside ``data/`` are one project)."""
    for _ in range(12):
        if not os.path.exists(os.path.join(folder, "__init__.py")):
            break
        folder = os.path.dirname(folder)
    return folder


# test_x.py, x_test.py, conftest.py, or anything under test/, tests/, testing/
_TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)(test_[^/]*|[^/]*_tests?|conftest)\.pyi?$")


def is_test_module(path: str) -> bool:
    """A test module: rules about performance and portability skip these by
    default (a test targets a device, or skips no-grad, on purpose)."""
    return bool(_TEST_PATH.search(path.replace("\\", "/")))


def with_target(facts: Optional[ProjectFacts], explicit: Optional[Version]) -> ProjectFacts:
    """``facts`` with the explicit ``target-torch`` (if any) replacing the declared range."""
    facts = facts or ProjectFacts()
    if explicit is None:
        return facts
    return replace(facts, torch=TorchRange(explicit, None, (EXPLICIT,)))


def for_file(facts: ProjectFacts, source: str, tree: Optional[ast.Module] = None) -> TorchRange:
    """The project's range with the file's own API use raising the floor
    (an explicit ``target-torch`` is taken as given)."""
    if EXPLICIT in facts.torch.sources:
        return facts.torch
    return raise_floor(facts.torch, api_floor(source, tree))


def infer_target_torch(pyproject: Dict[str, Any]) -> Optional[Version]:
    """The lower bound of the torch requirement in a parsed pyproject.toml."""
    ranges = []
    for requirement in _pyproject_requirements(pyproject):
        bounds = requirement_range(requirement)
        if bounds is not None:
            ranges.append((bounds[0], bounds[1], "pyproject.toml"))
    return union(ranges).lower
