// Counter-based random numbers behind the synthetic task and parameter initialization: every value
// is a pure function of (stream, index), so the CPU engine, the CUDA engine's kernels and any
// layout of ranks draw the same numbers. Compiled by the host compiler and by nvcc (the CUDA
// engine generates tokens and initial weights on the device with these same functions).
#ifndef DROPLESS_WORKER_ENGINE_CPU_COUNTER_RNG_H_
#define DROPLESS_WORKER_ENGINE_CPU_COUNTER_RNG_H_

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DROPLESS_RNG_HD __host__ __device__
#else
#define DROPLESS_RNG_HD
#endif

namespace dropless::cpu {

DROPLESS_RNG_HD inline uint64_t SplitMix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Well-mixed 64-bit hash of a and b.
DROPLESS_RNG_HD inline uint64_t MixSeed(uint64_t a, uint64_t b) {
  return SplitMix64(SplitMix64(a) ^ (b * 0xd6e8feb86659fd93ULL));
}

// Standard normal sample number `index` of stream `stream` (Box-Muller on two 32-bit halves).
DROPLESS_RNG_HD inline double NormalAt(uint64_t stream, uint64_t index) {
  const uint64_t bits = SplitMix64(stream ^ SplitMix64(index));
  // u1 in (0, 1] keeps the log finite; u2 in [0, 1).
  const double u1 = (static_cast<double>(bits >> 32) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(bits & 0xffffffffULL) / 4294967296.0;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return sqrt(-2.0 * log(u1)) * cos(kTwoPi * u2);
}

}  // namespace dropless::cpu

#undef DROPLESS_RNG_HD

#endif  // DROPLESS_WORKER_ENGINE_CPU_COUNTER_RNG_H_
