#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repository root: builds DeepGEMM
# (deepseek-ai/DeepGEMM, SM90 FP8 grouped GEMMs) from TARBALL with the machine's torch and nvcc (no
# internet: `setup.py build_ext --inplace`, never the wheel download), imports it, JIT-compiles
# its kernels for the cases (bench/peers/deepgemm_impl.py --warm, one process per shape and
# weight, in parallel), then times dropless's fp8-block grouped GEMMs against it and torch in one
# process (bench/peers/interleaved_gemm.py --precisions fp8-block; issue 17). TARBALL is
# .device/deepgemm.tar.xz: DeepGEMM/ with third-party/cutlass and third-party/fmt filled in at the
# submodules' commits (DeepGEMM/DG_SOURCE.txt). BUNDLE (from /work/shared/tools/device-bundle)
# holds libdropless_gemm_capi.so (BUNDLE/, BUNDLE/bin/, or CAPI_LIB=path; build/bench/ as a last
# resort) and lib/. Every stage runs under `timeout`, all of them within BUDGET_S (default 560 s).
# $OUT gets three files: gemm-deepgemm-interleaved.json, interleaved.log and setup.log (stage
# summaries, the build log's tail, the import and warm-up output). Extra arguments go to
# interleaved_gemm.py after the defaults (e.g. --dists uniform to halve the run).
#   scripts/gpu/run-deepgemm-peer.sh [TARBALL] [BUNDLE] [COMMIT] [interleaved_gemm.py flags...]
set -uo pipefail
tarball=${1:-.device/deepgemm.tar.xz}
bundle=${2:-.device/t}
commit=${3:-unknown}
shift 3 2>/dev/null || shift $#
out=${OUT:-/tmp/deepgemm-peer-out}
mkdir -p "$out"
log=$out/setup.log
: >"$log"
start=$(date +%s)
budget=${BUDGET_S:-560}
# min(stage cap, seconds left of the budget)
cap() {
  local left=$(( budget - ($(date +%s) - start) ))
  [ "$left" -gt 1 ] || left=1
  [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}
say() { echo "$*" | tee -a "$log"; }
fail() { say "FAILED: $*"; exit "${2:-1}"; }

repo=$PWD
bundle_abs=$(cd "$bundle" 2>/dev/null && pwd) || bundle_abs=$repo/$bundle
nccl_dir=${NCCL_LIB_DIR:-$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || echo /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib)}
export LD_LIBRARY_PATH=$bundle_abs/lib${nccl_dir:+:$nccl_dir}:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1

capi=${CAPI_LIB:-}
for c in "$bundle_abs/libdropless_gemm_capi.so" "$bundle_abs/bin/libdropless_gemm_capi.so" \
         "$repo/build/bench/libdropless_gemm_capi.so"; do
  [ -n "$capi" ] && break
  [ -f "$c" ] && capi=$c
done
say "capi: ${capi:-MISSING (no libdropless_gemm_capi.so in $bundle, \$CAPI_LIB or build/bench)}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$log"

# ---- toolchain: nvcc and cuobjdump (the JIT calls both at run time), nvrtc, Python.h
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then
    CUDA_HOME=/usr/local/cuda
  else
    nvcc_bin=$(command -v nvcc) || fail "no nvcc on PATH and no /usr/local/cuda/bin/nvcc"
    CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")
  fi
fi
export CUDA_HOME
for b in nvcc cuobjdump; do [ -x "$CUDA_HOME/bin/$b" ] || fail "$CUDA_HOME/bin/$b missing (DeepGEMM's JIT runs it)"; done
cuda_lib=
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib"; do
  ls "$d"/libnvrtc.so* >/dev/null 2>&1 && { cuda_lib=$d; break; }
