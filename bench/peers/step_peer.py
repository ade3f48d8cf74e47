#!/usr/bin/env python3
"""`dropless-bench step` and its peers: one MoE layer training step on one GPU, timed in one process.

The layer (every impl computes the same thing):
  logits = x @ Wr (bf16 operands, fp32 out); probs = softmax(logits); top-k with weights
  renormalized to sum 1; Switch aux loss 0.01 * E * sum_e f_e * P_e (f_e: share of the T*k choices
  that went to e, P_e: mean router probability of e); permute the T*k (token, choice) rows into
  expert-contiguous order (stable argsort of expert ids); h = grouped GEMM(xs, w1 [E,H,2F]);
  a = silu(h[:, :F]) * h[:, F:]; y = grouped GEMM(a, w2 [E,F,H]); unpermute + weighted combine;
  out = x + combined; loss = mean((out - target)^2) + aux, target a fixed random tensor.
  Backward through all of it (autograd; the layer input x requires grad, as a layer in a stack,
  so both data-gradient GEMMs are part of the step), then AdamW over fp32 master weights
  (lr 1e-4, betas 0.9/0.999, eps 1e-8, --weight-decay, default 0.0 as dropless's OptimizerSpec)
  and the bf16 copies refreshed from the masters after the step.
  Step FLOPs: 18*T*k*H*F (fwd + dgrad + wgrad of both expert GEMMs; router and the rest uncounted).
  MFU is against 989.5 TFLOP/s, the dense BF16 datasheet peak of H100/H200 SXM.

Impls (names as in ../shared/docs/BENCH.md):
  torch._grouped_mm         both expert GEMMs with torch._grouped_mm(offs=int32 cumulative group ends)
  torch._grouped_mm+master-adamw
                            (opt-in) the same layer with a master-weight AdamW: one torch.compile'd
                            pass per weight reads the bf16 gradient and writes the fp32 master,
                            moments and bf16 weight (28 B a parameter), where torch._grouped_mm
                            casts the gradient to fp32, runs torch.optim.AdamW(fused=True) and
                            copies the weight back (40 B): the stronger torch optimizer. Every torch
                            impl counts rows per expert without a host sync (scatter_add_); all run
                            eagerly otherwise (no CUDA graph, no torch.compile of the layer). The
                            JSON row's `optimizer` says which optimizer path ran.
  torch-naive-loop          a Python loop over experts, one matmul per expert (host sync for sizes)
  jax.ragged_dot            jax.lax.ragged_dot, jitted value_and_grad + hand-written AdamW
                            (--jax-allocator platform, the default: XLA_PYTHON_CLIENT_ALLOCATOR=
                            platform, so that what JAX frees, a failed compile's included, goes back
                            to the device for the impls after it, at one cudaMalloc/cudaFree of the
                            step's temporaries a step; bfc: XLA's pool, capped at --jax-mem-fraction
                            and never returned while the process lives. XLA:GPU may lower ragged_dot
                            to a zero-padded batched dot whose temporaries grow as E/ep x T*k x H:
                            a RESOURCE_EXHAUSTED failure line is that lowering)
  torch._scaled_grouped_mm  (precision fp8-rowwise; default with a quantized --precision) forward expert
                            GEMMs in e4m3 with row-wise scales (activation rows, weight columns,
                            quantized every step), backward in bf16 torch._grouped_mm
  dropless                  the CUDA step engine through ctypes (--lib) in --precision, C API:

      void* dl_step_create(const char* spec_yaml, char* err, int err_len);
          // builds the engine for the job spec (YAML text); NULL on error, message in err
      int   dl_step_run(void* h, int steps, double* ms_per_step, char* err, int err_len);
          // runs `steps` full training steps, synchronizes, writes the mean ms per step; 0 = ok,
          // else the message is in err
      int   dl_step_stats(void* h, double* out, int n);
          // fills up to n doubles, in this order: peak_mem_bytes, loss, fwd_gemm_ms,
          // dgrad_gemm_ms, wgrad_gemm_ms (the step's own grouped GEMMs timed alone: each is
          // both expert GEMMs, w1 and w2, of one step, 6*T*k*H*F FLOPs), dispatch_ms,
          // combine_ms; returns how many it wrote
      void  dl_step_destroy(void* h);

  Any dropless impl may carry environment variables for its engine, "dropless@VAR=VALUE;VAR=VALUE"
  (set while the engine is created, over those the impl's name sets): variants of one engine timed
  in the same rounds.
  dropless-bf16-moments and dropless-bf16-bf16-moments (opt-in) are dropless and dropless-bf16
  with AdamW's moments stored in bf16 (optimizer.moment_dtype: bf16; the JSON row's moment_dtype);
  dropless-bf16-moments-two-pass-adamw is dropless-bf16-moments with the two passes forced.
  dropless-bf16 (default with a quantized --precision) is the same engine in bf16, so that the
  quantized step and the bf16 step are compared in one run. dropless-mx-promotion (opt-in, with
  --precision mxfp8) is the mxfp8 engine on its per-32 promotion kernels (DROPLESS_MX_CORE=0)
  instead of the default bf16-core expert GEMMs. dropless-fp8-block (opt-in, with --precision
  fp8-block-wgrad128) is the engine in fp8-block, whose weight gradient reads X per 1x128 tile.
  Each round creates the engine, runs 1 warm step and one timed dl_step_run(steps), reads
  dl_step_stats (per-step values of the last run) and destroys it. The spec passed is printed by
  --print-spec (step_impls/dropless_capi.py): the fields of the brief plus name, renormalize,
  activation, aux_loss_coeff and the AdamW constants, so that it states what the peers compute;
  `dropless submit` accepts it.

Method: for each shape, for each round, for each impl (order rotated per round): build its state
(the same seeded init for the torch and JAX impls), run one warm step, time --steps steps
(synchronize, wall clock, synchronize), record, free the state. dropless's `ms` is not that wall
clock but its own CUDA events around forward, backward and optimizer (`engine_ms`; `wall_ms` in
the JSON row is the wall clock, which also holds the synthetic task's batch, the tokens and the
teacher's forward that the peers do not compute, and one host wait a step). Reported: the median over rounds of ms per step (the H200's
clock moves 5-15% with its power cap, so the impls alternate rather than run one after the
other; `round_ms` lists every round). Peak memory: torch max_memory_allocated (reset per impl and
round), JAX peak_bytes_in_use (process lifetime; null without memory stats), dropless its own
peak_mem_bytes. `loss`: torch and JAX the first step's (the same init: they should agree to bf16
rounding), dropless the one it reports. `ceilings.dense_bf16_tflops`: a bf16 8192^3 torch.mm in
the same run (and `ceilings_at_end`). A failing or missing impl prints one line (also in the
JSON's `errors`) and the others go on.

--ep N or --ep dsv3=8,qwen3=1 (default 1): every impl models one GPU's share of an N-way
expert-parallel layer without the all-to-all (dropless too: its spec has E/N experts at
parallel.ep 1, all T*k rows routed to them; the row's `ep` is N): E/N local experts,
the router over all E, each choice folded onto local expert (id mod E/N), so each local expert
sees N times the rows, as in EP. Memory: weights + fp32 masters + AdamW state + fp32 grads take
20 B per parameter; dsv3 at ep 1 (11.3 G expert parameters, ~210 GiB) cannot fit one H200: the
peers are then skipped with that reason (dropless is still tried); use --ep dsv3=8.

--check: float32 on the tiny shape (ep 1, ep 2, two experts without tokens): loss and gradients
(x, Wr, w1, w2) of torch._grouped_mm, the naive loop and JAX against each other and against a
float64 formulation without permutation, to 1e-4 (max-abs relative); JAX's AdamW against
torch.optim.AdamW fed the same gradients; on a GPU also the bf16 (and fp8) torch steps against the
bf16 naive loop, and torch._grouped_mm+master-adamw's optimizer against torch.optim.AdamW. Exit status 1 on any failure. --device cpu runs it (and smoke runs) on a CPU.

Files: this script (bench loop, table, JSON), step_impls/ (torch_impls, jax_impl, dropless_capi,
check).

  python3 bench/peers/step_peer.py --check [--device cpu|cuda]
  python3 bench/peers/step_peer.py --lib build/lib/libdropless_step.so --ep dsv3=8 \
      --json bench/results/step-h200-YYYYMMDD.json [--precision mxfp8|fp8-block] [--rounds 5 --steps 10]
"""
import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_impls import (BF16_MOMENT_IMPLS, DEFAULT_IMPLS, DROPLESS, DROPLESS_BF16,  # noqa: E402
                        DROPLESS_BF16_MOMENTS_TWO_PASS,
                        DROPLESS_BF16_BF16_MOMENTS, DROPLESS_BF16_MOMENTS, DROPLESS_IMPLS,
                        DROPLESS_FP8_BLOCK, DROPLESS_FUSED, DROPLESS_MX_PROMOTION,
                        DROPLESS_TWO_PASS, FP8, GROUPED_MASTER, JAX, PEAK,
                        SHAPES, short, step_flop)
