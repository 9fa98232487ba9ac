"""What a rule is: its metadata, its examples, its findings and its fixes.

A rule is one class in one module of ``torchlint.rules``. Its docstring is its
user documentation (rendered by ``torchlint rule CODE``, ``docs/rules.md`` and
SARIF), and its ``VALID``/``INVALID`` examples become tests automatically.

Rules are visitors: a method ``visit_Call(self, node)`` is called for every
``libcst.Call`` in the file, ``leave_For(self, node)`` after a loop's body, and
``finish()`` once after the whole module, when every module-wide fact in
``self.ctx`` is complete. The engine walks each file once for all rules.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:  # pragma: no cover
    import libcst as cst

    from torchlint.model import FileModel

SAFE = "safe"
UNSAFE = "unsafe"
DISPLAY_ONLY = "display-only"
APPLICABILITIES = (SAFE, UNSAFE, DISPLAY_ONLY)

DOCS_URL = "https://github.com/torchlint/torchlint/blob/main/docs/rules.md"


@dataclass(frozen=True)
class Option:
    """A per-rule option, set under ``[tool.torchlint.rules.CODE]``."""

    type: type
    default: Any
    doc: str


# Every rule leaves test modules alone unless this option is set for it: judging.md's
# "not training code" (a test targets a device, syncs or skips no-grad on purpose, on
# tiny inputs nobody times). ``torchlint.linter`` does the skipping.
CHECK_TESTS = "check-tests"
CHECK_TESTS_OPTION = Option(
    bool, False, "also check test modules (test_*.py, *_test.py, conftest.py, tests/), skipped by default"
)


@dataclass(frozen=True)
class Valid:
    """Code on which the rule must stay silent."""

    code: str
    options: Dict[str, Any] = field(default_factory=dict)
    target_torch: Optional[str] = None

    @property
    def source(self) -> str:
        return _dedent(self.code)


@dataclass(frozen=True)
class Invalid:
    """Code on which the rule must fire.

    ``fixed`` is the source after ``--fix`` (plus ``--unsafe-fixes`` when
    ``unsafe_fixes`` is true); ``None`` means the fix changes nothing at that
    level (no fix, or a display-only one). ``count`` is the exact number of
    findings; ``line`` the row of the first; ``message`` a substring of it.
    """

    code: str
    fixed: Optional[str] = None
    unsafe_fixes: bool = False
    count: int = 1
    line: Optional[int] = None
    message: Optional[str] = None
    options: Dict[str, Any] = field(default_factory=dict)
    target_torch: Optional[str] = None

    @property
    def source(self) -> str:
        return _dedent(self.code)

    @property
    def fixed_source(self) -> Optional[str]:
        return None if self.fixed is None else _dedent(self.fixed)


def _dedent(code: str) -> str:
    return textwrap.dedent(code).lstrip("\n")


@dataclass(frozen=True)
class Edit:
    """Replace ``start``..``end`` with ``content``.

    Positions are (row, column): row 1-based, column 0-based, as libcst counts
    them. Either a node's range (resolved after the walk, when positions are
    known) or an explicit range.
    """

    content: str
    node: Optional["cst.CSTNode"] = None
    start: Optional[Tuple[int, int]] = None
    end: Optional[Tuple[int, int]] = None
    # "replace" covers the node; "line-before" inserts a whole line above the
    # line where the node starts, with the same indentation.
    mode: str = "replace"
    # The replacement as a node: its code is generated where it lands, with
    # the block's indentation on continuation lines and the file's newlines.
    new_node: Optional["cst.CSTNode"] = None


@dataclass(frozen=True)
class Fix:
    applicability: str
    message: str
    edits: Tuple[Edit, ...]

    def __post_init__(self) -> None:
        if self.applicability not in APPLICABILITIES:
            raise ValueError(f"bad applicability {self.applicability!r}")


@dataclass(frozen=True)
class Evidence:
    """One fact a finding rests on, and where it is: "`model` moved to the
    GPU" at train.py:40, "runs once per batch of `train_loader`" at :61.

    Either ``node``, a node of the linted file (placed after the walk, like a
    finding's own node), or an explicit place: ``path`` (another file of the
    project; ``None`` for the linted file) with ``row`` (1-based) and
    ``column`` (1-based)."""

    text: str
    node: Optional["cst.CSTNode"] = None
    path: Optional[str] = None
    row: Optional[int] = None
    column: int = 1


@dataclass(frozen=True)
class ResolvedEvidence:
    """An ``Evidence`` with its place: ``path`` is the file holding the fact."""

    text: str
    path: str
    row: int
    column: int  # 1-based
    cell: Optional[int] = None  # a notebook's cell (1-based); ``row`` is then the row in it


@dataclass
class Diagnostic:
    """One finding. Rows are 1-based; columns 1-based here (0-based for flake8)."""

    code: str
    name: str
    message: str
    path: str
    row: int
    column: int
    end_row: int
    end_column: int
    fix: Optional["ResolvedFix"] = None
    noqa_row: Optional[int] = None
    # The facts the finding rests on, in the order a reader follows them.
    evidence: Tuple[ResolvedEvidence, ...] = ()
    # In a notebook: the cell (1-based position among all its cells); ``row``
    # and ``end_row`` are then rows in that cell, ``noqa_row`` the row in the
    # program of its joined code cells (torchlint.notebook).
    cell: Optional[int] = None

    @property
    def place(self) -> str:
        """``12:5``, or ``cell 4:3:12`` in a notebook: what follows the path."""
        cell = f"cell {self.cell}:" if self.cell is not None else ""
        return f"{cell}{self.row}:{self.column}"

    @property
    def url(self) -> str:
        return f"{DOCS_URL}#{self.code.lower()}"

    def sort_key(self) -> Tuple:
        return (self.path, self.cell or 0, self.row, self.column, self.code)


@dataclass(frozen=True)
class ResolvedEdit:
    content: str
    start: Tuple[int, int]  # row 1-based, column 0-based
    end: Tuple[int, int]


@dataclass(frozen=True)
class ResolvedFix:
    applicability: str
    message: str
    edits: Tuple[ResolvedEdit, ...]


class Rule:
    """Base class of every rule. See the module docstring."""

    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    default_enabled: ClassVar[bool] = True
    # "always", "sometimes" or "none": whether findings carry a fix.
    fix_availability: ClassVar[str] = "none"
    added: ClassVar[str] = "0.1.0"
    # Each rule's own options; ``check-tests`` is added to every rule's (``__init_subclass__``).
    options: ClassVar[Dict[str, Option]] = {}
    # Text pre-filter: the rule can only fire on a file containing one of
    # these substrings. Empty means "run on every file". Claim a token here
    # only if the rule provably cannot fire without it.
    requires_any: ClassVar[Tuple[str, ...]] = ()
    VALID: ClassVar[List[Valid]] = []
    INVALID: ClassVar[List[Invalid]] = []

    # A rule about code that runs (every rule but the engine's TL000) leaves test modules alone.
    about_running_code: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.about_running_code:
            cls.options = {**cls.options, CHECK_TESTS: CHECK_TESTS_OPTION}

    def __init__(self, ctx: "FileModel", options: Dict[str, Any]) -> None:
        self.ctx = ctx
        self.opts = options

    def report(
        self, node: "cst.CSTNode", message: str, fix: Optional[Fix] = None, evidence: Sequence[Evidence] = ()
    ) -> None:
        self.ctx.report(self, node, message, fix, tuple(evidence))

    def finish(self) -> None:
        """Called once after the walk; module-wide facts are complete here."""

    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def option_defaults(cls) -> Dict[str, Any]:
        return {key: opt.default for key, opt in cls.options.items()}