done
[ -n "$cuda_lib" ] || fail "no libnvrtc.so under $CUDA_HOME (setup.py links -lnvrtc -lcudart)"
# setup.py names $CUDA_HOME/lib64; LIBRARY_PATH covers other layouts, the rpath finds nvrtc at import
export LIBRARY_PATH=$cuda_lib${LIBRARY_PATH:+:$LIBRARY_PATH}
export LDFLAGS="-Wl,-rpath,$cuda_lib ${LDFLAGS:-}"
say "CUDA_HOME=$CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version | grep -o 'release [0-9.]*')), libs $cuda_lib"
python3 - <<'EOF' 2>&1 | tee -a "$log"
import os, sysconfig, torch
inc = sysconfig.get_paths()["include"]
print(f"python {sysconfig.get_python_version()} torch {torch.__version__} cuda {torch.version.cuda} "
      f"cxx11abi {int(torch.compiled_with_cxx11_abi())}; Python.h {'found' if os.path.exists(inc + '/Python.h') else 'MISSING'} in {inc}; "
      f"CC {sysconfig.get_config_var('CC')}")
EOF

# ---- extract and build (develop.sh's layout: cute/ and cutlass/ linked into deep_gemm/include,
# where the JIT's -I points; the extension built in place)
work=/tmp/deepgemm-peer
rm -rf "$work" && mkdir -p "$work" || fail "cannot create $work"
timeout "$(cap 60)" tar xJf "$tarball" -C "$work" || fail "extracting $tarball"
dg=$work/DeepGEMM
DEEP_GEMM_SOURCE=${DEEP_GEMM_SOURCE:-$(awk 'NR == 1 {print $1}' "$dg/DG_SOURCE.txt" 2>/dev/null)}
export DEEP_GEMM_SOURCE=${DEEP_GEMM_SOURCE:-deepseek-ai/DeepGEMM@54e22612409371d6364144b69086735beb54e98b}
head -3 "$dg/DG_SOURCE.txt" 2>/dev/null | tee -a "$log"
ln -sfn ../../third-party/cutlass/include/cute "$dg/deep_gemm/include/cute"
ln -sfn ../../third-party/cutlass/include/cutlass "$dg/deep_gemm/include/cutlass"
build_env=()
if ! python3 -c 'import wheel.bdist_wheel' >/dev/null 2>&1; then
  # setup.py imports wheel.bdist_wheel at the top; newer setuptools holds the command itself
  mkdir -p "$work/shim/wheel" && : >"$work/shim/wheel/__init__.py"
  echo 'from setuptools.command.bdist_wheel import bdist_wheel' >"$work/shim/wheel/bdist_wheel.py"
  build_env=(env "PYTHONPATH=$work/shim${PYTHONPATH:+:$PYTHONPATH}")
  say "wheel.bdist_wheel not importable: shimmed from setuptools"
fi
# DG_FORCE_BUILD / DG_USE_LOCAL_VERSION: never the prebuilt-wheel download (only bdist_wheel tries)
export DG_FORCE_BUILD=1 DG_USE_LOCAL_VERSION=1 MAX_JOBS=16
t0=$(date +%s)
(cd "$dg" && timeout "$(cap 360)" "${build_env[@]}" python3 setup.py build_ext --inplace) >"$work/build.log" 2>&1
rc=$?
say "deep_gemm build: exit $rc in $(( $(date +%s) - t0 )) s (setup.py build_ext --inplace, MAX_JOBS=$MAX_JOBS)"
if [ "$rc" -ne 0 ] || ! ls "$dg"/deep_gemm/_C*.so >/dev/null 2>&1; then
  tail -40 "$work/build.log" | tee -a "$log"
  fail "deep_gemm build (exit $rc)"
fi
grep -iE "warning: |error" "$work/build.log" | head -5 >>"$log"

# ---- import (the JIT cache lives with the build; DG_JIT_CACHE_DIR is what deepgemm_impl.py warms)
export PYTHONPATH=$dg${PYTHONPATH:+:$PYTHONPATH}
export DG_JIT_CACHE_DIR=$work/jit-cache
timeout "$(cap 120)" python3 - <<'EOF' 2>&1 | tee -a "$log"
import os, torch, deep_gemm
need = ("m_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_nt_contiguous",
        "get_mn_major_tma_aligned_tensor", "get_mk_alignment_for_contiguous_layout")
print(f"deep_gemm {deep_gemm.__version__} ({os.environ.get('DEEP_GEMM_SOURCE')}) from {deep_gemm.__file__}; "
      f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}, {deep_gemm.get_num_sms()} SMs, "
      f"mk alignment {deep_gemm.get_mk_alignment_for_contiguous_layout()}; "
      f"missing: {[n for n in need if not hasattr(deep_gemm, n)] or 'none'}")
