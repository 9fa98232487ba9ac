"""Positions of a few nodes (torchlint.positions) agree with libcst's
PositionProvider over the whole module, whatever sits around them."""
import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from torchlint.positions import positions_of
from torchlint.tree import child_nodes

SOURCES = {
    "header comments and blank lines": "#!/usr/bin/env python\n# a header\n\nimport torch\n\n\nx = torch.ones(3).cuda()\nprint(x.item())\n",
    "decorators and nested defs": (
        "import torch\n\n@torch.no_grad()\n# between\n@staticmethod\ndef f(a,\n      b=1):\n"
        "    def g():\n        return a.item()\n    return g\n\nclass C:\n    @property\n    def p(self):\n        return self.x.cpu()\n"
    ),
    "semicolons and continuation lines": "a = 1; b = f(a)\nc = (1 +\n     2)\nd = g(c,\n      h(b)) \\\n    + 3\n",
    "CRLF newlines": "import torch\r\nx = 1\r\n\r\ndef f():\r\n    return torch.zeros(2)\r\n",
    "CR newlines": "x = 1\ry = f(x)\r",
    "no trailing newline": "x = 1\ny = f(x)",
    "tabs and a footer comment": "if True:\n\tfor i in range(3):\n\t\tprint(i)\n# trailing\n",
    "multi-line strings": 'x = """\none\ntwo\n"""\ny = f(x)\n',
}


def all_nodes(node):
    yield node
    for child in child_nodes(node):
        yield from all_nodes(child)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_statement_alone_matches_the_whole_module(name):
    module = cst.parse_module(SOURCES[name])
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    for statement in module.body:
        nodes = list(all_nodes(statement))
        got = positions_of(module, nodes)
        assert {id(n): got[n] for n in nodes} == {id(n): expected[n] for n in nodes}


def test_nodes_in_several_statements_and_the_module_itself():
    module = cst.parse_module(SOURCES["decorators and nested defs"])
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    picked = [module.body[-1], module.body[1].body.body[0]]
    got = positions_of(module, picked)
    assert [got[n] for n in picked] == [expected[n] for n in picked]
    got = positions_of(module, [module, *picked])  # the module: no statement holds it
    assert [got[n] for n in (module, *picked)] == [expected[n] for n in (module, *picked)]


@pytest.mark.parametrize("name", ["linter.py", "walker.py", "collector.py"])
def test_every_node_of_a_real_module(name):
    import torchlint

    path = torchlint.__file__.replace("__init__.py", name)
    with open(path, encoding="utf-8") as handle:
        module = cst.parse_module(handle.read())
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    nodes = list(all_nodes(module))[1:]  # every statement holds some: the statement-by-statement path
    got = positions_of(module, nodes)
    assert [got[n] for n in nodes] == [expected[n] for n in nodes]
    got = positions_of(module, [module, *nodes])  # the whole-module path
    assert [got[n] for n in (module, *nodes)] == [expected[n] for n in (module, *nodes)]
