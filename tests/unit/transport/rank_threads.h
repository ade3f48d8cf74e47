// Runs one function per rank, each on its own thread, and joins them: the shape of every
// multi-rank transport test.
#ifndef DROPLESS_TESTS_UNIT_TRANSPORT_RANK_THREADS_H_
#define DROPLESS_TESTS_UNIT_TRANSPORT_RANK_THREADS_H_

#include <functional>
#include <thread>
#include <vector>

namespace dropless::testing {

inline void RunRankThreads(int ranks, const std::function<void(int rank)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  for (int r = 0; r < ranks; ++r) threads.emplace_back(body, r);
  for (std::thread& t : threads) t.join();
}

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_UNIT_TRANSPORT_RANK_THREADS_H_