EOF
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "import deep_gemm"

# ---- smoke: one small m-grouped call in one process, DeepGEMM's JIT verbose, Python's fault
# handler on (a crash names the Python line; gdb, where the machine has it, adds the native stack)
cat >"$work/smoke.py" <<'PY'
import torch, deep_gemm
torch.manual_seed(0)
G, m_g, n, k = 2, 128, 256, 256
m = G * m_g
fp8 = torch.float8_e4m3fn
a = torch.randn(m, k, device="cuda").to(fp8)
sfa = torch.ones(m, k // 128, device="cuda", dtype=torch.float32)
b = torch.randn(G, n, k, device="cuda").to(fp8)
sfb = torch.ones(G, n // 128, k // 128, device="cuda", dtype=torch.float32)
d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
layout = torch.arange(m, device="cuda", dtype=torch.int32) // m_g
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libstdc++" in l})
print(f"smoke: libstdc++ mapped: {maps}", flush=True)
print("smoke: calling m_grouped_fp8_gemm_nt_contiguous", flush=True)
deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, deep_gemm.get_mn_major_tma_aligned_tensor(sfa)), (b, sfb), d, layout)
torch.cuda.synchronize()
ref = torch.cat([a[i * m_g:(i + 1) * m_g].float() @ b[i].float().t() for i in range(G)])
err = ((d.float() - ref).norm() / ref.norm()).item()
print(f"smoke: m-grouped ok, relative error {err:.2e}", flush=True)
PY
t0=$(date +%s)
DG_JIT_DEBUG=1 timeout "$(cap 150)" stdbuf -oL -eL python3 -X faulthandler "$work/smoke.py" >"$work/smoke.log" 2>&1
smoke_rc=$?
tail -40 "$work/smoke.log" | tee -a "$log"
say "smoke: exit $smoke_rc in $(( $(date +%s) - t0 )) s"
if [ "$smoke_rc" -ne 0 ]; then
  # A crash inside std::regex (DeepGEMM's JIT include parser) has been seen here: the extension's
  # inline libstdc++ code bound to another copy of the library's internals than the process's
  # locale. Preloading the libstdc++ of the compiler that built the extension puts its symbols first.
  stdcxx=$(g++ -print-file-name=libstdc++.so.6 2>/dev/null)
  if [ -n "$stdcxx" ] && [ -e "$stdcxx" ]; then
    stdcxx=$(readlink -f "$stdcxx")
    DG_JIT_DEBUG=1 LD_PRELOAD=$stdcxx timeout "$(cap 150)" stdbuf -oL -eL python3 -X faulthandler "$work/smoke.py" \
      >"$work/smoke-preload.log" 2>&1
    smoke_rc=$?
    tail -20 "$work/smoke-preload.log" | tee -a "$log"
    say "smoke with LD_PRELOAD=$stdcxx: exit $smoke_rc"
    [ "$smoke_rc" -eq 0 ] && export LD_PRELOAD=$stdcxx${LD_PRELOAD:+:$LD_PRELOAD}
  fi
fi
if [ "$smoke_rc" -ne 0 ]; then
  if command -v gdb >/dev/null 2>&1; then
    timeout "$(cap 120)" gdb -q -batch -ex run -ex bt --args python3 "$work/smoke.py" 2>&1 | grep -vE "^\[(New|Thread)" | tail -40 | tee -a "$log"
  else
    # No gdb: a preloaded SIGSEGV handler prints the native frames (module + offset), and
    # addr2line names the functions of the modules that have symbols.
    cat >"$work/segv_trace.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>
