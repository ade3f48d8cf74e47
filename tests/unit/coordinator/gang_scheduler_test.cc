#include "coordinator/scheduler/gang_scheduler.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

NodeCapacity Node(std::string name, std::string kind, int32_t slots, std::vector<int32_t> free) {
  return NodeCapacity{"w-" + name, name, std::move(kind), slots, std::move(free)};
}

NodeCapacity FreeNode(std::string name, std::string kind, int32_t slots) {
  std::vector<int32_t> free;
  for (int32_t i = 0; i < slots; ++i) free.push_back(i);
  return Node(std::move(name), std::move(kind), slots, std::move(free));
}

// A worker LOST for less than its lease (it may reconnect): its slots count, none is free.
NodeCapacity AwayNode(std::string name, std::string kind, int32_t slots) {
  NodeCapacity node = Node(std::move(name), std::move(kind), slots, {});
  node.away = true;
  return node;
}

QueuedJob Job(std::string id, int32_t priority, int64_t seq, std::string backend, int32_t world) {
  return QueuedJob{std::move(id), priority, seq, std::move(backend), world};
}

constexpr int64_t kGiB = int64_t{1} << 30;

// A cuda node whose GPUs have these totals (GiB; 0: unknown), one slot each, all free.
NodeCapacity GpuNode(std::string name, std::vector<int64_t> gib) {
  NodeCapacity node = FreeNode(std::move(name), "cuda", static_cast<int32_t>(gib.size()));
  for (int64_t g : gib) node.device_memory_bytes.push_back(g * kGiB);
  return node;
}

// The same with every slot busy.
NodeCapacity BusyGpuNode(std::string name, std::vector<int64_t> gib) {
  NodeCapacity node = GpuNode(std::move(name), std::move(gib));
  node.free_slots.clear();
  return node;
}

// The same with its first slot busy.
NodeCapacity HalfBusyGpuNode(std::string name, std::vector<int64_t> gib) {
  NodeCapacity node = GpuNode(std::move(name), std::move(gib));
  node.free_slots.erase(node.free_slots.begin());
  return node;
}

// The same with its last slot busy.
NodeCapacity BusyLastGpuNode(std::string name, std::vector<int64_t> gib) {
  NodeCapacity node = GpuNode(std::move(name), std::move(gib));
  node.free_slots.pop_back();
  return node;
}

// A cuda job that ran out of memory on a GPU of `gib`.
QueuedJob NeedsMoreThan(std::string id, int64_t seq, int32_t world, int64_t gib) {
  QueuedJob job = Job(std::move(id), 0, seq, "cuda", world);
  job.needs_device_memory_above = gib * kGiB;
  return job;
}

// "job=node:slot,node:slot" with ranks in order; a wrong rank numbering fails the comparison.
std::string Describe(const JobPlacement& p) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < p.ranks.size(); ++i) {
    const RankSlot& r = p.ranks[i];
    EXPECT_EQ(r.rank, static_cast<int32_t>(i)) << p.job_id;
    EXPECT_EQ(r.worker_id, "w-" + r.node) << p.job_id;
    parts.push_back(absl::StrCat(r.node, ":", r.slot));
  }
  return absl::StrCat(p.job_id, "=", absl::StrJoin(parts, ","));
}

struct ScheduleCase {
  std::string name;
  std::vector<NodeCapacity> nodes;
  std::vector<QueuedJob> queue;
  std::vector<std::string> placed;                            // Describe() of each, in order
  std::vector<std::pair<std::string, std::string>> waiting;  // job id, substring of the reason
};

class PlanScheduleTest : public ::testing::TestWithParam<ScheduleCase> {};

