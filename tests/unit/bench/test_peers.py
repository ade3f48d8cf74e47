#!/usr/bin/env python3
"""CPU checks of the benchmark peers' own logic (bench/peers/): the group sizes the same-process
comparison builds, its alternating rounds, the --ops / --cooldown-ms flags of gemm_peer.py and
the DeepGEMM peer's skip reasons and padded layout, and step_peer.py's engine variants.
A fake torch stands in for the GPU: these test the scripts, not torch."""
import argparse
import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "bench", "peers"))
import deepgemm_impl  # noqa: E402
import gemm_peer  # noqa: E402
import interleaved_gemm  # noqa: E402
import step_peer  # noqa: E402


class FakeTorch:
    """Events timestamp a fake clock that each timed function advances by its own duration."""

    def __init__(self, durations):
        self.durations, self.now, self.calls, self.syncs = durations, 0.0, [], 0
        torch = self

        class _Event:
            def __init__(self, enable_timing=True):
                self.t = None

            def record(self):
                self.t = torch.now

            def elapsed_time(self, other):
                return other.t - self.t

        class Cuda:
            Event = _Event

            @staticmethod
            def synchronize():
                torch.syncs += 1

        self.cuda = Cuda

    def fn(self, name):
        def call():
            self.calls.append(name)
            self.now += self.durations[name]
        return call


class GroupSizesTest(unittest.TestCase):
    def test_uniform_and_zipf_cover_every_row(self):
        for rows, experts in ((65536, 256), (131072, 128), (16384, 8), (1000, 7)):
            for dist in ("uniform", "zipf"):
                sizes = interleaved_gemm.group_sizes(rows, experts, dist)
                self.assertEqual(len(sizes), experts)
                self.assertEqual(sum(sizes), rows)
                self.assertTrue(all(s >= 0 for s in sizes))
        self.assertEqual(interleaved_gemm.group_sizes(131072, 128, "uniform"), [1024] * 128)
        self.assertEqual(interleaved_gemm.group_sizes(10, 4, "uniform"), [3, 3, 2, 2])

    def test_zipf_shares_fall_as_one_over_rank(self):
        sizes = interleaved_gemm.group_sizes(65536, 256, "zipf")
        self.assertEqual(sizes[:5], [10701, 5351, 3567, 2676, 2141])
        self.assertTrue(all(a >= b for a, b in zip(sizes, sizes[1:])))


class InterleaveTest(unittest.TestCase):
    def test_rounds_alternate_and_report_each_implementations_median(self):
        torch = FakeTorch({"a": 2.0, "b": 5.0})
        with mock.patch.object(interleaved_gemm.time, "time", side_effect=[0.0, 0.1, 1.0]):
            res = interleaved_gemm.interleave(torch, {"a": torch.fn("a"), "b": torch.fn("b")},
                                              rounds=4, iters=3, warm_s=0.5)
        self.assertEqual(res["a"], (2.0, 2.0, 2.0))
        self.assertEqual(res["b"], (5.0, 5.0, 5.0))
        # warm-up a b, then rounds a b | b a | a b | b a, each 1 untimed + 3 timed calls
        order = [c for i, c in enumerate(torch.calls[2:]) if i % 4 == 0]
        self.assertEqual(order, ["a", "b", "b", "a", "a", "b", "b", "a"])
        self.assertEqual(len(torch.calls), 2 + 4 * 2 * 4)


class GemmPeerFlagsTest(unittest.TestCase):
    def tearDown(self):
        gemm_peer.COOLDOWN_S, gemm_peer.OPS = 0.0, None

    def test_cooldown_sleeps_before_each_measurement(self):
        ap = argparse.ArgumentParser()
        gemm_peer.add_state_flags(ap)
        gemm_peer.apply_state_flags(ap.parse_args(["--cooldown-ms", "250", "--ops", "fwd"]))
        torch = FakeTorch({"f": 1.0})
        calls_before_sleep = []
        with mock.patch.object(gemm_peer.time, "sleep",
                               side_effect=lambda s: calls_before_sleep.append(len(torch.calls))) as sleep:
            ms = gemm_peer.median_ms(torch, torch.fn("f"), warmup=2, iters=5)
        sleep.assert_called_once_with(0.25)
        self.assertEqual(calls_before_sleep, [0])  # idle first, then the warm-up calls
        self.assertEqual(ms, 1.0)
        self.assertEqual(len(torch.calls), 7)

    def test_ops_filter_skips_other_products(self):
        gemm_peer.OPS = {"fwd"}
        case = gemm_peer.GroupedCase.__new__(gemm_peer.GroupedCase)
        case.torch, case.out, case.errors = FakeTorch({"f": 1.0}), [], None
        case.shape, case.weight, case.dist, case.flop, case.note = "s", "w13", "uniform", 2e9, "n"
        with mock.patch.object(gemm_peer, "median_ms", return_value=1.0) as timed:
            case.add("dgrad", "torch._grouped_mm", "bf16", lambda: None, 1e6)
            case.add("fwd", "torch._grouped_mm", "bf16", lambda: None, 1e6)
        self.assertEqual(timed.call_count, 1)
        self.assertEqual([r["name"] for r in case.out], ["fwd"])


