#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with binaries bundled by
# /work/shared/tools/device-bundle into BUNDLE (libdropless_engine_cuda.so, engine_gpu_test,
# wgrad_adamw_test, dropless-bench): the fused weight-gradient + AdamW
# kernel's tests, the engine with it against the CPU engine, its per-weight
# benchmark against the CUTLASS + AdamW passes, and the step with it next to the two passes and
# torch._grouped_mm (step_peer.py); RUN_NCU=1 adds an Nsight Compute profile of the kernel's two
# forms. Logs and JSON in $OUT.
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
if [ "${RUN_NCU:-0}" = 1 ]; then
  # Nsight Compute on qwen3 w13: the fused update and its gradient alone, memory tables included,
  # to tell L2/HBM contention from shared-memory bandwidth (docs/step_performance.md). The reports
  # stay in $OUT; a summary goes to stdout.
  ncu_bin=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  for form in true false; do
    timeout 120 "$ncu_bin" --kernel-name-base demangled -k "regex:TmaWgradAdamWKernel<$form" \
      --launch-count 1 --set full --import-source no -o "$out/wgrad-adamw-$form" \
      "$bundle/bin/dropless-bench" wgrad-adamw --shapes=qwen3 --rounds=1 --iters=1 \
      >"$out/ncu-$form.log" 2>&1
    echo "ncu (kAdamW=$form) exit $?"
    "$ncu_bin" --import "$out/wgrad-adamw-$form.ncu-rep" --page details >"$out/ncu-$form.txt" 2>&1
    grep -E "Duration|DRAM Throughput|L2 Hit Rate|Mem Busy|Max Bandwidth|Shared" \
      "$out/ncu-$form.txt" | head -20
  done
fi
