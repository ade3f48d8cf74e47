#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with binaries bundled by
# /work/shared/tools/device-bundle into BUNDLE (default .device/engine): the CUDA engine's GPU tests
# (engine_gpu_test), `dropless-bench step` (the engine alone), `dropless-bench dispatch`
# (RUN_DISPATCH=1: the EP dispatchers) and the product end to end (a cuda job through a coordinator,
# a worker daemon and the CLI: scripts/gpu/run-cuda-job.sh). Logs go to $OUT.
# The nccl-lsa dispatcher needs an NCCL runtime at least as new as the headers it was built with:
# when the machine's libnccl is older, NCCL_LIB_DIR (default: the one torch ships, if any) is put
# first on LD_LIBRARY_PATH.
#   scripts/gpu/run-engine.sh [BUNDLE] [COMMIT] [STEP_BENCH_FLAGS...]
set -uo pipefail
bundle=${1:-.device/engine}
commit=${2:-unknown}
shift 2 || true
out=${OUT:-/tmp/engine-out}
mkdir -p "$out"
nccl_dir=${NCCL_LIB_DIR:-$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)}
export LD_LIBRARY_PATH=$PWD/$bundle/lib${nccl_dir:+:$nccl_dir}:${LD_LIBRARY_PATH:-}
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
if [ "${RUN_DISPATCH:-0}" = 1 ]; then
  timeout 300 "$bundle/bin/dropless-bench" dispatch --commit="$commit" --json="$out/dispatch.json" 2>&1 | tee "$out/dispatch-bench.log"
  echo "dropless-bench dispatch exit ${PIPESTATUS[0]}"
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
