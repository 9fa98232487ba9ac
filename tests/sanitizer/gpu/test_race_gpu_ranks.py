"""Two ranks: one race report per rank, merged; collectives tracked as in one process.

Two processes on one GPU through gloo, and, on a machine with two GPUs, one
GPU per rank through NCCL; each under the native tap and the dispatch-mode
fallback.
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
    import os
    import torch
    import torch.distributed as dist

    backend = os.environ["TEST_BACKEND"]
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) if backend == "nccl" else 0)
    dist.init_process_group(backend)
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
@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_two_ranks_give_one_merged_race_report(tmp_path, interception, backend):
    import torch.distributed as dist

    if not dist.is_available() or not getattr(dist, f"is_{backend}_available")():
        pytest.skip(f"{backend} is not available")
    if backend == "nccl" and torch.cuda.device_count() < 2:
        pytest.skip("NCCL runs one rank per GPU: needs two GPUs")
    (tmp_path / "train.py").write_text(SCRIPT)
    env = dict(os.environ, TORCHLINT_RACE_TAP=interception, OMP_NUM_THREADS="1", TEST_BACKEND=backend)
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "torchlint.sanitizer", "--checks", "race", "--report-json", "out/report.json", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    merged = json.loads((tmp_path / "out" / "report.json").read_text())
    racy = next(n for n, text in enumerate(SCRIPT.splitlines(), 1) if "RACY" in text)
    assert merged["world_size"] == 2
    # The collective writes x on its own stream (gloo copies through one too): the read before
    # work.wait() races with it, the read after never does.
    assert {(f["rank"], f["line"]) for f in merged["findings"]} == {(0, racy), (1, racy)}, merged["findings"]
    for entry in merged["ranks"]:
        assert entry["race"]["active"] and entry["race"]["activation_reason"] == "a collective was issued"
        expected = "native tap" if interception == "native" else "dispatch mode"
        assert entry["race"]["interception"] == expected
    assert any("work.wait()" in f["fix_hint"] for f in merged["findings"])
