"""Engine behaviour on its own: names, fixes, atomic writes, selection, noqa, gitignore, config."""
from __future__ import annotations

import os
import signal
import stat

import libcst as cst
import pytest

from torchlint import gitignore, noqa
from torchlint.config import parse_version
from torchlint.project import infer_target_torch
from torchlint.fixer import fix_text
from torchlint.linter import FileOptions, lint_text
from torchlint.names import ImportTable
from torchlint.registry import all_rules
from torchlint.rule import SAFE, Invalid, Rule, Valid
from torchlint.runner import CHECK, FIX, Job, run_file
from torchlint.selection import Layer, resolve
from torchlint.source import decode, write_atomic


class AddNonBlocking(Rule):
    """## What it does
    Test rule: `.cuda()` gets `non_blocking=True`.

    ## Why is this bad?
    Test only.

    ## Example
    ```python
    x.cuda()
    ```

    Use instead:
    ```python
    x.cuda(non_blocking=True)
    ```

    ## Fix safety
    Safe.
    """

    code = "TL990"
    name = "test-rule"
    summary = "test"
    fix_availability = "always"
    visited = 0

    def visit_Call(self, node):
        type(self).visited += 1
        if isinstance(node.func, cst.Attribute) and node.func.attr.value == "cuda" and not node.args:
            new = node.with_changes(args=[cst.Arg(keyword=cst.Name("non_blocking"), value=cst.Name("True"), equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))])
            self.report(node, "blocking copy", self.ctx.fix(SAFE, "Add non_blocking", self.ctx.replace(node, new)))


OPTIONS = FileOptions(rules=[AddNonBlocking])


def test_import_table_resolves_aliases():
    module = cst.parse_module(
        "import torch as T\nfrom torch import cuda\nfrom torch.cuda.amp import GradScaler as GS\nimport torch.nn.functional as F\nfrom . import local\n"
    )
    table = ImportTable()
    for statement in module.body:
        table.add(statement.body[0])
    assert table.qualify("T.cuda.synchronize") == "torch.cuda.synchronize"
    assert table.qualify("cuda.synchronize") == "torch.cuda.synchronize"
    assert table.qualify("GS") == "torch.cuda.amp.GradScaler"
    assert table.qualify("F.relu") == "torch.nn.functional.relu"
    assert table.qualify("local") is None and table.qualify("unknown.x") is None


def test_one_walk_visits_each_call_once_for_all_rules():
    AddNonBlocking.visited = 0
    source = "a.cuda()\nb.cuda()\nf(g(h()))\n"
    lint_text(source, "x.py", FileOptions(rules=[AddNonBlocking, all_rules()["TL101"]]))
    assert AddNonBlocking.visited == 5


def test_fix_keeps_formatting_and_is_idempotent():
    source = "x = a.cuda()  # keep me\n\n\ny = (\n    b.cuda()\n)\n"
    first = fix_text(source, "x.py", OPTIONS)
    assert first.text == "x = a.cuda(non_blocking=True)  # keep me\n\n\ny = (\n    b.cuda(non_blocking=True)\n)\n"
    assert sum(first.applied.values()) == 2
    assert fix_text(first.text, "x.py", OPTIONS).text == first.text


def test_fix_that_breaks_code_is_refused():
    class Breaker(AddNonBlocking):
        code = "TL991"
        name = "breaker"

        def visit_Call(self, node):
            self.report(node, "x", self.ctx.fix(SAFE, "break", self.ctx.replace(node, "(((")))

    result = fix_text("a.cuda()\n", "x.py", FileOptions(rules=[Breaker]))
    assert result.text == "a.cuda()\n" and "does not parse" in result.error


def test_fix_preserves_bom_crlf_and_permissions(tmp_path):
    path = tmp_path / "m.py"
    path.write_bytes(b"\xef\xbb\xbfx = a.cuda()\r\ny = 1\r\n")
    os.chmod(path, 0o640)
    result = run_file(Job(str(path), OPTIONS, FIX))
    assert sum(result.fixed.values()) == 1
    assert path.read_bytes() == b"\xef\xbb\xbfx = a.cuda(non_blocking=True)\r\ny = 1\r\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_fix_preserves_declared_encoding(tmp_path):
    path = tmp_path / "m.py"
    path.write_bytes("# -*- coding: latin-1 -*-\ns = 'é'\nx = a.cuda()\n".encode("latin-1"))
    run_file(Job(str(path), OPTIONS, FIX))
    assert path.read_bytes() == "# -*- coding: latin-1 -*-\ns = 'é'\nx = a.cuda(non_blocking=True)\n".encode("latin-1")


def test_failed_write_leaves_original_untouched(tmp_path, monkeypatch):
    path = tmp_path / "m.py"
    path.write_text("x = a.cuda()\n")

    def fail_halfway(fd, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail_halfway)
    result = run_file(Job(str(path), OPTIONS, FIX))
    assert path.read_text() == "x = a.cuda()\n"
    assert "No space left" in result.fix_error
    assert [p.name for p in tmp_path.iterdir()] == ["m.py"]  # no temporary file left behind


