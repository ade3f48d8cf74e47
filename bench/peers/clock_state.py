#!/usr/bin/env python3
"""How much the H200's clock state moves a grouped-GEMM figure: torch._grouped_mm forward (w13,
uniform groups) timed cold (after 3 s idle) and hot (after 3 s of back-to-back calls) in one job.
Backs the "Measuring: the GPU's clock state" section of docs/grouped_gemm.md.

  python3 bench/peers/clock_state.py --out clock.json
"""
import argparse
import datetime
import json
import statistics
import time

SHAPES = {"dsv3": (8192, 7168, 2048, 256, 8), "qwen3": (16384, 2048, 768, 128, 8),
          "mixtral": (8192, 4096, 14336, 8, 2)}


def median_ms(torch, fn, iters=20):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--load-s", type=float, default=3.0)
    args = ap.parse_args()
    import torch
    rows_out = []
    for name, (tokens, hidden, ffn, experts, top_k) in SHAPES.items():
        rows, k, n = tokens * top_k, hidden, 2 * ffn
        x = torch.rand(rows, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
        w = torch.rand(experts, k, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
        offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * (rows // experts)
        fn = lambda: torch._grouped_mm(x, w, offs=offs)  # noqa: E731
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        time.sleep(args.idle_s)
        cold = median_ms(torch, fn)
        t0 = time.time()
        while time.time() - t0 < args.load_s:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        hot = median_ms(torch, fn)
        flop = 2.0 * rows * k * n
        for state, ms in (("cold", cold), ("hot", hot)):
            rows_out.append({"name": "fwd", "shape": name, "impl": "torch._grouped_mm",
                             "precision": "bf16", "ms": round(ms, 4),
                             "tflops": round(flop / (ms * 1e9), 1), "gbps": None,
                             "note": f"w13, uniform groups; {state}: after {args.idle_s} s idle"
                                     if state == "cold" else
                                     f"w13, uniform groups; hot: after {args.load_s} s of calls"})
            print(f"torch fwd {name} w13 uniform {state}: {flop / (ms * 1e9):.0f} TFLOP/s", flush=True)
        del x, w
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"bench": "gemm", "device": f"{torch.cuda.get_device_name()} (1 GPU)",
                   "date": datetime.date.today().isoformat(),
                   "command": "python3 bench/peers/clock_state.py --out " + args.out,
                   "commit": "", "ceilings": {}, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    main()
