#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with binaries bundled by
# /work/shared/tools/device-bundle into BUNDLE (libdropless_engine_cuda.so, engine_gpu_test,
# wgrad_adamw_test, dropless-bench): the fused weight-gradient + AdamW
# kernel's tests, the engine with it against the CPU engine, its per-weight
# benchmark against the CUTLASS + AdamW passes, and the step with it next to the two passes and
# torch._grouped_mm (step_peer.py). Logs and JSON in $OUT.
#   scripts/gpu/run-fused-adamw.sh [BUNDLE] [COMMIT]
set -uo pipefail
bundle=${1:-.device/t}
commit=${2:-unknown}
out=${OUT:-/tmp/fused-adamw-out}
mkdir -p "$out"
nccl_dir=${NCCL_LIB_DIR:-$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)}
export LD_LIBRARY_PATH=$PWD/$bundle/lib${nccl_dir:+:$nccl_dir}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1

timeout 60 "$bundle/bin/wgrad_adamw_test" >"$out/wgrad-adamw-test.log" 2>&1
tests=$?
echo "wgrad_adamw_test exit $tests"
grep -E "PASSED|FAILED|Failure|first at" "$out/wgrad-adamw-test.log" | head -8
DROPLESS_FUSED_EXPERT_ADAMW=1 timeout 90 "$bundle/bin/engine_gpu_test" \
  --gtest_filter='*CudaMatchesCpu*:*GraphReplay*' >"$out/engine-test.log" 2>&1
echo "engine_gpu_test (fused) exit $?"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$out/engine-test.log" | head -10
timeout 120 "$bundle/bin/dropless-bench" wgrad-adamw --rounds=3 --iters=5 --commit="$commit" \
  --json="$out/wgrad-adamw.json" 2>&1 | tail -8
[ "$tests" = 0 ] || exit 1
timeout 330 python3 bench/peers/step_peer.py --lib "$PWD/$bundle/bin/libdropless_engine_cuda.so" \
  --impls dropless,dropless-fused-adamw,torch._grouped_mm --shapes qwen3,dsv3,mixtral --ep dsv3=8 \
  --rounds 3 --steps 5 --commit "$commit" --json "$out/step-fused.json" >"$out/step-peer.log" 2>&1
echo "step_peer exit $?"
grep -E "^(qwen3|dsv3|mixtral):|^  (dropless|torch)" "$out/step-peer.log"
