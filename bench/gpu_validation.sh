#!/usr/bin/env bash
# Everything that needs a GPU, in one go: the GPU tests, the sanitizer on the
# bundled example, the overhead benchmark, the CSAN comparison, and real
# training scripts of the development corpus (issue #32).
#   bash bench/gpu_validation.sh tests|bench|csan [OUTDIR]
#   bash bench/gpu_validation.sh real [OUTDIR] CORPUS [RECIPES]
# Logs and JSON go to OUTDIR (default: ./gpu-results). Each part fits a
# 10-minute device call on an H100: the tap is built first (about 40 s), so no
# timed window and no test pays for it. `real` runs bench/real_scripts/run.py
# on CORPUS (a copy of /work/shared/corpus holding at least the recipes'
# repositories; `run.py --list` names them), RECIPES a comma list or all; a
# 10-minute call holds about three of them (gpt2-compiled alone takes ~4).
set -uo pipefail
part="${1:-tests}"
out="${2:-gpu-results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# pyproject.toml's SPDX licence string needs setuptools 77 or newer, and this install builds with
# the machine's own setuptools. A device that cannot reach an index takes a carried wheel from .whl/.
if ! python3 -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)"; then
  carried=$(ls .whl/setuptools-*.whl 2>/dev/null | tail -1)
  if [ -n "$carried" ]; then
    python3 -m pip install -q --no-index --no-deps "$carried" || exit 1
  else
    echo "setuptools >= 77 is needed to install torchlint here; carry its wheel in .whl/ (docs/development.md)" >&2
    exit 1
  fi
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
python3 -m torchlint.sanitizer --build-tap 2>&1 | tail -1
if [ "$part" = tests ]; then
  python3 -m pytest -p no:cacheprovider tests/sanitizer/gpu -q -rs -n 0 2>&1 | tee "$out/gpu-tests.log" | tail -25
  echo "== torchlint-sanitize examples/train.py"
  report="$(cd "$out" && pwd)/train-report.json"
  (cd examples && torchlint-sanitize --warmup-steps 2 --report-json "$report" train.py --epochs 1 --samples 2048) 2>&1 | tail -25
elif [ "$part" = real ]; then
  corpus="${3:?bash bench/gpu_validation.sh real OUTDIR CORPUS [RECIPES]}"
  only="${4:-}"
  python3 bench/real_scripts/run.py --corpus "$corpus" --out "$out/real" ${only:+--only "$only"} 2>&1 \
    | tee "$out/real.log" | tail -80
elif [ "$part" = csan ]; then
  python3 bench/csan_comparison.py --jobs 8 --json "$out/csan.json" 2>&1 | tee "$out/csan.log" | tail -20
else
  # One run: every mode of the issue's targets, next to CSAN and a second baseline.
  python3 bench/sanitizer_overhead.py --rounds 2 --modes baseline,baseline-2,sync+memory,race,csan \
    --json "$out/overhead.json" 2>&1 | tee "$out/overhead.log" | tail -30
fi