from step_impls.dropless_capi import STAT_NAMES, DroplessStep, dropless_spec, load_lib  # noqa: E402
from step_impls.jax_impl import JaxStep  # noqa: E402
from step_impls.torch_impls import TorchStep, init_tensors  # noqa: E402


def dense_bf16_tflops(torch, device):
    """Median of 5 timings of 10 bf16 8192^3 torch.mm (1024^3 on a CPU smoke run)."""
    d = 8192 if device == "cuda" else 1024
    a = torch.randn(d, d, device=device, dtype=torch.bfloat16)
    b = torch.randn(d, d, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b)
    times = []
    for _ in range(5):
        sync(torch, device)
        t0 = time.perf_counter()
        for _ in range(10):
            torch.mm(a, b)
        sync(torch, device)
        times.append((time.perf_counter() - t0) * 100)
    del a, b
    free(torch, device)
    return round(2.0 * d ** 3 / (statistics.median(times) * 1e9), 1)


def sync(torch, device):
    if device == "cuda":
        torch.cuda.synchronize()


def free(torch, device):
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def split_env(name):
    """'dropless@VAR=VALUE[;VAR=VALUE]' -> ('dropless', {VAR: VALUE}): a dropless impl created
    with those environment variables set (engine A/B variants in one process)."""
    base, _, rest = name.partition("@")
    pairs = [kv.split("=", 1) for kv in rest.split(";") if kv]
    if any(len(p) != 2 or not p[0] for p in pairs):
        raise ValueError(f"{name}: an engine variant is IMPL@VAR=VALUE[;VAR=VALUE]")
    return base, dict(pairs)


