#!/usr/bin/env python3
"""DeepGEMM (deepseek-ai/DeepGEMM, SM90) as a peer of interleaved_gemm.py's fp8-block rows.

Only DeepGEMM's public Python API is called; DeepGEMM itself is not part of this repository and
must be importable (`import deep_gemm`) for these rows to exist. Its SM90 FP8 recipe is ours:
1x128 activation tiles and 128x128 weight blocks with fp32 scales. The operands are the same bytes
that interleaved_gemm.py hands to dropless, put into DeepGEMM's layouts once, outside the timing:

  fwd / dgrad  deep_gemm.m_grouped_fp8_gemm_nt_contiguous: A [M, K] E4M3 with every group padded
               to get_mk_alignment_for_contiguous_layout() rows (128 on SM90) and a per-row group
               index (-1 on padding rows), its 1x128 scales MN-major and TMA-aligned
               (get_mn_major_tma_aligned_tensor); B the K-major weight [E, N, K] with [E, N/128,
               K/128] scales, i.e. dropless's forward operand W^T (scales_t) and its
               data-gradient operand W (scales) as they are. Out bf16 [M_padded, N].
  wgrad        deep_gemm.k_grouped_fp8_gemm_nt_contiguous: K (tokens) grouped, groups padded to
               128 as dropless's column-wise operands are; A and B per group [cols][K_g] (tokens
               contiguous, groups one after another), scales [P/128][cols] (dropless's layout,
               passed transposed), out fp32 [E, k, n] accumulated into (c = d).

TFLOP/s count the real rows (2*rows*k*n, as every other row); the padded rows the m-grouped
kernels compute are reported in the row's note.
"""
import os
import sys
import time

FP8_BLOCK = 128
REQUIRED = ("m_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_nt_contiguous",
            "get_mn_major_tma_aligned_tensor", "get_mk_alignment_for_contiguous_layout")
# Relative Frobenius error ||out - ref|| / ||ref|| a checked output must stay under; ref is an fp32
# matmul of the dequantized operands (bf16 output alone gives ~1e-3).
CHECK_TOL = 1e-2


def load(torch):
    """(deep_gemm module, None) when its SM90 FP8 grouped kernels can run here, else (None, why)."""
    try:
        import deep_gemm
    except Exception as exc:  # ImportError, or its _C failing to load or initialize
        return None, f"import deep_gemm failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    missing = [f for f in REQUIRED if not hasattr(deep_gemm, f)]
    if missing:
        return None, f"deep_gemm {getattr(deep_gemm, '__version__', '?')} lacks {', '.join(missing)}"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return None, f"deep_gemm's fp32-scale FP8 kernels are SM90's; this GPU is sm_{major}{minor}"
    return deep_gemm, None


def version(dg):
    v = getattr(dg, "__version__", "?")
    src = os.environ.get("DEEP_GEMM_SOURCE")  # set by whoever built it (e.g. "deepseek-ai/DeepGEMM@<sha>")
    return f"{v} ({src})" if src else v


def _deq_rows(torch, q, s):
    """E4M3 bytes [r, c] with 1x128 scales [r, c/128] -> fp32."""
    return q.view(torch.float8_e4m3fn).float() * s.repeat_interleave(FP8_BLOCK, dim=1)


def _deq_block(torch, q, s):
    """E4M3 bytes [a, b] with 128x128 scales [a/128, b/128] -> fp32."""
    s = s.repeat_interleave(FP8_BLOCK, dim=0).repeat_interleave(FP8_BLOCK, dim=1)
    return q.view(torch.float8_e4m3fn).float() * s


