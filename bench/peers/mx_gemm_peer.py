#!/usr/bin/env python3
"""Peers of `dropless-bench mxgemm`, run in the same job on the same GPU.

Reads the JSON that `dropless-bench mxgemm --json` wrote (its rows and the exact group sizes it
used) and measures on the same shapes and group sizes:
  torch._grouped_mm            bf16 fwd / dgrad / wgrad
  torch._scaled_grouped_mm     fp8 e4m3, row-wise fp32 scales (one per token row / weight column):
                               fwd and dgrad; wgrad where torch takes the 2-D x 2-D (k-grouped) form
  torch MX (BlockWise1x32)     torch.nn.functional.scaled_grouped_mm with e8m0 scales per 32, if the
                               installed torch runs it on this GPU (recorded as an error otherwise);
                               tried once, last (dsv3 w13 uniform)
plus a dense fp8 ceiling (torch._scaled_mm 8192^3, tensor-wise scales). Writes the merged BENCH.md
JSON. Failures of a peer are printed and recorded under "peer_errors", never fatal.

  python3 bench/peers/mx_gemm_peer.py --base dropless.json --out mxgemm-h200-YYYYMMDD.json \
      --command "exact command line"
"""
import argparse
import json
import sys

# The shapes, the timing and the row format are gemm_peer.py's (this directory is on sys.path when
# the script runs), so both peers' rows line up with the dropless benches'.
import gemm_peer  # noqa: E402
from gemm_peer import SHAPES, GroupedCase, median_ms, row  # noqa: E402

ERRORS = []


def dense_fp8_ceiling():
    import torch
    d = 8192
    a = (torch.rand(d, d, device="cuda") * 2 - 1).to(torch.float8_e4m3fn)
    b = (torch.rand(d, d, device="cuda") * 2 - 1).to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    ms = median_ms(torch, lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16))
    return 2.0 * d ** 3 / (ms * 1e-3) / 1e12


def torch_rows(shape, weight, k, n, dist, sizes):
    import torch

    c = GroupedCase(torch, shape, weight, k, n, dist, sizes, errors=ERRORS)
    c.add_grouped_mm_bf16()
    x, w, dy, offs, add, dev = c.x, c.w, c.dy, c.offs, c.add, "cuda"
    rows_total, e, nonempty = c.rows_total, c.e, c.nonempty

    # fp8 row-wise: e4m3 operands, fp32 scale per token row and per weight output column.
    f8 = torch.float8_e4m3fn
    xq = x.to(f8)
    dyq = dy.to(f8)
    wq = w.transpose(-2, -1).contiguous().to(f8).transpose(-2, -1)   # [E, k, n], k contiguous
    wtq = w.contiguous().to(f8).transpose(-2, -1)                     # [E, n, k], n contiguous
    ones_m = torch.ones(rows_total, device=dev)
    ones_en, ones_ek = torch.ones(e, n, device=dev), torch.ones(e, k, device=dev)
    ones_ek1, ones_en1 = torch.ones(e * k, device=dev), torch.ones(e * n, device=dev)
    fwd_bytes = rows_total * k + nonempty * k * n + 2.0 * rows_total * n
    add("fwd", "torch._scaled_grouped_mm", "fp8-rowwise",
        lambda: torch._scaled_grouped_mm(
            xq, wq, ones_m, ones_en, offs=offs,
            out_dtype=torch.bfloat16), fwd_bytes, ", e4m3, row-wise fp32 scales")
    add("dgrad", "torch._scaled_grouped_mm", "fp8-rowwise",
        lambda: torch._scaled_grouped_mm(
            dyq, wtq, ones_m, ones_ek, offs=offs,
            out_dtype=torch.bfloat16), rows_total * n + nonempty * k * n + 2.0 * rows_total * k,
        ", e4m3, row-wise fp32 scales")
    if all(s % 16 == 0 for s in sizes):
        xtq = x.t().contiguous().to(f8)             # [k, rows], tokens contiguous
        dycq = dy.t().contiguous().to(f8).t()       # [rows, n], column-major
        add("wgrad", "torch._scaled_grouped_mm", "fp8-rowwise",
            lambda: torch._scaled_grouped_mm(
                xtq, dycq, ones_ek1, ones_en1, offs=offs,
                out_dtype=torch.bfloat16), rows_total * (k + n) + 2.0 * e * k * n,
            ", e4m3, per-group row-wise fp32 scales (k-grouped)")
        del xtq, dycq
    else:  # torch asserts on the device (and poisons the context) for such sizes
        ERRORS.append(f"torch._scaled_grouped_mm fp8-rowwise wgrad {shape} {weight} {dist}: "
                      "skipped, torch needs every group size to be a multiple of 16 for the "
                      "k-grouped fp8 form")

    out = c.out
    del x, w, dy, xq, dyq, wq, wtq, c
    torch.cuda.empty_cache()
    return out


