// The CUDA engine's choice of the routed experts' update (FusesExpertUpdate): AdamW fused into the
// weight-gradient GEMM in bf16 with fp32 moments on H200-class devices where a local expert
// expects at most 1024 rows (forced, with either width, on any device), the two passes
// elsewhere and in every quantized precision; DROPLESS_FUSED_EXPERT_ADAMW forces either. Host-only
// (no CUDA call without overlap): runs without a GPU. Also the routed experts' bf16 gradient
// (DROPLESS_BF16_EXPERT_GRAD), mxfp8's choice of the bf16-core GEMMs and the backward's order of
// the expert GEMMs, and fp8-block's quantizers fused into the passes that produce their
// activations.
#include <cstdlib>

#include "gtest/gtest.h"
#include "worker/engine/cuda/cuda_engine.h"

namespace dropless {
namespace {

EngineConfig Layer(int64_t tokens, int64_t hidden, int64_t ffn, int64_t experts, int64_t topk,
                   int64_t ep, Precision precision) {
  EngineConfig c;
  c.model.hidden = hidden;
  c.model.ffn = ffn;
  c.model.experts = experts;
  c.model.topk = topk;
  c.model.layers = 1;
  c.parallel.ep = ep;
  c.tokens_per_rank = tokens;
  c.precision = precision;
  return c;
}

bool Fused(const EngineConfig& c) { return cuda_engine::FusesExpertUpdate(c); }

TEST(EngineSetup, FusedExpertUpdateWhereALocalExpertExpectsFewRows) {
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  // qwen3: 16384 x 8 rows over 128 experts, 1024 each; 1024 tokens more give 1088.
  EXPECT_TRUE(Fused(Layer(16384, 2048, 768, 128, 8, 1, Precision::kBf16)));
  EXPECT_FALSE(Fused(Layer(16384 + 1024, 2048, 768, 128, 8, 1, Precision::kBf16)));
  // dsv3 at EP 8: 8 ranks x 8192 x 8 rows over 256 experts, 2048 each; mixtral 8192 x 2 over 8.
  EXPECT_FALSE(Fused(Layer(8192, 7168, 2048, 256, 8, 8, Precision::kBf16)));
  EXPECT_FALSE(Fused(Layer(8192, 4096, 14336, 8, 2, 1, Precision::kBf16)));
  // The same dsv3 layer at EP 4 expects 1024 rows per local expert.
  EXPECT_TRUE(Fused(Layer(8192, 7168, 2048, 256, 8, 4, Precision::kBf16)));
  // Not with bf16 moments, where the two passes are faster (forced, it runs: below).
  EngineConfig bf16_moments = Layer(16384, 2048, 768, 128, 8, 1, Precision::kBf16);
  bf16_moments.optimizer.moment_dtype = MomentDtype::kBf16;
  EXPECT_FALSE(Fused(bf16_moments));
  // Quantized precisions have no fused update.
  EXPECT_FALSE(Fused(Layer(16384, 2048, 768, 128, 8, 1, Precision::kMxfp8)));
  EXPECT_FALSE(Fused(Layer(16384, 2048, 768, 128, 8, 1, Precision::kFp8Block)));
}

// On H100-class devices (less memory bandwidth) the two passes everywhere, unless forced.
TEST(EngineSetup, TwoPassesOnDevicesOfLessMemoryBandwidth) {
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  const EngineConfig qwen3 = Layer(16384, 2048, 768, 128, 8, 1, Precision::kBf16);
  EXPECT_TRUE(cuda_engine::FusesExpertUpdate(qwen3, /*high_memory_bandwidth=*/true));
  EXPECT_FALSE(cuda_engine::FusesExpertUpdate(qwen3, /*high_memory_bandwidth=*/false));
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", "1", 1);
  EXPECT_TRUE(cuda_engine::FusesExpertUpdate(qwen3, /*high_memory_bandwidth=*/false));
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  // The bf16 expert gradient (opt-in) is stored wherever the two passes run: on such a device
  // for qwen3, not on an H200-class one, where the update is fused and keeps no gradient.
  setenv("DROPLESS_BF16_EXPERT_GRAD", "1", 1);
  EXPECT_TRUE(cuda_engine::StoresBf16ExpertGradient(qwen3, /*high_memory_bandwidth=*/false));
  EXPECT_FALSE(cuda_engine::StoresBf16ExpertGradient(qwen3, /*high_memory_bandwidth=*/true));
  unsetenv("DROPLESS_BF16_EXPERT_GRAD");
}

TEST(EngineSetup, FusedExpertUpdateForcedByTheEnvironment) {
  const EngineConfig qwen3 = Layer(16384, 2048, 768, 128, 8, 1, Precision::kBf16);
  const EngineConfig mixtral = Layer(8192, 4096, 14336, 8, 2, 1, Precision::kBf16);
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", "0", 1);
  EXPECT_FALSE(Fused(qwen3));
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", "1", 1);
  EXPECT_TRUE(Fused(mixtral));
  EngineConfig bf16_moments = qwen3;
  bf16_moments.optimizer.moment_dtype = MomentDtype::kBf16;
  EXPECT_TRUE(Fused(bf16_moments));
  EXPECT_FALSE(Fused(Layer(8192, 4096, 14336, 8, 2, 1, Precision::kFp8Block)));
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
}

// The routed experts' gradient is stored in bf16 only when DROPLESS_BF16_EXPERT_GRAD=1 asks for it
// and the bf16 two passes store one: never with the fused update (no gradient) or a quantized
// precision (fp32 weight gradients).
TEST(EngineSetup, Bf16ExpertGradientOnlyWhenAskedAndTheBf16TwoPassesStoreOne) {
  auto bf16_grad = [](const EngineConfig& c) { return cuda_engine::StoresBf16ExpertGradient(c); };
  const EngineConfig qwen3 = Layer(16384, 2048, 768, 128, 8, 1, Precision::kBf16);   // fused
  const EngineConfig mixtral = Layer(8192, 4096, 14336, 8, 2, 1, Precision::kBf16);  // two passes
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  unsetenv("DROPLESS_BF16_EXPERT_GRAD");
  EXPECT_FALSE(bf16_grad(mixtral));
  setenv("DROPLESS_BF16_EXPERT_GRAD", "0", 1);
  EXPECT_FALSE(bf16_grad(mixtral));
  setenv("DROPLESS_BF16_EXPERT_GRAD", "1", 1);
  EXPECT_TRUE(bf16_grad(mixtral));
  EXPECT_FALSE(bf16_grad(qwen3));
  EngineConfig bf16_moments = qwen3;  // the two passes by default
  bf16_moments.optimizer.moment_dtype = MomentDtype::kBf16;
  EXPECT_TRUE(bf16_grad(bf16_moments));
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", "0", 1);
  EXPECT_TRUE(bf16_grad(qwen3));
  setenv("DROPLESS_FUSED_EXPERT_ADAMW", "1", 1);
  EXPECT_FALSE(bf16_grad(mixtral));
  unsetenv("DROPLESS_FUSED_EXPERT_ADAMW");
  for (Precision p : {Precision::kMxfp8, Precision::kFp8Block, Precision::kFp8BlockWgrad128}) {
    EXPECT_FALSE(bf16_grad(Layer(8192, 4096, 14336, 8, 2, 1, p)));
  }
  unsetenv("DROPLESS_BF16_EXPERT_GRAD");
}

// mxfp8's expert GEMMs run on the bf16 tensor cores over weight images where every reduction
// length (hidden, ffn, 2 ffn) is a multiple of 64; DROPLESS_MX_CORE=0 keeps the promotion kernels.
TEST(EngineSetup, MxCoreWhereEveryReductionIsAMultipleOf64) {
  auto core = [](const EngineConfig& c) { return cuda_engine::UsesMxCore(c); };
  unsetenv("DROPLESS_MX_CORE");
  EXPECT_TRUE(core(Layer(16384, 2048, 768, 128, 8, 1, Precision::kMxfp8)));
  EXPECT_TRUE(core(Layer(8192, 7168, 2048, 256, 8, 8, Precision::kMxfp8)));
  EXPECT_FALSE(core(Layer(16384, 2048, 736, 128, 8, 1, Precision::kMxfp8)));  // ffn % 64 = 32
  EXPECT_FALSE(core(Layer(16384, 2080, 768, 128, 8, 1, Precision::kMxfp8)));  // hidden % 64 = 32
  EXPECT_FALSE(core(Layer(16384, 2048, 768, 128, 8, 1, Precision::kBf16)));
  EXPECT_FALSE(core(Layer(16384, 2048, 768, 128, 8, 1, Precision::kFp8Block)));
  setenv("DROPLESS_MX_CORE", "0", 1);
  EXPECT_FALSE(core(Layer(16384, 2048, 768, 128, 8, 1, Precision::kMxfp8)));
  unsetenv("DROPLESS_MX_CORE");
}

// The backward's expert GEMMs run one at a time without overlap (LayerDims::
// serial_expert_backward); DROPLESS_SERIAL_EXPERT_BACKWARD=0 puts them side by side.
TEST(EngineSetup, BackwardExpertGemmsRunOneAtATime) {
  unsetenv("DROPLESS_SERIAL_EXPERT_BACKWARD");
  for (Precision p : {Precision::kBf16, Precision::kMxfp8, Precision::kFp8Block}) {
    EXPECT_TRUE(
        cuda_engine::RunsExpertBackwardOneGemmAtATime(Layer(8192, 4096, 14336, 8, 2, 1, p)));
  }
  // With overlap, in its chunks, side by side; with one local expert there is one chunk.
  EngineConfig overlap = Layer(8192, 4096, 14336, 8, 2, 1, Precision::kBf16);
  overlap.overlap = true;
  EXPECT_FALSE(cuda_engine::RunsExpertBackwardOneGemmAtATime(overlap));
  EngineConfig one_expert = Layer(8192, 4096, 14336, 8, 2, 8, Precision::kBf16);
  one_expert.overlap = true;
  EXPECT_TRUE(cuda_engine::RunsExpertBackwardOneGemmAtATime(one_expert));
  setenv("DROPLESS_SERIAL_EXPERT_BACKWARD", "0", 1);
  EXPECT_FALSE(cuda_engine::RunsExpertBackwardOneGemmAtATime(
      Layer(8192, 4096, 14336, 8, 2, 1, Precision::kBf16)));
  unsetenv("DROPLESS_SERIAL_EXPERT_BACKWARD");
}

TEST(EngineSetup, Fp8BlockActivationsQuantizedByTheirProducersUnlessTheEnvironmentSaysNo) {
  unsetenv("DROPLESS_FP8_BLOCK_FUSED_QUANTIZERS");
  for (Precision p : {Precision::kBf16, Precision::kMxfp8}) {
    EXPECT_FALSE(cuda_engine::FusesFp8BlockQuantizers(Layer(8192, 4096, 14336, 8, 2, 1, p)));
  }
  for (Precision p : {Precision::kFp8Block, Precision::kFp8BlockWgrad128}) {
    EXPECT_TRUE(cuda_engine::FusesFp8BlockQuantizers(Layer(8192, 4096, 14336, 8, 2, 1, p)));
    setenv("DROPLESS_FP8_BLOCK_FUSED_QUANTIZERS", "0", 1);
    EXPECT_FALSE(cuda_engine::FusesFp8BlockQuantizers(Layer(8192, 4096, 14336, 8, 2, 1, p)));
    unsetenv("DROPLESS_FP8_BLOCK_FUSED_QUANTIZERS");
  }
}

}  // namespace
}  // namespace dropless
