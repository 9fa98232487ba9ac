"""``%%gpu_sanitize`` on a real GPU in a real kernel: a per-step ``.item()``
is found at its line in the cell, and the report renders inline."""
import html
import json
import os
import re
import sys

import pytest

pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from notebook_kernel import html_of, run_notebook  # noqa: E402

pytestmark = pytest.mark.gpu

TRAINING_CELL = """\
%%gpu_sanitize --checks sync --warmup-steps 2 --report-json run.json
import torch
model = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 512, device="cuda")
losses = []
for step in range(20):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    losses.append(loss.item())
"""
ITEM_LINE = TRAINING_CELL.splitlines().index("    losses.append(loss.item())") + 1  # the magic's line is line 1


def test_a_per_step_item_is_found_at_the_cells_line(tmp_path):
    outputs = run_notebook(tmp_path, ["%load_ext torchlint.sanitizer", TRAINING_CELL])
    report = json.loads((tmp_path / "run.json").read_text())
    # Other syncs (the one-off copy of the model's weights) may be listed too; the per-step read is at its line.
    at_item = [finding for finding in report["findings"] if finding["kind"] == "sync" and finding["line"] == ITEM_LINE]
    assert [finding["file"] for finding in at_item] == ["Cell In[2]"], report["findings"]
    assert at_item[0]["severity"] == "warning" and at_item[0]["rule"] == "TL101", at_item[0]
    frame = re.search(r'srcdoc="([^"]*)"', html_of(outputs[1]))
    assert frame, outputs[1]
    page = html.unescape(frame.group(1))
    assert "<h1>torchlint sanitizer report</h1>" in page and f"Cell In[2]:{ITEM_LINE}" in page
