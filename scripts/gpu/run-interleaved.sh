#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root: the grouped-GEMM GPU tests, then
# dropless and torch grouped GEMMs timed in one process, alternating (bench/peers/
# interleaved_gemm.py; docs/grouped_gemm.md "Measuring"). BUNDLE holds libdropless_gemm_capi.so,
# bin/grouped_gemm_test and lib/ (from /work/shared/tools/device-bundle). Output goes to $OUT.
#   scripts/gpu/run-interleaved.sh BUNDLE COMMIT [interleaved_gemm.py flags...]
set -uo pipefail
bundle=$(cd "${1:?bundle}" && pwd)
commit=${2:-unknown}
shift 2 || true
out=${OUT:-/tmp/interleaved-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-} PYTHONUNBUFFERED=1
if [ -x "$bundle/bin/grouped_gemm_test" ]; then
  "$bundle/bin/grouped_gemm_test" >"$out/test.log" 2>&1
  echo "grouped_gemm_test exit $? $(grep -E '^\[  (PASSED|FAILED) ' "$out/test.log" | tr '\n' ' ')"
fi
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader \
  -lms 200 >"$out/smi.csv" &
smi=$!
python3 bench/peers/interleaved_gemm.py --lib "$bundle/libdropless_gemm_capi.so" \
  --out "$out/gemm-interleaved.json" --commit "$commit" "$@" >"$out/interleaved.log" 2>&1
echo "interleaved_gemm.py exit $?"
kill "$smi"
grep -E "TFLOP/s" "$out/interleaved.log" | head -200