def run_one(name, shape, ctx, args):
    """Builds one impl, warms it, times args.steps steps; returns a measurement dict."""
    torch, jax, dev = ctx["torch"], ctx.get("jax"), ctx["device"]
    meas, obj = {}, None
    name, env = split_env(name)
    try:
        if name in DROPLESS_IMPLS:
            precision = {DROPLESS_BF16: "bf16", DROPLESS_BF16_BF16_MOMENTS: "bf16",
                         DROPLESS_FP8_BLOCK: "fp8-block"}.get(name, args.precision)
            # Read by the engine when it is created.
            if name in (DROPLESS_FUSED, DROPLESS_TWO_PASS, DROPLESS_BF16_MOMENTS_TWO_PASS):
                os.environ["DROPLESS_FUSED_EXPERT_ADAMW"] = "1" if name == DROPLESS_FUSED else "0"
            else:
                os.environ.pop("DROPLESS_FUSED_EXPERT_ADAMW", None)
            if name == DROPLESS_MX_PROMOTION:
                os.environ["DROPLESS_MX_CORE"] = "0"
            else:
                os.environ.pop("DROPLESS_MX_CORE", None)
            moments = "bf16" if name in BF16_MOMENT_IMPLS else None
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                obj = DroplessStep(ctx["lib"], dropless_spec(shape, args, precision, moments))
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            obj.run(1)
            t0 = time.perf_counter()
            obj.run(args.steps)
            # The training step (forward, backward, optimizer) by the engine's events; the wall
            # time also holds the synthetic task's batch (tokens and the teacher's forward pass),
            # which the peers do not compute, and one host wait per step.
            meas["wall_ms"] = (time.perf_counter() - t0) * 1e3 / args.steps
            meas["ms"] = obj.engine_ms
            st = obj.stats()
            meas.update(engine_ms=obj.engine_ms, stats=st, peak=st.get("peak_mem_bytes"),
                        loss=st.get("loss"))
            return meas
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        init = init_tensors(torch, shape, args.ep_of[shape], dev)
        if name == JAX:
            obj = JaxStep(jax, torch, shape, init, "bfloat16", args.weight_decay)
            del init
            free(torch, dev)
        else:
            obj = TorchStep(torch, name, shape, init, torch.bfloat16, args.weight_decay)
            del init
        obj.step()
        obj.sync()
        meas["loss"] = float(obj.loss)  # after the first step: the same init for torch and JAX
        meas["optimizer"] = getattr(obj, "optimizer", None)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            obj.step()
        obj.sync()
        meas["ms"] = (time.perf_counter() - t0) * 1e3 / args.steps
        meas["peak"] = (obj.peak_bytes() if name == JAX else
                        torch.cuda.max_memory_allocated() if dev == "cuda" else None)
        return meas
    finally:
        if isinstance(obj, DroplessStep):
            obj.close()
        del obj
        free(torch, dev)


