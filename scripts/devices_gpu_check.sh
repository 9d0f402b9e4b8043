#!/bin/sh
# The GPU checks of issue 32 (docs/devices.md), run on a lent GPU from a copy of the tree:
# the `cuda`-marked tests, the budget calibration, and the device-split benchmark.
# Logs go to $OUT (default: ./gpu-logs); a short table is printed last.
# A folder stub/ beside the tree may hold a stand-in for the MiniLM package (its vocab only).
set -u
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
export PYTHONPATH="$PWD:$PWD/stub" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
$PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())" | tee "$OUT/env.log"
timeout 200 $PY -m pytest tests/devices -q -rA -p no:cacheprovider --tb=short 2>&1 | tee "$OUT/pytest.log" | tail -40
timeout 150 $PY -m benchmarks.devices_calibrate --models bert-tiny bert-base 2>&1 | tee "$OUT/calibrate.log"
timeout 150 $PY -m benchmarks.devices_bench --model bert-base --repeat 3 2>&1 | tee "$OUT/bench.log"
echo "== summary"
grep -E "passed|failed|error" "$OUT/pytest.log" | tail -3
cat "$OUT/calibrate.log" "$OUT/bench.log" | grep '^{'
