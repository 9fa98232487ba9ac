"""The editor's parse in pieces (torchlint.incremental): the same module and the same findings as a whole
parse, with only the changed top-level statement parsed again, and positions that follow the edit."""
import textwrap

import libcst as cst
import pytest
from libcst.metadata import MetadataWrapper, PositionProvider

from torchlint.cli import Settings, build_parser
from torchlint.incremental import ChunkedParser
from torchlint.linter import lint_text, parse_module
from torchlint.positions import PlacementMemo, positions_of
from torchlint.tree import child_nodes

SOURCES = {
    "header, cookie and comments between statements": (
        "#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n# a header\n\nimport torch\n\n# about f\n\n"
        "def f():\n    return 1\n\n\n# about g\nx = f()\n"
    ),
    "decorators, a class and async": (
        "import torch\n\n@torch.no_grad()\n# between decorators\n@staticmethod\ndef f(a,\n      b=1):\n"
        "    def g():\n        return a.item()\n    return g\n\nclass C:\n    @property\n    def p(self):\n"
        "        return self.x.cpu()\n\nasync def h():\n    await x\n"
    ),
    "semicolons and continuations": "a = 1; b = f(a)\nc = (1 +\n     2)\nd = g(c,\n      h(b)) \\\n    + 3\n",
    "indented comments after a body": "def f():\n    x = 1\n    # still inside\n  # less indented\n# at the margin\ny = 2\n",
    "two indentation units": "def f():\n    return 1\n\nx = 3\n\ndef g():\n  if x:\n    return 2\n  return 3\n",
    "first block indented by two": "x = 1\nif x:\n  y = 2\nz = 3\ndef f():\n    return 4\n",
    "tabs": "if True:\n\tfor i in range(3):\n\t\tprint(i)\nx = 1\n",
    "no trailing newline and a footer": "x = 1\ny = f(x)\n# the end\n\n",
    "no trailing newline": "x = 1\ny = f(x)",
    "multi-line strings": 'x = """\none\ntwo\n"""\ny = f(x)\n',
    "if main": "import sys\n\n\ndef main():\n    return 0\n\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
}

TRAIN = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def setup(dataset):
        # a helper above the loop
        return DataLoader(dataset, batch_size=32)


    def train(model, optimizer, dataset, device):
        loader = setup(dataset)
        for images, labels in loader:
            images = images.to(device)
            optimizer.zero_grad()
            loss = model(images).sum()
            loss.backward()
            optimizer.step()
            print(loss.item())


    def evaluate(model, loader, device):
        total = 0
        for images, labels in loader:
            total += model(images.to(device)).argmax(1).eq(labels.to(device)).sum().item()
        return total
    """
)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_the_pieces_join_into_the_module_a_whole_parse_gives(name):
    text = SOURCES[name]
    parser = ChunkedParser(parse_module)
    module = parser.parse(text, None)
    whole = parse_module(text)
    assert module.code == text
    assert (module.default_indent, module.encoding, module.has_trailing_newline) == (
        whole.default_indent,
        whole.encoding,
        whole.has_trailing_newline,
    )
    assert len(module.body) == len(whole.body)
    assert _positions(module) == _positions(whole)


def test_an_edit_parses_only_the_statement_it_touched():
    parser = ChunkedParser(parse_module)
    parser.parse(TRAIN, None)
    assert parser.parsed_pieces == 5  # two imports, three functions
    parser.parse(TRAIN, None)
    assert parser.parsed_pieces == 0
    module = parser.parse(TRAIN.replace("total = 0", "total = 1"), None)
    assert parser.parsed_pieces == 1 and module.code == TRAIN.replace("total = 0", "total = 1")


def test_a_statement_that_stands_twice_is_two_nodes():
    text = "import torch\n\nx = torch.ones(2).cuda()\n\nx = torch.ones(2).cuda()\n"
    parser = ChunkedParser(parse_module)
    for _ in range(2):  # the first parse, then one that reuses the pieces
        module = parser.parse(text, None)
        assert module.code == text and module.body[1] is not module.body[2]
        assert module.body[1].body[0] is not module.body[2].body[0]


@pytest.mark.parametrize(
    "text",
    [TRAIN.replace("\n", "\r\n"), "\ufeff" + TRAIN, TRAIN.replace("import torch\n", "import torch\n\f\n")],
    ids=["CRLF", "byte-order mark", "form feed"],
)
def test_text_the_pieces_cannot_show_to_be_the_same_is_parsed_whole(text):
    parser = ChunkedParser(parse_module)
    assert parser.parse(text, None).code == parse_module(text).code and parser.parsed_pieces == 1


def _findings(output):
    return [(d.code, d.row, d.column, d.end_row, d.end_column, d.message, d.fix) for d in output.diagnostics]


@pytest.mark.parametrize(
    "before, after",
    [
        ("    # a helper above the loop\n", "    # a helper above the loop\n    # and a second line typed\n"),
        ("        print(loss.item())\n", "        print(loss.item())  # typed\n"),
        ("    return total\n", "    return total\n\n\nx = evaluate(None, [], 'cuda')\n"),
    ],
    ids=["a line added above the findings", "a comment on a finding's line", "a statement added at the end"],
)
def test_findings_after_an_edit_are_those_of_a_whole_parse(before, after, tmp_path):
    path = str(tmp_path / "train.py")
    options = Settings(build_parser().parse_args(["--select", "ALL", "--preview"])).file_options(path)
    parser = ChunkedParser(parse_module)
    first = lint_text(TRAIN, path, options, parser=parser)
    assert _findings(first) == _findings(lint_text(TRAIN, path, options)) and first.diagnostics
    edited = TRAIN.replace(before, after)
    again = lint_text(edited, path, options, parser=parser)
    assert parser.parsed_pieces == 1
    assert _findings(again) == _findings(lint_text(edited, path, options))


def test_the_placement_memo_forgets_statements_the_module_no_longer_holds():
    memo = PlacementMemo()
    module = cst.parse_module("def f():\n    return g(1)\n\nx = f()\n")
    memo.keep(module)
    call = module.body[0].body.body[0].body[0].value
    assert positions_of(module, [call], memo)[call].start.line == 2
    moved = module.with_changes(body=[cst.parse_statement("y = 0\n"), *module.body])
    memo.keep(moved)
    assert positions_of(moved, [call], memo)[call].start.line == 3
    memo.keep(moved.with_changes(body=moved.body[:1]))
    assert len(memo._statements) <= 1


def _positions(module):
    ranges = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    return [(type(node).__name__, ranges[node]) for node in _all(module) if node in ranges]


def _all(node):
    yield node
    for child in child_nodes(node):
        yield from _all(child)
