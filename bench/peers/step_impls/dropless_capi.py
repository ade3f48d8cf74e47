"""dropless's step engine through its C API (ctypes); the job spec it is given."""
import ctypes

from . import AUX_COEFF, BETAS, EPS, LR, SHAPES


def load_lib(path):
    lib = ctypes.CDLL(path)
    lib.dl_step_create.restype = ctypes.c_void_p
    lib.dl_step_create.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    lib.dl_step_run.restype = ctypes.c_int
    lib.dl_step_run.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_double),
                                ctypes.c_char_p, ctypes.c_int]
    lib.dl_step_time_gemms.restype = ctypes.c_int
    lib.dl_step_time_gemms.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    lib.dl_step_stats.restype = ctypes.c_int
    lib.dl_step_stats.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_double), ctypes.c_int]
    lib.dl_step_destroy.restype = None
    lib.dl_step_destroy.argtypes = [ctypes.c_void_p]
    return lib


def yfloat(x):
    """A float as YAML 1.1 reads it too (1.0e-08, never 1e-08)."""
    r = repr(float(x))
    return r.replace("e", ".0e", 1) if "e" in r and "." not in r else r


def dropless_spec(shape, args, precision=None, moment_dtype=None):
    """The engine runs one GPU: with --ep N it gets one GPU's share of the layer, E/N experts that
    receive all T*k routed rows (the peers' model of an EP rank); its router then scores E/N experts
    instead of E (a negligible part of the step's FLOPs). precision: default args.precision;
    moment_dtype: AdamW's moments (default: the spec's default, fp32)."""
    t, h, f, e, k = SHAPES[shape]
    ep = args.ep_of[shape]
    e //= ep
    lines = [f"name: step-bench-{shape}", "model:", f"  hidden: {h}", f"  ffn: {f}",
             f"  experts: {e}", f"  topk: {k}", "  shared_experts: 0", "  layers: 1",
             "  router: softmax", "  renormalize: true", "  activation: swiglu",
             f"  aux_loss_coeff: {AUX_COEFF}", "parallel:", "  ep: 1", "  dp: 1",
             f"precision: {precision or args.precision}", f"tokens_per_rank: {t}", "steps: 1000000",
             "optimizer:", "  name: adamw", f"  lr: {yfloat(LR)}", f"  betas: [{BETAS[0]}, {BETAS[1]}]",
             f"  eps: {yfloat(EPS)}", f"  weight_decay: {yfloat(args.weight_decay)}"]
    if moment_dtype:
        lines.append(f"  moment_dtype: {moment_dtype}")
    if args.dispatcher:
        lines.append(f"dispatcher: {args.dispatcher}")
    if args.offload:
        lines.append("activation_offload: true")
    lines += ["resources:", "  backend: cuda"]
    return "\n".join(lines) + "\n"


STAT_NAMES = ["peak_mem_bytes", "loss", "fwd_gemm_ms", "dgrad_gemm_ms", "wgrad_gemm_ms",
              "dispatch_ms", "combine_ms", "data_ms", "forward_ms", "backward_ms", "optimizer_ms"]


class DroplessStep:
    def __init__(self, lib, spec):
        self.lib, self.err = lib, ctypes.create_string_buffer(4096)
        self.h = lib.dl_step_create(spec.encode(), self.err, len(self.err))
        if not self.h:
            raise RuntimeError(f"dl_step_create: {self.err.value.decode(errors='replace')}")
        self.engine_ms = None

    def run(self, steps):
        ms = ctypes.c_double()
        if self.lib.dl_step_run(self.h, steps, ctypes.byref(ms), self.err, len(self.err)) != 0:
            raise RuntimeError(f"dl_step_run: {self.err.value.decode(errors='replace')}")
        self.engine_ms = ms.value

    def stats(self, gemm_iterations=5):
        if self.lib.dl_step_time_gemms(self.h, gemm_iterations, self.err, len(self.err)) != 0:
            raise RuntimeError(f"dl_step_time_gemms: {self.err.value.decode(errors='replace')}")
        buf = (ctypes.c_double * len(STAT_NAMES))()
        n = self.lib.dl_step_stats(self.h, buf, len(STAT_NAMES))
        return dict(zip(STAT_NAMES, list(buf)[:max(0, n)]))

    def close(self):
        if self.h:
            self.lib.dl_step_destroy(self.h)
            self.h = None
