"""Many processes: one report per rank, merged into one (rank on every finding, a summary per rank)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from torchlint.sanitizer import ranks
from torchlint.sanitizer.ranks import RankInfo, merge_reports, rank_info, rank_path, write_rank_report

from san_sync_helpers import write_distribution


def _report(index, findings, checks=("sync",), steps=None, **extra):
    report = {
        "version": 1, "tool": "torchlint-sanitizer", "torch": "2.x", "device": {"name": f"GPU{index}"},
        "checks": list(checks), "fail_on": ["race", "sync"], "findings": findings,
        "steps": steps or {"completed": 3, "warmup": 1, "measured": 2, "source": "optimizer"},
        "memory": {"available": True, "peak_allocated_bytes": 100 * (index + 1), "peak_reserved_bytes": 200 * (index + 1)},
    }
    report.update(extra)
    return report


def _finding(kind, line):
    return {"kind": kind, "severity": "error" if kind == "race" else "warning", "message": f"{kind} at {line}",
            "file": "train.py", "line": line, "function": "step", "stack": [], "count": 1, "rule": None,
            "fix_hint": "", "details": {}, "test": None}


def test_rank_info_reads_the_launchers_environment():
    assert rank_info({}) is None
    assert rank_info({"WORLD_SIZE": "1", "RANK": "0"}) is None
    info = rank_info({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0", "TORCHELASTIC_RUN_ID": "abc",
                      "MASTER_ADDR": "h", "MASTER_PORT": "29500"})
    assert (info.rank, info.world_size, info.local_rank) == (2, 4, 0)
    assert "abc" in info.run_id and "29500" in info.run_id
    assert rank_path("out/report.json", 3) == "out/report.rank3.json"


def test_the_merged_report_tags_each_finding_with_its_rank_and_sums_up_each_rank():
    rank1 = _report(1, [_finding("race", 12)], checks=("race", "sync"), rank=1, world_size=2, run_id="r")
    rank0 = _report(0, [_finding("sync", 7), _finding("sync", 9)], rank=0, world_size=2, run_id="r")
    merged = merge_reports([rank1, rank0], ["r.rank1.json", "r.rank0.json"])
    assert [(f["rank"], f["line"]) for f in merged["findings"]] == [(0, 7), (0, 9), (1, 12)]
    assert merged["checks"] == ["race", "sync"] and merged["world_size"] == 2
    assert merged["device"] == {"name": "GPU0"} and merged["steps"]["measured"] == 2
    by_rank = {entry["rank"]: entry for entry in merged["ranks"]}
    assert by_rank[0]["by_kind"] == {"sync": 2} and by_rank[1]["by_kind"] == {"race": 1}
    assert by_rank[1]["failing"] == 1 and by_rank[1]["report"] == "r.rank1.json"
    assert by_rank[1]["memory"]["peak_reserved_bytes"] == 400
    assert "rank 1 (GPU1): 1 race" in ranks.render_ranks(merged)


def test_the_last_rank_to_finish_merges_and_reports_of_another_run_are_left_out(tmp_path):
    path = str(tmp_path / "report.json")
    stale = _report(1, [_finding("sync", 1)])
    write_rank_report(path, stale, RankInfo(1, 2, 1, "old-run"), started_at=1000.0)
    first = write_rank_report(path, _report(0, [_finding("sync", 7)]), RankInfo(0, 2, 0, "run"), started_at=5000.0)
    assert first is None and not os.path.exists(path)  # rank 1 of this run has not written yet
    last = write_rank_report(path, _report(1, [_finding("race", 3)]), RankInfo(1, 2, 1, "run"), started_at=5001.0)
    assert last is not None
    on_disk = json.loads(open(path).read())
    assert [(f["rank"], f["kind"]) for f in on_disk["findings"]] == [(0, "sync"), (1, "race")]
    own = json.loads(open(rank_path(path, 1)).read())
    assert own["rank"] == 1 and own["run_id"] == "run" and "rank" not in own["findings"][0]


SCRIPT = textwrap.dedent("""
    import os, sys
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "deps"))
    import fakecuda

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    value = torch.ones(4)
    dist.all_reduce(value)
    assert value[0].item() == dist.get_world_size()
    for _ in range(5 + rank):  # a loop: repeated sites (the summaries leave one-off syncs out)
        if rank == 0:
            fakecuda.read_back(1)  # SYNC-RANK-0
        else:
            fakecuda.read_back(1, times=2)  # SYNC-RANK-1
    dist.barrier()
    dist.destroy_process_group()
""")


def test_torchrun_gives_a_report_per_rank_and_one_merged_report(tmp_path):
    pytest.importorskip("torch.distributed")
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("gloo is not available")
    write_distribution(tmp_path / "deps", "fakecuda")  # installed, with metadata: a library, not user code
    (tmp_path / "train.py").write_text(SCRIPT)
    env = dict(os.environ, TORCHLINT_SANITIZER_FORCE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         "-m", "torchlint.sanitizer", "--checks", "sync", "--report-json", "out/report.json", "train.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=220,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    merged = json.loads((tmp_path / "out" / "report.json").read_text())
    assert merged["world_size"] == 2
    lines = {line: number for number, line in enumerate(SCRIPT.splitlines(), 1)}
    rank0_line = next(n for text, n in lines.items() if "SYNC-RANK-0" in text)
    rank1_line = next(n for text, n in lines.items() if "SYNC-RANK-1" in text)
    assert sorted((f["rank"], f["line"], f["count"]) for f in merged["findings"]) == [(0, rank0_line, 5), (1, rank1_line, 12)]
    assert [entry["rank"] for entry in merged["ranks"]] == [0, 1]
    for rank in (0, 1):
        own = json.loads((tmp_path / "out" / f"report.rank{rank}.json").read_text())
        assert own["rank"] == rank and len(own["findings"]) == 1
    assert "merged report of 2 ranks" in done.stderr
    assert f"[rank 1] train.py:{rank1_line}: sync" in done.stderr
    assert "[rank 0/2]" in done.stderr and "[rank 1/2]" in done.stderr
