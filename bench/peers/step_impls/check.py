"""--check: the peers' float32 agreement on the tiny shape (and bf16 on a GPU)."""
import numpy as np

from . import AUX_COEFF, BETAS, EPS, FP8, GROUPED, GROUPED_MASTER, JAX, NAIVE, SHAPES, short
from .jax_impl import JaxStep
from .torch_impls import MasterAdamW, TorchStep, init_tensors


def rel_err(torch, a, b):
    a, b = (torch.tensor(np.array(v)) if not isinstance(v, torch.Tensor) else v for v in (a, b))
    a, b = a.detach().double().cpu(), b.detach().double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def run_check(args):
    """float32, tiny shape: loss and gradients of torch._grouped_mm, the naive loop and JAX against
    an independent float64 dense formulation (every expert on every token, a routing mask, no
    permutation); JAX's hand-written AdamW against torch.optim.AdamW fed the same gradients."""
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        import jax
        jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 on the GPU
        if device == "cpu":
            jax.config.update("jax_platforms", "cpu")
        print(f"torch {torch.__version__}, jax {jax.__version__} on {jax.devices()[0].platform}")
    except Exception as exc:
        jax = None
        print(f"FAIL jax unavailable: {short(exc)}")
    passed, failed = 0, int(jax is None)
    tol, names = 1e-4, ("wr", "w1", "w2")

    def report(ok, text):
        nonlocal passed, failed
        passed, failed = passed + bool(ok), failed + (not ok)
        print(f"{'ok  ' if ok else 'FAIL'} {text}")

    cases = [("ep=1", 1, False), ("ep=2", 2, False), ("ep=1, experts 6,7 empty", 1, True)]
    for label, ep, skew in cases:
        init = init_tensors(torch, "tiny", ep, device, seed=7, skew=skew)
        print(f"{label}: tokens per local expert {g_counts(torch, init)}")
        ref_loss, ref = dense_reference(torch, init)
        got = {}
        for name in (NAIVE, GROUPED, JAX):
            fresh = {n: v.clone() for n, v in init.items()}
            try:
                if name == JAX:
                    if jax is None:
                        continue
                    st = JaxStep(jax, torch, "tiny", fresh, "float32", 0.1, 1e-2)
                    loss, g = st.grads()
                    g = {n: np.asarray(v) for n, v in g.items()}
                    st.step()  # the jitted training step runs and starts from the same loss
                    st.sync()
                    g["step_loss"] = np.asarray(st.loss)
                    ref["step_loss"] = torch.tensor(ref_loss)
                else:
                    st = TorchStep(torch, name, "tiny", fresh, torch.float32, 0.1)
                    st.forward_backward()
                    loss, g = st.loss.detach(), {n: v.detach().clone() for n, v in st.grads().items()}
            except Exception as exc:
                if name == GROUPED and device == "cuda":  # bf16 only here: check_bf16 covers it
                    print(f"skip {label}: {name} float32 on cuda: {short(exc)}")
                else:
                    report(False, f"{label}: {name} did not run on {device}: {short(exc)}")
                continue
            got[name] = (float(loss), g)
            errs = {"loss": abs(float(loss) - ref_loss) / abs(ref_loss)}
            errs.update({n: rel_err(torch, g[n], ref[n]) for n in g})
            report(all(v <= tol for v in errs.values()),
                   f"{label}: {name} (float32, {device}) vs the float64 dense reference: "
                   + ", ".join(f"{n} {v:.1e}" for n, v in errs.items()))
        for name in (GROUPED, JAX):  # and pairwise, each against the naive loop
            if name in got and NAIVE in got:
                (loss, g), (nloss, ng) = got[name], got[NAIVE]
                errs = {"loss": abs(loss - nloss) / abs(nloss)}
                errs.update({n: rel_err(torch, g[n], ng[n]) for n in ng})
                report(all(v <= tol for v in errs.values()),
                       f"{label}: {name} vs {NAIVE} (float32, {device}): "
                       + ", ".join(f"{n} {v:.1e}" for n, v in errs.items()))
        if jax is None:
            continue
        # AdamW: JAX's update vs torch.optim.AdamW (fused where it can), the same gradients, 2 steps
        st = JaxStep(jax, torch, "tiny", {n: v.clone() for n, v in init.items()}, "float32", 0.1, 1e-2)
        masters = [init[n].clone() for n in names]
        try:
            opt = torch.optim.AdamW(masters, lr=1e-2, betas=BETAS, eps=EPS, weight_decay=0.1, fused=True)
        except (RuntimeError, ValueError):
            opt = torch.optim.AdamW(masters, lr=1e-2, betas=BETAS, eps=EPS, weight_decay=0.1)
        state = st.state
        for _ in range(2):
            _, g = st.grads_fn(state[0], st.x, st.target)
            for m, gg in zip(masters, g[0]):
                m.grad = torch.tensor(np.asarray(gg), device=m.device)
            opt.step()
            state = st.adamw_fn(state, g[0])
        errs = {n: rel_err(torch, np.asarray(a) - init[n].cpu().numpy(), (b - init[n]).cpu())
                for n, a, b in zip(names, state[1], masters)}
        report(all(v <= tol for v in errs.values()),
               f"{label}: JAX AdamW vs torch AdamW, 2 steps (lr 1e-2, wd 0.1), updates: "
               + ", ".join(f"{n} {v:.1e}" for n, v in errs.items()))
    if device == "cuda":
        p, f = check_bf16(torch)
        passed, failed = passed + p, failed + f
    print(f"{passed} passed, {failed} failed")
    return failed == 0


