#!/usr/bin/env python3
"""Peers of `dropless-bench gemm`, run in the same job on the same GPU.

Reads the JSON that `dropless-bench gemm --json` wrote (its rows, ceilings and the exact group
sizes it used), measures torch._grouped_mm (fwd, dgrad, wgrad), torch._scaled_grouped_mm (fp8
rowwise fwd), a naive per-expert torch loop (fwd) and optionally jax.lax.ragged_dot (fwd) on the
same shapes and group sizes, and writes the merged BENCH.md JSON.

  python3 bench/peers/gemm_peer.py --base dropless.json --out gemm-h200-YYYYMMDD.json \
      --command "exact command line" [--jax]
"""
import argparse
import json
import os
import statistics
import sys
import time

SHAPES = {  # name: (tokens, hidden, ffn, experts, top_k), as in bench/gemm_bench.cu
    "dsv3": (8192, 7168, 2048, 256, 8),
    "qwen3": (16384, 2048, 768, 128, 8),
    "mixtral": (8192, 4096, 14336, 8, 2),
    # One rank of dsv3 under 8-way expert parallelism (the step benchmark's `--ep dsv3=8`): the
    # 65536 routed rows land on 32 local experts, 2048 a group. Python peers only.
    "dsv3-ep8": (8192, 7168, 2048, 32, 8),
}


# Idle seconds before each measurement and the ops measured (--cooldown-ms, --ops): the same
# meaning as dropless-bench's flags of those names, so both sides measure from the same GPU state.
COOLDOWN_S = 0.0
OPS = None


def median_ms(torch, fn, warmup=3, iters=20):
    if COOLDOWN_S > 0:
        torch.cuda.synchronize()
        time.sleep(COOLDOWN_S)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def row(name, shape, impl, precision, ms, flop, nbytes, weight, groups, note, out="bf16"):
    return {
        "name": name, "shape": shape, "impl": impl, "precision": precision,
        "ms": round(ms, 4), "tflops": round(flop / (ms * 1e-3) / 1e12, 1),
        "gbps": round(nbytes / (ms * 1e-3) / 1e9, 1) if nbytes else None,
        "weight": weight, "groups": groups, "kernel": "", "out": out, "note": note,
    }


class GroupedCase:
    """One shape's random bf16 operands (x [rows, k], w [E, k, n], dy [rows, n]) and group offsets
    on the GPU, and the rows measured on them. Both peers (gemm_peer.py, mx_gemm_peer.py) use it,
    so their bf16 torch rows are the same measurement."""

    def __init__(self, torch, shape, weight, k, n, dist, sizes, errors=None):
        self.torch, self.shape, self.weight, self.dist, self.errors = torch, shape, weight, dist, errors
        self.k, self.n, self.sizes = k, n, sizes
        self.rows_total, self.e, dev = sum(sizes), len(sizes), "cuda"
        g = torch.Generator(device=dev).manual_seed(1)
        bf16 = torch.bfloat16
        self.x = torch.rand(self.rows_total, k, device=dev, generator=g, dtype=bf16) * 2 - 1
        self.w = torch.rand(self.e, k, n, device=dev, generator=g, dtype=bf16) * 2 - 1
        self.dy = torch.rand(self.rows_total, n, device=dev, generator=g, dtype=bf16) * 2 - 1
        self.offs = torch.cumsum(torch.tensor(sizes, device=dev, dtype=torch.int32), 0,
                                 dtype=torch.int32)
        self.flop = 2.0 * self.rows_total * k * n
        self.nonempty = sum(1 for s in sizes if s > 0)
        self.note = f"{weight} (k={k}, n={n}), {dist} groups, E={self.e}, {self.rows_total} rows"
        self.out = []

    def add(self, name, impl, precision, fn, nbytes, extra="", out_type="bf16", iters=20):
        """Times fn and records a row; a peer that cannot run this layout is reported, not fatal."""
        if OPS is not None and name not in OPS:
            return
        try:
            ms = median_ms(self.torch, fn, iters=iters)
            self.out.append(row(name, self.shape, impl, precision, ms, self.flop, nbytes,
                                self.weight, self.dist, self.note + extra, out_type))
        except Exception as exc:
            msg = (f"{impl} {precision} {name} {self.shape} {self.weight} {self.dist}: "
                   f"{str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__}")
            print("peer error: " + msg, file=sys.stderr)
            if self.errors is not None:
                self.errors.append(msg)

    def add_grouped_mm_bf16(self):
        """torch._grouped_mm fwd / dgrad / wgrad (bytes: activations in and out, non-empty
        experts' weights; wgrad writes every expert's gradient)."""
        torch, x, w, dy, offs = self.torch, self.x, self.w, self.dy, self.offs
        act_in, act_out = 2.0 * self.rows_total * self.k, 2.0 * self.rows_total * self.n
        wbytes = 2.0 * self.nonempty * self.k * self.n
        self.add("fwd", "torch._grouped_mm", "bf16", lambda: torch._grouped_mm(x, w, offs=offs),
                 act_in + wbytes + act_out)
        self.add("dgrad", "torch._grouped_mm", "bf16",
                 lambda: torch._grouped_mm(dy, w.transpose(-2, -1), offs=offs),
                 act_out + wbytes + act_in)
        self.add("wgrad", "torch._grouped_mm", "bf16",
                 lambda: torch._grouped_mm(x.t(), dy, offs=offs),
                 act_in + act_out + 2.0 * self.e * self.k * self.n)