TEST_P(PlanScheduleTest, PlacesAndExplains) {
  const ScheduleCase& c = GetParam();
  SchedulePlan plan = PlanSchedule(c.queue, c.nodes);
  std::vector<std::string> placed;
  for (const JobPlacement& p : plan.placements) placed.push_back(Describe(p));
  EXPECT_THAT(placed, ElementsAreArray(c.placed));
  ASSERT_EQ(plan.waiting.size(), c.waiting.size());
  for (size_t i = 0; i < c.waiting.size(); ++i) {
    EXPECT_EQ(plan.waiting[i].job_id, c.waiting[i].first);
    EXPECT_THAT(plan.waiting[i].reason, HasSubstr(c.waiting[i].second));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, PlanScheduleTest,
    ::testing::Values(
        ScheduleCase{"FitsOnOneNode",
                     {FreeNode("a", "cpu", 4)},
                     {Job("j1", 0, 1, "cpu", 2)},
                     {"j1=a:0,a:1"},
                     {}},
        ScheduleCase{"UsesOnlyFreeSlots",
                     {Node("a", "cpu", 4, {1, 3})},
                     {Job("j1", 0, 1, "cpu", 2)},
                     {"j1=a:1,a:3"},
                     {}},
        ScheduleCase{"DoesNotFitWaitsAllOrNothing",
                     {Node("a", "cpu", 4, {0, 1}), Node("b", "cpu", 2, {1})},
                     {Job("j1", 0, 1, "cpu", 4)},
                     {},
                     {{"j1", "needs 4 cpu slots; 3 free now"}}},
        ScheduleCase{"SingleNodeBestFitOverLargerNode",
                     {FreeNode("a", "cpu", 8), FreeNode("b", "cpu", 2), FreeNode("c", "cpu", 4)},
                     {Job("j1", 0, 1, "cpu", 2)},
                     {"j1=b:0,b:1"},
                     {}},
        ScheduleCase{"PrefersOneNodeOverSpreading",
                     {FreeNode("a", "cpu", 2), FreeNode("b", "cpu", 2), FreeNode("c", "cpu", 4)},
                     {Job("j1", 0, 1, "cpu", 4)},
                     {"j1=c:0,c:1,c:2,c:3"},
                     {}},
        ScheduleCase{"SpansFewestNodesLargestFirstTightLast",
                     {FreeNode("a", "cpu", 3), FreeNode("b", "cpu", 2), FreeNode("c", "cpu", 1)},
                     {Job("j1", 0, 1, "cpu", 4)},
                     {"j1=a:0,a:1,a:2,c:0"},
                     {}},
        ScheduleCase{"FewestNodesAcrossFour",
                     {FreeNode("a", "cpu", 2), FreeNode("b", "cpu", 2), FreeNode("c", "cpu", 2),
                      FreeNode("d", "cpu", 1)},
                     {Job("j1", 0, 1, "cpu", 5)},
                     {"j1=a:0,a:1,b:0,b:1,d:0"},
                     {}},
        // The cuda engine's EP group is one NVLink domain: never split across nodes.
        ScheduleCase{"CudaGangLargerThanEveryWorkerWaitsWithoutBlocking",
                     {FreeNode("a", "cuda", 2), FreeNode("b", "cuda", 2)},
                     {Job("wide", 0, 1, "cuda", 3), Job("narrow", 0, 2, "cuda", 2)},
                     {"narrow=a:0,a:1"},
                     {{"wide",
                       "needs 3 cuda slots on one node (the cuda engine's EP group is one "
                       "NVLink domain) but the largest READY cuda worker has 2"}}},
        ScheduleCase{"CudaGangWaitsForOneNodeToHoldIt",
                     {Node("a", "cuda", 4, {2, 3}), Node("b", "cuda", 4, {0, 1})},
                     {Job("four", 0, 1, "cuda", 4), Job("one", 0, 2, "cuda", 1)},
                     {},
                     {{"four", "needs 4 cuda slots on one node; at most 2 free on one now"},
                      {"one", "queued behind four"}}},
        ScheduleCase{
            "BackendKindsAreSeparatePools",
            {FreeNode("cpu1", "cpu", 8), FreeNode("gpu1", "cuda", 2)},
            {Job("j1", 0, 1, "cuda", 2), Job("j2", 0, 2, "cuda", 1), Job("j3", 0, 3, "cpu", 4)},
            {"j1=gpu1:0,gpu1:1", "j3=cpu1:0,cpu1:1,cpu1:2,cpu1:3"},
            {{"j2", "needs 1 cuda slots on one node; at most 0 free on one now"}}},
        ScheduleCase{"HigherPriorityFirst",
                     {FreeNode("a", "cpu", 2)},
                     {Job("low", 0, 1, "cpu", 2), Job("high", 5, 2, "cpu", 2)},
                     {"high=a:0,a:1"},
                     {{"low", "needs 2 cpu slots; 0 free now"}}},
        ScheduleCase{"FifoAmongEqualPriority",
                     {FreeNode("a", "cpu", 2)},
                     {Job("second", 1, 7, "cpu", 2), Job("first", 1, 3, "cpu", 2)},
                     {"first=a:0,a:1"},
                     {{"second", "0 free now"}}},
        ScheduleCase{"BigGangBlocksSmallerJobsBehindIt",
                     {FreeNode("a", "cpu", 4), Node("b", "cpu", 4, {})},
                     {Job("big", 0, 1, "cpu", 6), Job("small", 0, 2, "cpu", 1)},
                     {},
                     {{"big", "needs 6 cpu slots; 4 free now"}, {"small", "queued behind big"}}},
        ScheduleCase{"HigherPriorityOvertakesBlockedGang",
                     {FreeNode("a", "cpu", 4), Node("b", "cpu", 4, {})},
                     {Job("big", 0, 1, "cpu", 6), Job("urgent", 3, 2, "cpu", 1)},
                     {"urgent=a:0"},
                     {{"big", "needs 6 cpu slots; 3 free now"}}},
        ScheduleCase{"NeverFitsWaitsWithoutBlocking",
                     {FreeNode("a", "cpu", 2), FreeNode("b", "cpu", 2)},
                     {Job("huge", 0, 1, "cpu", 16), Job("small", 0, 2, "cpu", 2)},
                     {"small=a:0,a:1"},
                     {{"huge", "needs 16 cpu slots but the READY cpu workers have 4 in total"}}},
        ScheduleCase{"NoWorkersOfTheKind",
                     {FreeNode("a", "cpu", 2)},
                     {Job("g", 0, 1, "cuda", 1)},
                     {},
                     {{"g", "READY cuda workers have 0 in total"}}},
        // A job that ran out of memory on an 80 GiB GPU goes to the 141 GiB node, although the
        // tie-break would pick the other; a job without that need fits the tightest node.
        ScheduleCase{"OutOfMemoryJobGoesOnLargerGpusOnly",
                     {GpuNode("h100", {80, 80}), GpuNode("h200", {141, 141})},
                     {NeedsMoreThan("big", 1, 1, 80), Job("small", 0, 2, "cuda", 1)},
                     {"big=h200:0", "small=h200:1"},
                     {}},
        ScheduleCase{"NoLargerGpuWaitsWithoutBlocking",
                     {GpuNode("h100", {80, 80})},
                     {NeedsMoreThan("big", 1, 1, 80), Job("small", 0, 2, "cuda", 1)},
                     {"small=h100:0"},
                     {{"big",
                       "needs 1 cuda slots with more than 80.0 GiB of GPU memory (an attempt ran "
                       "out of memory on one that size) but the READY cuda workers have 0 in "
                       "total"}}},
        ScheduleCase{"GpusOfUnknownMemoryDoNotQualify",
                     {GpuNode("old", {0, 0}), FreeNode("older", "cuda", 2)},
                     {NeedsMoreThan("big", 1, 1, 80)},
                     {},
                     {{"big", "have 0 in total"}}},
        ScheduleCase{"EqualMemoryDoesNotQualify",
                     {GpuNode("h100", {80})},
                     {NeedsMoreThan("big", 1, 1, 80)},
                     {},
                     {{"big", "have 0 in total"}}},
        ScheduleCase{"OneNodeGangCountsOnlyTheLargerGpusOfANode",
                     {GpuNode("mixed", {80, 141, 141}), GpuNode("other", {141, 80, 80})},
                     {NeedsMoreThan("pair", 1, 2, 80), NeedsMoreThan("three", 2, 3, 80)},
                     {"pair=mixed:1,mixed:2"},
                     {{"three",
                       "on one node (the cuda engine's EP group is one NVLink domain) "
                       "but the largest READY cuda worker has 2"}}},
        // A job that waits for larger GPUs holds back only those it could run on (h200: two on
        // one node); the smaller GPU and the lone larger one on h200b stay open to the jobs
        // behind it, and a job that may use any slot then waits for the rest.
        ScheduleCase{
            "WaitingForLargerGpusHoldsBackOnlyThoseItCouldUse",
            {HalfBusyGpuNode("h200", {141, 141}), GpuNode("h100", {80}), GpuNode("h200b", {141})},
            {NeedsMoreThan("big", 1, 2, 80), Job("small", 0, 2, "cuda", 1),
             NeedsMoreThan("big2", 3, 1, 80), Job("any", 0, 4, "cuda", 1),
             Job("last", 0, 5, "cuda", 1)},
            {"small=h100:0", "big2=h200b:0"},
            {{"big",
              "needs 2 cuda slots with more than 80.0 GiB of GPU memory (an attempt "
              "ran out of memory on one that size) on one node; at most 1 free on "
              "one now"},
             {"any",
              "needs 1 cuda slots on one node; at most 0 free on one now (the "
              "larger GPUs that big waits for are held for it)"},
             {"last", "queued behind any"}}},
        // The same on a node whose larger GPUs are not its first slots: held by slot index (a
        // view of the larger GPUs counts 2 slots but keeps indices 0 and 2), so the later job
        // needing one larger GPU does not take m:0 from big.
        ScheduleCase{
            "LargerGpusAreHeldByTheirSlotIndices",
            {BusyLastGpuNode("m", {141, 80, 141})},
            {NeedsMoreThan("big", 1, 2, 80), NeedsMoreThan("later", 2, 1, 80)},
            {},
            {{"big",
              "needs 2 cuda slots with more than 80.0 GiB of GPU memory (an attempt "
              "ran out of memory on one that size) on one node; at most 1 free on "
              "one now"},
             {"later",
              "needs 1 cuda slots with more than 80.0 GiB of GPU memory (an attempt ran out of "
              "memory on one that size) on one node; at most 0 free on one now (the larger GPUs "
              "that big waits for are held for it)"}}},
        // A worker that went LOST a moment ago keeps the gang's hold: the small job does not
        // take the slot the gang waits for while the worker reconnects. (Before, the gang no
        // longer fitted the READY workers and stopped blocking: the small job backfilled.)
        ScheduleCase{"GangWaitingForAWorkerAwayForNowStillBlocks",
                     {Node("a", "cpu", 4, {2, 3}), AwayNode("b", "cpu", 4)},
                     {Job("big", 0, 1, "cpu", 6), Job("small", 0, 2, "cpu", 1)},
                     {},
                     {{"big", "needs 6 cpu slots; 2 free now; 4 slots on workers reconnecting"},
                      {"small", "queued behind big"}}},
        ScheduleCase{"CudaGangWaitingForItsNodeAwayForNowStillBlocks",
                     {FreeNode("small", "cuda", 2), AwayNode("large", "cuda", 8)},
                     {Job("big", 0, 1, "cuda", 8), Job("one", 0, 2, "cuda", 1)},
                     {},
                     {{"big", "needs 8 cuda slots on one node; at most 2 free on one now"},
                      {"one", "queued behind big"}}},
        // Nothing is placed on a worker away for now, even one listing free slots.
        ScheduleCase{"NothingIsPlacedOnAWorkerAwayForNow",
                     {[] {
                       NodeCapacity node = FreeNode("b", "cpu", 2);
                       node.away = true;
                       return node;
                     }()},
                     {Job("j1", 0, 1, "cpu", 1)},
                     {},
                     {{"j1", "needs 1 cpu slots; 0 free now; 2 slots on workers reconnecting"}}},
        // Away workers do not make a job that could never fit block the queue.
        ScheduleCase{"NeverFitsWithAwayWorkersWaitsWithoutBlocking",
                     {FreeNode("a", "cpu", 2), AwayNode("b", "cpu", 2)},
                     {Job("huge", 0, 1, "cpu", 16), Job("small", 0, 2, "cpu", 2)},
                     {"small=a:0,a:1"},
                     {{"huge", "needs 16 cpu slots but the READY cpu workers and those "
                               "reconnecting (2 slots LOST for less than their lease) have 4 in "
                               "total"}}},
        ScheduleCase{
            "SuccessiveJobsShareCapacity",
            {FreeNode("a", "cpu", 4)},
            {Job("j1", 0, 1, "cpu", 2), Job("j2", 0, 2, "cpu", 2), Job("j3", 0, 3, "cpu", 1)},
            {"j1=a:0,a:1", "j2=a:2,a:3"},
            {{"j3", "needs 1 cpu slots; 0 free now"}}}),
    [](const ::testing::TestParamInfo<ScheduleCase>& info) { return info.param.name; });

// What could ever be placed, busy slots counted: the controller's test before it queues a job
// for larger GPUs.
TEST(GangFitsCapacityTest, CountsOnlyLargerGpusAndOneNodeForCuda) {
  std::vector<NodeCapacity> nodes = {BusyGpuNode("h100", {80, 80}), GpuNode("h200", {141})};
  EXPECT_TRUE(GangFitsCapacity(2, "cuda", 0, nodes));
  EXPECT_TRUE(GangFitsCapacity(1, "cuda", 80 * kGiB, nodes));
  EXPECT_FALSE(GangFitsCapacity(2, "cuda", 80 * kGiB, nodes));  // one larger GPU on one node
  EXPECT_FALSE(GangFitsCapacity(1, "cuda", 141 * kGiB, nodes));
  EXPECT_FALSE(GangFitsCapacity(1, "cpu", 0, nodes));
  EXPECT_FALSE(GangFitsCapacity(1, "cuda", 80 * kGiB, {FreeNode("unknown", "cuda", 4)}));
  // Two larger GPUs, one per node: not one cuda gang of two.
  std::vector<NodeCapacity> apart = {GpuNode("a", {141}), GpuNode("b", {141})};
  EXPECT_FALSE(GangFitsCapacity(2, "cuda", 80 * kGiB, apart));
  EXPECT_TRUE(GangFitsCapacity(1, "cuda", 80 * kGiB, apart));
}

TEST(PackGangTest, RejectsNonPositiveWorldSize) {
  EXPECT_FALSE(PackGang(0, "cpu", {FreeNode("a", "cpu", 4)}).has_value());
}

TEST(PackGangTest, IgnoresNodesOfOtherKinds) {
  EXPECT_FALSE(PackGang(2, "cuda", {FreeNode("a", "cpu", 4)}).has_value());
}

TEST(PackGangTest, PlacementIsDeterministicOnTies) {
  std::vector<NodeCapacity> nodes = {FreeNode("b", "cpu", 2), FreeNode("a", "cpu", 2)};
  auto first = PackGang(2, "cpu", nodes);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ((*first)[0].worker_id, "w-a");
  std::reverse(nodes.begin(), nodes.end());
  auto second = PackGang(2, "cpu", nodes);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(*first, *second);
}

struct LeaseCase {
  std::string name;
  std::vector<WorkerLease> leases;
  int64_t now_ms;
  int64_t timeout_ms;
  std::vector<std::string> expired;
};

class ExpiredLeasesTest : public ::testing::TestWithParam<LeaseCase> {};

TEST_P(ExpiredLeasesTest, Expires) {
  const LeaseCase& c = GetParam();
  EXPECT_THAT(ExpiredLeases(c.leases, c.now_ms, c.timeout_ms), ElementsAreArray(c.expired));
}

INSTANTIATE_TEST_SUITE_P(
    Table, ExpiredLeasesTest,
    ::testing::Values(LeaseCase{"Fresh", {{"w1", 10'000}}, 15'000, 10'000, {}},
                      LeaseCase{"ExactlyAtTimeoutStillHolds", {{"w1", 10'000}}, 20'000, 10'000, {}},
                      LeaseCase{"JustPast", {{"w1", 10'000}}, 20'001, 10'000, {"w1"}},
                      LeaseCase{"OnlyTheSilentOnes",
                                {{"w1", 0}, {"w2", 9'500}, {"w3", 1'000}},
                                10'000,
                                5'000,
                                {"w1", "w3"}}),
    [](const ::testing::TestParamInfo<LeaseCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dropless::coordinator
