#!/usr/bin/env python3
"""Where a dropless training step spends its GPU time, kernel by kernel.

Runs the engine through its C API (the same spec step_peer.py gives it) eagerly
(DROPLESS_CUDA_GRAPH=0, so that every kernel is its own launch), records --steps steps with
torch.profiler (CUPTI sees every kernel of the process, the engine's included) and prints, per
shape and precision, each kernel's GPU time per step (summed over its launches, whatever stream
it ran on), its share of the summed kernel time and its launches per step. The streams overlap,
so the shares say where work goes, not what the step waits for; the step time that step_peer.py
reports is the graph-replayed one. --json writes the same table; --trace-dir also writes each
profile's Chrome trace, and --timeline-ms prints the last step's longer kernels in start order
with their streams (what runs beside what).

  python3 bench/peers/step_profile.py --lib libdropless_engine_cuda.so --shapes qwen3 \
      --precisions bf16,fp8-block --ep dsv3=8 [--steps 3] [--top 30] [--json out.json] \
      [--trace-dir DIR [--timeline-ms 0.3]]
"""
import argparse
import json
import os
import re
import sys
import time
import zlib
from collections import defaultdict
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from step_impls.dropless_capi import DroplessStep, dropless_spec, load_lib  # noqa: E402


def short_name(name):
    """A kernel's name without template arguments and parameter lists."""
    if name.startswith("_ZN7cutlass"):  # mangled (as in Chrome traces): told apart by a hash
        return f"cutlass kernel #{zlib.crc32(name.encode()) % 1000:03d}"
    name = name.replace("(anonymous namespace)::", "")
    depth, out = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out).replace("void ", "").strip()[-80:]
    tile = re.search(r"C<(\d+)>, cute::C<(\d+)>, cute::C<(\d+)>", name)
    if short.startswith("cutlass::") and tile:  # CUTLASS kernels differ in their arguments only
        short += f" {'x'.join(tile.groups())} #{zlib.crc32(name.encode()) % 1000:03d}"
    return short


def profile(lib, spec, steps, trace=None):
    import torch
    from torch.profiler import ProfilerActivity
    engine = DroplessStep(lib, spec)
    try:
        engine.run(2)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.run(steps)
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3 / steps
        eager_ms = engine.engine_ms
        if trace:
            prof.export_chrome_trace(trace)
    finally:
        engine.close()
    per_kernel = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type.name != "CUDA":
            continue
        k = per_kernel[ev.name]
        k[0] += ev.device_time_total / 1e3 / steps  # us -> ms per step
        k[1] += 1
    return eager_ms, wall_ms, {n: (ms, count / steps) for n, (ms, count) in per_kernel.items()}


def last_step_timeline(trace_path, min_ms):
    """The last profiled step's kernels of at least min_ms from a Chrome trace, in start order:
    (start ms from the step's first kernel, ms, stream, short name). A step starts with the
    teacher's token generation (the data phase)."""
    with open(trace_path) as f:
        events = [e for e in json.load(f)["traceEvents"]
                  if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    events.sort(key=lambda e: e["ts"])
    starts = [e["ts"] for e in events if "GenerateTokens" in e["name"]]
    t0 = starts[-1] if starts else events[0]["ts"]
    return [((e["ts"] - t0) / 1e3, e["dur"] / 1e3, e.get("args", {}).get("stream"), short_name(e["name"]))
            for e in events if e["ts"] >= t0 and e["dur"] / 1e3 >= min_ms]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--shapes", default="qwen3")
    ap.add_argument("--precisions", default="bf16")
    ap.add_argument("--ep", default="1", help="N for every shape, or per shape: dsv3=8")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json")
    ap.add_argument("--trace-dir", help="also write each profile's Chrome trace (kernels with their "
                    "streams and start times) to DIR/<shape>-<precision>.json")
    ap.add_argument("--timeline-ms", type=float, help="also print the last step's kernels of at "
                    "least this many ms in start order, with their streams (needs --trace-dir)")
    args = ap.parse_args()
    if args.timeline_ms is not None and not args.trace_dir:
        ap.error("--timeline-ms needs --trace-dir")
    if args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
    shapes = args.shapes.split(",")
    if "=" in args.ep:
        ep_of = {s: 1 for s in shapes}
        ep_of.update({k: int(v) for k, v in (x.split("=") for x in args.ep.split(","))})
    else:
        ep_of = {s: int(args.ep) for s in shapes}
    os.environ["DROPLESS_CUDA_GRAPH"] = "0"
    lib = load_lib(args.lib)
    results = []
    for shape in shapes:
        for precision in args.precisions.split(","):
            spec_args = SimpleNamespace(ep_of=ep_of, precision=precision, dispatcher=None,
                                        offload=False, weight_decay=0.0)
            trace = (os.path.join(args.trace_dir, f"{shape}-{precision}.json")
                     if args.trace_dir else None)
            eager_ms, wall_ms, kernels = profile(lib, dropless_spec(shape, spec_args), args.steps,
                                                 trace)
            total = sum(ms for ms, _ in kernels.values())
            print(f"\n== {shape} {precision} ep {ep_of[shape]}: eager step {eager_ms:.3f} ms "
                  f"(engine's phases), wall {wall_ms:.3f} ms/step under the profiler, "
                  f"kernel time {total:.3f} ms/step")
            rows = sorted(kernels.items(), key=lambda kv: -kv[1][0])
            for name, (ms, launches) in rows[:args.top]:
                print(f"  {ms:8.3f} ms {100 * ms / total:5.1f}%  x{launches:<6.1f} {short_name(name)}")
            if trace and args.timeline_ms is not None:
                print(f"  -- the last step's kernels of at least {args.timeline_ms} ms "
                      "(start ms, ms, stream):")
                for start, ms, stream, name in last_step_timeline(trace, args.timeline_ms):
                    print(f"  {start:8.3f} {ms:7.3f}  s{stream}  {name}")
            results.append({"shape": shape, "precision": precision, "ep": ep_of[shape],
                            "eager_step_ms": eager_ms, "profiled_wall_ms": wall_ms,
                            "kernel_ms": total,
                            "kernels": [{"name": n, "ms": ms, "launches": c} for n, (ms, c) in rows]})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
