#!/usr/bin/env python3
"""dropless's grouped GEMMs and torch's, timed in one process, alternating round by round.

An H200's clock and temperature move within seconds of sustained GEMMs (torch._grouped_mm forward
on qwen3 w13 read 741 TFLOP/s after 3 s idle and 597 after 3 s of back-to-back calls in one job),
so two processes run one after the other (dropless-bench, then gemm_peer.py) do not measure from
the same state. Here the dropless kernels are called through libdropless_gemm_capi.so (ctypes, the
same kernels as dropless-bench) on the same torch tensors, and each case alternates its
implementations (A B B A ...) after a shared warm-up: every implementation sees the same clock.

Rows (BENCH.md format) per shape, weight, group distribution:
  bf16  fwd / dgrad / wgrad: dropless (bf16 out) vs torch._grouped_mm
  mxfp8-wgrad (opt-in): the MXFP8 weight gradient's default and --mx-kernels, fp32 and bf16 out
        (no torch MX peer: torch's fp8 k-grouped form needs groups of multiples of 16)
  mxfp8 fwd / dgrad: dropless MXFP8 (per-32 E8M0 scales; the promotion kernel and, where the
        reduction is a multiple of 64, the bf16-core kernel on weight images, with the image pass
        timed in the same rounds as its own row and the two kernels' outputs compared) vs
        torch._scaled_grouped_mm (fp8, row-wise scales: no per-block promotion) vs
        torch._grouped_mm (bf16)
  fp8-block fwd / dgrad / wgrad: dropless FP8 blockwise (1x128 activation tiles, 128x128 weight
        blocks, fp32 scales; wgrad k-grouped over groups padded to 128, fp32 out) vs
        torch._scaled_grouped_mm (fp8 row-wise; for wgrad the same padded groups) vs
        torch._grouped_mm (bf16) vs, when `import deep_gemm` works (--deep-gemm auto), DeepGEMM's
        SM90 kernels of the same recipe on the same operands (deepgemm_impl.py: m-grouped
        contiguous layout, groups padded to 128 rows, TFLOP/s on the real rows; k-grouped wgrad,
        fp32 out); otherwise the reason is recorded under "peer_errors". The wgrad rows also
        time precision fp8-block-wgrad128's kernel (X scaled per 128 x 128 block). --check (default)
        compares dropless's and DeepGEMM's outputs on 3 groups to an fp32 reference of the same
        quantized operands (row field "check": relative error, tolerance 1e-2).

  python3 bench/peers/interleaved_gemm.py --lib build/bench/libdropless_gemm_capi.so \
      --out gemm-h200-YYYYMMDD-interleaved.json [--shapes dsv3,qwen3,mixtral] [--dists uniform,zipf]
"""
import argparse
import ctypes
import datetime
import json
import os
import subprocess
import sys
import time

import deepgemm_impl
from gemm_peer import SHAPES
from interleave import check, interleave, random_e4m3, random_e8m0
from mx_interleaved import run_mxfp8

c_void_p, c_int, c_int64, c_char_p = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_char_p
X_BLOCKS = "x-blocks"  # the fp8-block weight gradient with X per 128 x 128 block
ERRORS = []  # peers that could not run (skipped, or failed on a case): "peer_errors" in the JSON


