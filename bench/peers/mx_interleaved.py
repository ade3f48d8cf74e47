"""The mxfp8 rows of one interleaved_gemm.py case (see its docstring): random E4M3 operands and
E8M0 scales in the layouts of kernels/include/dropless/kernels/mxfp8.h; the promotion kernels, the
bf16-core kernels on weight images (with the image pass and an output check), torch's peers."""
import sys

from interleave import check, interleave, random_e4m3, random_e8m0


def run_mxfp8(torch, lib, args, ops, g, tensors, dims, add, tag=""):
    x, w, dy, ends, offsets, y, dx = tensors
    rows, k, n, experts, sizes = dims
    bf16 = torch.bfloat16
    fp8 = torch.float8_e4m3fn
    xq, xs = random_e4m3(torch, (rows, k), g), random_e8m0(torch, (rows, k // 32), g)
    wtq, wts = random_e4m3(torch, (experts, n, k), g), random_e8m0(torch, (experts, n, k // 32), g)
    dyq, dys = random_e4m3(torch, (rows, n), g), random_e8m0(torch, (rows, n // 32), g)
    wq, ws = random_e4m3(torch, (experts, k, n), g), random_e8m0(torch, (experts, k, n // 32), g)
    ones_rows = torch.ones(rows, device="cuda", dtype=torch.float32)
    h = lib.dl_mxgemm_create(experts, k, n, rows, 0, rows // experts, None)
    if not h:
        raise RuntimeError(lib.dl_last_error().decode())
    kernel = lib.dl_mxgemm_kernel(h).decode()
    # The bf16-core variant the default picks, and the other one (one CTA per tile, or 2 x 1
    # clusters sharing the image tile) timed beside it.
    core_kernel = lib.dl_mxgemm_core_kernel(h).decode()
    other_core = ("mx_core_bf16_128x256x64_s4" if core_kernel.endswith("_c2x1")
                  else "mx_core_bf16_128x256x64_s4_c2x1")
    h_c2 = lib.dl_mxgemm_create(experts, k, n, rows, 0, rows // experts, other_core.encode())
    if not h_c2:
        raise RuntimeError(lib.dl_last_error().decode())
    # The bf16-core kernel reads the weights as exact bf16 images, made once per update;
    # it needs reductions that are multiples of 64.
    wt_img = torch.empty(experts, n, k, device="cuda", dtype=bf16)
    w_img = torch.empty(experts, k, n, device="cuda", dtype=bf16)
    y2, dx2 = torch.empty_like(y), torch.empty_like(dx)
    core = {"fwd": k % 64 == 0, "dgrad": n % 64 == 0}

    def image(which):
        if which == "fwd":
            return check(lib, lib.dl_mx_weight_image(experts * n, k, wtq.data_ptr(),
                                                     wts.data_ptr(), wt_img.data_ptr(), None),
                         "mx image")
        return check(lib, lib.dl_mx_weight_image(experts * k, n, wq.data_ptr(), ws.data_ptr(),
                                                 w_img.data_ptr(), None), "mx image")
    try:
        cases = {
            "fwd": (lambda: check(lib, lib.dl_mxgemm_forward(
                        h, xq.data_ptr(), xs.data_ptr(), wtq.data_ptr(), wts.data_ptr(),
                        offsets.data_ptr(), y.data_ptr(), None), "mx fwd"),
                    lambda hh=h: check(lib, lib.dl_mxgemm_forward_image(
                        hh, xq.data_ptr(), xs.data_ptr(), wt_img.data_ptr(),
                        offsets.data_ptr(), y2.data_ptr(), None), "mx core fwd"),
                    (xq.view(fp8), wtq.view(fp8).transpose(-2, -1),
                     torch.ones(experts, n, device="cuda", dtype=torch.float32)),
                    lambda: torch._grouped_mm(x, w, offs=ends), (y, y2)),
            "dgrad": (lambda: check(lib, lib.dl_mxgemm_backward_data(
                          h, dyq.data_ptr(), dys.data_ptr(), wq.data_ptr(), ws.data_ptr(),
                          offsets.data_ptr(), dx.data_ptr(), None), "mx dgrad"),
                      lambda hh=h: check(lib, lib.dl_mxgemm_backward_data_image(
                          hh, dyq.data_ptr(), dys.data_ptr(), w_img.data_ptr(),
                          offsets.data_ptr(), dx2.data_ptr(), None), "mx core dgrad"),
                      (dyq.view(fp8), wq.view(fp8).transpose(-2, -1),
                       torch.ones(experts, k, device="cuda", dtype=torch.float32)),
                      lambda: torch._grouped_mm(dy, w.transpose(-2, -1), offs=ends), (dx, dx2)),
        }
        for op in ops:
            if op not in cases:
                continue
            ours, ours_core, (a, b, sb), bf16_fn, (out_p, out_c) = cases[op]
            fns = {"dropless": ours, "bf16": bf16_fn}
            if core[op]:
                image(op)
                fns["core"] = ours_core
                fns["core-other"] = lambda f=ours_core: f(h_c2)
                fns["image"] = lambda op=op: image(op)
            try:
                torch._scaled_grouped_mm(a, b, ones_rows, sb, offs=ends, out_dtype=bf16)
                fns["fp8"] = lambda: torch._scaled_grouped_mm(a, b, ones_rows, sb, offs=ends,
                                                              out_dtype=bf16)
            except Exception as exc:  # a peer that cannot run this layout is reported
                print(f"peer error: torch._scaled_grouped_mm {op} {tag}: "
                      f"{str(exc).splitlines()[0][:200]}", file=sys.stderr)
            res = interleave(torch, fns, args.rounds, args.iters, args.warm_s)
            add(op, "dropless", "mxfp8", res["dropless"], kernel)
            if core[op]:
                # The same product through both kernels: they must agree to bf16 rounding.
                ours()
                ours_core()
                torch.cuda.synchronize()
                live = sum(sizes)
                p_, c_ = out_p[:live].float(), out_c[:live].float()
                rel = float((p_ - c_).norm() / p_.norm().clamp_min(1e-30))
                add(op, "dropless", "mxfp8", res["core"],
                    f"{core_kernel} (bf16 tensor cores, weights as exact bf16 images), "
                    "default kernel",
                    check={"against": kernel, "rel_err": rel, "ok": rel < 2e-2},
                    extra_note="weight image pass (once per weight update) timed in the same "
                               "rounds: see the mx-image row")
                ours_core(h_c2)
                torch.cuda.synchronize()
                c2_ = out_c[:live].float()
                rel2 = float((p_ - c2_).norm() / p_.norm().clamp_min(1e-30))
                add(op, "dropless", "mxfp8", res["core-other"],
                    f"{other_core} (the other bf16-core variant)",
                    check={"against": kernel, "rel_err": rel2, "ok": rel2 < 2e-2})
                add(op, "dropless-mx-image", "mxfp8", res["image"],
                    "MxWeightImage of this product's weights (not a GEMM: TFLOP/s is the "
                    "GEMM's FLOPs over the image's time)")
            if "fp8" in res:
                add(op, "torch._scaled_grouped_mm", "fp8-rowwise", res["fp8"])
            add(op, "torch._grouped_mm", "bf16", res["bf16"])
    finally:
        lib.dl_mxgemm_destroy(h)
        lib.dl_mxgemm_destroy(h_c2)