def preflight(args, ctx, impls, nparam):
    """Skips (with the reason) the peers whose weights, masters, grads and AdamW state alone exceed
    the device (20 B/param for torch, ~16 for JAX within its memory fraction); dropless still runs."""
    if ctx["device"] != "cuda":
        return {}
    total = ctx["torch"].cuda.get_device_properties(0).total_memory
    skip = {}
    for name in impls:
        need = nparam * (16 if name == JAX else 20)
        capped = name == JAX and args.jax_allocator == "bfc"
        have = total * (args.jax_mem_fraction if capped else 1.0)
        if split_env(name)[0] not in DROPLESS_IMPLS and need > have:
            skip[name] = (f"skipped: needs > {need / 2 ** 30:.0f} GiB for weights, fp32 masters, "
                          f"grads and AdamW state, {have / 2 ** 30:.0f} GiB available"
                          + ("; raise --jax-mem-fraction" if capped else "; use a larger --ep for it"))
            print(f"  {name}: {skip[name]}", flush=True)
    return skip


def bench(args, impls):
    import torch
    ctx = {"torch": torch, "device": args.device or "cuda", "skipped": []}
    if JAX in impls:
        try:
            import jax
            ctx["jax"] = jax
            platform = jax.devices()[0].platform
            if ctx["device"] == "cuda" and platform != "gpu":
                raise RuntimeError(f"jax {jax.__version__} has no GPU backend (only {platform}); "
                                   "install its CUDA plugin")
        except Exception as exc:
            ctx["skipped"].append(f"{JAX}: {short(exc)}")
            impls.remove(JAX)
    ours = [n for n in impls if split_env(n)[0] in DROPLESS_IMPLS]
    if ours:
        problem = "no --lib" if not args.lib else None
        if args.lib:
            try:
                ctx["lib"] = load_lib(args.lib)
            except Exception as exc:
                problem = short(exc)
        if problem:
            for name in ours:
                ctx["skipped"].append(f"{name}: {problem}")
                impls.remove(name)
    for line in ctx["skipped"]:
        print(f"skip {line}", flush=True)
    ceil = dense_bf16_tflops(torch, ctx["device"])
    print(f"dense bf16 GEMM: {ceil} TFLOP/s; impls: {', '.join(impls)}", flush=True)
    rows, errors = [], [f"skipped {line}" for line in ctx["skipped"]]
    for shape in args.shapes.split(","):
        t, h, f, e, k = SHAPES[shape]
        ep = args.ep_of[shape]
        nparam = h * e + 3 * (e // ep) * h * f
        print(f"\n{shape}: T={t} H={h} F={f} E={e} k={k} ep={ep}: {nparam / 1e9:.2f} G params, "
              f"~{nparam * 20 / 2 ** 30:.0f} GiB of weights, masters, grads and AdamW state", flush=True)
        res = {n: [] for n in impls}
        failed = preflight(args, ctx, impls, nparam)
        errors.extend(f"{n} {shape}: {m}" for n, m in failed.items())
        for r in range(args.rounds):
            order = impls[r % len(impls):] + impls[:r % len(impls)]
            for name in order:
                if name in failed:
                    continue
                try:
                    res[name].append(run_one(name, shape, ctx, args))
                except Exception as exc:
                    failed[name] = short(exc)
                    msg = f"{name} {shape}: {failed[name]}"
                    errors.append(msg)
                    print(f"  FAILED {msg}", flush=True)
                free(torch, ctx["device"])  # what a failed impl held, once its traceback is gone
        flop = step_flop(shape)
        note = (f"T={t} H={h} F={f} E={e} k={k}; one GPU, ep={ep}"
                f"{' (peers: E/ep local experts, no all-to-all)' if ep > 1 else ''}; "
                f"median of {args.rounds} interleaved rounds of {args.steps} steps")
        print(f"  {'impl':26} {'prec':11} {'ms':>9} {'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9} "
              f"{'loss':>9}  rounds ms")
        for name in impls:
            ms_all = [m["ms"] for m in res[name]]
            if not ms_all or name in failed:
                continue
            base = split_env(name)[0]
            ms = statistics.median(ms_all)
            tflops = flop / (ms * 1e9)
            peaks = [m["peak"] for m in res[name] if m.get("peak") is not None]
            loss = res[name][-1].get("loss")
            prec = {DROPLESS: args.precision, DROPLESS_MX_PROMOTION: args.precision,
                    DROPLESS_BF16_MOMENTS: args.precision,
                    DROPLESS_FP8_BLOCK: "fp8-block", FP8: "fp8-rowwise"}.get(base, "bf16")
            ours = base in DROPLESS_IMPLS
            row = {"name": "step", "shape": shape, "impl": name, "precision": prec,
                   "ms": round(ms, 3), "tflops": round(tflops, 1), "gbps": None,
                   "mfu": round(tflops / PEAK["tflops"], 4),
                   "peak_mem_gib": round(max(peaks) / 2 ** 30, 2) if peaks else None,
                   "ep": ep, "backend": (args.dispatcher or "auto") if ours else "local",
                   "offload": bool(args.offload) if ours else False,
                   "loss": loss, "round_ms": [round(x, 3) for x in ms_all], "note": note}
            if res[name][-1].get("optimizer"):
                row["optimizer"] = res[name][-1]["optimizer"]
            if ours:
                row["moment_dtype"] = "bf16" if base in BF16_MOMENT_IMPLS else "fp32"
                # The host's view: also the synthetic batch (tokens, the teacher's forward), which
                # the peers do not compute, and one host wait a step.
                row["wall_ms"] = round(statistics.median(m["wall_ms"] for m in res[name]), 3)
                st = {key: statistics.median(m["stats"][key] for m in res[name])
                      for key in STAT_NAMES[2:] if all(key in m["stats"] for m in res[name])}
                row["phases_ms"] = {key: round(v, 3) for key, v in st.items()}
                row["engine_ms"] = round(statistics.median(m["engine_ms"] for m in res[name]), 3)
                gemm = [st.get(key) for key in ("fwd_gemm_ms", "dgrad_gemm_ms", "wgrad_gemm_ms")]
                # each of fwd, dgrad, wgrad is 6*T*k*H*F: the harmonic mean of their throughputs
                row["gemm_tflops"] = (round(flop / (sum(gemm) * 1e9), 1)
                                      if all(g and g > 0 for g in gemm) else None)
            rows.append(row)
            print(f"  {name:26} {prec:11} {ms:9.3f} {tflops:8.1f} {row['mfu']:6.3f} "
                  f"{row['peak_mem_gib'] if row['peak_mem_gib'] is not None else '-':>9} "
                  f"{loss if loss is None else round(loss, 5)!s:>9}  "
                  f"{' '.join(f'{x:.2f}' for x in ms_all)}", flush=True)
            if ours:
                print(f"    engine {row['engine_ms']} ms; phases {row['phases_ms']}; "
                      f"gemm harmonic mean {row['gemm_tflops']} TFLOP/s", flush=True)
    return rows, errors, ceil, ctx


def write_json(args, rows, errors, ceil_start, ctx):
    torch = ctx["torch"]
    name = torch.cuda.get_device_name() if ctx["device"] == "cuda" else "cpu"
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                               text=True, cwd=here).stdout.strip()
        if commit and not args.commit and subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                                     capture_output=True, text=True, cwd=here).stdout.strip():
            commit += "-dirty"
    except OSError:
        commit = ""
    versions = {"torch": torch.__version__}
    if "jax" in ctx:
        versions["jax"] = ctx["jax"].__version__
        versions["jax_env"] = {k: os.environ[k] for k in sorted(os.environ)
                               if k.startswith("XLA_")}
    today = datetime.date.today()
    path = args.json or f"step-{name.split()[-1].lower()}-{today:%Y%m%d}.json"
    result = {"bench": "step", "device": f"{name} (1 GPU)", "date": today.isoformat(),
              "command": "python3 bench/peers/step_peer.py " + " ".join(sys.argv[1:]),
              "commit": commit or "unknown", "ceilings": {"dense_bf16_tflops": ceil_start},
              "ceilings_at_end": {"dense_bf16_tflops": dense_bf16_tflops(torch, ctx["device"])},
              "mfu_peak": PEAK, "peer_versions": versions, "rows": rows, "errors": errors}
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="dsv3,qwen3,mixtral", help=f"of {','.join(SHAPES)}")
    ap.add_argument("--impls", default=None, help=f"default {','.join(DEFAULT_IMPLS)} "
                    f"(+{FP8} and {DROPLESS_BF16} with a quantized --precision)")
    ap.add_argument("--precision", choices=("bf16", "mxfp8", "fp8-block", "fp8-block-wgrad128"),
                    default="bf16",
                    help="dropless's precision; the torch and JAX peers stay bf16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per impl and round")
    ap.add_argument("--lib", help="shared library with the dl_step_* C API")
    ap.add_argument("--json", help="output file (default step-<gpu>-<yyyymmdd>.json)")
    ap.add_argument("--ep", default="1", help="N for every shape, or per shape: dsv3=8,qwen3=1")
    ap.add_argument("--dispatcher", help="dropless spec `dispatcher:` (auto, nccl-a2a, ...)")
    ap.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD here; give it "
                    "when the binaries were built elsewhere)")
    ap.add_argument("--offload", action="store_true", help="dropless spec `activation_offload: true`")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--jax-allocator", choices=("platform", "bfc"), default="platform",
                    help="JAX's device allocator: platform returns what JAX frees (default); bfc "
                    "is XLA's pool, capped at --jax-mem-fraction and kept while the process lives")
    ap.add_argument("--jax-mem-fraction", type=float, default=0.45,
                    help="XLA_PYTHON_CLIENT_MEM_FRACTION with --jax-allocator bfc (JAX's cap; "
                    "torch and dropless get the rest)")
    ap.add_argument("--check", action="store_true", help="float32 agreement of the peers (tiny)")
    ap.add_argument("--device", choices=("cpu", "cuda"), help="default cuda (--check: cuda if any); cpu: smoke runs")
    ap.add_argument("--print-spec", action="store_true", help="print dropless's spec per shape, exit")
    args = ap.parse_args()
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", str(args.jax_mem_fraction))
    # The flag decides (an inherited XLA_PYTHON_CLIENT_ALLOCATOR would contradict the preflight).
    os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = args.jax_allocator
    if args.check:
        from step_impls.check import run_check
        sys.exit(0 if run_check(args) else 1)
    shapes = args.shapes.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"--shapes: unknown {','.join(unknown)} (known: {','.join(SHAPES)})")
    try:
        given = dict(x.split("=") if "=" in x else ("*", x) for x in args.ep.split(","))
        args.ep_of = {s: int(given.get(s, given.get("*", 1))) for s in SHAPES}
    except ValueError:
        sys.exit(f"--ep: {args.ep!r} is not N or shape=N,...")
    for s in shapes:
        if args.ep_of[s] < 1 or SHAPES[s][3] % args.ep_of[s]:
            sys.exit(f"--ep: {s} has {SHAPES[s][3]} experts, not divisible by {args.ep_of[s]}")
    if args.print_spec:
        for s in shapes:
            print(f"# {s}\n{dropless_spec(s, args)}")
        return
    quantized = [FP8, DROPLESS_BF16] if args.precision != "bf16" else []
    impls = args.impls.split(",") if args.impls else DEFAULT_IMPLS + quantized
    try:
        bad = [i for i in impls if i not in DEFAULT_IMPLS + [FP8, GROUPED_MASTER]
               and split_env(i)[0] not in DROPLESS_IMPLS]
    except ValueError as exc:
        sys.exit(f"--impls: {exc}")
    if bad:
        sys.exit(f"--impls: unknown {','.join(bad)}")
    rows, errors, ceil, ctx = bench(args, list(impls))
    write_json(args, rows, errors, ceil, ctx)


if __name__ == "__main__":
    main()
