"""The torch layer: init, router, expert GEMMs (grouped, naive loop, fp8 forward), step."""
import math

from . import AUX_COEFF, BETAS, EPS, GROUPED, GROUPED_MASTER, LR, NAIVE, SHAPES


def init_tensors(torch, shape, ep, device, seed=1234, skew=False):
    """fp32 x, target, wr [H,E], w1 [E/ep,H,2F], w2 [E/ep,F,H] (seeded, the same for torch and JAX).
    skew: x[:, 0] = 1 and wr[0, -2:] = -100, so the last two experts receive no token."""
    t, h, f, e, _ = SHAPES[shape]
    if e % ep:
        raise ValueError(f"experts {e} not divisible by ep {ep}")
    g = torch.Generator(device=device).manual_seed(seed)

    def randn(*size, scale=1.0):
        return torch.randn(*size, generator=g, device=device).mul_(scale)
    out = {"x": randn(t, h), "target": randn(t, h), "wr": randn(h, e, scale=h ** -0.5),
           "w1": randn(e // ep, h, 2 * f, scale=h ** -0.5), "w2": randn(e // ep, f, h, scale=f ** -0.5)}
    if skew:
        out["x"][:, 0] = 1.0
        out["wr"][0, -2:] = -100.0
    return out


_MM_OUT_DTYPE = {}


def router_mm_fn(torch):
    """x [T,H] @ wr [H,E] -> fp32 logits from bf16 operands; backward in the operands' dtype."""
    def fwd(x, w):  # torch.mm(..., out_dtype=) where this torch and device have it (CUDA), else
        if x.device.type not in _MM_OUT_DTYPE:  # an fp32 GEMM of upcast operands
            try:
                torch.mm(x[:16, :16], w[:16, :16], out_dtype=torch.float32)
                _MM_OUT_DTYPE[x.device.type] = True
            except Exception:
                _MM_OUT_DTYPE[x.device.type] = False
        if _MM_OUT_DTYPE[x.device.type]:
            return torch.mm(x, w, out_dtype=torch.float32)
        return torch.mm(x.float(), w.float())

    class RouterMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return torch.mm(x, w) if x.dtype == torch.float32 else fwd(x, w)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            g = g.to(x.dtype)
            return g @ w.t(), x.t() @ g
    return RouterMM.apply


def swiglu(torch, h):
    """silu(gate) * up, gate the first F columns (split, not slicing: one cat in backward)."""
    gate, up = h.split(h.shape[-1] // 2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def experts_grouped(torch, xs, w1, w2, counts):
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    return torch._grouped_mm(swiglu(torch, torch._grouped_mm(xs, w1, offs=offs)), w2, offs=offs)


def experts_naive(torch, xs, w1, w2, counts):
    """One matmul per expert and GEMM. split/unbind rather than indexing, so that backward
    gathers the pieces with one cat/stack instead of a full-size zero tensor per expert."""
    sizes, outs = counts.tolist(), []
    for xe, a, b in zip(xs.split(sizes), w1.unbind(0), w2.unbind(0)):
        if xe.shape[0]:
            outs.append(swiglu(torch, xe @ a) @ b)
    return torch.cat(outs) if outs else xs.new_zeros(0, w2.shape[2])


def experts_fp8(torch):
    """Forward GEMMs through torch._scaled_grouped_mm (e4m3, row-wise scales), backward bf16."""
    e4m3, fmax = torch.float8_e4m3fn, 448.0

    class ScaledGroupedMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, offs):
            ctx.save_for_backward(x, w, offs)
            sx = x.abs().amax(1).float().clamp_(min=1e-12) / fmax             # [M]
            sw = w.abs().amax(1).float().clamp_(min=1e-12) / fmax             # [E, N]
            xq = (x.float() / sx[:, None]).to(e4m3)
            wq = (w.float() / sw[:, None, :]).to(e4m3).transpose(-2, -1).contiguous()  # [E,N,K]
            return torch._scaled_grouped_mm(xq, wq.transpose(-2, -1), sx, sw, offs=offs,
                                            out_dtype=x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, w, offs = ctx.saved_tensors
            dy = dy.contiguous()
            return (torch._grouped_mm(dy, w.transpose(-2, -1), offs=offs),
                    torch._grouped_mm(x.t(), dy, offs=offs), None)

    def fn(_torch, xs, w1, w2, counts):
        offs = torch.cumsum(counts, 0, dtype=torch.int32)
        return ScaledGroupedMM.apply(swiglu(torch, ScaledGroupedMM.apply(xs, w1, offs)), w2, offs)
    return fn


def counts_of(torch, idx, n):
    """Rows per index in [0, n) without a host sync (torch.bincount on CUDA reads its input's
    min and max back to the host)."""
    return torch.zeros(n, dtype=torch.long, device=idx.device).scatter_add_(
        0, idx, torch.ones_like(idx))


def torch_loss(torch, router_mm, experts, x, wr, w1, w2, target, k):
    t, hid = x.shape
    e, el = wr.shape[1], w1.shape[0]
    probs = torch.softmax(router_mm(x, wr), dim=-1)
    vals, idx = torch.topk(probs, k, dim=-1)
    weights = vals / vals.sum(-1, keepdim=True)
    flat = idx.reshape(-1)
    frac = counts_of(torch, flat, e).float() / (t * k)
    aux = e * (frac * probs.mean(0)).sum()
    local = flat % el if el != e else flat
    order = torch.argsort(local, stable=True)
    xs = x.index_select(0, order // k)
    y = experts(torch, xs, w1, w2, counts_of(torch, local, el))
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(t * k, device=x.device))
    y_tok = y.index_select(0, inv).view(t, k, hid)
    out = x + torch.bmm(weights.to(x.dtype).unsqueeze(1), y_tok).squeeze(1)
    mse = (out.float() - target.float()).pow(2).mean()
    return mse + AUX_COEFF * aux


_MASTER_UPDATES = {}


def master_update_fn(torch, beta1, beta2, eps, lr_wd):
    """One pass per weight (torch.compile fuses it): AdamW as torch.optim.AdamW computes it, from
    the bf16 gradient into the fp32 master and moments, and the bf16 weight written from the new
    master. scal [2] fp32 on the device: lr / (1 - beta1^t), 1 / sqrt(1 - beta2^t)."""
    key = (beta1, beta2, eps, lr_wd)
    if key not in _MASTER_UPDATES:
        def update(master, m, v, grad, weight, scal):
            g = grad.float()
            master.mul_(1.0 - lr_wd)
            m.lerp_(g, 1.0 - beta1)
            v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
            master.sub_(scal[0] * m / (v.sqrt() * scal[1] + eps))
            weight.copy_(master)
        # One code object serves every weight of every shape: sizes dynamic, and room in
        # dynamo's cache past its default 8 entries (else the 9th weight shape of a run falls
        # back to the eager, multi-kernel update without a word).
        config = torch._dynamo.config
        for limit in ("recompile_limit", "cache_size_limit"):
            if hasattr(config, limit):
                setattr(config, limit, max(getattr(config, limit), 64))
        _MASTER_UPDATES[key] = torch.compile(update, dynamic=True)
    return _MASTER_UPDATES[key]


class MasterAdamW:
    """AdamW over fp32 masters fed by bf16 gradients, writing the bf16 weights, without the
    separate cast passes (GROUPED_MASTER's optimizer)."""

    def __init__(self, torch, masters, weights, lr, wd):
        self.torch, self.masters, self.weights, self.lr, self.t = torch, masters, weights, lr, 0
        self.m = [torch.zeros_like(w) for w in masters]
        self.v = [torch.zeros_like(w) for w in masters]
        self.scal = torch.zeros(2, dtype=torch.float32, device=masters[0].device)
        self.update = master_update_fn(torch, BETAS[0], BETAS[1], EPS, lr * wd)

    def step(self):
        self.t += 1
        # Kernel arguments, not copies from host memory: no sync.
        self.scal[0].fill_(self.lr / (1.0 - BETAS[0] ** self.t))
        self.scal[1].fill_(1.0 / math.sqrt(1.0 - BETAS[1] ** self.t))
        with self.torch.no_grad():
            for master, m, v, w in zip(self.masters, self.m, self.v, self.weights):
                self.update(master, m, v, w.grad, w.detach(), self.scal)


class TorchStep:
    """State and step of one torch impl. dtype float32: the params are the masters (--check)."""

    def __init__(self, torch, name, shape, init, dtype, wd, lr=LR):
        self.torch, self.k, self.device = torch, SHAPES[shape][4], init["x"].device
        self.experts = ({GROUPED: experts_grouped, GROUPED_MASTER: experts_grouped,
                         NAIVE: experts_naive}.get(name) or experts_fp8(torch))
        self.router_mm = router_mm_fn(torch)
        self.masters = [init["wr"], init["w1"], init["w2"]]
        if dtype == torch.float32:
            self.params = [m.requires_grad_() for m in self.masters]
        else:
            self.params = [m.to(dtype).requires_grad_() for m in self.masters]
            if name != GROUPED_MASTER:  # the fp32 gradient copies torch.optim.AdamW reads
                for m in self.masters:
                    m.grad = torch.empty_like(m)
        self.x = init["x"].to(dtype).requires_grad_()
        self.target = init["target"].to(dtype)
        self.opt = self.master_adamw = None
        if name == GROUPED_MASTER and dtype != torch.float32:
            self.master_adamw = MasterAdamW(torch, self.masters, self.params, lr, wd)
            self.optimizer = "master AdamW (torch.compile, one pass per weight)"
        else:
            try:
                self.opt = torch.optim.AdamW(self.masters, lr=lr, betas=BETAS, eps=EPS,
                                             weight_decay=wd, fused=True)
                self.optimizer = "torch.optim.AdamW(fused=True)"
            except (RuntimeError, ValueError):  # fused AdamW unavailable on this device
                self.opt = torch.optim.AdamW(self.masters, lr=lr, betas=BETAS, eps=EPS,
                                             weight_decay=wd)
                self.optimizer = "torch.optim.AdamW (not fused: unavailable here)"
            if self.params[0] is not self.masters[0]:
                self.optimizer += " with fp32 gradient and bf16 weight copies"
        self.loss = None

    def forward_backward(self):
        for p in self.params:
            p.grad = None
        self.x.grad = None
        loss = torch_loss(self.torch, self.router_mm, self.experts, self.x, *self.params,
                          self.target, self.k)
        loss.backward()
        self.loss = loss.detach()

    def step(self):
        self.forward_backward()
        if self.master_adamw is not None:
            self.master_adamw.step()
            return
        mixed = self.params[0] is not self.masters[0]
        if mixed:
            for m, p in zip(self.masters, self.params):
                m.grad.copy_(p.grad)
        self.opt.step()
        if mixed:
            with self.torch.no_grad():
                for m, p in zip(self.masters, self.params):
                    p.copy_(m)

    def sync(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()

    def grads(self):
        return {"dx": self.x.grad, "dwr": self.params[0].grad, "dw1": self.params[1].grad,
                "dw2": self.params[2].grad}
