// The WorkerRegistry where workers come and go: which daemon run holds a node after a coordinator
// restart (a stored run only while it has work), and how long a worker without a session counts
// as away for the scheduler (one lease from its session's end, whatever its registrations).
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/controller/worker_registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/coordinator/worker_registry_test_support.h"

namespace dropless::coordinator {
namespace {

using registry_testing::HelloAs;
using registry_testing::kLeaseMs;
using registry_testing::Request;
using registry_testing::Session;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// After a restart the run the store names (its receipt) has not said hello to this coordinator.
// While it holds no work, it holds the node against no other run: a new run of the node (its
// host rebooted, its journal lost) registers and says hello at once, replacing it, and from then
// on holds the node (the old run, were it alive, is refused, also while the new one reconnects).
// While a rank process holds a slot of the node (a stored active attempt), the stored run keeps
// the node for the lease that runs from the restart: a duplicate daemon's run is refused, and the
// stored run gets back in; a new run gets the node once that lease ran out. The stored run that
// says hello first keeps the node as before.
TEST(WorkerRegistryChurnTest, ARunKnownOnlyFromTheStoreHoldsTheNodeOnlyWhileItHasWork) {
  constexpr int64_t kRestartMs = 100;
  auto restore = [](WorkerRegistry& registry, bool with_work) {
    v1::Worker stored;
    stored.set_id("worker-0005");
    stored.set_node("n5");
    stored.set_state(v1::WORKER_STATE_READY);
    ActiveState state;
    state.workers = {WorkerRecord{stored, 0}};
    state.receipts = {{"worker-0005", "run-a", 12}};
    StoreWrite write;
    registry.Restore(state, kRestartMs, write);
    // What Coordinator::Load does for a rank of a stored active attempt placed on it.
    if (with_work) registry.Find("worker-0005")->occupied[1] = RankKey{"job-1", 1, 0, true};
  };
  auto run = [](const std::string& boot_id) {
    v1::RegisterWorkerRequest request = Request("n5", 2);
    request.set_boot_id(boot_id);
    return request;
  };
  StoreWrite write;
  bool fresh = true;
  {  // no work: a new run takes the node at once
    WorkerRegistry registry(kLeaseMs);
    restore(registry, /*with_work=*/false);
    ASSERT_TRUE(registry.Register(run("run-b"), 200, write, &fresh).ok())
        << "refused within the lease of the restart";
    auto session = Session("n5");
    registry.OpenSession(session, 200);
    bool new_run = false;
    ASSERT_TRUE(
        registry.Hello(session, HelloAs("worker-0005", "run-b"), 200, write, &new_run).ok());
    EXPECT_TRUE(new_run);
    WorkerEntry* worker = registry.Find("worker-0005");
    EXPECT_FALSE(WorkerRegistry::Handled(*worker, 1)) << "the new run numbers from 1";
    absl::StatusOr<const v1::Worker*> old_run = registry.Register(run("run-a"), 300, write, &fresh);
    EXPECT_EQ(old_run.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_EQ(registry.ForgetSession(session), "worker-0005");
    ASSERT_EQ(registry.Disconnect("worker-0005", session, 350), worker);
    EXPECT_EQ(registry.Register(run("run-a"), 400, write, &fresh).status().code(),
              absl::StatusCode::kAlreadyExists)
        << "the new run reconnects within its lease";
  }
  {  // work: a duplicate daemon's run is refused, the stored run gets back in and keeps the node
    WorkerRegistry registry(kLeaseMs);
    restore(registry, /*with_work=*/true);
    absl::StatusOr<const v1::Worker*> duplicate =
        registry.Register(run("run-b"), 200, write, &fresh);
    EXPECT_EQ(duplicate.status().code(), absl::StatusCode::kAlreadyExists);
    EXPECT_THAT(duplicate.status().message(), HasSubstr("held by another running worker daemon"));
    ASSERT_TRUE(registry.Register(run("run-a"), 300, write, &fresh).ok());
    auto session = Session("n5");
    registry.OpenSession(session, 300);
    bool new_run = true;
    ASSERT_TRUE(
        registry.Hello(session, HelloAs("worker-0005", "run-a"), 300, write, &new_run).ok());
    EXPECT_FALSE(new_run);
    EXPECT_TRUE(WorkerRegistry::Handled(*registry.Find("worker-0005"), 12));
    registry.Find("worker-0005")->occupied.clear();  // its rank ended: it holds the node still
    EXPECT_EQ(registry.Register(run("run-b"), 400, write, &fresh).status().code(),
              absl::StatusCode::kAlreadyExists);
  }
  {  // work, and the stored run never comes back: a new run gets the node once the lease ran out
    WorkerRegistry registry(kLeaseMs);
    restore(registry, /*with_work=*/true);
    EXPECT_EQ(registry.Register(run("run-b"), kRestartMs + kLeaseMs, write, &fresh).status().code(),
              absl::StatusCode::kAlreadyExists);
    ASSERT_EQ(registry.ExpireLeases(kRestartMs + kLeaseMs + 1).size(), 1u);
    ASSERT_TRUE(registry.Register(run("run-b"), kRestartMs + kLeaseMs + 1, write, &fresh).ok());
  }
  {  // the stored run says hello first: it keeps the node as before
    WorkerRegistry registry(kLeaseMs);
    restore(registry, /*with_work=*/false);
    ASSERT_TRUE(registry.Register(run("run-a"), 200, write, &fresh).ok());
    auto session = Session("n5");
    registry.OpenSession(session, 200);
    bool new_run = true;
    ASSERT_TRUE(
        registry.Hello(session, HelloAs("worker-0005", "run-a"), 200, write, &new_run).ok());
    EXPECT_FALSE(new_run);
    EXPECT_TRUE(WorkerRegistry::Handled(*registry.Find("worker-0005"), 12));
    EXPECT_EQ(registry.Register(run("run-b"), 300, write, &fresh).status().code(),
              absl::StatusCode::kAlreadyExists);
  }
}

// A worker away for less than its lease (its session ended; it may reconnect) stays in the
// scheduler's capacity with every slot busy (NodeCapacity::away), so that a gang waiting for it
// keeps its hold; once its lease ran out, or when its daemon said Goodbye, it counts no more.
TEST(WorkerRegistryChurnTest, AWorkerAwayForLessThanItsLeaseCountsWithNoSlotFree) {
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const std::string a = (*registry.Register(Request("a", 2), 0, write, &fresh))->id();
  const std::string b = (*registry.Register(Request("b", 3), 0, write, &fresh))->id();
  auto session_a = Session();
  auto session_b = Session();
  for (const auto& [id, session] : {std::pair{a, session_a}, std::pair{b, session_b}}) {
    registry.OpenSession(session, 0);
    ASSERT_TRUE(registry.Hello(session, HelloAs(id), 0, write).ok());
  }
  EXPECT_EQ(registry.ForgetSession(session_b), b);
  WorkerEntry* worker_b = registry.Disconnect(b, session_b, 100);
  ASSERT_NE(worker_b, nullptr);
  registry.MarkLost(*worker_b, "session ended", write);

  std::vector<NodeCapacity> capacity = registry.Capacity(100);
  ASSERT_EQ(capacity.size(), 2u);
  EXPECT_FALSE(capacity[0].away);
  EXPECT_THAT(capacity[0].free_slots, ElementsAre(0, 1));
  EXPECT_TRUE(capacity[1].away);
  EXPECT_EQ(capacity[1].slots, 3);
  EXPECT_TRUE(capacity[1].free_slots.empty());
  EXPECT_EQ(registry.Count().free_slots, 2) << "the gauges count READY workers only";

  registry.Find(a)->last_message_ms = kLeaseMs;
  ASSERT_EQ(registry.ExpireLeases(kLeaseMs + 1).size(), 1u);  // b's
  capacity = registry.Capacity(kLeaseMs + 1);
  ASSERT_EQ(capacity.size(), 1u);
  EXPECT_EQ(capacity[0].worker_id, a);

  // A daemon that said Goodbye is stopping its ranks: it holds nothing once its session ends.
  registry.Find(a)->leaving = "the worker daemon got Terminated";
  EXPECT_EQ(registry.ForgetSession(session_a), a);
  ASSERT_NE(registry.Disconnect(a, session_a, kLeaseMs + 2), nullptr);
  EXPECT_TRUE(registry.Capacity(kLeaseMs + 2).empty());
}

// Away counts from when the session ended (or from the restart, for a worker connected when the
// last coordinator stopped), not from the last message: a daemon that registers again and again
// but never keeps a session (its Session stream fails, its Hello is refused) renews its lease
// with each registration, yet is away for one lease only, and then blocks no gang's backend. A
// worker that registered but never said hello, or was LOST before the restart, is never away.
TEST(WorkerRegistryChurnTest, AwayLastsOneLeaseFromTheSessionsEndWhateverTheRegistrations) {
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const std::string b = (*registry.Register(Request("b", 2), 100, write, &fresh))->id();
  EXPECT_TRUE(registry.Capacity(100).empty()) << "registered, never said hello: not away";
  auto session = Session();
  registry.OpenSession(session, 100);
  ASSERT_TRUE(registry.Hello(session, HelloAs(b), 100, write).ok());
  EXPECT_EQ(registry.ForgetSession(session), b);
  ASSERT_NE(registry.Disconnect(b, session, 200), nullptr);
  // It registers every 300 ms from then on, never saying hello: its lease never runs out ...
  for (int64_t now = 200; now <= 200 + 3 * kLeaseMs; now += 300) {
    ASSERT_TRUE(registry.Register(Request("b", 2), now, write, &fresh).ok());
    EXPECT_TRUE(registry.ExpireLeases(now).empty());
    std::vector<NodeCapacity> capacity = registry.Capacity(now);
    // ... but it is away for one lease after its session ended only.
    if (now - 200 <= kLeaseMs) {
      ASSERT_EQ(capacity.size(), 1u) << now;
      EXPECT_TRUE(capacity[0].away);
    } else {
      EXPECT_TRUE(capacity.empty()) << now;
    }
  }
  // Back with a session: READY, not away; its next session's end starts a new lease of away.
  auto back = Session();
  registry.OpenSession(back, 5000);
  ASSERT_TRUE(registry.Hello(back, HelloAs(b), 5000, write).ok());
  ASSERT_EQ(registry.Capacity(5000).size(), 1u);
  EXPECT_FALSE(registry.Capacity(5000)[0].away);
  EXPECT_EQ(registry.ForgetSession(back), b);
  ASSERT_NE(registry.Disconnect(b, back, 6000), nullptr);
  ASSERT_EQ(registry.Capacity(6000 + kLeaseMs).size(), 1u);
  EXPECT_TRUE(registry.Capacity(6000 + kLeaseMs + 1).empty());

  // After a restart: one stored READY is away for a lease from the restart, also while it keeps
  // registering; one stored LOST (away before the restart) and a fresh registration are not.
  constexpr int64_t kRestartMs = 10'000'000;
  auto stored = [](const std::string& id, v1::WorkerState state) {
    WorkerRecord row;
    row.info.set_id(id);
    row.info.set_node(absl::StrCat("node-", id));
    row.info.set_state(state);
    row.info.set_slot_kind("cpu");
    row.info.set_slots(2);
    row.lost_since_ms = state == v1::WORKER_STATE_LOST ? kRestartMs - 5000 : 0;
    return row;
  };
  ActiveState state;
  state.workers = {stored("worker-0001", v1::WORKER_STATE_READY),
                   stored("worker-0002", v1::WORKER_STATE_LOST)};
  WorkerRegistry restarted(kLeaseMs);
  restarted.Restore(state, kRestartMs, write);
  ASSERT_TRUE(restarted.Register(Request("node-new", 2), kRestartMs, write, &fresh).ok());
  for (const char* node : {"node-worker-0001", "node-worker-0002"}) {
    ASSERT_TRUE(restarted.Register(Request(node, 2), kRestartMs + kLeaseMs, write, &fresh).ok());
  }
  std::vector<NodeCapacity> capacity = restarted.Capacity(kRestartMs + kLeaseMs);
  ASSERT_EQ(capacity.size(), 1u);
  EXPECT_EQ(capacity[0].worker_id, "worker-0001");
  EXPECT_TRUE(capacity[0].away);
  EXPECT_TRUE(restarted.Capacity(kRestartMs + kLeaseMs + 1).empty());
}

}  // namespace
}  // namespace dropless::coordinator
