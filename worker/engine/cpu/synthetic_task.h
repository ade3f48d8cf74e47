// The synthetic task the CPU engine trains on, and the counter-based random numbers behind it and
// behind parameter initialization. Every value is a pure function of (seed, what, where), so the
// job's global batch and parameters are the same whatever the ep/dp layout, thread count or rank.
//
// Task: regress the output of a fixed random teacher MoE stack (same architecture as the student,
// its own seed) on generated tokens. A token is x = z B / sqrt(r): z ~ N(0, I_r) drawn from
// (seed, step, global token index) and B a fixed r x H standard-normal basis: hidden values have
// unit variance on average and tokens span an r-dimensional subspace. The low rank is what makes
// the task learnable in a short job: on configs/jobs/tiny-cpu.yaml the loss falls ~7x in 40 steps
// with r = 8, but only halves (to the teacher's own variance, then plateaus) with full-rank tokens.
// With a zipf distribution the teacher's router adds log p_e, p_e ∝ (e + 1)^-exponent, to its
// logits so that its routing is skewed towards low expert ids.
#ifndef DROPLESS_WORKER_ENGINE_CPU_SYNTHETIC_TASK_H_
#define DROPLESS_WORKER_ENGINE_CPU_SYNTHETIC_TASK_H_

#include <cstdint>
#include <vector>

#include "common/job_spec.h"
#include "worker/engine/cpu/counter_rng.h"

namespace dropless::cpu {

// Seeds of the parts of a job, derived from data.seed.
struct TaskSeeds {
  uint64_t student = 0;
  uint64_t teacher = 0;
  uint64_t tokens = 0;
};
TaskSeeds DeriveTaskSeeds(uint64_t data_seed);

inline constexpr int64_t kTokenLatentRank = 8;

class TokenGenerator {
 public:
  TokenGenerator(uint64_t token_seed, int64_t hidden);

  // x[t, :] for the global tokens [first_token, first_token + tokens) of `step`.
  template <typename T>
  void Generate(int64_t step, int64_t first_token, int64_t tokens, T* x) const;

  // What a device generator needs to draw the same tokens: x[t] = latent(t) . basis, with
  // latent(t)[i] = NormalAt(MixSeed(MixSeed(seed, step), t), i) for i < latent_rank.
  uint64_t seed() const { return seed_; }
  int64_t latent_rank() const { return rank_; }
  const std::vector<double>& basis() const { return basis_; }  // latent_rank x hidden

 private:
  uint64_t seed_;
  int64_t hidden_;
  int64_t rank_;
  std::vector<double> basis_;  // rank x hidden, already divided by sqrt(rank)
};

// Teacher router logit offsets: log p_e for zipf, zeros for uniform.
std::vector<double> TeacherRouterBias(const DataSpec& data, int64_t experts);

}  // namespace dropless::cpu

#endif  // DROPLESS_WORKER_ENGINE_CPU_SYNTHETIC_TASK_H_