static void on_fault(int sig, siginfo_t* info, void* ctx) {
  (void)ctx;
  void* frames[64];
  int n = backtrace(frames, 64);
  dprintf(2, "segv_trace: signal %d at address %p\n", sig, info->si_addr);
  for (int i = 0; i < n; ++i) {
    Dl_info d;
    if (dladdr(frames[i], &d) && d.dli_fname) {
      dprintf(2, "segv_trace: frame %d %s 0x%lx %s\n", i, d.dli_fname,
              (unsigned long)((char*)frames[i] - (char*)d.dli_fbase), d.dli_sname ? d.dli_sname : "?");
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) {
  struct sigaction sa = {0};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGBUS, &sa, 0);
}
C
    if cc -shared -fPIC -O1 -o "$work/segv_trace.so" "$work/segv_trace.c" -ldl 2>>"$log"; then
      DG_JIT_DEBUG=1 LD_PRELOAD=$work/segv_trace.so timeout "$(cap 120)" stdbuf -oL -eL python3 "$work/smoke.py" \
        >"$work/smoke-trace.log" 2>&1
      grep -v "^segv_trace: frame" "$work/smoke-trace.log" | tail -25 | tee -a "$log"
      grep "^segv_trace: frame" "$work/smoke-trace.log" | head -30 | while read -r _ _ idx mod off sym; do
        where=$(addr2line -f -C -e "$mod" "$off" 2>/dev/null | head -1)
        say "  #$idx $(basename "$mod") $off $sym ${where:+($where)}"
      done
    else
      say "no gdb on this machine, and cc could not build the SIGSEGV tracer"
    fi
  fi
  ls -la "$dg/deep_gemm/include" | tee -a "$log"
  fail "DeepGEMM smoke call (exit $smoke_rc)"
fi

# ---- JIT warm-up: one process per shape:weight, in parallel (nvcc runs once per kernel config)
shapes=dsv3,qwen3,mixtral
dists=uniform,zipf
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do  # the run's --shapes / --dists, when given
  case ${args[i]} in
    --shapes) shapes=${args[i + 1]:-$shapes} ;; --shapes=*) shapes=${args[i]#*=} ;;
    --dists) dists=${args[i + 1]:-$dists} ;; --dists=*) dists=${args[i]#*=} ;;
  esac
done
t0=$(date +%s)
warm_cap=$(cap "${WARM_S:-180}")
pids=()
for s in ${shapes//,/ }; do
  for w in w13 w2; do
    timeout "$warm_cap" python3 bench/peers/deepgemm_impl.py --dists "$dists" \
      --warm "$s:$w:fwd,$s:$w:dgrad,$s:$w:wgrad" >"$work/warm-$s-$w.log" 2>&1 &
    pids+=($!)
  done
done
warm_rc=0
for p in "${pids[@]}"; do wait "$p" || warm_rc=1; done
cat "$work"/warm-*.log | grep -vE "^\s*$" | tail -60 >>"$log"
say "deep_gemm JIT warm-up: exit $warm_rc in $(( $(date +%s) - t0 )) s, $(ls "$DG_JIT_CACHE_DIR/cache" 2>/dev/null | wc -l) kernels cached"
grep -h "FAILED\|Error\|error" "$work"/warm-*.log | head -10

# ---- the timed run
[ -n "$capi" ] || fail "no libdropless_gemm_capi.so: DeepGEMM built and warmed, nothing timed" 3
run_cap=$(cap 400)
[ "$run_cap" -gt 30 ] || fail "no time left for interleaved_gemm.py (${run_cap} s)"
t0=$(date +%s)
timeout "$run_cap" python3 bench/peers/interleaved_gemm.py --lib "$capi" \
  --out "$out/gemm-deepgemm-interleaved.json" --commit "$commit" --precisions fp8-block \
  --shapes "$shapes" --dists "$dists" --ops fwd,dgrad,wgrad --rounds 3 --iters 10 --warm-s 0.2 \
  "$@" >"$out/interleaved.log" 2>&1
rc=$?
say "interleaved_gemm.py: exit $rc in $(( $(date +%s) - t0 )) s (limit $run_cap s; whole script $(( $(date +%s) - start )) s)"
grep -E "TFLOP/s|^deep_gemm|peer error|check failed|skipped" "$out/interleaved.log" | head -120
[ "$rc" -eq 0 ] || { tail -30 "$out/interleaved.log"; exit "$rc"; }
python3 -c "import json, sys; r = json.load(open(sys.argv[1])); print('peer_versions', r['peer_versions']); [print(e) for e in r.get('peer_errors', [])]" \
  "$out/gemm-deepgemm-interleaved.json"
