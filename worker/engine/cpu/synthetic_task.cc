#include "worker/engine/cpu/synthetic_task.h"

#include <algorithm>
#include <cmath>


namespace dropless::cpu {
namespace {

// Stream tags: any distinct constants.
constexpr uint64_t kStudentTag = 0x73747564656e7431ULL;
constexpr uint64_t kTeacherTag = 0x7465616368657231ULL;
constexpr uint64_t kTokensTag = 0x746f6b656e733031ULL;
constexpr uint64_t kBasisTag = 0x6261736973303031ULL;

}  // namespace

TaskSeeds DeriveTaskSeeds(uint64_t data_seed) {
  return TaskSeeds{MixSeed(data_seed, kStudentTag), MixSeed(data_seed, kTeacherTag),
                   MixSeed(data_seed, kTokensTag)};
}

TokenGenerator::TokenGenerator(uint64_t token_seed, int64_t hidden)
    : seed_(token_seed), hidden_(hidden), rank_(std::min(kTokenLatentRank, hidden)) {
  const uint64_t basis_stream = MixSeed(token_seed, kBasisTag);
  const double scale = 1.0 / std::sqrt(static_cast<double>(rank_));
  basis_.resize(rank_ * hidden_);
  for (int64_t i = 0; i < rank_ * hidden_; ++i) {
    basis_[i] = scale * NormalAt(basis_stream, static_cast<uint64_t>(i));
  }
}

template <typename T>
void TokenGenerator::Generate(int64_t step, int64_t first_token, int64_t tokens, T* x) const {
  const uint64_t step_stream = MixSeed(seed_, static_cast<uint64_t>(step));
  std::vector<double> latent(tokens * rank_);
  for (int64_t t = 0; t < tokens; ++t) {
    const uint64_t token_stream = MixSeed(step_stream, static_cast<uint64_t>(first_token + t));
    for (int64_t i = 0; i < rank_; ++i) {
      latent[t * rank_ + i] = NormalAt(token_stream, static_cast<uint64_t>(i));
    }
  }
  // x = latent basis as a plain loop (rank <= 8): the model library links no BLAS.
  std::vector<double> row(hidden_);
  for (int64_t t = 0; t < tokens; ++t) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t i = 0; i < rank_; ++i) {
      const double z = latent[t * rank_ + i];
      const double* b = basis_.data() + i * hidden_;
      for (int64_t j = 0; j < hidden_; ++j) row[j] += z * b[j];
    }
    for (int64_t j = 0; j < hidden_; ++j) x[t * hidden_ + j] = static_cast<T>(row[j]);
  }
}

std::vector<double> TeacherRouterBias(const DataSpec& data, int64_t experts) {
  std::vector<double> bias(experts, 0.0);
  if (data.distribution != RoutingDistribution::kZipf) return bias;
  double total = 0;
  for (int64_t e = 0; e < experts; ++e) total += std::pow(static_cast<double>(e + 1), -data.zipf_exponent);
  for (int64_t e = 0; e < experts; ++e) {
    bias[e] = -data.zipf_exponent * std::log(static_cast<double>(e + 1)) - std::log(total);
  }
  return bias;
}

template void TokenGenerator::Generate<float>(int64_t, int64_t, int64_t, float*) const;
template void TokenGenerator::Generate<double>(int64_t, int64_t, int64_t, double*) const;

}  // namespace dropless::cpu
