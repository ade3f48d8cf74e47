#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with binaries bundled by
# /work/shared/tools/device-bundle into BUNDLE (default .device/engine): the CUDA engine's GPU tests
# (engine_gpu_test), `dropless-bench step` (the engine alone) and the product end to end (a cuda
# job through a coordinator, a worker daemon and the CLI: scripts/gpu/run-cuda-job.sh). Logs go to
# $OUT.
#   scripts/gpu/run-engine.sh [BUNDLE] [COMMIT] [STEP_BENCH_FLAGS...]
set -uo pipefail
bundle=${1:-.device/engine}
commit=${2:-unknown}
shift 2 || true
out=${OUT:-/tmp/engine-out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/$bundle/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
if [ -x "$bundle/bin/engine_gpu_test" ]; then
  timeout 300 "$bundle/bin/engine_gpu_test" >"$out/engine-test.log" 2>&1
  echo "engine_gpu_test exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|error|step-1 loss|gradient relative|500 steps|step 6|Expected|Which is|actual" "$out/engine-test.log" | head -60
fi
if [ "${RUN_BENCH:-1}" = 1 ]; then
  timeout 300 "$bundle/bin/dropless-bench" step --commit="$commit" --json="$out/step-dropless.json" "$@" 2>&1 | tee "$out/step-bench.log"
  echo "dropless-bench step exit ${PIPESTATUS[0]}"
fi
if [ "${RUN_JOB:-1}" = 1 ]; then
  timeout 240 bash scripts/gpu/run-cuda-job.sh "$bundle" "${JOB:-configs/jobs/qwen3-30b-a3b-layer.yaml}" "$out/job" >"$out/job.log" 2>&1
  echo "cuda job exit $?"
  tail -40 "$out/job.log"
fi
if [ "${RUN_PEERS:-0}" = 1 ]; then
  # The step next to its peers in one process, alternating rounds (bench/peers/step_peer.py).
  timeout "${PEER_TIMEOUT:-300}" python3 bench/peers/step_peer.py --lib "$PWD/$bundle/bin/libdropless_engine_cuda.so" \
    --ep dsv3=8 --rounds "${PEER_ROUNDS:-3}" --steps "${PEER_STEPS:-5}" --json "$out/step-h200.json" \
    ${PEER_FLAGS:-} >"$out/step-peer.log" 2>&1
  echo "step_peer exit $?"
  tail -40 "$out/step-peer.log"
fi