def peer_error(line):
    print(line, file=sys.stderr, flush=True)
    ERRORS.append(line)


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.dl_last_error.restype = c_char_p
    lib.dl_gemm_create.restype = c_void_p
    lib.dl_gemm_create.argtypes = [c_int, c_int, c_int, c_int64, c_int64, c_int,
                                   c_char_p, c_char_p, c_char_p]
    lib.dl_gemm_kernel.restype = c_char_p
    lib.dl_gemm_kernel.argtypes = [c_void_p, c_int]
    for f in (lib.dl_gemm_forward, lib.dl_gemm_backward_data, lib.dl_gemm_backward_weight):
        f.restype = c_int
        f.argtypes = [c_void_p] * 6
    lib.dl_gemm_destroy.argtypes = [c_void_p]
    lib.dl_mxgemm_create.restype = c_void_p
    lib.dl_mxgemm_create.argtypes = [c_int, c_int, c_int, c_int64, c_int64, c_int64, c_char_p]
    lib.dl_mxgemm_kernel.restype = c_char_p
    lib.dl_mxgemm_kernel.argtypes = [c_void_p]
    lib.dl_mxgemm_core_kernel.restype = c_char_p
    lib.dl_mxgemm_core_kernel.argtypes = [c_void_p]
    for f in (lib.dl_mxgemm_forward, lib.dl_mxgemm_backward_data):
        f.restype = c_int
        f.argtypes = [c_void_p] * 8
    for f in (lib.dl_mxgemm_forward_image, lib.dl_mxgemm_backward_data_image):
        f.restype = c_int
        f.argtypes = [c_void_p] * 7
    lib.dl_mx_weight_image.restype = c_int
    lib.dl_mx_weight_image.argtypes = [c_int64, c_int64] + [c_void_p] * 4
    lib.dl_mxgemm_backward_weight.restype = c_int
    lib.dl_mxgemm_backward_weight.argtypes = [c_void_p] * 7 + [c_int, c_void_p]
    lib.dl_mxgemm_destroy.argtypes = [c_void_p]
    lib.dl_fp8block_create.restype = c_void_p
    lib.dl_fp8block_create.argtypes = [c_int, c_int, c_int, c_int64, c_int64, c_char_p, c_char_p,
                                       c_int]
    lib.dl_fp8block_kernel.restype = c_char_p
    lib.dl_fp8block_kernel.argtypes = [c_void_p]
    for f in (lib.dl_fp8block_forward, lib.dl_fp8block_backward_data,
              lib.dl_fp8block_backward_weight):
        f.restype = c_int
        f.argtypes = [c_void_p] * 8
    lib.dl_fp8block_destroy.argtypes = [c_void_p]
    return lib


