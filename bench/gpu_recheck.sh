#!/usr/bin/env bash
# One short device call after sanitizer changes: install, build the tap, the GPU
# tests of what changed (named on the command line), then real scripts of the
# corpus under the sanitizer, each part under its own time limit so the call
# fits 10 minutes. The reports come back as one archive (the device returns at
# most 8 files).
#   bash bench/gpu_recheck.sh OUTDIR CORPUS RECIPES TEST_SECONDS TESTS...
set -uo pipefail
out="$1"; corpus="$2"; recipes="$3"; test_seconds="$4"; shift 4
repo="$(pwd)"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile .whl/*.whl > "$out/install.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$out/install.log" 2>&1 || { tail -5 "$out/install.log"; exit 1; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
python3 -m torchlint.sanitizer --build-tap 2>&1 | tail -1
# Outside the source tree, so the installed package (rules/ and sanitizer/ inside torchlint) is the one imported.
(cd /tmp && timeout "$test_seconds" python3 -m pytest -p no:cacheprovider -q -rs -n 0 "${@/#/$repo/}") 2>&1 | tee "$out/gpu-tests.log" | tail -25
timeout "${REAL_SECONDS:-600}" python3 bench/real_scripts/run.py --corpus "$corpus" --out "$out/real" --only "$recipes" 2>&1 | tail -60
tar czf "$out/real.tgz" -C "$out" real && rm -rf "$out/real"
