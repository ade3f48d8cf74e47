#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with binaries bundled by
# /work/shared/tools/device-bundle into BUNDLE (default .device/gemm): the grouped-GEMM GPU tests,
# `dropless-bench gemm` and its torch / JAX peers in one job. Logs and JSON go to $OUT.
#   scripts/gpu/run-gemm.sh [BUNDLE] [COMMIT] [BENCH_FLAGS...]
set -uo pipefail
bundle=${1:-.device/gemm}
commit=${2:-unknown}
shift 2 || true
out=${OUT:-/tmp/gemm-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$bundle/lib:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv \
  >"$out/smi.txt" 2>&1
cat "$out/smi.txt"

"$bundle/bin/grouped_gemm_test" >"$out/test.log" 2>&1
echo "grouped_gemm_test exit $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|relative error" "$out/test.log" | head -40

bench_cmd="dropless-bench gemm --json=dropless.json --commit=$commit $*"
"$bundle/bin/dropless-bench" gemm --json="$out/dropless.json" --commit="$commit" "$@" \
  >"$out/bench.log" 2>&1
echo "dropless-bench exit $?"
full_cmd="$bench_cmd && python3 bench/peers/gemm_peer.py --base dropless.json --out gemm.json"
[ "${RUN_JAX:-1}" = 1 ] && full_cmd="$full_cmd && python3 bench/peers/gemm_peer.py --jax --base gemm.json --out gemm.json"
python3 bench/peers/gemm_peer.py --base "$out/dropless.json" --out "$out/gemm.json" \
  --command "$full_cmd" >"$out/peer.log" 2>&1
echo "torch peer exit $?"
[ "${RUN_JAX:-1}" = 1 ] && timeout 240 python3 bench/peers/gemm_peer.py --jax --base "$out/gemm.json" --out "$out/gemm.json" \
  >"$out/jax.log" 2>&1
echo "jax peer exit $?"

# Summary: default dropless kernels and the torch peer, forward / dgrad / wgrad.
grep -E "^ceilings" "$out/bench.log"
grep -E "dropless|cublaslt" "$out/bench.log" | head -120
grep -E "torch|jax" "$out/peer.log" "$out/jax.log" | head -80
