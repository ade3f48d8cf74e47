#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root, with binaries bundled by
# /work/shared/tools/device-bundle into BUNDLE (default .device/tests): every GPU test binary the
# bundle holds, each bounded in time, with a summary per binary; logs go to $OUT. SANITIZE names
# binaries to run again under compute-sanitizer's memcheck (with GTEST_FILTER_<binary> as their
# filter, when set), e.g. SANITIZE="fp8_block_grouped_gemm_test".
#   scripts/gpu/run-tests.sh [BUNDLE]
set -uo pipefail
bundle=${1:-.device/tests}
out=${OUT:-/tmp/tests-out}
mkdir -p "$out"
nccl_dir=${NCCL_LIB_DIR:-$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)}
export LD_LIBRARY_PATH=$PWD/$bundle/lib${nccl_dir:+:$nccl_dir}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
for test in kernels_gpu_test grouped_gemm_test wgrad_adamw_test mx_grouped_gemm_test fp8_block_grouped_gemm_test \
            engine_gpu_test; do
  [ -x "$bundle/bin/$test" ] || continue
  timeout "${TEST_TIMEOUT:-400}" "$bundle/bin/$test" >"$out/$test.log" 2>&1
  echo "== $test exit $?"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|Expected|Which is|actual|500 steps|step 5" \
    "$out/$test.log" | head -40
done
for test in ${SANITIZE:-}; do
  filter_var="GTEST_FILTER_${test}"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  timeout "${SANITIZE_TIMEOUT:-300}" "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$bundle/bin/$test" ${!filter_var:+--gtest_filter=${!filter_var}} >"$out/$test.memcheck.log" 2>&1
  echo "== memcheck $test exit $?"
  grep -E "ERROR SUMMARY|Invalid|^\[  (PASSED|FAILED) " "$out/$test.memcheck.log" | head -20
done
