"""Record the sanitizer reports the HTML, trace and bridge tests read, from real GPU runs.

    python bench/record_report_fixtures.py [--out tests/sanitizer/data/reports]

Runs ``examples/sanitizer_tour.py`` under ``python -m torchlint.sanitizer``
(a fresh process per run, as a user would) and keeps each JSON report:

- ``sync.json``: the sync-heavy part (optimizer steps, per-step ``.item()``,
  a sync in a helper, one inside ``clip_grad_norm_``);
- ``memory.json``: the fragmenting part (new segments every step, then a
  fragmentation OOM under a 1 GiB cap);
- ``race.json``: the racy part (a side stream, no optimizer steps);
- ``tour.json``: all three in one run (the README's example and screenshot);
- ``rank0.json``, ``rank1.json``: the sync part with ``RANK`` set, the two
  halves of a merged multi-rank report.

Paths under the repository are rewritten relative to it, so the fixtures join
with a lint of this checkout wherever it lives. ``profiler_alignment.json``
holds the measured offset between this tool's sync slices and the PyTorch
profiler's ``aten::item`` events for the same calls, both on the Unix-epoch
clock (see ``sanitizer/trace.py``). Needs a CUDA device.

Through the device ``run`` tool, whose ``$OUT`` sends back only a few files,
write into ``$OUT/reports``, pack it (``tar -C $OUT -czf $OUT/reports.tgz
reports``) and unpack it here into ``tests/sanitizer/data/``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOUR = os.path.join("examples", "sanitizer_tour.py")
RUNS = {
    "sync": (["--part", "sync"], {}),
    "memory": (["--part", "memory"], {}),
    "race": (["--part", "race"], {}),
    "tour": (["--part", "all"], {}),
    "rank0": (["--part", "sync", "--steps", "12"], {"RANK": "0"}),
    "rank1": (["--part", "sync", "--steps", "12"], {"RANK": "1"}),
}

# Runs the sync part under torch.profiler and the sanitizer at once; prints the offsets.
_ALIGNMENT_CHILD = textwrap.dedent("""
    import json, sys, tempfile, os
    import torch
    sys.path.insert(0, "examples")
    import sanitizer_tour
    from torchlint.sanitizer.session import SanitizerSession
    from torchlint.sanitizer.trace import trace_events
    from torchlint.sanitizer import frames
    frames.add_user_root(os.getcwd())
    session = SanitizerSession(checks={"sync"}, warmup_steps=0)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as profiler:
        session.start()
        try:
            sanitizer_tour.sync_part(8)
        finally:
            session.stop()
    path = os.path.join(tempfile.mkdtemp(), "kineto.json")
    profiler.export_chrome_trace(path)
    kineto = json.load(open(path))
    ours = trace_events(session.report())
    kbase, obase = int(kineto["baseTimeNanoseconds"]), int(ours["baseTimeNanoseconds"])
    items = sorted(kbase / 1e3 + e["ts"] for e in kineto["traceEvents"]
                   if e.get("ph") == "X" and e.get("name") == "aten::item")
    mine = sorted(obase / 1e3 + e["ts"] for e in ours["traceEvents"] if e.get("name") == "sync item")
    offsets = [min(abs(m - k) for k in items) for m in mine] if items else []
    print(json.dumps({"kineto_item_events": len(items), "sanitizer_item_slices": len(mine),
                      "offsets_us": offsets}))
""")


def _relative(value, prefix):
    if isinstance(value, str):
        return value[len(prefix):] if value.startswith(prefix) else value
    if isinstance(value, list):
        return [_relative(item, prefix) for item in value]
    if isinstance(value, dict):
        return {key: _relative(item, prefix) for key, item in value.items()}
    return value


def record(name: str, args, env_extra, out: str) -> dict:
    path = os.path.join(out, f"{name}.json")
    env = dict(os.environ, **env_extra)
    command = [sys.executable, "-m", "torchlint.sanitizer", "--report-json", path, TOUR, *args]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    sys.stderr.write(f"== {name}: exit {done.returncode}\n{done.stderr[-3000:]}\n")
    with open(path, encoding="utf-8") as handle:
        report = json.load(handle)
    report = _relative(report, REPO + os.sep)
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=1)
        handle.write("\n")
    timeline = report.get("timeline", {})
    return {"findings": len(report["findings"]), "kinds": sorted({f["kind"] for f in report["findings"]}),
            "bytes": os.path.getsize(path), "steps": len(timeline.get("steps", [])),
            "memory_samples": len(timeline.get("memory", [])), "exit": done.returncode}


def alignment(out: str) -> dict:
    done = subprocess.run([sys.executable, "-c", _ALIGNMENT_CHILD], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        return {"error": done.stderr[-500:]}
    data = json.loads(done.stdout.strip().splitlines()[-1])
    offsets = data.pop("offsets_us")
    data.update({"median_offset_us": round(statistics.median(offsets), 1) if offsets else None,
                 "max_offset_us": round(max(offsets), 1) if offsets else None})
    with open(os.path.join(out, "profiler_alignment.json"), "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=1)
        handle.write("\n")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "tests", "sanitizer", "data", "reports"))
    parser.add_argument("--only", default=",".join(RUNS), help="comma-separated runs (default: all)")
    parser.add_argument("--no-alignment", action="store_true", help="skip the torch.profiler alignment run")
    options = parser.parse_args()
    out = os.path.abspath(options.out)
    os.makedirs(out, exist_ok=True)
    summary = {}
    for name in options.only.split(","):
        args, env = RUNS[name]
        summary[name] = record(name, args, env, out)
    if not options.no_alignment:
        summary["profiler_alignment"] = alignment(out)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