def torch_rows(shape, weight, k, n, dist, sizes):
    import torch

    c = GroupedCase(torch, shape, weight, k, n, dist, sizes)
    c.add_grouped_mm_bf16()
    x, w, offs, add, dev = c.x, c.w, c.offs, c.add, "cuda"
    rows_total, e = c.rows_total, c.e
    act_in, act_out = 2.0 * rows_total * k, 2.0 * rows_total * n
    wbytes = 2.0 * c.nonempty * k * n

    bounds = [0]
    for s in sizes:
        bounds.append(bounds[-1] + s)
    y = torch.empty(rows_total, n, device=dev, dtype=torch.bfloat16)

    def naive():
        for i in range(e):
            if sizes[i]:
                torch.matmul(x[bounds[i]:bounds[i + 1]], w[i], out=y[bounds[i]:bounds[i + 1]])

    add("fwd", "torch-naive-loop", "bf16", naive, act_in + wbytes + act_out, iters=5)

    # fp8 rowwise: e4m3 operands, one fp32 scale per token row and per weight column.
    try:
        xq = x.to(torch.float8_e4m3fn)
        wq = w.transpose(-2, -1).contiguous().to(torch.float8_e4m3fn).transpose(-2, -1)
        sa = torch.ones(rows_total, device=dev, dtype=torch.float32)
        sb = torch.ones(e, n, device=dev, dtype=torch.float32)
        add("fwd", "torch._scaled_grouped_mm", "fp8-rowwise",
            lambda: torch._scaled_grouped_mm(xq, wq, sa, sb, offs=offs, out_dtype=torch.bfloat16),
            (act_in + wbytes) / 2 + act_out, ", e4m3 rowwise scales")
        del xq, wq
    except Exception as exc:
        print(f"peer torch._scaled_grouped_mm {shape}: {exc}", file=sys.stderr)
    out = c.out
    del x, w, y, c
    torch.cuda.empty_cache()
    return out


def jax_rows(shape, weight, k, n, dist, sizes):
    import jax
    import jax.numpy as jnp

    rows_total, e = sum(sizes), len(sizes)
    key = jax.random.PRNGKey(0)
    x = jax.random.uniform(key, (rows_total, k), jnp.bfloat16, -1, 1)
    w = jax.random.uniform(key, (e, k, n), jnp.bfloat16, -1, 1)
    gs = jnp.array(sizes, dtype=jnp.int32)
    f = jax.jit(lambda a, b, c: jax.lax.ragged_dot(a, b, c))
    for _ in range(3):
        f(x, w, gs).block_until_ready()
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        f(x, w, gs).block_until_ready()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    note = f"{weight} (k={k}, n={n}), {dist} groups, E={e}, {rows_total} rows, host-timed"
    nonempty = sum(1 for s in sizes if s > 0)
    nbytes = 2.0 * rows_total * (k + n) + 2.0 * nonempty * k * n
    return [row("fwd", shape, "jax.ragged_dot", "bf16", ms, 2.0 * rows_total * k * n, nbytes,
                weight, dist, note)]


def add_state_flags(ap):
    ap.add_argument("--cooldown-ms", type=int, default=0,
                    help="idle milliseconds before each measurement (as dropless-bench's flag)")
    ap.add_argument("--ops", default="fwd,dgrad,wgrad", help="ops to measure")


def apply_state_flags(args):
    global COOLDOWN_S, OPS
    COOLDOWN_S = max(0, args.cooldown_ms) / 1000.0
    OPS = set(args.ops.split(","))
    unknown = OPS - {"fwd", "dgrad", "wgrad"}
    if unknown:
        sys.exit(f"--ops: unknown {', '.join(sorted(unknown))} (fwd, dgrad, wgrad)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="JSON written by dropless-bench gemm --json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="")
    ap.add_argument("--jax", action="store_true", help="only jax.ragged_dot rows (own process)")
    add_state_flags(ap)
    args = ap.parse_args()
    apply_state_flags(args)

    with open(args.base) as f:
        result = json.load(f)
    for key, sizes in result["group_sizes"].items():
        shape, dist = key.split("/")
        _, hidden, ffn, _, _ = SHAPES[shape]
        for weight, k, n in (("w13", hidden, 2 * ffn), ("w2", ffn, hidden)):
            fn = jax_rows if args.jax else torch_rows
            try:
                rows = fn(shape, weight, k, n, dist, sizes)
            except Exception as exc:
                print(f"peer {shape} {weight} {dist}: {exc}", file=sys.stderr)
                continue
            result["rows"].extend(rows)
            for r in rows:
                print(f"{r['name']:6} {shape:8} {weight:4} {dist:8} {r['impl']:26} "
                      f"{r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s", flush=True)
    if args.command:
        result["command"] = args.command
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    main()