def torch_mx_rows(shape, weight, k, n, dist, sizes):
    """torch's MXFP8 grouped GEMM (e8m0 scales per 32 along K, BlockWise1x32), if this torch runs it
    on this GPU. Run once, last: a device-side assert would poison the CUDA context."""
    import torch
    import torch.nn.functional as F
    from torch.nn.functional import ScalingType, SwizzleType

    rows_total, e, dev = sum(sizes), len(sizes), "cuda"
    f8 = torch.float8_e4m3fn
    xq = (torch.rand(rows_total, k, device=dev) * 2 - 1).to(f8)
    wq = (torch.rand(e, n, k, device=dev) * 2 - 1).to(f8).transpose(-2, -1)  # [E, k, n], k-major
    offs = torch.cumsum(torch.tensor(sizes, device=dev, dtype=torch.int32), 0, dtype=torch.int32)
    up = lambda v, m: (v + m - 1) // m * m  # noqa: E731
    # torch's blocked layout: per group, scales padded to (128 rows) x (4 K blocks).
    sa = torch.full((up(rows_total, 128) + 128 * e, up(k // 32, 4)), 127, device=dev,
                    dtype=torch.uint8).view(torch.float8_e8m0fnu)
    sb = torch.full((e, up(n, 128) * up(k // 32, 4)), 127, device=dev,
                    dtype=torch.uint8).view(torch.float8_e8m0fnu)
    fn = lambda: F.scaled_grouped_mm(  # noqa: E731
        xq, wq, sa, ScalingType.BlockWise1x32, sb, ScalingType.BlockWise1x32,
        swizzle_a=SwizzleType.SWIZZLE_32_4_4, swizzle_b=SwizzleType.SWIZZLE_32_4_4, offs=offs,
        output_dtype=torch.bfloat16)
    ms = median_ms(torch, fn)
    nonempty = sum(1 for s in sizes if s > 0)
    nbytes = (rows_total * k + nonempty * k * n) * (1 + 1 / 32) + 2.0 * rows_total * n
    note = f"{weight} (k={k}, n={n}), {dist} groups, E={e}, {rows_total} rows, e4m3 + e8m0 per 32"
    return [row("fwd", shape, "torch.scaled_grouped_mm", "mxfp8", ms, 2.0 * rows_total * k * n,
                nbytes, weight, dist, note)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="JSON written by dropless-bench mxgemm --json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default="")
    gemm_peer.add_state_flags(ap)
    args = ap.parse_args()
    gemm_peer.apply_state_flags(args)

    with open(args.base) as f:
        result = json.load(f)
    import torch
    result["peer_versions"] = {"torch": torch.__version__}
    try:
        result["ceilings"]["dense_fp8_tflops"] = round(dense_fp8_ceiling(), 1)
        print(f"ceiling: dense fp8 8192^3 (torch._scaled_mm) {result['ceilings']['dense_fp8_tflops']} TFLOP/s")
    except Exception as exc:
        ERRORS.append(f"dense fp8 ceiling: {exc}")
    def write():
        result["peer_errors"] = ERRORS
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}", flush=True)

    if args.command:
        result["command"] = args.command
    for key, sizes in result["group_sizes"].items():
        shape, dist = key.split("/")
        _, hidden, ffn, _, _ = SHAPES[shape]
        for weight, k, n in (("w13", hidden, 2 * ffn), ("w2", ffn, hidden)):
            try:
                rows = torch_rows(shape, weight, k, n, dist, sizes)
            except Exception as exc:
                ERRORS.append(f"{shape} {weight} {dist}: {exc}")
                print(f"peer {shape} {weight} {dist}: {exc}", file=sys.stderr)
                continue
            result["rows"].extend(rows)
            for r in rows:
                print(f"{r['name']:6} {shape:8} {weight:4} {dist:8} {r['impl']:26} {r['precision']:11} "
                      f"{r['ms']:9.3f} ms {r['tflops']:7.1f} TFLOP/s", flush=True)
            write()  # after every shape: a run cut short keeps what it measured
    write()
    key = next((k for k in result["group_sizes"] if k.endswith("/uniform")), None)
    if key:
        shape, dist = key.split("/")
        _, hidden, ffn, _, _ = SHAPES[shape]
        try:
            rows = torch_mx_rows(shape, "w13", hidden, 2 * ffn, dist, result["group_sizes"][key])
            result["rows"].extend(rows)
            print(f"fwd    {shape:8} w13  {dist:8} torch.scaled_grouped_mm mxfp8 "
                  f"{rows[0]['ms']:9.3f} ms {rows[0]['tflops']:7.1f} TFLOP/s", flush=True)
        except Exception as exc:
            msg = f"torch MX scaled_grouped_mm {shape} w13 {dist}: {str(exc).splitlines()[0][:300]}"
            print("peer error: " + msg, file=sys.stderr)
            ERRORS.append(msg)
        write()


if __name__ == "__main__":
    main()
