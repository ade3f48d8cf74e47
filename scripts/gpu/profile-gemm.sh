#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root: Nsight Compute on one timed
# forward call of the default bf16 grouped GEMM per shape (w13, uniform groups): tensor-pipe
# utilization, SM clock, DRAM and L2 throughput, issue stalls (docs/grouped_gemm.md, "Where the
# time goes"). ncu locks the clocks to base by default, so read the utilizations, not the times.
#   scripts/gpu/profile-gemm.sh BUNDLE [shape...]   (BUNDLE holds bin/dropless-bench and lib/)
set -uo pipefail
bundle=$(cd "${1:?bundle}" && pwd)
shift
export LD_LIBRARY_PATH=$bundle/lib:${LD_LIBRARY_PATH:-}
ncu=$(ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[ -n "$ncu" ] || { echo "no ncu on this machine"; exit 1; }
shapes=("$@"); [ ${#shapes[@]} -gt 0 ] || shapes=(dsv3 qwen3 mixtral)
for shape in "${shapes[@]}"; do
  echo "== $shape w13 forward, uniform groups"
  "$ncu" --kernel-name regex:'Tma(GroupedGemm|Pingpong)Kernel' --launch-skip 3 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum \
    "$bundle/bin/dropless-bench" gemm --shapes="$shape" --ops=fwd --dists=uniform --iters=5 2>&1 |
    grep -E "TmaGroupedGemm|TmaPingpong|hmma|dram__bytes|SM Frequency|DRAM Throughput|L2 Cache Throughput|Compute \(SM\)|Duration|Issue Slots Busy|Eligible Warps|No Eligible"
done
