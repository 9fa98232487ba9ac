#!/usr/bin/env bash
# Everything that needs a GPU, in one go: the GPU tests, the sanitizer on the
# bundled example, the overhead benchmark and the CSAN comparison.
#   bash bench/gpu_validation.sh tests|bench|csan [OUTDIR]
# Logs and JSON go to OUTDIR (default: ./gpu-results). Each part fits a
# 10-minute device call on an H100: the tap is built first (about 40 s), so no
# timed window and no test pays for it.
set -uo pipefail
part="${1:-tests}"
out="${2:-gpu-results}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.log" 2>&1 || { cat "$out/install.log"; exit 1; }
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))"
python3 -m torchlint.sanitizer --build-tap 2>&1 | tail -1
if [ "$part" = tests ]; then
  python3 -m pytest -p no:cacheprovider tests/sanitizer/gpu -q -rs -n 0 2>&1 | tee "$out/gpu-tests.log" | tail -25
  echo "== torchlint-sanitize examples/train.py"
  report="$(cd "$out" && pwd)/train-report.json"
  (cd examples && torchlint-sanitize --warmup-steps 2 --report-json "$report" train.py --epochs 1 --samples 2048) 2>&1 | tail -25
elif [ "$part" = csan ]; then
  python3 bench/csan_comparison.py --jobs 8 --json "$out/csan.json" 2>&1 | tee "$out/csan.log" | tail -20
else
  # One run: every mode of the issue's targets, next to CSAN and a second baseline.
  python3 bench/sanitizer_overhead.py --rounds 2 --modes baseline,baseline-2,sync+memory,race,csan \
    --json "$out/overhead.json" 2>&1 | tee "$out/overhead.log" | tail -30
fi