def rel_err(torch, out, ref):
    return float((out.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def check_groups(experts):
    return sorted({0, experts // 2, experts - 1})


class Fp8BlockPeer:
    """DeepGEMM's kernels over one case's operands (see the module docstring for the layouts)."""

    def __init__(self, dg, torch, sizes, k, n):
        self.dg, self.torch, self.sizes, self.k, self.n = dg, torch, list(sizes), k, n
        self.experts, self.rows = len(sizes), sum(sizes)
        self.align = int(dg.get_mk_alignment_for_contiguous_layout())
        self.m_padded = [(s + self.align - 1) // self.align * self.align for s in self.sizes]
        self.mp = sum(self.m_padded)
        self.offsets = [0]
        self.poffsets = [0]
        for s, p in zip(self.sizes, self.m_padded):
            self.offsets.append(self.offsets[-1] + s)
            self.poffsets.append(self.poffsets[-1] + p)
        self._layout = None
        self.fns, self.outs, self.errors = {}, {}, {}

    def padding_note(self):
        pad = self.mp - self.rows
        return (f"contiguous layout: groups padded to {self.align} rows, {self.mp} rows computed "
                f"for {self.rows} real ({100.0 * pad / self.rows:.1f}% padding; TFLOP/s on real rows)")

    def _m_layout(self):
        """Destination row of every real row in the padded buffer, and the per-row group index."""
        if self._layout is None:
            torch = self.torch
            dev = "cuda"
            if self.mp == self.rows:  # every group already aligned: the same rows, no copy
                dest = None
            else:
                dest = torch.cat([torch.arange(p0, p0 + s, device=dev, dtype=torch.int64)
                                  for p0, s in zip(self.poffsets, self.sizes)])
            m_indices = torch.full((self.mp,), -1, device=dev, dtype=torch.int32)
            for g, (p0, s) in enumerate(zip(self.poffsets, self.sizes)):
                m_indices[p0:p0 + s] = g
            self._layout = (dest, m_indices)
        return self._layout

    def _pad(self, q, s):
        dest, _ = self._m_layout()
        if dest is None:
            return q, s
        torch = self.torch
        qp = torch.zeros(self.mp, q.shape[1], device="cuda", dtype=q.dtype)
        sp = torch.ones(self.mp, s.shape[1], device="cuda", dtype=s.dtype)
        qp[dest] = q
        sp[dest] = s
        return qp, sp

    def prepare_m_grouped(self, op, a_q, a_s, b_q, b_s):
        """op fwd: a = x [rows, k], b = W^T [E, n, k]; op dgrad: a = dy [rows, n], b = W [E, k, n]
        (E4M3 as uint8 or float8, fp32 scales). Returns the timed callable."""
        torch, dg = self.torch, self.dg
        fp8 = torch.float8_e4m3fn
        aq, as_ = self._pad(a_q, a_s)
        sfa = dg.get_mn_major_tma_aligned_tensor(as_.contiguous())
        _, m_indices = self._m_layout()
        out_cols = b_q.shape[1]
        d = torch.empty(self.mp, out_cols, device="cuda", dtype=torch.bfloat16)
        a_pair, b_pair = (aq.view(fp8), sfa), (b_q.view(fp8), b_s)

        def fn():
            dg.m_grouped_fp8_gemm_nt_contiguous(a_pair, b_pair, d, m_indices)
        self.fns[op], self.outs[op] = fn, (d, a_q, a_s, b_q, b_s)
        return fn

    def prepare_wgrad(self, xc, xcs, dyc, dycs, padded, dw):
        """xc [k, P] / dyc [n, P] E4M3 bytes (P = sum(padded)), xcs [P/128, k] / dycs [P/128, n]
        fp32, padded: the 128-multiple group sizes; dw fp32 [E, k, n] (accumulated into)."""
        torch, dg = self.torch, self.dg
        fp8 = torch.float8_e4m3fn
        ks = [int(p) for p in padded]
        layout = torch.tensor(ks, device="cuda", dtype=torch.int32)
        a_pair = (xc.reshape(-1).view(fp8), xcs.t())
        b_pair = (dyc.reshape(-1).view(fp8), dycs.t())

        def fn():
            dg.k_grouped_fp8_gemm_nt_contiguous(a_pair, b_pair, dw, ks, layout, dw)
        self.fns["wgrad"], self.outs["wgrad"] = fn, (dw, xc, xcs, dyc, dycs, ks)
        return fn

    # ---- checks against an fp32 reference of the same quantized operands ----

    def check(self, op):
        """Relative error of this peer's last output on check_groups(); fn must have run."""
        torch = self.torch
        worst = 0.0
        if op in ("fwd", "dgrad"):
            d, a_q, a_s, b_q, b_s = self.outs[op]
            for g in check_groups(self.experts):
                s0, s1, p0 = self.offsets[g], self.offsets[g + 1], self.poffsets[g]
                if s1 == s0:
                    continue
                ref = _deq_rows(torch, a_q[s0:s1], a_s[s0:s1]) @ _deq_block(torch, b_q[g], b_s[g]).t()
                worst = max(worst, rel_err(torch, d[p0:p0 + (s1 - s0)], ref))
        else:
            dw, xc, xcs, dyc, dycs, ks = self.outs["wgrad"]
            worst = max(rel_err(torch, dw[g], ref)
                        for g, ref in wgrad_refs(torch, xc, xcs, dyc, dycs, ks, "grouped"))
        return worst


def m_grouped_ref_err(torch, out, offsets, a_q, a_s, b_q, b_s):
    """Error of an unpadded m-grouped output (dropless's) on check_groups()."""
    worst = 0.0
    for g in check_groups(len(offsets) - 1):
        s0, s1 = offsets[g], offsets[g + 1]
        if s1 == s0:
            continue
        ref = _deq_rows(torch, a_q[s0:s1], a_s[s0:s1]) @ _deq_block(torch, b_q[g], b_s[g]).t()
        worst = max(worst, rel_err(torch, out[s0:s1], ref))
    return worst


def wgrad_refs(torch, xc, xcs, dyc, dycs, ks, layout):
    """(group, fp32 reference of dW_g) on check_groups(). layout "columns": dropless's column-wise
    operands (element (token p, col c) at data[c * P + p]); "grouped": DeepGEMM's (group g's
    [cols][K_g] block at data[P_g * cols ...], tokens contiguous). Scales [P/128][cols] in both."""
    k, n = xc.shape[0], dyc.shape[0]
    P = sum(ks)
    starts = [0]
    for kg in ks:
        starts.append(starts[-1] + kg)
    for g in check_groups(len(ks)):
        p0, kg = starts[g], ks[g]
        if kg == 0:
            continue
        if layout == "columns":
            a = xc.view(k, P)[:, p0:p0 + kg]
            b = dyc.view(n, P)[:, p0:p0 + kg]
        else:
            a = xc.reshape(-1)[p0 * k:(p0 + kg) * k].view(k, kg)
            b = dyc.reshape(-1)[p0 * n:(p0 + kg) * n].view(n, kg)
        t0, t1 = p0 // FP8_BLOCK, (p0 + kg) // FP8_BLOCK
        fa = a.view(torch.float8_e4m3fn).float() * xcs[t0:t1].t().repeat_interleave(FP8_BLOCK, dim=1)
        fb = b.view(torch.float8_e4m3fn).float() * dycs[t0:t1].t().repeat_interleave(FP8_BLOCK, dim=1)
        yield g, fa @ fb.t()


def _warm_one(dg, torch, sizes, k, n, op):
    u8, f32 = torch.uint8, torch.float32
    peer = Fp8BlockPeer(dg, torch, sizes, k, n)
    if op in ("fwd", "dgrad"):
        kk, nn = (k, n) if op == "fwd" else (n, k)
        fn = peer.prepare_m_grouped(
            op, torch.zeros(peer.rows, kk, device="cuda", dtype=u8),
            torch.ones(peer.rows, kk // FP8_BLOCK, device="cuda", dtype=f32),
            torch.zeros(peer.experts, nn, kk, device="cuda", dtype=u8),
            torch.ones(peer.experts, nn // FP8_BLOCK, kk // FP8_BLOCK, device="cuda", dtype=f32))
    else:
        padded = [(s + FP8_BLOCK - 1) // FP8_BLOCK * FP8_BLOCK for s in sizes]
        P = sum(padded)
        fn = peer.prepare_wgrad(
            torch.zeros(k, P, device="cuda", dtype=u8),
            torch.ones(P // FP8_BLOCK, k, device="cuda", dtype=f32),
            torch.zeros(n, P, device="cuda", dtype=u8),
            torch.ones(P // FP8_BLOCK, n, device="cuda", dtype=f32),
            padded, torch.zeros(peer.experts, k, n, device="cuda", dtype=f32))
    fn()
    torch.cuda.synchronize()


def warm(specs, dists):
    """Compile (JIT) DeepGEMM's kernels for the given shape:weight:op cases of interleaved_gemm.py,
    with the same sizes, so that a later run finds them in DG_JIT_CACHE_DIR. Returns 0 / 1."""
    import torch
    from gemm_peer import SHAPES
    from interleaved_gemm import group_sizes
    dg, why = load(torch)
    if dg is None:
        print(f"deep_gemm warm: {why}", flush=True)
        return 1
    rc = 0
    for spec in specs:
        shape, weight, op = spec.split(":")
        tokens, hidden, ffn, experts, top_k = SHAPES[shape]
        k, n = (hidden, 2 * ffn) if weight == "w13" else (ffn, hidden)
        for dist in dists:
            t0 = time.time()
            try:
                _warm_one(dg, torch, group_sizes(tokens * top_k, experts, dist), k, n, op)
                print(f"deep_gemm warm {spec} {dist}: {time.time() - t0:.1f} s", flush=True)
            except Exception as exc:
                rc = 1
                print(f"deep_gemm warm {spec} {dist} FAILED: {type(exc).__name__}: {exc}", flush=True)
            torch.cuda.empty_cache()
    return rc


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="JIT-compile DeepGEMM's kernels for interleaved_gemm.py's "
                                             "fp8-block cases ahead of the timed run")
    ap.add_argument("--warm", required=True, help="comma list of shape:weight:op, e.g. dsv3:w13:fwd")
    ap.add_argument("--dists", default="uniform,zipf")
    a = ap.parse_args()
    sys.exit(warm(a.warm.split(","), a.dists.split(",")))
