#!/usr/bin/env bash
# One device call after sanitizer changes: install, build the tap, the GPU tests
# named on the command line, optionally the overhead bench, then real scripts of
# the corpus under the sanitizer, each part under its own time limit so the
# call fits 10 minutes. The device returns at most 8 files of 16 MiB: the
# scripts' reports (JSON, HTML, logs; not the traces) come back as one archive
# and their summary as summary.md.
#   bash bench/gpu_recheck.sh OUTDIR CORPUS RECIPES TEST_SECONDS [TESTS...]
# RECIPES "" runs no script, TEST_SECONDS 0 no test; OVERHEAD_ARGS (the
# arguments of bench/sanitizer_overhead.py) runs the overhead bench after the
# tests; REAL_SECONDS caps the scripts (default 600).
set -uo pipefail
out="$1"; corpus="$2"; recipes="$3"; test_seconds="$4"; shift 4
repo="$(pwd)"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl > "$out/install.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 1; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
python3 -m torchlint.sanitizer --build-tap 2>&1 | tail -1
if [ "$test_seconds" != 0 ] && [ $# -gt 0 ]; then
  # Outside the source tree, so the installed package (rules/ and sanitizer/ inside torchlint) is the one imported.
  (cd /tmp && timeout "$test_seconds" python3 -m pytest -p no:cacheprovider -v -rs -n 0 --durations=15 \
    "${@/#/$repo/}") > "$out/gpu-tests.log" 2>&1
  echo "gpu tests: exit $?"; grep -E "passed|failed|error" "$out/gpu-tests.log" | tail -3
  grep -E "FAILED|ERROR" "$out/gpu-tests.log" | head -20
fi
if [ -n "${OVERHEAD_ARGS:-}" ]; then
  (cd /tmp && python3 "$repo/bench/sanitizer_overhead.py" $OVERHEAD_ARGS --json "$out/overhead.json") \
    > "$out/overhead.log" 2>&1
  tail -40 "$out/overhead.log"
fi
if [ -n "$recipes" ]; then
  timeout "${REAL_SECONDS:-600}" python3 bench/real_scripts/run.py --corpus "$corpus" --out "$out/real" \
    --only "$recipes" > "$out/real.log" 2>&1
  echo "real scripts: exit $?"
  cp "$out/real/summary.md" "$out/summary.md" 2>/dev/null
  (cd "$out/real" && tar czf "$out/real.tgz" --exclude='*.trace.json' --exclude=work .) && rm -rf "$out/real"
fi
