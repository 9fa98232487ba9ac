"""The lint's parse (libcst's, without per-node validation) builds the same
tree, and leaves validation on for everything else."""
import threading

import libcst as cst
import pytest

from torchlint import linter

SOURCES = [
    "import torch\n\n@torch.no_grad()\ndef f(a, *, b=1, **k) -> int:\n    return (a + b) * -k['x'] if a else [i for i in a]\n",
    "class C(Base, metaclass=M):\n    x: int = 1\n    async def g(self):\n        async with a as b:\n            await c\n",
    "x = f'{a!r:>{width}}' + rb'\\x00' + '''\nmulti\n'''\nlambda *a, **k: (yield)\n",
    "try:\n    pass\nexcept* ValueError as e:\n    raise\nfinally:\n    del x[1:2, ::3]\n",
    "match p:\n    case [1, *rest] | {'k': v} if v:\n        pass\n    case _:\n        pass\n",
    "x = 1;  y = 2 \\\n    + 3  # comment\r\nwhile not x: break\r\n",
]


@pytest.mark.parametrize("source", SOURCES)
def test_same_tree_as_libcst(source):
    ours = linter.parse_module(source)
    theirs = cst.parse_module(source)
    assert ours.deep_equals(theirs)
    assert ours.code == source


def test_syntax_errors_still_raise():
    with pytest.raises(cst.ParserSyntaxError):
        linter.parse_module("def f(:\n")


def test_validation_is_back_after_a_parse():
    linter.parse_module(SOURCES[0])
    with pytest.raises(cst.CSTValidationError):
        cst.Name("not a name")


def test_another_thread_builds_validated_nodes_during_a_parse(monkeypatch):
    outcome = []
    real_parse = cst.parse_module

    def parse_with_a_neighbour(text):
        def neighbour():
            try:
                cst.Name("not a name")
                outcome.append("built")
            except cst.CSTValidationError:
                outcome.append("rejected")

        thread = threading.Thread(target=neighbour)
        thread.start()
        thread.join()
        return real_parse(text)

    monkeypatch.setattr(linter.cst, "parse_module", parse_with_a_neighbour)
    linter.parse_module(SOURCES[0])
    assert outcome == ["rejected"]
