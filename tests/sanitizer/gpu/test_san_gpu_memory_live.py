"""Memory observed while it happens, on a real GPU, in programs without a single optimizer step.

The issue's case in small: long-lived small blocks pin partly used segments,
then larger requests cannot use the gaps and the allocator maps new segments.
The watcher must judge the new segment when it appears, the runner must look
before the script's globals are torn down, and the summary must carry the
peaks and the worst fragmented state.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torchlint.sanitizer.session import sanitize  # noqa: E402

pytestmark = pytest.mark.gpu
MiB = 1 << 20

PROGRAM = textwrap.dedent("""
    import time
    import torch

    MiB = 1 << 20
    torch.cuda.empty_cache()
    blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(150)]
    pinned = [b for i, b in enumerate(blocks) if i % 3 == 0]  # two of every three freed: 14 MiB gaps
    del blocks
    time.sleep(0.2)
    large = [torch.empty(40 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]  # LARGE
    time.sleep(0.2)  # the watcher looks every 20 ms
""")


def test_a_stepless_script_under_the_runner_reports_fragmentation_while_it_happens(tmp_path):
    (tmp_path / "fragment.py").write_text(PROGRAM)
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "torchlint.sanitizer", "--checks", "memory", "--report-json", str(report), "fragment.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert data["steps"]["completed"] == 0
    # The segments mapped beside free memory are the evidence (memory.new_segment_waste), at the line the
    # watcher saw the program at (the allocating line or one just after it; none for a segment first seen
    # after the script had returned); the finding is the cost they bought: reserved well above allocated.
    waste = data["memory"]["new_segment_waste"]
    assert waste and all(w["file"] is None or w["file"].endswith("fragment.py") for w in waste), waste
    live = max((w for w in waste if w["file"]), key=lambda w: w["pool_free_bytes"])
    assert live["pool_free_bytes"] >= live["request_bytes"]
    assert live["pool_largest_free_block_bytes"] < live["request_bytes"]
    # Reserved never climbed far above the tensors' own peak (900 MiB before the frees): no cost, no finding.
    assert [f for f in data["findings"] if f["kind"] == "fragmentation"] == [], data["findings"]
    memory = data["memory"]
    assert memory["worst_fragmentation"]["free_between_live_blocks_bytes"] >= 500 * MiB
    assert memory["peak_reserved_bytes"] > memory["peak_allocated_bytes"]
    assert memory["observed_peak_allocated_bytes"] >= 300 * MiB  # seen alive, not the empty end state
    # One memory series, the report's timeline, fed by the watcher although the script never steps.
    timeline = data["timeline"]
    assert "timeline" not in memory
    assert len(timeline["memory"]) >= 3 and all(row[4] == 0 for row in timeline["memory"])
    assert max(row[1] for row in timeline["memory"]) >= 300 * MiB  # the pinned blocks and the large ones, alive
    assert any(row[3] and row[3].endswith("fragment.py") for row in timeline["segments"]), timeline["segments"]


def test_the_runner_snapshots_before_the_globals_are_torn_down(tmp_path):
    script = "import torch\nMiB = 1 << 20\nblocks = [torch.empty(6 * MiB, dtype=torch.uint8, device='cuda') for _ in range(150)]\n" \
             "pinned = [b for i, b in enumerate(blocks) if i % 3 == 0]\ndel blocks\n"
    (tmp_path / "ends.py").write_text(script)
    report = tmp_path / "report.json"
    env = dict(os.environ)
    done = subprocess.run(
        [sys.executable, "-m", "torchlint.sanitizer", "--checks", "memory", "--report-json", str(report), "ends.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    (state,) = [s for s in data["memory"]["fragmented_states"] if s["trigger"] == "program-end"]
    assert state["category"] == "hard"
    assert state["allocated_bytes"] >= 250 * MiB  # the script's tensors were alive when it looked


def test_with_memory_history_the_new_segment_names_its_allocating_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHLINT_MEMORY_HISTORY", "1")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    with sanitize(checks={"memory"}) as session:
        blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(150)]
        pinned = [b for i, b in enumerate(blocks) if i % 3 == 0]
        del blocks
        import time

        # The watcher must look between the frees and the large request, and again after it. It looks
        # every 20 ms, but one look can take far longer when it snapshots with the allocator's history.
        time.sleep(0.3)
        large = torch.empty(40 * MiB, dtype=torch.uint8, device="cuda"); line = sys._getframe().f_lineno
        time.sleep(0.3)
    live = session.summaries()["memory"]["new_segment_waste"]
    assert live, session.summaries()["memory"]
    assert live[0]["site_observed"] == "allocator history (exact)"
    assert (live[0]["file"], live[0]["line"]) == (__file__, line)
    del pinned, large
