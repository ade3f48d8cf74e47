"""The JAX layer: ragged_dot experts, jitted value_and_grad and a hand-written AdamW."""
from . import AUX_COEFF, BETAS, EPS, LR, SHAPES

_JAX_FNS = {}


def jax_fns(jax, shape, el, dtype_name, wd, lr):
    """Jitted (step, value_and_grad, AdamW update) of one shape, cached so that rounds do not retrace."""
    key = (shape, el, dtype_name, wd, lr)
    if key in _JAX_FNS:
        return _JAX_FNS[key]
    jnp = jax.numpy
    t, _, f, e, k = SHAPES[shape]
    f32 = jnp.float32

    def loss_fn(params, x, target):
        wr, w1, w2 = params
        probs = jax.nn.softmax(jnp.dot(x, wr, preferred_element_type=f32), axis=-1)
        vals, idx = jax.lax.top_k(probs, k)
        weights = vals / vals.sum(-1, keepdims=True)
        flat = idx.reshape(-1)
        frac = jnp.bincount(flat, length=e).astype(f32) / (t * k)
        aux = e * jnp.sum(frac * probs.mean(0))
        local = flat % el
        order = jnp.argsort(local, stable=True)
        xs = jnp.take(x, order // k, axis=0)
        sizes = jnp.bincount(local, length=el).astype(jnp.int32)
        h = jax.lax.ragged_dot(xs, w1, sizes)
        y = jax.lax.ragged_dot(jax.nn.silu(h[:, :f]) * h[:, f:], w2, sizes)
        inv = jnp.zeros_like(order).at[order].set(jnp.arange(t * k, dtype=order.dtype))
        y_tok = jnp.take(y, inv, axis=0).reshape(t, k, -1)
        out = x + jnp.einsum("tk,tkh->th", weights.astype(x.dtype), y_tok)
        mse = jnp.mean(jnp.square(out.astype(f32) - target.astype(f32)))
        return mse + AUX_COEFF * aux

    grads = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))

    def adamw(state, g):
        """torch.optim.AdamW's update of the fp32 masters, then the bf16 copies refreshed."""
        params, masters, m, v, n = state
        n = n + 1
        c1, c2 = 1 - BETAS[0] ** n.astype(f32), 1 - BETAS[1] ** n.astype(f32)
        new_p, new_master, new_m, new_v = [], [], [], []
        for p, pm, mm, vv, gg in zip(params, masters, m, v, g):
            gg = gg.astype(f32)
            mm = BETAS[0] * mm + (1 - BETAS[0]) * gg
            vv = BETAS[1] * vv + (1 - BETAS[1]) * gg * gg
            pm = pm * (1 - lr * wd) - (lr / c1) * mm / (jnp.sqrt(vv) / jnp.sqrt(c2) + EPS)
            new_master.append(pm), new_m.append(mm), new_v.append(vv), new_p.append(pm.astype(p.dtype))
        return new_p, new_master, new_m, new_v, n

    def step(state, x, target):
        loss, (g, dx) = jax.value_and_grad(loss_fn, argnums=(0, 1))(state[0], x, target)
        # dx is returned so that XLA keeps the data-gradient GEMMs the torch impls compute too
        return adamw(state, g), loss, dx

    _JAX_FNS[key] = (jax.jit(step, donate_argnums=(0,)), grads, jax.jit(adamw))
    return _JAX_FNS[key]


def to_jax(jax, torch, t):
    """A JAX-owned copy of a torch tensor (DLPack on the GPU, numpy on the CPU)."""
    if t.device.type == "cuda":
        torch.cuda.synchronize()
        try:
            return jax.numpy.array(jax.dlpack.from_dlpack(t.contiguous()), copy=True)
        except Exception:
            pass
    return jax.numpy.asarray(t.detach().cpu().numpy())


class JaxStep:
    def __init__(self, jax, torch, shape, init, dtype_name, wd, lr=LR):
        jnp = self.jnp = jax.numpy
        self.jax = jax
        dt = jnp.float32 if dtype_name == "float32" else jnp.bfloat16
        masters = [to_jax(jax, torch, init[n]) for n in ("wr", "w1", "w2")]
        self.x = to_jax(jax, torch, init["x"]).astype(dt)
        self.target = to_jax(jax, torch, init["target"]).astype(dt)
        params = [m.astype(dt) for m in masters]
        if dt == jnp.float32:
            params = [jnp.array(p, copy=True) for p in params]
        self.state = (params, masters, [jnp.zeros_like(m) for m in masters],
                      [jnp.zeros_like(m) for m in masters], jnp.zeros((), jnp.int32))
        self.step_fn, self.grads_fn, self.adamw_fn = jax_fns(jax, shape, init["w1"].shape[0],
                                                             dtype_name, wd, lr)
        self.loss = self.dx = None

    def step(self):
        self.state, self.loss, self.dx = self.step_fn(self.state, self.x, self.target)

    def sync(self):
        self.jax.block_until_ready((self.state, self.loss, self.dx))

    def grads(self):
        loss, (g, dx) = self.grads_fn(self.state[0], self.x, self.target)
        return loss, {"dx": dx, "dwr": g[0], "dw1": g[1], "dw2": g[2]}

    def peak_bytes(self):
        try:
            return (self.jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
        except Exception:
            return None
