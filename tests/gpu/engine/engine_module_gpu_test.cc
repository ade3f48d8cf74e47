// The CUDA engine as the rank process gets it: libdropless_engine_cuda.so loaded by the engine
// registry (dlopen), not linked in. The module has its own copy of the step-phase hook; the
// phases its engine enters must still reach the listener of the executable that loaded it (the
// rank's PhaseReporter, which the hang watchdog reads), also when that listener is set after the
// engine was built, as the rank process does.
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/engine_config.h"
#include "common/step_phase.h"
#include "gtest/gtest.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "worker/engine/engine_registry.h"

namespace dropless {
namespace {

std::vector<StepPhase>* g_seen = nullptr;
void Record(StepPhase phase) { g_seen->push_back(phase); }

class EngineModuleGpu : public kernels::testing::GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    // In the build tree the module is in bin/, not next to this test (the device bundle puts
    // both in one folder, where the registry finds it by itself).
    const std::string beside = CudaEngineLibraryPath();
    if (std::getenv("DROPLESS_CUDA_ENGINE_LIBRARY") == nullptr && !std::ifstream(beside).good()) {
      setenv("DROPLESS_CUDA_ENGINE_LIBRARY", DROPLESS_TEST_CUDA_ENGINE_MODULE, 1);
    }
  }
};

EngineConfig SmallConfig() {
  EngineConfig c;
  c.model.hidden = 128;
  c.model.ffn = 64;
  c.model.experts = 16;
  c.model.topk = 2;
  c.model.layers = 1;
  c.parallel.ep = 1;
  c.tokens_per_rank = 64;
  c.steps = 10;
  c.optimizer.lr = 1e-3;
  c.data.seed = 5;
  return c;
}

TEST_F(EngineModuleGpu, PhasesOfTheLoadedEngineReachTheExecutablesListener) {
  std::vector<StepPhase> seen;
  g_seen = &seen;
  EngineContext context;
  context.config = SmallConfig();
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine(Backend::kCuda, context);
  ASSERT_TRUE(engine.ok()) << engine.status();
  SetStepPhaseListener(&Record);  // after the engine is built, as the rank process does
  for (int step = 0; step < 2; ++step) {
    absl::StatusOr<StepStats> stats = (*engine)->Step();
    ASSERT_TRUE(stats.ok()) << stats.status();
  }
  SetStepPhaseListener(nullptr);
  g_seen = nullptr;
  ASSERT_FALSE(seen.empty()) << "no phase of the module's engine reached this executable";
  bool optimizer = false;
  for (StepPhase phase : seen) optimizer |= phase == StepPhase::kOptimizer;
  EXPECT_TRUE(optimizer) << "the step's last phase (optimizer) was never reported";
}

}  // namespace
}  // namespace dropless
