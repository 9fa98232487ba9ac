"""The sanitizer's Jupyter magics in a real kernel, on CPU: the cell magic,
a session across cells, the report rendered inline, no GPU said in the
cell's output, bad options. The GPU case is gpu/test_san_gpu_jupyter.py."""
from __future__ import annotations

import html
import json
import os
import re

import pytest

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")

from notebook_kernel import html_of, run_notebook, text_of  # noqa: E402

from torchlint.sanitizer.jupyter import _cell_file, _cell_names, _name_cells  # noqa: E402

pytestmark = pytest.mark.xdist_group("jupyter-kernel")

THREE_STEPS = """\
import torch
w = torch.zeros(1, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for _ in range(3):
    (w * 2).sum().backward()
    opt.step()
"""


def _forced():
    return dict(os.environ, TORCHLINT_SANITIZER_FORCE="1")


def _without_cuda():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("TORCHLINT_SANITIZER_FORCE", None)
    return env


def _page(outputs):
    """The report page inside the cell's iframe."""
    frame = re.search(r'<iframe class="torchlint-sanitizer-report" srcdoc="([^"]*)"', html_of(outputs))
    assert frame, html_of(outputs)[:500]
    return html.unescape(frame.group(1))


def test_the_cell_magic_renders_the_report_inline(tmp_path):
    outputs = run_notebook(tmp_path, [
        "%load_ext torchlint.sanitizer",
        "%%gpu_sanitize --checks sync --warmup-steps 0 --report-json run.json\n" + THREE_STEPS,
        "print(round(w.item(), 1))",
    ], env=_forced())
    page = _page(outputs[1])
    assert "<h1>torchlint sanitizer report</h1>" in page and "Nothing was checked" not in page
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["steps"]["completed"] == 3 and report["checks"] == ["sync"]
    # The text form is the runner's summary, titled by the magic.
    plain = "".join(output.get("data", {}).get("text/plain", "") for output in outputs[1])
    assert plain.startswith("%%gpu_sanitize") and "3 measured steps" in plain
    # The cell ran in the notebook's namespace: the next cell sees its variables.
    assert text_of(outputs[2]).strip() == "-1.2"


def test_a_session_across_cells(tmp_path):
    outputs = run_notebook(tmp_path, [
        "%load_ext torchlint.sanitizer",
        "%gpu_sanitize start --checks sync --warmup-steps 0",
        THREE_STEPS,
        "for _ in range(2):\n    (w * 2).sum().backward()\n    opt.step()",
        "%gpu_sanitize stop",
        "%gpu_sanitize stop",
    ], env=_forced())
    assert "sanitizer started (sync)" in text_of(outputs[1])
    assert "<h1>torchlint sanitizer report</h1>" in _page(outputs[4])
    plain = "".join(output.get("data", {}).get("text/plain", "") for output in outputs[4])
    assert "5 measured steps" in plain, plain
    assert "no session is running" in text_of(outputs[5])


def test_without_a_gpu_the_cell_says_so_and_runs(tmp_path):
    outputs = run_notebook(tmp_path, [
        "%load_ext torchlint.sanitizer",
        "%%gpu_sanitize\n" + THREE_STEPS + "print('ran', round(w.item(), 1))",
    ], env=_without_cuda())
    said = text_of(outputs[1])
    assert "%%gpu_sanitize: no CUDA device: GPU sanitizer inactive" in said and "ran -1.2" in said
    assert "Nothing was checked" in _page(outputs[1])


def test_bad_options_are_one_line_and_the_cell_does_not_run(tmp_path):
    outputs = run_notebook(tmp_path, [
        "%load_ext torchlint.sanitizer",
        "%%gpu_sanitize --checks bogus\nprint('ran')",
        "%gpu_sanitize pause",
    ], env=_forced())
    said = text_of(outputs[1])
    assert "%%gpu_sanitize: error:" in said and "bogus" in said and "ran" not in said.replace("unknown", "")
    assert "%gpu_sanitize: error: argument action: invalid choice: 'pause'" in text_of(outputs[2])


def test_an_error_in_the_cell_still_shows_the_report_then_the_error(tmp_path):
    outputs = run_notebook(tmp_path, [
        "%load_ext torchlint.sanitizer",
        "%%gpu_sanitize --checks sync\nx = 1\nraise ValueError('boom')",
    ], env=_forced())
    kinds = [output["output_type"] for output in outputs[1]]
    assert kinds.index("display_data") < kinds.index("error")
    error = next(output for output in outputs[1] if output["output_type"] == "error")
    assert error["ename"] == "ValueError"
    # The traceback names the cell and its line as IPython does (the magic's line is line 1).
    assert any("Cell In[2], line 3" in re.sub(r"\x1b\[[0-9;]*m", "", line) for line in error["traceback"])


class _Shell:
    class compile:  # noqa: N801 - IPython's attribute name
        _filename_map = {"/tmp/ipykernel_1/123.py": 4}
        flags = 0


def test_sites_in_cells_are_named_by_cell():
    path = _cell_file(_Shell, "\nx = 1\n", 7)
    names = _cell_names(_Shell)
    assert names[path] == "Cell In[7]" and names["/tmp/ipykernel_1/123.py"] == "Cell In[4]"
    report = {"findings": [{"file": path, "line": 2, "stack": [{"file": path, "line": 2}, {"file": "lib.py", "line": 9}]}],
              "sites": [{"file": "/tmp/ipykernel_1/123.py", "line": 3}]}
    named = _name_cells(report, names)
    assert named["findings"][0]["file"] == "Cell In[7]" and named["findings"][0]["stack"][1]["file"] == "lib.py"
    assert named["sites"][0] == {"file": "Cell In[4]", "line": 3}
