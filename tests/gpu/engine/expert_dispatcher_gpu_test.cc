// The ExpertDispatchers against a host reference: fresh random per-(rank, expert) counts with
// skew, a rank that receives no rows and a rank that sends none; every received row, the plan's
// offsets and counts, the combine back into poisoned buffers, the same exchanges in runs of the
// local experts (overlap's chunks), and the all-reduce sums. `local` at
// EP 1/2/4/8 (every rank in this process); `nccl-lsa` and `nccl-a2a` at world size 1 (one GPU
// here). And the
// NCCL group setup: a group whose second rank never joins fails within its timeout, naming it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/job_error.h"
#include "gtest/gtest.h"
#include "nccl.h"
#include "tests/gpu/engine/local_ep_test_support.h"
#include "tests/gpu/kernels/gpu_test_util.h"
#include "worker/engine/cuda/device_memory.h"
#include "worker/engine/cuda/ep/expert_dispatcher.h"
#include "worker/engine/cuda/ep/nccl_group.h"
#include "worker/transport/transport_factory.h"

namespace dropless::cuda_engine {
namespace {

using kernels::testing::BitEqual;
using kernels::testing::DeviceArray;
using kernels::testing::GpuTest;

struct Backend {
  const char* name;
  int ep;
  int64_t row_bytes = 48;  // 24 bf16 values; 12: an MXFP8 scale row (4-byte copies)
};

class DispatcherGpu : public GpuTest, public ::testing::WithParamInterface<Backend> {};

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> MakeDispatcher(const Backend& b,
                                                                 const EpShape& shape,
                                                                 StreamLinks* links,
                                                                 DeviceArena* arena,
                                                                 KeyValueStore* store) {
  if (std::string(b.name) == "local") return NewLocalDispatcher(shape, links, arena);
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(store, "dispatcher-test", 0, 1, absl::Seconds(60));
  if (!group.ok()) return group.status();
  if (std::string(b.name) == "nccl-a2a") {
    return NewNcclA2aDispatcher(shape, static_cast<size_t>(b.row_bytes), *std::move(group), arena);
  }
  return NewNcclLsaDispatcher(shape, *std::move(group), arena);
}

// counts[s][e]: rows rank s sends to global expert e.
std::vector<std::vector<int32_t>> RandomCounts(int ep, int experts, int64_t rows,
                                               std::mt19937* rng) {
  const int local = experts / ep;
  std::vector<std::vector<int32_t>> counts(ep, std::vector<int32_t>(experts, 0));
  std::uniform_real_distribution<double> u(0, 1);
  for (int s = 0; s < ep; ++s) {
    if (ep > 2 && s == 1) continue;  // a rank that sends nothing
    // Zipf-like skew over experts; the experts of rank ep - 1 get nothing (it receives no rows).
    std::vector<double> weight(experts);
    for (int e = 0; e < experts; ++e) {
      weight[e] =
          (ep > 1 && e / local == ep - 1) ? 0.0 : 1.0 / std::pow(1 + ((e * 7 + s) % experts), 1.1);
    }
    std::discrete_distribution<int> pick(weight.begin(), weight.end());
    const int64_t n = static_cast<int64_t>(rows * (0.5 + 0.5 * u(*rng)));
    for (int64_t i = 0; i < n; ++i) ++counts[s][pick(*rng)];
  }
  return counts;
}

TEST_P(DispatcherGpu, DispatchCombineAndSumsMatchTheHostReference) {
  if (std::string(GetParam().name) == "nccl-lsa") {
    const std::string unavailable = local_ep_testing::NcclLsaUnavailableReason();
    if (!unavailable.empty()) GTEST_SKIP() << unavailable;
  }
  const int ep = GetParam().ep;
  const int experts = 64, local = experts / ep;
  const int64_t rows = 300;  // T * k per rank
  const int64_t row_bytes = GetParam().row_bytes;
  std::mt19937 rng(std::random_device{}());
  const std::vector<std::vector<int32_t>> counts = RandomCounts(ep, experts, rows, &rng);
  const EpShape shape{ep, experts, rows};

  DeviceArena arena;
  StreamLinks links;
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  absl::StatusOr<std::unique_ptr<ExpertDispatcher>> dispatcher =
      MakeDispatcher(GetParam(), shape, &links, &arena, store.get());
  ASSERT_TRUE(dispatcher.ok()) << dispatcher.status();
  EXPECT_EQ((*dispatcher)->name(), GetParam().name);
  EXPECT_EQ((*dispatcher)->local_ranks(), ep);

  std::vector<cudaStream_t> streams(ep);
  for (cudaStream_t& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<std::unique_ptr<DeviceArray<int32_t>>> offsets;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> send;
  std::vector<uint8_t*> recv;
  std::vector<std::vector<uint8_t>> send_host(ep);
  std::vector<ExchangePlan> plans(ep);
  std::vector<RankCall> calls(ep);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int s = 0; s < ep; ++s) {
    std::vector<int32_t> off(experts + 1, 0);
    for (int e = 0; e < experts; ++e) off[e + 1] = off[e] + counts[s][e];
    offsets.push_back(std::make_unique<DeviceArray<int32_t>>(off));
    send_host[s].resize(rows * row_bytes);
    for (uint8_t& b : send_host[s]) b = static_cast<uint8_t>(byte(rng));
    send.push_back(std::make_unique<DeviceArray<uint8_t>>(send_host[s]));
    uint8_t* r = nullptr;  // peers write it: the dispatcher's shared memory
    ASSERT_TRUE((*dispatcher)->AllocateShared(shape.max_recv_rows() * row_bytes, "recv", &r).ok());
    ASSERT_EQ(cudaMemset(r, 0xA5, shape.max_recv_rows() * row_bytes), cudaSuccess);
    recv.push_back(r);
    ASSERT_TRUE(AllocateExchangePlan(dispatcher->get(), &arena, &plans[s]).ok());
    plans[s].send_offsets = offsets[s]->get();
    calls[s] = RankCall{&plans[s], send[s]->get(), recv[s], streams[s]};
  }
  ASSERT_TRUE((*dispatcher)->Plan(calls).ok());
  ASSERT_TRUE((*dispatcher)->Dispatch(calls, row_bytes).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  // Host reference: receiver p's rows grouped by local expert, each group by source rank.
  for (int p = 0; p < ep; ++p) {
    std::vector<int32_t> want_offsets(local + 1, 0);
    std::vector<uint8_t> want;
    for (int l = 0; l < local; ++l) {
      const int e = p * local + l;
      for (int s = 0; s < ep; ++s) {
        int32_t first = 0;
        for (int x = 0; x < e; ++x) first += counts[s][x];
        want.insert(want.end(), send_host[s].begin() + first * row_bytes,
                    send_host[s].begin() + (first + counts[s][e]) * row_bytes);
      }
      want_offsets[l + 1] = static_cast<int32_t>(want.size() / row_bytes);
    }
    std::vector<int32_t> got_offsets(local + 1);
    ASSERT_EQ(cudaMemcpy(got_offsets.data(), plans[p].recv_offsets, (local + 1) * sizeof(int32_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(got_offsets, want_offsets) << "receive offsets of rank " << p;
    std::vector<uint8_t> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), recv[p], got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(BitEqual(got, want)) << "rows received by rank " << p;
    if (p == ep - 1 && ep > 1)
      EXPECT_EQ(want_offsets[local], 0) << "rank " << p << " receives nothing";
    std::vector<int32_t> job(experts);
    ASSERT_EQ(cudaMemcpy(job.data(), plans[p].job_counts, experts * sizeof(int32_t),
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int e = 0; e < experts; ++e) {
      int32_t sum = 0;
      for (int s = 0; s < ep; ++s) sum += counts[s][e];
      ASSERT_EQ(job[e], sum) << "job count of expert " << e << " at rank " << p;
    }
  }

  // Combine back into poisoned send buffers: every sent row returns to its place.
  for (int s = 0; s < ep; ++s) send[s]->Poison(0x5A);
  ASSERT_TRUE((*dispatcher)->Combine(calls, row_bytes).ok());
  for (int s = 0; s < ep; ++s) {
    const int64_t sent = std::accumulate(counts[s].begin(), counts[s].end(), int64_t{0});
    std::vector<uint8_t> got = send[s]->Download();
    got.resize(sent * row_bytes);
    std::vector<uint8_t> want(send_host[s].begin(), send_host[s].begin() + sent * row_bytes);
    EXPECT_TRUE(BitEqual(got, want)) << "rows combined back to rank " << s;
  }

  // The same exchanges in runs of the local experts (overlap's chunks, uneven): the same rows
  // land in the receive buffers and combine brings each back. nccl-a2a refuses runs.
  if (local >= 2) {
    std::vector<LocalExperts> runs;
    for (int first = 0, c = 0; first < local; ++c) {
      const int count = std::min(local - first, 1 + c % 3);
      runs.push_back(LocalExperts{first, count});
      first += count;
    }
    if (std::string(GetParam().name) == "nccl-a2a") {
      EXPECT_FALSE((*dispatcher)->exchanges_expert_runs());
      EXPECT_EQ((*dispatcher)->Dispatch(calls, row_bytes, runs[0]).code(),
                absl::StatusCode::kInvalidArgument);
    } else {
      EXPECT_TRUE((*dispatcher)->exchanges_expert_runs());
      const size_t recv_bytes = shape.max_recv_rows() * row_bytes;
      std::vector<std::vector<uint8_t>> whole(ep, std::vector<uint8_t>(recv_bytes));
      for (int p = 0; p < ep; ++p) {
        ASSERT_EQ(cudaMemcpy(whole[p].data(), recv[p], recv_bytes, cudaMemcpyDeviceToHost),
                  cudaSuccess);
        ASSERT_EQ(cudaMemset(recv[p], 0xA5, recv_bytes), cudaSuccess);
      }
      for (const LocalExperts& run : runs)
        ASSERT_TRUE((*dispatcher)->Dispatch(calls, row_bytes, run).ok());
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      for (int p = 0; p < ep; ++p) {
        std::vector<uint8_t> got(recv_bytes);
        ASSERT_EQ(cudaMemcpy(got.data(), recv[p], recv_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        EXPECT_TRUE(BitEqual(got, whole[p]))
            << "rows received by rank " << p << " in " << runs.size() << " runs";
      }
      for (int s = 0; s < ep; ++s) send[s]->Poison(0x5A);
      for (const LocalExperts& run : runs)
        ASSERT_TRUE((*dispatcher)->Combine(calls, row_bytes, run).ok());
      for (int s = 0; s < ep; ++s) {
        const int64_t sent = std::accumulate(counts[s].begin(), counts[s].end(), int64_t{0});
        std::vector<uint8_t> got = send[s]->Download();
        got.resize(sent * row_bytes);
        std::vector<uint8_t> want(send_host[s].begin(), send_host[s].begin() + sent * row_bytes);
        EXPECT_TRUE(BitEqual(got, want)) << "rows combined back to rank " << s << " in runs";
      }
    }
    EXPECT_EQ((*dispatcher)->Dispatch(calls, row_bytes, LocalExperts{local - 1, 2}).code(),
              absl::StatusCode::kInvalidArgument)
        << "a run past the local experts";
  }

  // All-reduce sums, float and double, in rank order.
  const size_t n = 1000;
  std::vector<std::unique_ptr<DeviceArray<float>>> f;
  std::vector<std::unique_ptr<DeviceArray<double>>> d;
  std::vector<std::vector<float>> fh(ep);
  std::vector<std::vector<double>> dh(ep);
  std::normal_distribution<double> normal;
  std::vector<float*> fp;
  std::vector<double*> dp;
  for (int r = 0; r < ep; ++r) {
    fh[r].resize(n);
    dh[r].resize(n);
    for (size_t i = 0; i < n; ++i) {
      fh[r][i] = static_cast<float>(normal(rng));
      dh[r][i] = normal(rng);
    }
    f.push_back(std::make_unique<DeviceArray<float>>(fh[r]));
    d.push_back(std::make_unique<DeviceArray<double>>(dh[r]));
    fp.push_back(f.back()->get());
    dp.push_back(d.back()->get());
  }
  ASSERT_TRUE((*dispatcher)->AllReduceSum(absl::MakeConstSpan(fp), n, streams).ok());
  ASSERT_TRUE((*dispatcher)->AllReduceSum(absl::MakeConstSpan(dp), n, streams).ok());
  for (int r = 0; r < ep; ++r) {
    const std::vector<float> gf = f[r]->Download();
    const std::vector<double> gd = d[r]->Download();
    for (size_t i = 0; i < n; ++i) {
      float sf = fh[0][i];
      double sd = dh[0][i];
      for (int x = 1; x < ep; ++x) {
        sf += fh[x][i];
        sd += dh[x][i];
      }
      ASSERT_EQ(gf[i], sf) << "float sum " << i << " at rank " << r;
      ASSERT_EQ(gd[i], sd) << "double sum " << i << " at rank " << r;
    }
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

INSTANTIATE_TEST_SUITE_P(Backends, DispatcherGpu,
                         ::testing::Values(Backend{"local", 1}, Backend{"local", 2},
                                           Backend{"local", 4}, Backend{"local", 8},
                                           Backend{"local", 4, 12}, Backend{"nccl-lsa", 1},
                                           Backend{"nccl-lsa", 1, 12}, Backend{"nccl-a2a", 1},
                                           Backend{"nccl-a2a", 1, 12}),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           std::string name = info.param.name;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name + "_ep" + std::to_string(info.param.ep) + "_row" +
                                  std::to_string(info.param.row_bytes);
                         });

class NcclGroupGpu : public GpuTest {};

TEST_F(NcclGroupGpu, ARankThatNeverJoinsFailsTheGroupWithinItsTimeoutNamingIt) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(store.get(), "ep/0", 0, 2, absl::Seconds(3));
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_NE(group.status().message().find("ranks that did not join: 1"), std::string::npos)
      << group.status();
  EXPECT_LT(took, absl::Seconds(10)) << "the abort must not hang";
  std::printf("group of 2 without rank 1: failed after %s: %s\n",
              absl::FormatDuration(took).c_str(), std::string(group.status().message()).c_str());
  // A non-zero rank waiting for rank 0's id fails the same way.
  absl::StatusOr<std::unique_ptr<NcclGroup>> late =
      JoinNcclGroup(store.get(), "ep/1", 1, 2, absl::Seconds(1));
  ASSERT_FALSE(late.ok());
  EXPECT_NE(late.status().message().find("ranks that did not join: 0"), std::string::npos)
      << late.status();
}

TEST_F(NcclGroupGpu, AOneRankGroupJoinsAndReduces) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(store.get(), "ep/0", 0, 1, absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->size(), 1);
}

// A store whose Wait answers `wait` and whose Get answers `get`, counting the Gets.
class AnsweringStore : public KeyValueStore {
 public:
  AnsweringStore(absl::Status wait, absl::Status get) : wait_(wait), get_(get) {}
  absl::Status Put(const std::string&, const std::string&) override { return absl::OkStatus(); }
  absl::StatusOr<std::string> Get(const std::string&) override {
    ++gets;
    return get_;
  }
  absl::Status Wait(const std::vector<std::string>&, absl::Duration) override { return wait_; }
  int gets = 0;

 private:
  absl::Status wait_, get_;
};

// A non-zero rank makes no NCCL or CUDA call before its wait for rank 0's id: these run without
// a GPU. A store that refuses the wait (the attempt ended, a wrong secret) is the error, at once
// and without asking it about every rank.
TEST(NcclGroupJoin, AStoreThatRefusesTheWaitIsTheError) {
  for (const absl::Status& refusal :
       {absl::FailedPreconditionError("attempt 1 of job-000007 has ended"),
        absl::PermissionDeniedError("wrong rendezvous secret"),
        absl::UnavailableError("coordinator at 10.0.0.1:7070 unreachable")}) {
    AnsweringStore store(refusal, absl::NotFoundError("no such key"));
    absl::StatusOr<std::unique_ptr<NcclGroup>> group =
        JoinNcclGroup(&store, "ep/0", 1, 8, absl::Seconds(120));
    ASSERT_FALSE(group.ok());
    EXPECT_EQ(group.status().code(), refusal.code()) << group.status();
    EXPECT_NE(group.status().message().find(refusal.message()), std::string::npos)
        << group.status();
    EXPECT_EQ(store.gets, 0) << group.status();
  }
}

// After a timed-out wait the group names the ranks that did not join, asking the store once per
// rank while it answers and stopping at the first answer that is not NotFound (an unreachable
// coordinator costs its client's retry budget once, not once a rank).
TEST(NcclGroupJoin, AnUnreachableStoreIsAskedOnceForTheMissingRanks) {
  AnsweringStore store(absl::DeadlineExceededError("timed out; coordinator unreachable"),
                       absl::UnavailableError("coordinator unreachable for 2m"));
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(&store, "ep/0", 3, 8, absl::Seconds(1));
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kDeadlineExceeded) << group.status();
  EXPECT_EQ(store.gets, 1);
  EXPECT_NE(group.status().message().find("unknown from rank 0 on"), std::string::npos)
      << group.status();
}

// Every rank of `auto` builds the same dispatcher: the agreement is an all-reduce (min).
TEST_F(NcclGroupGpu, AOneRankGroupAgreesWithItself) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(store.get(), "ep/0", 0, 1, absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  for (bool mine : {true, false, true}) {
    absl::StatusOr<bool> all = AllRanksAgree(**group, mine);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(*all, mine);
  }
}

// `dispatcher: auto`'s probe on a one-rank group (the one rank reaches itself): nccl-lsa is
// reachable exactly when the loaded NCCL runtime is at least the headers' version; otherwise the
// reason names the versions, and the same group still runs nccl-a2a.
TEST_F(NcclGroupGpu, AutoProbeAnswersByTheRuntimeVersion) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(store.get(), "ep/0", 0, 1, absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  int runtime = 0;
  ASSERT_EQ(ncclGetVersion(&runtime), ncclSuccess);
  const absl::Status probe = NcclLsaReachable(**group);
  std::printf("NCCL runtime %d, headers %d: probe %s\n", runtime, NCCL_VERSION_CODE,
              probe.ToString().c_str());
  if (runtime >= NCCL_VERSION_CODE) {
    EXPECT_TRUE(probe.ok()) << probe;
  } else {
    EXPECT_EQ(probe.code(), absl::StatusCode::kFailedPrecondition) << probe;
    EXPECT_NE(probe.message().find("NCCL"), std::string::npos) << probe;
  }
  DeviceArena arena;
  absl::StatusOr<std::unique_ptr<ExpertDispatcher>> a2a =
      NewNcclA2aDispatcher(EpShape{1, 8, 64}, 256, *std::move(group), &arena);
  EXPECT_TRUE(a2a.ok()) << a2a.status();
}

// The NCCL dispatchers' device memory is the engine's: nccl-a2a's staging comes from the arena and
// nccl-lsa's symmetric windows are counted in it (until the dispatcher is destroyed), so the
// engine's device bytes and its beyond-the-device verdict include them.
TEST_F(NcclGroupGpu, TheDispatchersDeviceMemoryIsCountedInTheArena) {
  std::unique_ptr<KeyValueStore> store = NewMemoryKvStore();
  {
    absl::StatusOr<std::unique_ptr<NcclGroup>> group =
        JoinNcclGroup(store.get(), "ep/a2a", 0, 1, absl::Seconds(60));
    ASSERT_TRUE(group.ok()) << group.status();
    DeviceArena arena;
    absl::StatusOr<std::unique_ptr<ExpertDispatcher>> a2a =
        NewNcclA2aDispatcher(EpShape{1, 8, 64}, 256, *std::move(group), &arena);
    ASSERT_TRUE(a2a.ok()) << a2a.status();
    // Both staging slots (ep x rows x max_row_bytes each) and the per-expert counts.
    EXPECT_EQ(arena.device_bytes(), 2 * 64 * 256 + 8 * 4);
    void* shared = nullptr;
    ASSERT_TRUE((*a2a)->AllocateShared(1000, "test shared", &shared).ok());
    EXPECT_EQ(arena.device_bytes(), 2 * 64 * 256 + 8 * 4 + 1000);
  }
  {
    // Staging beyond the whole device is the job's property (its tokens and hidden size) on a GPU
    // of this size, not a node problem: only a larger GPU runs it.
    absl::StatusOr<std::unique_ptr<NcclGroup>> group =
        JoinNcclGroup(store.get(), "ep/a2a-huge", 0, 1, absl::Seconds(60));
    ASSERT_TRUE(group.ok()) << group.status();
    DeviceArena arena;
    absl::StatusOr<std::unique_ptr<ExpertDispatcher>> a2a = NewNcclA2aDispatcher(
        EpShape{1, 8, int64_t{1} << 22}, size_t{1} << 18, *std::move(group), &arena);
    ASSERT_FALSE(a2a.ok());
    EXPECT_EQ(a2a.status().code(), absl::StatusCode::kResourceExhausted) << a2a.status();
    EXPECT_TRUE(IsDeviceTooSmall(a2a.status())) << a2a.status();
    EXPECT_NE(a2a.status().message().find("nccl-a2a receive slots"), std::string::npos)
        << a2a.status();
  }
  absl::StatusOr<std::unique_ptr<NcclGroup>> group =
      JoinNcclGroup(store.get(), "ep/lsa", 0, 1, absl::Seconds(60));
  ASSERT_TRUE(group.ok()) << group.status();
  const absl::Status probe = NcclLsaReachable(**group);
  if (!probe.ok()) GTEST_SKIP() << "nccl-lsa cannot run with this NCCL runtime: " << probe;
  DeviceArena arena;
  {
    absl::StatusOr<std::unique_ptr<ExpertDispatcher>> lsa =
        NewNcclLsaDispatcher(EpShape{1, 8, 64}, *std::move(group), &arena);
    ASSERT_TRUE(lsa.ok()) << lsa.status();
    void* shared = nullptr;
    ASSERT_TRUE((*lsa)->AllocateShared(1000, "test window", &shared).ok());
    EXPECT_EQ(arena.device_bytes(), 1000);
  }
  EXPECT_EQ(arena.device_bytes(), 0);
}

TEST(LocalDispatcherShape, RefusesShapesItCannotRun) {
  StreamLinks links;
  DeviceArena arena;
  EXPECT_FALSE(NewLocalDispatcher(EpShape{3, 64, 10}, &links, &arena).ok());   // 64 experts over 3
  EXPECT_FALSE(NewLocalDispatcher(EpShape{16, 64, 10}, &links, &arena).ok());  // more than 8 ranks
  EXPECT_FALSE(NewLocalDispatcher(EpShape{2, 64, 10}, nullptr, &arena).ok());
}

}  // namespace
}  // namespace dropless::cuda_engine