def group_sizes(rows, experts, dist):
    """As GroupSizes in bench/gemm_bench_common.h (the same sizes dropless-bench uses)."""
    if dist == "uniform":
        sizes = [rows // experts] * experts
    else:
        harmonic = sum(1.0 / (e + 1) for e in range(experts))
        sizes = [int(rows / (e + 1) / harmonic) for e in range(experts)]
    e = 0
    while sum(sizes) < rows:
        sizes[e] += 1
        e = (e + 1) % experts
    return sizes


def run_case(torch, lib, args, shape, weight, k, n, dist, out_rows):
    tokens, _, _, experts, top_k = SHAPES[shape]
    rows = tokens * top_k
    sizes = group_sizes(rows, experts, dist)
    g = torch.Generator(device="cuda").manual_seed(7)
    bf16 = torch.bfloat16
    x = torch.rand(rows, k, device="cuda", generator=g, dtype=bf16) * 2 - 1
    w = torch.rand(experts, k, n, device="cuda", generator=g, dtype=bf16) * 2 - 1
    dy = torch.rand(rows, n, device="cuda", generator=g, dtype=bf16) * 2 - 1
    ends = torch.cumsum(torch.tensor(sizes, device="cuda", dtype=torch.int32), 0, dtype=torch.int32)
    offsets = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int32), ends])
    y, dx = torch.empty(rows, n, device="cuda", dtype=bf16), torch.empty(rows, k, device="cuda", dtype=bf16)
    fp32_wgrad = args.wgrad_out == "fp32"
    dw = torch.empty(experts, k, n, device="cuda", dtype=torch.float32 if fp32_wgrad else bf16)
    flop = 2.0 * rows * k * n
    note = (f"{weight} (k={k}, n={n}), {dist} groups, E={experts}, {rows} rows; interleaved in one "
            f"process, median of {args.rounds} rounds of {args.iters}")

    def add(name, impl, precision, res, kernel="", out="bf16", extra_note="", check=None):
        ms, lo, hi = res
        row = {
            "name": name, "shape": shape, "impl": impl, "precision": precision, "ms": round(ms, 4),
            "tflops": round(flop / (ms * 1e-3) / 1e12, 1), "gbps": None, "weight": weight,
            "groups": dist, "kernel": kernel, "out": out,
            "note": f"{note} (round medians {flop / (hi * 1e9):.0f}-{flop / (lo * 1e9):.0f} TFLOP/s)"
                    + (f"; {extra_note}" if extra_note else "")}
        if check is not None:
            row["check"] = check
        out_rows.append(row)
        print(f"{name:6} {shape:8} {weight:4} {dist:8} {impl:26} {precision:6} {ms:8.3f} ms "
              f"{flop / (ms * 1e9):7.1f} TFLOP/s  {kernel}"
              + (f"  [check {check['rel_err']:.2e} {'ok' if check['ok'] else 'FAIL'}]" if check else ""),
              flush=True)

    ops = args.ops.split(",")
    precisions = set(args.precisions.split(","))
    if "bf16" in precisions:
        op_index = {"fwd": 0, "dgrad": 1, "wgrad": 2}
        sweep = {op: [""] + [kn for kn in getattr(args, f"{op}_kernels").split(",") if kn]
                 for op in op_index}
        for op in ops:
            handles = {}
            try:
                for kn in sweep[op]:
                    names = [None, None, None]
                    names[op_index[op]] = kn.encode() or None
                    h = lib.dl_gemm_create(experts, k, n, rows, rows // experts,
                                           1 if fp32_wgrad else 0, *names)
                    if not h:
                        if not kn:  # the default must exist
                            raise RuntimeError(f"{op}: {lib.dl_last_error().decode()}")
                        print(f"skip {op} {kn}: {lib.dl_last_error().decode()}", file=sys.stderr)
                        continue
                    if kn and kn == lib.dl_gemm_kernel(handles[""], op_index[op]).decode():
                        lib.dl_gemm_destroy(h)  # the default itself: measured as ""
                        continue
                    handles[kn] = h
                fns = {}
                for kn, h in handles.items():
                    if op == "fwd":
                        fns[kn] = (lambda h=h: check(lib, lib.dl_gemm_forward(
                            h, x.data_ptr(), w.data_ptr(), offsets.data_ptr(), y.data_ptr(), None), "fwd"))
                    elif op == "dgrad":
                        fns[kn] = (lambda h=h: check(lib, lib.dl_gemm_backward_data(
                            h, dy.data_ptr(), w.data_ptr(), offsets.data_ptr(), dx.data_ptr(), None), "dgrad"))
                    else:
                        fns[kn] = (lambda h=h: check(lib, lib.dl_gemm_backward_weight(
                            h, x.data_ptr(), dy.data_ptr(), offsets.data_ptr(), dw.data_ptr(), None), "wgrad"))
                torch_fn = {"fwd": lambda: torch._grouped_mm(x, w, offs=ends),
                            "dgrad": lambda: torch._grouped_mm(dy, w.transpose(-2, -1), offs=ends),
                            "wgrad": lambda: torch._grouped_mm(x.t(), dy, offs=ends)}[op]
                fns["torch"] = torch_fn
                # Ceilings for the same FLOPs without grouping, uniform forward only: cuBLAS's
                # batched GEMM (the same weight traffic, no per-group descriptors) and one dense
                # GEMM of the whole token buffer with expert 0's weight (no weight traffic).
                batched = (args.ceiling_peers and op == "fwd" and dist == "uniform"
                           and rows % experts == 0)
                if batched:
                    xb, yb = x.view(experts, rows // experts, k), y.view(experts, rows // experts, n)
                    fns["torch.bmm"] = lambda: torch.bmm(xb, w, out=yb)
                    fns["cublas-dense"] = lambda: torch.mm(x, w[0], out=y)
                res = interleave(torch, fns, args.rounds, args.iters, args.warm_s)
                default_kernel = lib.dl_gemm_kernel(handles[""], op_index[op]).decode()
                for kn in handles:
                    name = kn or default_kernel
                    add(op, "dropless", "bf16", res[kn],
                        name + (", default kernel" if not kn else ""),
                        out=args.wgrad_out if op == "wgrad" else "bf16")
                add(op, "torch._grouped_mm", "bf16", res["torch"])
                if batched:
                    add(op, "torch.bmm", "bf16", res["torch.bmm"],
                        "cuBLAS batched GEMM, same groups and weights (uniform groups only)")
                    add(op, "cublas-dense", "bf16", res["cublas-dense"],
                        "torch.mm of all rows with one expert's weight: the same FLOPs, one weight")
            finally:
                for h in handles.values():
                    lib.dl_gemm_destroy(h)

    if "mxfp8" in precisions:
        run_mxfp8(torch, lib, args, ops, g, (x, w, dy, ends, offsets, y, dx),
                  (rows, k, n, experts, sizes), add, f"{shape} {weight} {dist}")
    if "fp8-block" in precisions:
        run_fp8_block(torch, lib, args, ops, g, (x, w, dy, ends, offsets, y, dx),
                      (rows, k, n, experts, sizes), add, f"{shape} {weight} {dist}")
    if "mxfp8-wgrad" in precisions:
        # Column-wise block-major operands ([P/32][cols][32] + [P/32][cols] scales) over the padded
        # group layout the quantizer writes (groups padded to 32 rows, P as MxGroupedGemm's bound).
        padded = [(s_ + 31) // 32 * 32 for s_ in sizes]
        p_rows = (rows + 31 * experts + 31) // 32 * 32
        pends = torch.cumsum(torch.tensor(padded, device="cuda", dtype=torch.int32), 0, dtype=torch.int32)
        poffsets = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int32), pends])
        xc, xcs = random_e4m3(torch, (k * p_rows,), g), random_e8m0(torch, (k * p_rows // 32,), g)
        dyc, dycs = random_e4m3(torch, (n * p_rows,), g), random_e8m0(torch, (n * p_rows // 32,), g)
        dw32 = torch.empty(experts, k, n, device="cuda", dtype=torch.float32)
        handles = {}
        try:
            for kn in [""] + [x_ for x_ in args.mx_kernels.split(",") if x_]:
                h = lib.dl_mxgemm_create(experts, k, n, rows, p_rows, rows // experts, kn.encode() or None)
                if not h:
                    raise RuntimeError(lib.dl_last_error().decode())
                handles[kn] = h
            for fp32_out, out in ((1, dw32), (0, dw)):
                fns = {kn: (lambda h=h, out=out, fp32_out=fp32_out: check(lib, lib.dl_mxgemm_backward_weight(
                    h, xc.data_ptr(), xcs.data_ptr(), dyc.data_ptr(), dycs.data_ptr(),
                    poffsets.data_ptr(), out.data_ptr(), fp32_out, None), "mx wgrad"))
                    for kn, h in handles.items()}
                res = interleave(torch, fns, args.rounds, args.iters, args.warm_s)
                for kn, h in handles.items():
                    name = lib.dl_mxgemm_kernel(h).decode()
                    add("wgrad", "dropless", "mxfp8", res[kn],
                        f"{name}{', default kernel' if not kn else ''}; {'fp32' if fp32_out else 'bf16'} out")
        finally:
            for h in handles.values():
                lib.dl_mxgemm_destroy(h)
    torch.cuda.synchronize()


def run_fp8_block(torch, lib, args, ops, g, tensors, dims, add, tag=""):
    """fp8-block rows of one case (see the docstring): random E4M3 operands and fp32 scales in the
    layouts of kernels/include/dropless/kernels/fp8_block.h."""
    x, w, dy, ends, offsets, y, dx = tensors
    rows, k, n, experts, sizes = dims
    fp8, bf16, f32 = torch.float8_e4m3fn, torch.bfloat16, torch.float32

    def scales(*shape):
        return torch.rand(*shape, device="cuda", generator=g, dtype=f32) * 1.5 + 0.25

    xq, xs = random_e4m3(torch, (rows, k), g), scales(rows, k // 128)
    wtq, wts = random_e4m3(torch, (experts, n, k), g), scales(experts, n // 128, k // 128)
    dyq, dys = random_e4m3(torch, (rows, n), g), scales(rows, n // 128)
    wq, ws = random_e4m3(torch, (experts, k, n), g), scales(experts, k // 128, n // 128)
    padded = [(s_ + 127) // 128 * 128 for s_ in sizes]
    p_rows = sum(padded)
    pends = torch.cumsum(torch.tensor(padded, device="cuda", dtype=torch.int32), 0, dtype=torch.int32)
    poffsets = torch.cat([torch.zeros(1, device="cuda", dtype=torch.int32), pends])
    xc, xcs = random_e4m3(torch, (k, p_rows), g), scales(p_rows // 128, k)
    dyc, dycs = random_e4m3(torch, (n, p_rows), g), scales(p_rows // 128, n)
    dw32 = torch.empty(experts, k, n, device="cuda", dtype=f32)
    # fp8-block-wgrad128's weight gradient: X scaled per 128 x 128 block ([P/128][k/128])
    xcs_blocks = scales(p_rows // 128, k // 128)
    h = lib.dl_fp8block_create(experts, k, n, rows, p_rows, None, None, 0)
    if not h:
        raise RuntimeError(lib.dl_last_error().decode())
    kernel = lib.dl_fp8block_kernel(h).decode()
    # --fp8-block-m-kernels / --fp8-block-wgrad-kernels: other kernels timed next to the defaults
    others = {"fwd": {}, "dgrad": {}, "wgrad": {}}
    per_block_handles = set()  # handles whose weight gradient reads xcs_blocks
    for ops_, flag, is_m in ((("fwd", "dgrad"), args.fp8_block_m_kernels, True),
                             (("wgrad",), args.fp8_block_wgrad_kernels, False)):
        for kn in [x_ for x_ in flag.split(",") if x_]:
            # a weight-gradient kernel that reads X per 128 x 128 block (its name says x_blocks)
            per_block = not is_m and "x_blocks" in kn
            other = lib.dl_fp8block_create(experts, k, n, rows, p_rows,
                                           kn.encode() if is_m else None,
                                           None if is_m else kn.encode(), 1 if per_block else 0)
            if other and per_block:
                per_block_handles.add(other)
            if not other:
                print(f"skip fp8-block {kn}: {lib.dl_last_error().decode()}", file=sys.stderr)
            elif lib.dl_fp8block_kernel(other).decode() == kernel:
                lib.dl_fp8block_destroy(other)  # the default itself
            else:
                for op in ops_:
                    others[op][kn] = other
    x_blocks = None
    if "wgrad" in ops:
        x_blocks = lib.dl_fp8block_create(experts, k, n, rows, p_rows, None, None, 1)
        if not x_blocks:
            raise RuntimeError(lib.dl_last_error().decode())
        others["wgrad"][X_BLOCKS] = x_blocks
        per_block_handles.add(x_blocks)
    ones_rows = torch.ones(rows, device="cuda", dtype=f32)

    def ours_with(op, handle):
        if op == "fwd":
            return lambda: check(lib, lib.dl_fp8block_forward(
                handle, xq.data_ptr(), xs.data_ptr(), wtq.data_ptr(), wts.data_ptr(),
                offsets.data_ptr(), y.data_ptr(), None), "fp8-block fwd")
        if op == "dgrad":
            return lambda: check(lib, lib.dl_fp8block_backward_data(
                handle, dyq.data_ptr(), dys.data_ptr(), wq.data_ptr(), ws.data_ptr(),
                offsets.data_ptr(), dx.data_ptr(), None), "fp8-block dgrad")
        x_scales = xcs_blocks if handle in per_block_handles else xcs
        return lambda: check(lib, lib.dl_fp8block_backward_weight(
            handle, xc.data_ptr(), x_scales.data_ptr(), dyc.data_ptr(), dycs.data_ptr(),
            poffsets.data_ptr(), dw32.data_ptr(), None), "fp8-block wgrad")

    torch_fp8 = {
        "fwd": lambda: torch._scaled_grouped_mm(
            xq.view(fp8), wtq.view(fp8).transpose(-2, -1), ones_rows,
            torch.ones(experts, n, device="cuda", dtype=f32), offs=ends, out_dtype=bf16),
        "dgrad": lambda: torch._scaled_grouped_mm(
            dyq.view(fp8), wq.view(fp8).transpose(-2, -1), ones_rows,
            torch.ones(experts, k, device="cuda", dtype=f32), offs=ends, out_dtype=bf16),
        "wgrad": lambda: torch._scaled_grouped_mm(
            xc.view(fp8), dyc.view(fp8).t(), torch.ones(k * experts, device="cuda", dtype=f32),
            torch.ones(n * experts, device="cuda", dtype=f32), offs=pends, out_dtype=bf16),
    }
    torch_bf16 = {"fwd": lambda: torch._grouped_mm(x, w, offs=ends),
                  "dgrad": lambda: torch._grouped_mm(dy, w.transpose(-2, -1), offs=ends),
                  "wgrad": lambda: torch._grouped_mm(x.t(), dy, offs=ends)}
    # DeepGEMM (deepgemm_impl.py) on the same operands, and the output checks
    peer = (deepgemm_impl.Fp8BlockPeer(args.dg, torch, sizes, k, n)
            if getattr(args, "dg", None) is not None else None)
    dg_kernel = {"fwd": "m_grouped_fp8_gemm_nt_contiguous", "dgrad": "m_grouped_fp8_gemm_nt_contiguous",
                 "wgrad": "k_grouped_fp8_gemm_nt_contiguous"}
    cpu_offsets = [0]
    for s_ in sizes:
        cpu_offsets.append(cpu_offsets[-1] + s_)

    def verdict(err):
        return {"rel_err": float(f"{err:.3g}"), "tol": deepgemm_impl.CHECK_TOL,
                "ok": bool(err < deepgemm_impl.CHECK_TOL),
                "groups": deepgemm_impl.check_groups(experts)}

    def ours_err(op, x_scales=None):
        if op == "fwd":
            return deepgemm_impl.m_grouped_ref_err(torch, y, cpu_offsets, xq, xs, wtq, wts)
        if op == "dgrad":
            return deepgemm_impl.m_grouped_ref_err(torch, dx, cpu_offsets, dyq, dys, wq, ws)
        return max(deepgemm_impl.rel_err(torch, dw32[e], ref) for e, ref in deepgemm_impl.wgrad_refs(
            torch, xc, xcs if x_scales is None else x_scales, dyc, dycs, padded, "columns"))

    def deep_gemm_fn(op):
        if op == "fwd":
            return peer.prepare_m_grouped(op, xq, xs, wtq, wts)
        if op == "dgrad":
            return peer.prepare_m_grouped(op, dyq, dys, wq, ws)
        return peer.prepare_wgrad(xc, xcs, dyc, dycs, padded, dw32)

    try:
        for op in ops:
            fns = {"dropless": ours_with(op, h), "bf16": torch_bf16[op]}
            for kn, other in others[op].items():
                fns[kn] = ours_with(op, other)
            checks = {}
            if args.check:
                fns["dropless"]()
                torch.cuda.synchronize()
                checks["dropless"] = verdict(ours_err(op))
                for kn, other in others[op].items():  # every kernel timed, named ones too
                    fns[kn]()
                    torch.cuda.synchronize()
                    # X's block scales as the per-column scales they stand for
                    checks[kn] = verdict(ours_err(op, xcs_blocks.repeat_interleave(128, dim=1)
                                                  if other in per_block_handles else None))
            try:
                torch_fp8[op]()
                fns["fp8"] = torch_fp8[op]
            except Exception as exc:  # a peer that cannot run this layout is reported
                peer_error(f"peer error: torch._scaled_grouped_mm fp8-block {op} {tag}: "
                           f"{str(exc).splitlines()[0][:200]}")
            if peer is not None:
                try:
                    fn = deep_gemm_fn(op)
                    if op == "wgrad":
                        dw32.zero_()  # DeepGEMM's wgrad accumulates into its output
                    t0 = time.time()
                    fn()  # the first call JIT-compiles (or loads from DG_JIT_CACHE_DIR)
                    torch.cuda.synchronize()
                    print(f"deep_gemm {op} {tag}: first call {time.time() - t0:.1f} s", flush=True)
                    if args.check:
                        checks["deep_gemm"] = verdict(peer.check(op))
                        if not checks["deep_gemm"]["ok"]:
                            peer_error(f"check failed: deep_gemm fp8-block {op} {tag}: relative "
                                       f"error {checks['deep_gemm']['rel_err']}")
                    fns["deep_gemm"] = fn
                except Exception as exc:
                    peer_error(f"peer error: deep_gemm fp8-block {op} {tag}: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0][:300] if str(exc) else ''}")
            res = interleave(torch, fns, args.rounds, args.iters, args.warm_s)
            out = "fp32" if op == "wgrad" else "bf16"
            add(op, "dropless", "fp8-block", res["dropless"], kernel + ", default kernels", out=out,
                check=checks.get("dropless"))
            for kn in others[op]:
                if kn == X_BLOCKS:
                    add(op, "dropless", "fp8-block-wgrad128", res[kn],
                        lib.dl_fp8block_kernel(x_blocks).decode(), out=out,
                        extra_note="X scaled per 128 x 128 block", check=checks.get(kn))
                elif others[op][kn] in per_block_handles:
                    add(op, "dropless", "fp8-block-wgrad128", res[kn], kn, out=out,
                        extra_note="X scaled per 128 x 128 block", check=checks.get(kn))
                else:
                    add(op, "dropless", "fp8-block", res[kn], kn, out=out, check=checks.get(kn))
            if "fp8" in res:
                add(op, "torch._scaled_grouped_mm", "fp8-rowwise", res["fp8"])
            add(op, "torch._grouped_mm", "bf16", res["bf16"])
            if "deep_gemm" in res:
                add(op, "deep_gemm", "fp8-block", res["deep_gemm"], dg_kernel[op], out=out,
                    extra_note=(peer.padding_note() if op != "wgrad" else
                                "k-grouped over the same groups padded to 128 rows, fp32 out "
                                "accumulated into (c = d)"),
                    check=checks.get("deep_gemm"))
    finally:
        for handle in {h, *others["fwd"].values(), *others["wgrad"].values()}:
            lib.dl_fp8block_destroy(handle)


def ceilings(torch):
    """Dense 8192^3 GEMMs (torch.mm bf16, torch._scaled_mm fp8 with tensor-wise scales) and a 2 GiB
    device copy, each measured as one case of interleave() (so from the same warm state)."""
    d = 8192
    a = torch.rand(d, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    b = torch.rand(d, d, device="cuda", dtype=torch.bfloat16) * 2 - 1
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    src = torch.empty(1 << 30, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    res = interleave(torch, {"bf16": lambda: torch.mm(a, b),
                             "fp8": lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16),
                             "copy": lambda: dst.copy_(src)}, rounds=3, iters=10, warm_s=0.3)
    flop = 2.0 * d ** 3
    out = {"dense_bf16_tflops": round(flop / (res["bf16"][0] * 1e9), 1),
           "dense_fp8_tflops": round(flop / (res["fp8"][0] * 1e9), 1),
           "copy_gbps": round(2.0 * src.numel() * 2 / (res["copy"][0] * 1e6), 1)}
    del a, b, a8, b8, src, dst
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="libdropless_gemm_capi.so")
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="dsv3,qwen3,mixtral")
    ap.add_argument("--dists", default="uniform,zipf")
    ap.add_argument("--ops", default="fwd,dgrad,wgrad")
    ap.add_argument("--precisions", default="bf16,mxfp8")
    ap.add_argument("--fwd-kernels", default="", help="bf16 kernels to time next to the default")
    ap.add_argument("--dgrad-kernels", default="")
    ap.add_argument("--wgrad-kernels", default="")
    ap.add_argument("--mx-kernels", default="",
                    help="MXFP8 kernels to time next to the default (mxfp8-wgrad precision)")
    ap.add_argument("--fp8-block-m-kernels", default="",
                    help="fp8-block forward / data-gradient kernels to time next to the default")
    ap.add_argument("--fp8-block-wgrad-kernels", default="",
                    help="fp8-block weight-gradient kernels to time next to the default")
    ap.add_argument("--ceiling-peers", action=argparse.BooleanOptionalAction, default=True,
                    help="uniform forward: also time torch.bmm and a dense GEMM of the same FLOPs")
    ap.add_argument("--wgrad-out", choices=("bf16", "fp32"), default="bf16",
                    help="dropless's weight-gradient output type (torch's is bf16 either way)")
    ap.add_argument("--deep-gemm", choices=("auto", "off"), default="auto",
                    help="fp8-block: also time DeepGEMM's SM90 kernels when `import deep_gemm` works "
                         "(the reason it does not is recorded under peer_errors)")
    ap.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                    help="fp8-block: check dropless's and DeepGEMM's outputs on 3 groups against an "
                         "fp32 reference (relative error < 1e-2)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warm-s", type=float, default=0.3)
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    unknown = set(args.ops.split(",")) - {"fwd", "dgrad", "wgrad"}
    if unknown:
        sys.exit(f"--ops: unknown {', '.join(sorted(unknown))} (fwd, dgrad, wgrad)")

    import torch
    lib = load_lib(args.lib)
    args.dg = None
    peer_versions = {"torch": torch.__version__}
    if "fp8-block" in args.precisions.split(",") and args.deep_gemm == "auto":
        args.dg, why = deepgemm_impl.load(torch)
        if args.dg is None:
            peer_error(f"skipped deep_gemm: {why}")
        else:
            peer_versions["deep_gemm"] = deepgemm_impl.version(args.dg)
    start = ceilings(torch)
    print(f"ceilings: {start}", flush=True)
    rows = []
    for shape in args.shapes.split(","):
        _, hidden, ffn, _, _ = SHAPES[shape]
        for weight, k, n in (("w13", hidden, 2 * ffn), ("w2", ffn, hidden)):
            for dist in args.dists.split(","):
                run_case(torch, lib, args, shape, weight, k, n, dist, rows)
                torch.cuda.empty_cache()
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,temperature.gpu,power.draw",
                              "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        smi = ""
    result = {
        "bench": "gemm", "device": f"{torch.cuda.get_device_name()} (1 GPU)",
        "date": datetime.date.today().isoformat(),
        "command": "python3 bench/peers/interleaved_gemm.py " + " ".join(sys.argv[1:]),
        "commit": args.commit, "ceilings": start, "ceilings_at_end": ceilings(torch),
        "peer_versions": peer_versions,
        "gpu_state_at_end": smi, "rows": rows,
    }
    if ERRORS:
        result["peer_errors"] = ERRORS
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