def g_counts(torch, init):
    el = init["w1"].shape[0]
    logits = init["x"].double() @ init["wr"].double()
    idx = torch.topk(torch.softmax(logits, -1), SHAPES["tiny"][4], -1).indices.reshape(-1)
    return torch.bincount(idx % el, minlength=el).tolist()


def dense_reference(torch, init):
    """float64 loss and gradients: every local expert applied to every token, weighted by a
    [T, E/ep] routing mask (scatter of the renormalized top-k weights): no permutation."""
    d = {n: v.detach().double().requires_grad_(n != "target") for n, v in init.items()}
    x, wr, w1, w2 = d["x"], d["wr"], d["w1"], d["w2"]
    t, _, f, e, k = SHAPES["tiny"]
    probs = torch.softmax(x @ wr, -1)
    vals, idx = torch.topk(probs, k, -1)
    weights = vals / vals.sum(-1, keepdim=True)
    el = w1.shape[0]
    gate = torch.zeros(t, el, dtype=torch.float64, device=x.device).scatter_add(1, idx % el, weights)
    out = x
    for j in range(el):
        h = x @ w1[j]
        out = out + gate[:, j:j + 1] * ((torch.nn.functional.silu(h[:, :f]) * h[:, f:]) @ w2[j])
    frac = torch.bincount(idx.reshape(-1), minlength=e).double() / (t * k)
    loss = (out - d["target"]).pow(2).mean() + AUX_COEFF * e * (frac * probs.mean(0)).sum()
    gx, gwr, gw1, gw2 = torch.autograd.grad(loss, [x, wr, w1, w2])
    return loss.item(), {"dx": gx, "dwr": gwr, "dw1": gw1, "dw2": gw2}


def check_bf16(torch, device="cuda"):
    """On the GPU: the bf16 grouped (and fp8) steps against the bf16 naive loop, loosely (bf16
    rounding), uniform and with two experts that receive no token (their gradients must be 0)."""
    passed = failed = 0
    for label, skew in (("bf16", False), ("bf16, experts 6,7 empty", True)):
        res = {}
        for name in (NAIVE, GROUPED, FP8):
            try:
                init = init_tensors(torch, "tiny", 1, device, seed=7, skew=skew)
                st = TorchStep(torch, name, "tiny", init, torch.bfloat16, 0.0)
                st.forward_backward()
                res[name] = (float(st.loss), {n: v.float() for n, v in st.grads().items()})
                st.step()
                st.sync()
            except Exception as exc:
                print(f"  {label}: {name} not run: {short(exc)}")
        for name, tol in ((GROUPED, 2e-2), (FP8, 5e-2)):
            if name not in res or NAIVE not in res:
                failed += name == GROUPED
                continue
            loss, g = res[name]
            errs = {"loss": abs(loss - res[NAIVE][0]) / abs(res[NAIVE][0])}
            if name == GROUPED:  # norm-wise: bf16 outputs and atomics make max-abs noisy
                errs.update({n: float((v - res[NAIVE][1][n]).norm() / res[NAIVE][1][n].norm())
                             for n, v in g.items()})
                if skew:
                    errs["empty experts' |dw|"] = float(g["dw1"][-2:].abs().max() + g["dw2"][-2:].abs().max())
            ok = all(v <= tol for v in errs.values()) and errs.get("empty experts' |dw|", 0.0) == 0.0
            passed, failed = passed + ok, failed + (not ok)
            print(f"{'ok  ' if ok else 'FAIL'} {label}: {name} vs {NAIVE} ({device}, tol {tol}): " +
                  ", ".join(f"{n} {v:.1e}" for n, v in errs.items()))
    ok, text = check_master_adamw(torch, device)
    passed, failed = passed + ok, failed + (not ok)
    print(f"{'ok  ' if ok else 'FAIL'} {text}")
    return passed, failed


def check_master_adamw(torch, device):
    """GROUPED_MASTER's optimizer against the default peer's (bf16 gradient cast to fp32,
    torch.optim.AdamW, bf16 weight copy) fed the same bf16 gradients, 3 steps with weight decay:
    the masters agree to fp32 rounding, the bf16 weights are the masters rounded."""
    init = init_tensors(torch, "tiny", 1, device, seed=11)
    names = ("wr", "w1", "w2")
    masters = [init[n].clone() for n in names]
    weights = [m.to(torch.bfloat16).requires_grad_() for m in masters]
    ours = MasterAdamW(torch, masters, weights, 1e-2, 0.1)
    ref = [init[n].clone() for n in names]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=BETAS, eps=EPS, weight_decay=0.1)
    g = torch.Generator(device=device).manual_seed(5)
    for _ in range(3):
        for w, r in zip(weights, ref):
            w.grad = torch.randn(w.shape, generator=g, device=device).to(torch.bfloat16)
            r.grad = w.grad.float()
        ours.step()
        opt.step()
    errs = {n: rel_err(torch, m - init[n], r - init[n]) for n, m, r in zip(names, masters, ref)}
    copies = all(torch.equal(w.detach(), m.to(torch.bfloat16)) for w, m in zip(weights, masters))
    return (all(v <= 1e-4 for v in errs.values()) and copies,
            f"{GROUPED_MASTER}'s AdamW vs torch.optim.AdamW, 3 steps (lr 1e-2, wd 0.1), updates: "
            + ", ".join(f"{n} {v:.1e}" for n, v in errs.items())
            + f"; bf16 weights are the masters rounded: {copies}")