def test_write_atomic_replaces_whole_file(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("old\n")
    write_atomic(str(path), b"new\n")
    assert path.read_text() == "new\n"


def test_a_signal_while_the_temporary_file_is_made_leaves_no_file_behind(tmp_path, monkeypatch):
    # A worker whose parent died gets SIGTERM and ends through an exception
    # (workers.die_with_parent). Arriving just after the file was made, before
    # its name came back from tempfile.mkstemp, it used to leave the file behind.
    path = tmp_path / "m.py"
    path.write_text("old\n")
    real_open = os.open

    def open_then_signal(name, *args, **kwargs):
        made = real_open(name, *args, **kwargs)
        if os.path.basename(str(name)).startswith(".torchlint-"):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this returns
        return made

    def end_like_a_worker(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, end_like_a_worker)
    monkeypatch.setattr(os, "open", open_then_signal)
    try:
        with pytest.raises(SystemExit):
            write_atomic(str(path), b"new\n")
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGTERM, previous)
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["m.py"]


def test_decode_reports_reason():
    with pytest.raises(Exception) as info:
        decode(b"x = '\xff'\n")
    assert "cannot decode as utf-8" in str(info.value)


def test_selection_specificity_and_layers():
    # The layering itself, with preview rules taking part (tests/linter/test_preview.py covers preview).
    rules = all_rules()
    default = resolve([], rules, preview=True)
    assert "TL101" in default
    only = resolve([Layer(select=["TL1", "TL2"], ignore=["TL101"]), Layer(select=["TL101"])], rules, preview=True)
    assert only == {"TL101", "TL000"}
    ignored_prefix = resolve([Layer(select=["ALL"], ignore=["TL1"], extend_select=["TL101"])], rules, preview=True)
    assert "TL101" in ignored_prefix
    assert resolve([Layer(ignore=["TL101"])], rules, preview=True) >= {"TL000"} and "TL101" not in resolve([Layer(ignore=["TL101"])], rules, preview=True)
    opt_in = [code for code, rule in rules.items() if not rule.default_enabled]
    for code in opt_in:
        assert code not in default
        assert code in resolve([Layer(extend_select=[code])], rules, preview=True)


def test_noqa_parsing():
    s = noqa.parse("a  # noqa: TL101,TL201\nb  # NOQA\nc  # noqa TL101\nd  # noqa:TL101 TL301  # type: ignore\n")
    assert s.suppresses("TL101", 1) and s.suppresses("TL201", 1) and not s.suppresses("TL301", 1)
    assert s.suppresses("TL999", 2) and s.suppresses("TL999", 3)
    assert s.suppresses("TL301", 4) and not s.suppresses("TL201", 4)
    assert not s.suppresses("TL101", 5)
    whole = noqa.parse("# flake8: noqa\nx = 1\n")
    assert whole.suppresses("TL101", 2)
    some = noqa.parse("# torchlint: noqa: TL101\n")
    assert some.suppresses("TL101", 9) and not some.suppresses("TL201", 9)


def test_gitignore_semantics(tmp_path):
    rules = gitignore.parse("*.log\n/top.py\nbuild/\n!keep.log\ndocs/**/gen_*.py\n", str(tmp_path))
    stack = gitignore.IgnoreStack(rules)
    p = lambda rel: str(tmp_path / rel)
    assert stack.ignored(p("a.log"), False) and stack.ignored(p("x/a.log"), False)
    assert not stack.ignored(p("keep.log"), False)
    assert stack.ignored(p("top.py"), False) and not stack.ignored(p("x/top.py"), False)
    assert stack.ignored(p("build"), True) and not stack.ignored(p("build"), False)
    assert stack.ignored(p("docs/a/b/gen_x.py"), False) and not stack.ignored(p("docs/a/b/x.py"), False)


def test_target_torch_inference():
    assert infer_target_torch({"project": {"dependencies": ["numpy", "torch>=1.13,<3"]}}) == (1, 13)
    assert infer_target_torch({"project": {"dependencies": ["torchvision>=0.15"]}}) is None
    assert infer_target_torch({"project": {"optional-dependencies": {"gpu": ["torch[opt]~=2.1.0"]}}}) == (2, 1)
    assert parse_version("2.4.1") == (2, 4)


def test_rule_examples_are_dedented():
    assert Valid("\n    x = 1\n").source == "x = 1\n"
    assert Invalid("\n    y\n", fixed="\n    z\n").fixed_source == "z\n"


def test_syntax_error_location_comes_from_python():
    out = lint_text("x = 1\ny = = 2\n", "x.py", FileOptions(rules=list(all_rules().values())))
    assert [(d.code, d.row) for d in out.diagnostics] == [("TL000", 2)]
