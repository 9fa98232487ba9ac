"""Two processes on one GPU (gloo): one race report per rank, merged; collectives tracked as in one process.

Runs under the native tap and the dispatch-mode fallback. Multi-GPU machines
(NCCL, one GPU per rank) are not lent to this project now; the same script
runs there unchanged with ``backend="nccl"``.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

SCRIPT = textwrap.dedent("""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    torch.cuda.set_device(0)
    x = torch.ones(1 << 20, device="cuda")
    work = dist.all_reduce(x, async_op=True)
    y = x * 2  # RACY: x is read before work.wait()
    work.wait()
    done = dist.all_reduce(x, async_op=True)
    done.wait()
    z = x * 2  # CORRECT
    torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("interception", ["native", "python"])
def test_two_ranks_on_one_gpu_give_one_merged_race_report(tmp_path, interception):
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("gloo is not available")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = dict(os.environ, TORCHLINT_RACE_TAP=interception, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "torchlint.sanitizer", "--checks", "race", "--report-json", "out/report.json", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    merged = json.loads((tmp_path / "out" / "report.json").read_text())
    racy = next(n for n, text in enumerate(SCRIPT.splitlines(), 1) if "RACY" in text)
    assert merged["world_size"] == 2
    # gloo copies through its own stream too: the racy line may race with that copy as well, never the correct one.
    assert {(f["rank"], f["line"]) for f in merged["findings"]} == {(0, racy), (1, racy)}, merged["findings"]
    for entry in merged["ranks"]:
        assert entry["race"]["active"] and entry["race"]["activation_reason"] == "a collective was issued"
        expected = "native tap" if interception == "native" else "dispatch mode"
        assert entry["race"]["interception"] == expected
    assert any("work.wait()" in f["fix_hint"] for f in merged["findings"])