class DeepGemmPeerTest(unittest.TestCase):
    """deepgemm_impl.py's bookkeeping (no DeepGEMM, no GPU): when it is skipped, and the padded
    contiguous layout it builds."""

    class FakeDeepGemm:
        def get_mk_alignment_for_contiguous_layout(self):
            return 128

    def test_skipped_with_the_reason_when_not_importable(self):
        with mock.patch.dict(sys.modules, {"deep_gemm": None}):
            dg, why = deepgemm_impl.load(FakeTorch({}))
        self.assertIsNone(dg)
        self.assertTrue(why.startswith("import deep_gemm failed: ModuleNotFoundError"), why)

    def test_skipped_when_the_grouped_api_is_missing(self):
        module = mock.Mock(spec=["__version__", "m_grouped_fp8_gemm_nt_contiguous"])
        module.__version__ = "0.0"
        with mock.patch.dict(sys.modules, {"deep_gemm": module}):
            dg, why = deepgemm_impl.load(FakeTorch({}))
        self.assertIsNone(dg)
        self.assertIn("k_grouped_fp8_gemm_nt_contiguous", why)

    def test_contiguous_layout_pads_every_group_to_the_alignment(self):
        sizes = interleaved_gemm.group_sizes(65536, 256, "zipf")
        peer = deepgemm_impl.Fp8BlockPeer(self.FakeDeepGemm(), None, sizes, 7168, 4096)
        self.assertEqual(peer.rows, 65536)
        self.assertTrue(all(p % 128 == 0 and 0 <= p - s < 128 for s, p in zip(sizes, peer.m_padded)))
        self.assertEqual(peer.mp, sum(peer.m_padded))
        self.assertEqual(peer.poffsets[-1], peer.mp)
        self.assertEqual(peer.offsets[-1], 65536)
        self.assertIn(f"{peer.mp} rows computed for 65536 real", peer.padding_note())
        uniform = deepgemm_impl.Fp8BlockPeer(self.FakeDeepGemm(), None, [256] * 256, 7168, 4096)
        self.assertEqual(uniform.mp, 65536)
        self.assertIn("(0.0% padding", uniform.padding_note())

    def test_checked_groups_are_first_middle_last(self):
        self.assertEqual(deepgemm_impl.check_groups(256), [0, 128, 255])
        self.assertEqual(deepgemm_impl.check_groups(1), [0])


class StepPeerEngineVariantsTest(unittest.TestCase):
    """'dropless@VAR=VALUE;...' creates the engine with those variables set, then restores them."""

    def test_split_env_parses_the_suffix(self):
        self.assertEqual(step_peer.split_env("dropless"), ("dropless", {}))
        self.assertEqual(step_peer.split_env("dropless-bf16@A=1;B=x=2"),
                         ("dropless-bf16", {"A": "1", "B": "x=2"}))
        for bad in ("dropless@FOO", "dropless@=1"):
            with self.assertRaisesRegex(ValueError, "IMPL@VAR=VALUE"):
                step_peer.split_env(bad)

    def test_engine_sees_the_variables_and_they_are_restored(self):
        seen = []

        class FakeStep:
            engine_ms = 1.5

            def __init__(self, lib, spec):
                seen.append((os.environ.get("DL_TEST_A"), os.environ.get("DL_TEST_B")))

            def run(self, steps):
                pass

            def stats(self):
                return {"peak_mem_bytes": 1, "loss": 0.5}

            def close(self):
                pass

        ctx = {"torch": None, "device": "cpu", "lib": object()}
        args = argparse.Namespace(precision="bf16", steps=2)
        os.environ["DL_TEST_B"] = "before"
        os.environ.pop("DL_TEST_A", None)
        try:
            with mock.patch.object(step_peer, "DroplessStep", FakeStep), \
                    mock.patch.object(step_peer, "dropless_spec", lambda *a: "spec"), \
                    mock.patch.object(step_peer, "free", lambda *a: None):
                meas = step_peer.run_one("dropless@DL_TEST_A=1;DL_TEST_B=2", "qwen3", ctx, args)
            self.assertEqual(seen, [("1", "2")])
            self.assertEqual(meas["ms"], 1.5)
            self.assertNotIn("DL_TEST_A", os.environ)
            self.assertEqual(os.environ["DL_TEST_B"], "before")
        finally:
            os.environ.pop("DL_TEST_B", None)


class StepPeerJaxMemoryTest(unittest.TestCase):
    """The preflight caps JAX at --jax-mem-fraction only with XLA's pool (bfc), whose memory is
    kept for the process's life; the platform allocator returns it, so JAX may use the device."""

    def preflight(self, allocator, nparam):
        props = argparse.Namespace(total_memory=80 * 2 ** 30)
        cuda = argparse.Namespace(get_device_properties=lambda index: props)
        ctx = {"device": "cuda", "torch": argparse.Namespace(cuda=cuda)}
        args = argparse.Namespace(jax_allocator=allocator, jax_mem_fraction=0.45)
        with mock.patch("builtins.print"):
            return step_peer.preflight(args, ctx, [step_peer.JAX, "torch._grouped_mm"], nparam)

    def test_fraction_caps_only_the_pool(self):
        nparam = 3 * 10 ** 9  # 48 GB of JAX state: over 0.45 of 80 GiB, under all of it
        skipped = self.preflight("bfc", nparam)
        self.assertEqual(list(skipped), [step_peer.JAX])
        self.assertIn("raise --jax-mem-fraction", skipped[step_peer.JAX])
        self.assertEqual(self.preflight("platform", nparam), {})

    def test_torch_is_skipped_past_the_device_whatever_the_allocator(self):
        skipped = self.preflight("platform", 6 * 10 ** 9)  # 96 GB JAX, 120 GB torch
        self.assertEqual(sorted(skipped), sorted([step_peer.JAX, "torch._grouped_mm"]))
        self.assertIn("larger --ep", skipped["torch._grouped_mm"])


if __name__ == "__main__":
    unittest.main()
