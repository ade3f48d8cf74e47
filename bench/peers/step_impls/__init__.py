"""The implementations that bench/peers/step_peer.py times and checks (see its docstring)."""
from gemm_peer import SHAPES as _GEMM_SHAPES  # bench/peers is on sys.path (step_peer.py puts it)

SHAPES = dict(_GEMM_SHAPES, tiny=(256, 128, 64, 8, 2))  # (T, H, F, E, k)
PEAK = {"name": "NVIDIA H100/H200 SXM dense BF16 datasheet", "tflops": 989.5}
AUX_COEFF, LR, BETAS, EPS = 0.01, 1e-4, (0.9, 0.999), 1e-8
GROUPED, NAIVE, JAX, FP8, DROPLESS = ("torch._grouped_mm", "torch-naive-loop", "jax.ragged_dot",
                                      "torch._scaled_grouped_mm", "dropless")
# torch._grouped_mm with a master-weight AdamW: one torch.compile'd pass per weight reads the bf16
# gradient and writes the fp32 master, both moments and the bf16 weight (28 B a parameter) where
# the default peer casts the gradient to fp32, runs torch.optim.AdamW(fused=True) and casts the
# weight back (40 B): the strong peer's optimizer
GROUPED_MASTER = "torch._grouped_mm+master-adamw"
TORCH_IMPLS = (GROUPED, GROUPED_MASTER, NAIVE, FP8)
DROPLESS_BF16 = "dropless-bf16"  # dropless in bf16 beside a quantized --precision, same run
# dropless with the routed experts' AdamW forced into their weight gradient's epilogue
# (DROPLESS_FUSED_EXPERT_ADAMW=1) or forced to the two passes (=0), same run; plain `dropless`
# lets the engine choose (fused in bf16 where a local expert expects at most 1024 rows)
DROPLESS_FUSED = "dropless-fused-adamw"
DROPLESS_TWO_PASS = "dropless-two-pass-adamw"
# dropless in mxfp8 with the per-32 promotion kernels (DROPLESS_MX_CORE=0) beside the default
# bf16-core expert GEMMs, same run
DROPLESS_MX_PROMOTION = "dropless-mx-promotion"
# dropless in fp8-block (X per 1x128 column tile) beside --precision fp8-block-wgrad128, same run
DROPLESS_FP8_BLOCK = "dropless-fp8-block"
# dropless with AdamW's moments stored in bf16 (optimizer.moment_dtype: bf16): in --precision, and
# in bf16 beside a quantized --precision, same run
DROPLESS_BF16_MOMENTS = "dropless-bf16-moments"
DROPLESS_BF16_BF16_MOMENTS = "dropless-bf16-bf16-moments"
# ... and in --precision with the two AdamW passes forced (DROPLESS_FUSED_EXPERT_ADAMW=0)
DROPLESS_BF16_MOMENTS_TWO_PASS = "dropless-bf16-moments-two-pass-adamw"
BF16_MOMENT_IMPLS = (DROPLESS_BF16_MOMENTS, DROPLESS_BF16_BF16_MOMENTS,
                     DROPLESS_BF16_MOMENTS_TWO_PASS)
DROPLESS_IMPLS = (DROPLESS, DROPLESS_BF16, DROPLESS_FUSED, DROPLESS_TWO_PASS,
                  DROPLESS_MX_PROMOTION, DROPLESS_FP8_BLOCK, *BF16_MOMENT_IMPLS)
DEFAULT_IMPLS = [DROPLESS, GROUPED, NAIVE, JAX]


def step_flop(shape):
    t, h, f, _, k = SHAPES[shape]
    return 18.0 * t * k * h * f


def short(exc):
    s = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {s[0][:300] if s else ''}"
