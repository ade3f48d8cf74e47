"""What the interleaved GEMM benchmark's cases share (interleaved_gemm.py, mx_interleaved.py):
the C library's error check, the alternating-rounds timer, and random MX operands."""
import statistics
import time

from gemm_peer import median_ms


def check(lib, rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: {lib.dl_last_error().decode()}")


def interleave(torch, fns, rounds, iters, warm_s):
    """Median over rounds of each implementation's median ms; rounds alternate the order."""
    t0 = time.time()
    while time.time() - t0 < warm_s:
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
    per = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            per[name].append(median_ms(torch, fns[name], warmup=1, iters=iters))
    return {name: (statistics.median(v), min(v), max(v)) for name, v in per.items()}


def random_e4m3(torch, shape, g):
    b = torch.randint(0, 256, shape, device="cuda", dtype=torch.uint8, generator=g)
    return torch.where((b & 0x7F) == 0x7F, b ^ 1, b)  # no NaN codes


def random_e8m0(torch, shape, g):
    return torch.randint(118, 137, shape, device="cuda", dtype=torch.uint8, generator=g)
