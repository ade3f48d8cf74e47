#!/usr/bin/env python3
"""How much the H200's clock state moves a grouped-GEMM figure: torch._grouped_mm forward (w13,
uniform groups) timed cold (after 3 s idle) and hot (after 3 s of back-to-back calls) in one job.
With --lib (libdropless_gemm_capi.so) dropless's forward is timed the same way, each state's two
implementations in alternating order (rounds A B, B A). Backs the "Measuring: the GPU's clock
state" section of docs/grouped_gemm.md.

  python3 bench/peers/clock_state.py --out clock.json [--lib libdropless_gemm_capi.so --rounds 2]
"""
import argparse
import datetime
import json
import statistics
import sys
import time

from gemm_peer import SHAPES, median_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--idle-s", type=float, default=3.0)
    ap.add_argument("--load-s", type=float, default=3.0)
    ap.add_argument("--lib", default="", help="libdropless_gemm_capi.so: also time dropless")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--commit", default="")
    args = ap.parse_args()
    import torch
    lib = None
    if args.lib:
        from interleaved_gemm import check, load_lib
        lib = load_lib(args.lib)
    handles = []
    rows_out = []
    for name, (tokens, hidden, ffn, experts, top_k) in SHAPES.items():
        rows, k, n = tokens * top_k, hidden, 2 * ffn
        x = torch.rand(rows, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
        w = torch.rand(experts, k, n, device="cuda", dtype=torch.bfloat16) * 2 - 1
        offs = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32) * (rows // experts)
        impls = {"torch._grouped_mm": lambda: torch._grouped_mm(x, w, offs=offs)}
        kernel = ""
        if lib is not None:
            y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
            offsets = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int32), offs])
            h = lib.dl_gemm_create(experts, k, n, rows, rows // experts, 0, None, None, None)
            if not h:
                raise RuntimeError(lib.dl_last_error().decode())
            handles.append(h)
            kernel = lib.dl_gemm_kernel(h, 0).decode()
            impls["dropless"] = (lambda h=h, y=y, offsets=offsets: check(lib, lib.dl_gemm_forward(
                h, x.data_ptr(), w.data_ptr(), offsets.data_ptr(), y.data_ptr(), None), "fwd"))
        for fn in impls.values():
            for _ in range(3):
                fn()
        torch.cuda.synchronize()
        res = {(impl, state): [] for impl in impls for state in ("cold", "hot")}
        names = list(impls)
        for r in range(args.rounds):
            for impl in (names if r % 2 == 0 else names[::-1]):
                fn = impls[impl]
                time.sleep(args.idle_s)
                res[(impl, "cold")].append(median_ms(torch, fn, warmup=0))
                t0 = time.time()
                while time.time() - t0 < args.load_s:
                    for _ in range(20):
                        fn()
                    torch.cuda.synchronize()
                res[(impl, "hot")].append(median_ms(torch, fn, warmup=0))
        flop = 2.0 * rows * k * n
        for (impl, state), v in res.items():
            ms = statistics.median(v)
            rows_out.append({"name": "fwd", "shape": name, "impl": impl,
                             "precision": "bf16", "ms": round(ms, 4),
                             "tflops": round(flop / (ms * 1e9), 1), "gbps": None,
                             "kernel": kernel if impl == "dropless" else "",
                             "note": (f"w13, uniform groups; {state}: "
                                      + (f"after {args.idle_s} s idle" if state == "cold" else
                                         f"after {args.load_s} s of calls")
                                      + f"; median of {len(v)} rounds of 20 calls "
                                        f"({', '.join(f'{flop / (t * 1e9):.0f}' for t in v)})")})
            print(f"{impl} fwd {name} w13 uniform {state}: {flop / (ms * 1e9):.0f} TFLOP/s "
                  f"(rounds {', '.join(f'{flop / (t * 1e9):.0f}' for t in v)})", flush=True)
        del x, w
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"bench": "gemm", "device": f"{torch.cuda.get_device_name()} (1 GPU)",
                   "date": datetime.date.today().isoformat(),
                   "command": "python3 bench/peers/clock_state.py " + " ".join(sys.argv[1:]),
                   "commit": args.commit, "ceilings": {}, "rows": rows_out}, f, indent=1)
    for h in handles:
        lib.dl_gemm_destroy(h)


if __name__ == "__main__":
    main()
