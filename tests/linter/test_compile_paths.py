"""TL000 comes from CPython's compiler whichever way a file is compiled
(whole without an ``ast`` tree, or as a tree and statement by statement),
and a file whose large literal must be elided always gets its tree."""
import ast
import sys

import pytest

from torchlint import linter
from torchlint.linter import LARGE_LITERAL_CHARS, elide_large_literals, may_hold_large_literal, python_syntax_errors

FUNCTIONS = "".join(f"def f{i}(x):\n    return x + {i}\n\n\n" for i in range(LARGE_LITERAL_CHARS // 20))
CLASS = "class Big:\n" + "".join(f"    def m{i}(self, x):\n        return x * {i}\n\n" for i in range(LARGE_LITERAL_CHARS // 20))
ROWS = LARGE_LITERAL_CHARS // 10

LITERALS = {
    "indented rows": "X = [\n" + "".join(f"    [{i}, {i / 2}, 'n{i}'],\n" for i in range(ROWS)) + "]\n",
    "rows at column 0": "X = [\n" + "".join(f"[{i}, -{i}],\n" for i in range(ROWS)) + "]\n",
    "constants at column 0": "X = (\n" + "".join(f"{'True' if i % 3 else 'None'},\n" for i in range(4 * ROWS)) + ")\n",
    "chained": "X = Y = [\n" + "".join(f"    {i},\n" for i in range(4 * ROWS)) + "]\n",
    "prefixed strings at column 0": "X = {\n" + "".join(f"b'k{i}': rb'v{i}',\n" for i in range(ROWS)) + "}\n",
    "annotated, a comment inside": "X: dict = {\n# keys\n" + "".join(f"    'k{i}': {i},\n" for i in range(ROWS)) + "}\n",
}


@pytest.mark.parametrize("name", sorted(LITERALS))
def test_a_large_literal_gets_its_tree_and_is_elided(name):
    source = "import torch\n\n" + LITERALS[name] + "\nprint(1)\n"
    assert may_hold_large_literal(source)
    tree, errors = linter._python_tree(source, "x.py")
    assert not errors and tree is not None
    assert elide_large_literals(source, tree) != source


@pytest.mark.parametrize("source", [FUNCTIONS, CLASS], ids=["functions", "class"])
def test_large_code_without_a_literal_is_compiled_whole(source):
    assert len(source) > LARGE_LITERAL_CHARS
    assert not may_hold_large_literal(source)
    assert linter._python_tree(source, "x.py") == (None, [])


@pytest.mark.parametrize("body", [FUNCTIONS, CLASS, LITERALS["indented rows"], "x = 1\n"], ids=["functions", "class", "literal", "small"])
@pytest.mark.parametrize(
    "error",
    ["return 1\n", "def g():\n    nonlocal q\n", "break\n", "def h(a, a):\n    pass\n", "f(x=1, x=2)\n", "x = (\n"],
)
def test_syntax_errors_are_cpythons_on_every_path(body, error):
    source = body + error
    try:
        compile(source, "x.py", "exec", dont_inherit=True)
    except SyntaxError as exc:
        expected = (exc.lineno, type(exc).__name__, exc.msg)
    else:
        pytest.fail("not an error")
    [diagnostic] = python_syntax_errors(source, "x.py")
    judge = f"(as Python {sys.version_info[0]}.{sys.version_info[1]} reads it)"  # which Python's verdict it is
    assert (diagnostic.row, diagnostic.message) == (expected[0], f"{expected[1]}: {expected[2]} {judge}")


def test_the_literal_precheck_misses_no_literal_elided_in_the_fixtures():
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        if elide_large_literals(text, tree) != text:
            assert may_hold_large_literal(text), path
