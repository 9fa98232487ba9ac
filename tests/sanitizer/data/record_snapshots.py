"""Record the allocator snapshots that the CPU tests replay.

Run on a machine with a CUDA device:

    python tests/sanitizer/data/record_snapshots.py OUTDIR

Each scenario runs in a fresh interpreter, because ``PYTORCH_ALLOC_CONF`` is
read once, when CUDA initialises. Every JSON file holds the allocator's
segments (``frames`` stripped, to keep the files small), the flat
``memory_stats()`` and, for the OOM scenarios, the OOM observer's arguments.
The scenarios are the reproduction of runtime-hooks §4.7: 150 blocks of
6 MiB under a 1 GiB cap, two of every three freed, then a 64 MiB request.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
CAP = 1 * GiB

SCENARIOS = {
    # name: extra environment
    "fragmented": {},
    "expandable": {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    "clean": {},
    "exhaustion": {},
    "streams": {},
}


def _strip(segments):
    out = []
    for seg in segments:
        seg = {k: v for k, v in seg.items() if k != "frames"}
        seg["blocks"] = [{k: v for k, v in b.items() if k != "frames"} for b in seg.get("blocks", [])]
        out.append(seg)
    return out


def _snapshot(torch):
    snap = torch.cuda.memory._snapshot()
    return {
        "segments": _strip(snap["segments"]),
        "allocator_settings": snap.get("allocator_settings"),
    }


def _run_scenario(name: str) -> dict:
    import torch

    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(CAP / total)
    record: dict = {
        "scenario": name,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "cap_bytes": CAP,
        "env_alloc_conf": os.environ.get("PYTORCH_ALLOC_CONF"),
    }
    observed: list = []

    def on_oom(device, alloc, device_total, device_free):
        # Check that the allocator can be queried from inside the observer.
        entry = {"device": device, "alloc": alloc, "device_total": device_total, "device_free": device_free}
        try:
            t0 = time.perf_counter()
            entry["stats_in_observer"] = dict(torch.cuda.memory_stats())
            entry["snapshot_in_observer"] = _snapshot(torch)
            entry["observer_query_s"] = time.perf_counter() - t0
        except Exception as exc:  # recorded, never raised into the allocator
            entry["observer_error"] = repr(exc)
        observed.append(entry)

    torch._C._cuda_attach_out_of_memory_observer(on_oom)

    def try_alloc(nbytes):
        try:
            t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            del t
            return {"requested": nbytes, "ok": True}
        except torch.cuda.OutOfMemoryError as exc:
            return {"requested": nbytes, "ok": False, "message": str(exc)}

    if name in ("fragmented", "expandable"):
        blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(150)]
        for i in range(150):
            if i % 3:
                blocks[i] = None
        torch.cuda.synchronize()
        record["stats"] = dict(torch.cuda.memory_stats())
        record.update(_snapshot(torch))
        record["attempt"] = try_alloc(64 * MiB)
        record["stats_after"] = dict(torch.cuda.memory_stats())
        torch.cuda.empty_cache()
        record["attempt_after_empty_cache"] = try_alloc(64 * MiB)
    elif name == "exhaustion":
        blocks = [torch.empty(64 * MiB, dtype=torch.uint8, device="cuda") for _ in range(15)]
        torch.cuda.synchronize()
        record["stats"] = dict(torch.cuda.memory_stats())
        record.update(_snapshot(torch))
        record["attempt"] = try_alloc(128 * MiB)
        record["stats_after"] = dict(torch.cuda.memory_stats())
    elif name == "clean":
        # A steady loop: the same sizes every step, so the cache serves them all.
        weight = torch.randn(1024, 1024, device="cuda")
        device_allocs = []
        for _ in range(20):
            x = torch.randn(256, 1024, device="cuda")
            for _ in range(4):
                x = torch.relu(x @ weight)
            del x
            device_allocs.append(torch.cuda.memory_stats()["num_device_alloc"])
        torch.cuda.synchronize()
        record["num_device_alloc_per_step"] = device_allocs
        record["stats"] = dict(torch.cuda.memory_stats())
        record.update(_snapshot(torch))
    elif name == "streams":
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            parked = [torch.empty(32 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
        torch.cuda.synchronize()
        del parked  # freed into the side stream's pool
        live = [torch.empty(32 * MiB, dtype=torch.uint8, device="cuda") for _ in range(4)]
        small = [torch.empty(100 * 1024, dtype=torch.uint8, device="cuda") for _ in range(30)]
        del small[::2]
        torch.cuda.synchronize()
        record["side_stream"] = side.cuda_stream
        record["default_stream"] = torch.cuda.current_stream().cuda_stream
        record["stats"] = dict(torch.cuda.memory_stats())
        record.update(_snapshot(torch))
    record["oom_observer_calls"] = observed
    return record


def _probe() -> dict:
    """Costs and facts the sanitizer's design depends on."""
    import torch

    torch.cuda.init()
    x = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(150)]
    del x[::3]

    def per_call(fn, n=2000):
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    out = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "us_mem_get_info": per_call(torch.cuda.mem_get_info),
        "us_memory_stats": per_call(torch.cuda.memory_stats),
        "us_raw_cuda_memoryStats": per_call(lambda: torch._C._cuda_memoryStats(0)),
        "us_memory_snapshot": per_call(torch.cuda.memory_snapshot, 200),
        "us_perf_counter": per_call(time.perf_counter),
        "stats_keys": sorted(torch.cuda.memory_stats()),
        "raw_stats_top_keys": sorted(torch._C._cuda_memoryStats(0)),
        "has_oom_observer": hasattr(torch._C, "_cuda_attach_out_of_memory_observer"),
    }
    raw = torch._C._cuda_memoryStats(0)
    out["raw_stats_sample"] = {k: raw[k] for k in raw if not isinstance(raw[k], dict)}
    try:
        import pynvml

        t0 = time.perf_counter()
        pynvml.nvmlInit()
        out["us_nvml_init"] = (time.perf_counter() - t0) * 1e6
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        out["nvml_pid"] = os.getpid()
        out["nvml_processes"] = [(p.pid, p.usedGpuMemory) for p in procs]
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        out["nvml_memory"] = {"total": mem.total, "used": mem.used, "free": mem.free}
        util = pynvml.nvmlDeviceGetUtilizationRates(handle)
        out["nvml_util"] = {"gpu": util.gpu, "memory": util.memory}
        out["torch_reserved"] = torch.cuda.memory_reserved()
        out["us_nvml_procs"] = per_call(lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle), 200)
        out["us_nvml_mem"] = per_call(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle), 200)
        out["us_nvml_util"] = per_call(lambda: pynvml.nvmlDeviceGetUtilizationRates(handle), 200)
        out["pynvml_version"] = getattr(pynvml, "__version__", None)
    except Exception as exc:
        out["nvml_error"] = repr(exc)
    return out


def main(argv) -> int:
    if len(argv) >= 3 and argv[1] == "--scenario":
        name = argv[2]
        result = _probe() if name == "probe" else _run_scenario(name)
        json.dump(result, sys.stdout)
        return 0
    outdir = argv[1] if len(argv) > 1 else "."
    os.makedirs(outdir, exist_ok=True)
    for name in list(SCENARIOS) + ["probe"]:
        env = dict(os.environ)
        env.pop("PYTORCH_ALLOC_CONF", None)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.update(SCENARIOS.get(name, {}))
        proc = subprocess.run(
            [sys.executable, __file__, "--scenario", name], env=env, capture_output=True, text=True
        )
        if proc.returncode != 0:
            print(f"{name}: failed\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        path = os.path.join(outdir, f"snapshot_{name}.json" if name != "probe" else "allocator_probe.json")
        with open(path, "w") as fh:
            fh.write(proc.stdout)
        print(f"{name}: wrote {path} ({len(proc.stdout)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
