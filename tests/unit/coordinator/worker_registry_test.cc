// The worker-facing state on its own: identity by node, sessions and certificates, leases, slots.
#include "coordinator/controller/worker_registry.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

TEST(WorkerRegistryTest, RegistrationIsCheckedAndANodeKeepsItsId) {
  EXPECT_THAT(WorkerRegistry::CheckRegistration(Request("", 1)).message(),
              HasSubstr("node: must not be empty"));
  EXPECT_THAT(WorkerRegistry::CheckRegistration(Request("a", 0)).message(),
              HasSubstr("devices: a worker needs at least one slot"));
  EXPECT_TRUE(WorkerRegistry::CheckRegistration(Request("a", 2)).ok());

  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const std::string a = (*registry.Register(Request("a", 2), 0, write, &fresh))->id();
  EXPECT_TRUE(fresh);
  EXPECT_EQ(a, "worker-0001");
  EXPECT_EQ((*registry.Register(Request("b", 1), 0, write, &fresh))->id(), "worker-0002");
  const v1::Worker& again = **registry.Register(Request("a", 3), 5, write, &fresh);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(again.id(), a);
  EXPECT_EQ(again.slots(), 3);
  EXPECT_EQ(again.state(), v1::WORKER_STATE_LOST);  // READY only after Hello
  ASSERT_EQ(write.events.size(), 3u);
  EXPECT_EQ(write.events[2].type(), "WorkerReregistered");
  EXPECT_EQ(write.workers.size(), 3u);
}

TEST(WorkerRegistryTest, RestoredWorkersAreLostAndNumberingContinues) {
  v1::Worker stored;
  stored.set_id("worker-0007");
  stored.set_node("n7");
  stored.set_state(v1::WORKER_STATE_READY);
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  ActiveState state;
  state.workers = {WorkerRecord{stored, 0}};
  registry.Restore(state, 100, write);
  ASSERT_EQ(write.workers.size(), 1u);
  EXPECT_EQ(write.workers[0].info.state(), v1::WORKER_STATE_LOST);
  bool fresh = false;
  EXPECT_EQ((*registry.Register(Request("n7", 1), 0, write, &fresh))->id(), "worker-0007");
  EXPECT_EQ((*registry.Register(Request("n8", 1), 0, write, &fresh))->id(), "worker-0008");
}

TEST(WorkerRegistryTest, RestoredReceiptsMakeTheSameBootsResendsHandled) {
  v1::Worker stored;
  stored.set_id("worker-0003");
  stored.set_node("n3");
  stored.set_state(v1::WORKER_STATE_READY);
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  ActiveState state;
  state.workers = {WorkerRecord{stored, 0}};
  state.receipts = {{"worker-0003", "boot-a", 41}, {"worker-0099", "boot-z", 7}};
  registry.Restore(state, 100, write);
  WorkerEntry* worker = registry.Find("worker-0003");
  ASSERT_NE(worker, nullptr);
  EXPECT_EQ(registry.Find("worker-0099"), nullptr);  // a receipt of an unknown worker is ignored

  // The same daemon run says hello again: what it resends up to seq 41 is already stored.
  auto session = Session("n3");
  registry.OpenSession(session, 200);
  v1::Hello hello = HelloAs("worker-0003");
  hello.set_boot_id("boot-a");
  ASSERT_TRUE(registry.Hello(session, hello, 200, write).ok());
  EXPECT_TRUE(WorkerRegistry::Handled(*worker, 41));
  EXPECT_FALSE(WorkerRegistry::Handled(*worker, 42));

  // Its session ends: the run keeps the node through its lease (it may reconnect) ...
  EXPECT_EQ(registry.ForgetSession(session), "worker-0003");
  EXPECT_EQ(registry.Disconnect("worker-0003", session, 250), worker);
  auto next = Session("n3");
  registry.OpenSession(next, 300);
  hello.set_boot_id("boot-b");
  EXPECT_EQ(registry.Hello(next, hello, 300, write).status().code(),
            absl::StatusCode::kAlreadyExists);
  // ... then, its lease expired, a restarted daemon (a new run) numbers from 1 again: nothing of
  // it is handled yet.
  ASSERT_EQ(registry.ExpireLeases(200 + kLeaseMs + 1).size(), 1u);
  ASSERT_TRUE(registry.Hello(next, hello, 200 + kLeaseMs + 1, write).ok());
  EXPECT_FALSE(WorkerRegistry::Handled(*worker, 1));
}

// Only the run that registered last may say hello: the entry holds its address and slots. A run
// that said Goodbye frees the node when its session ends, and gets no new work meanwhile.
TEST(WorkerRegistryTest, TheLastRegisteredRunSaysHelloAndALeavingRunIsNotScheduled) {
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  v1::RegisterWorkerRequest a = Request("n", 2);
  a.set_boot_id("run-a");
  const std::string id = (*registry.Register(a, 0, write, &fresh))->id();
  auto session_a = Session();
  registry.OpenSession(session_a, 0);
  ASSERT_TRUE(registry.Hello(session_a, HelloAs(id, "run-a"), 0, write).ok());
  EXPECT_EQ(registry.Capacity(0).size(), 1u);
  WorkerEntry* worker = registry.Find(id);
  worker->leaving = "the worker daemon got Terminated";
  EXPECT_TRUE(registry.Capacity(0).empty());  // stopping its ranks: nothing new goes there

  v1::RegisterWorkerRequest b = Request("n", 5);
  b.set_boot_id("run-b");
  EXPECT_EQ(registry.Register(b, 10, write, &fresh).status().code(),
            absl::StatusCode::kAlreadyExists);  // run-a still has its session
  EXPECT_EQ(registry.ForgetSession(session_a), id);
  EXPECT_EQ(registry.Disconnect(id, session_a, 15), worker);
  ASSERT_TRUE(registry.Register(b, 20, write, &fresh).ok());  // said Goodbye, session over: free
  EXPECT_EQ(worker->info.slots(), 5);
  // run-a comes back and registers again (the node is free: nobody said hello since) ...
  ASSERT_TRUE(registry.Register(a, 30, write, &fresh).ok());
  EXPECT_EQ(worker->info.slots(), 2);
  // ... so run-b, whose registration it replaced, may not say hello with run-a's slots.
  auto session_b = Session();
  registry.OpenSession(session_b, 40);
  absl::StatusOr<WorkerEntry*> refused = registry.Hello(session_b, HelloAs(id, "run-b"), 40, write);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(refused.status().message(), HasSubstr("register again"));
  auto session_a2 = Session();
  registry.OpenSession(session_a2, 50);
  ASSERT_TRUE(registry.Hello(session_a2, HelloAs(id, "run-a"), 50, write).ok());
  EXPECT_TRUE(worker->leaving.empty());  // a new session of the run: it is back
  EXPECT_EQ(registry.Capacity(50).size(), 1u);
}

TEST(WorkerRegistryTest, HelloBindsTheSessionOfTheCertifiedNodeOnly) {
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const std::string id = (*registry.Register(Request("node-a", 1), 0, write, &fresh))->id();
  auto impostor = Session("node-b");
  registry.OpenSession(impostor, 0);
  absl::StatusOr<WorkerEntry*> refused = registry.Hello(impostor, HelloAs(id), 0, write);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("a worker may only report as itself"));
  EXPECT_EQ(registry.Hello(impostor, HelloAs("worker-0099"), 0, write).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(*registry.SessionWorker(impostor), "");

  auto own = Session("node-a");
  registry.OpenSession(own, 0);
  StoreWrite ready;
  absl::StatusOr<WorkerEntry*> worker = registry.Hello(own, HelloAs(id), 10, ready);
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->info.state(), v1::WORKER_STATE_READY);
  EXPECT_EQ(*registry.SessionWorker(own), id);
  ASSERT_EQ(ready.events.size(), 1u);
  EXPECT_EQ(ready.events[0].type(), "WorkerReady");
  (*worker)->last_seq = 5;
  EXPECT_TRUE(WorkerRegistry::Handled(**worker, 5));
  EXPECT_FALSE(WorkerRegistry::Handled(**worker, 6));

  // Another daemon run of the node (another boot_id) is refused while this session is live, at
  // registration and at hello, and nothing of the worker changes.
  v1::RegisterWorkerRequest other_run = Request("node-a", 7);
  other_run.set_boot_id("boot-2");
  StoreWrite untouched;
  bool fresh_again = true;
  absl::StatusOr<const v1::Worker*> taken =
      registry.Register(other_run, 15, untouched, &fresh_again);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(taken.status().message(), HasSubstr("node \"node-a\" is held by another running"));
  EXPECT_TRUE(untouched.workers.empty());
  EXPECT_EQ((*worker)->info.slots(), 1);
  auto intruder = Session("node-a");
  registry.OpenSession(intruder, 15);
  EXPECT_EQ(registry.Hello(intruder, HelloAs(id, "boot-2"), 15, untouched).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*worker)->session, own);
  other_run.set_boot_id("boot-1");  // the same run registering again (a reconnect) is fine
  EXPECT_TRUE(registry.Register(other_run, 15, untouched, &fresh_again).ok());

  // A newer session of the same run supersedes it; the old one's end does not disconnect the
  // worker.
  auto newer = Session("node-a");
  registry.OpenSession(newer, 20);
  ASSERT_TRUE(registry.Hello(newer, HelloAs(id), 20, ready).ok());
  EXPECT_EQ((*worker)->session, newer);
  EXPECT_EQ(registry.ForgetSession(own), id);
  EXPECT_EQ(registry.Disconnect(id, own, 20), nullptr);
  EXPECT_EQ(registry.SessionWorker(own), nullptr);
  EXPECT_EQ(registry.ForgetSession(newer), id);
  EXPECT_EQ(registry.Disconnect(id, newer, 20), *worker);
  EXPECT_EQ((*worker)->session, nullptr);
}

// A cuda worker's GPUs' total memory: one entry per slot, kept and handed to the scheduler.
TEST(WorkerRegistryTest, GpuMemoryIsCheckedKeptAndScheduled) {
  v1::RegisterWorkerRequest gpus = Request("g", 2);
  gpus.set_slot_kind("cuda");
  gpus.add_device_memory_bytes(int64_t{80} << 30);
  EXPECT_THAT(WorkerRegistry::CheckRegistration(gpus).message(),
              HasSubstr("device_memory_bytes: one entry per slot of a cuda worker (got 1 for 2"));
  gpus.add_device_memory_bytes(-1);
  EXPECT_THAT(WorkerRegistry::CheckRegistration(gpus).message(),
              HasSubstr("device_memory_bytes: must be >= 0"));
  gpus.set_device_memory_bytes(1, int64_t{141} << 30);
  EXPECT_TRUE(WorkerRegistry::CheckRegistration(gpus).ok());
  v1::RegisterWorkerRequest cpus = Request("c", 1);
  cpus.add_device_memory_bytes(1);
  EXPECT_THAT(WorkerRegistry::CheckRegistration(cpus).message(),
              HasSubstr("of a cuda worker (got 1 for 1 cpu slots)"));

  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const v1::Worker& info = **registry.Register(gpus, 0, write, &fresh);
  EXPECT_THAT(info.device_memory_bytes(), ElementsAre(int64_t{80} << 30, int64_t{141} << 30));
  auto session = Session();
  registry.OpenSession(session, 0);
  ASSERT_TRUE(registry.Hello(session, HelloAs(info.id()), 0, write).ok());
  std::vector<NodeCapacity> capacity = registry.Capacity(0);
  ASSERT_EQ(capacity.size(), 1u);
  EXPECT_THAT(capacity[0].device_memory_bytes, ElementsAre(int64_t{80} << 30, int64_t{141} << 30));
  // Re-registered without it (an older daemon): unknown again.
  gpus.clear_device_memory_bytes();
  EXPECT_TRUE((*registry.Register(gpus, 1, write, &fresh))->device_memory_bytes().empty());
}

TEST(WorkerRegistryTest, LeasesExpireOnceAndFreeSlotsFeedTheScheduler) {
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const std::string a = (*registry.Register(Request("a", 3), 0, write, &fresh))->id();
  const std::string b = (*registry.Register(Request("b", 1), 0, write, &fresh))->id();
  for (const std::string& id : {a, b}) {
    auto session = Session();
    registry.OpenSession(session, 0);
    ASSERT_TRUE(registry.Hello(session, HelloAs(id), 0, write).ok());
  }
  registry.Find(a)->occupied[1] = RankKey{"job-1", 1, 0};
  std::vector<NodeCapacity> capacity = registry.Capacity(0);
  ASSERT_EQ(capacity.size(), 2u);
  EXPECT_THAT(capacity[0].free_slots, ElementsAre(0, 2));
  WorkerRegistry::Counts counts = registry.Count();
  EXPECT_EQ(counts.ready, 2);
  EXPECT_EQ(counts.busy_slots, 1);
  EXPECT_EQ(counts.free_slots, 3);

  registry.Find(a)->last_message_ms = 1500;  // b says nothing
  std::vector<WorkerEntry*> expired = registry.ExpireLeases(2000);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0]->info.id(), b);
  EXPECT_EQ(expired[0]->session, nullptr);
  EXPECT_TRUE(registry.ExpireLeases(2100).empty());  // handled once
  StoreWrite lost;
  registry.MarkLost(*expired[0], "lease expired", lost);
  registry.MarkLost(*expired[0], "lease expired", lost);
  ASSERT_EQ(lost.events.size(), 1u);
  EXPECT_THAT(lost.events[0].message(), HasSubstr("lease expired"));
  EXPECT_EQ(registry.Capacity(2100).size(), 1u);
}

// --lost-worker-expiry: a worker away longer than the expiry, since it was last heard from, is
// forgotten, but only once its lease ran out too, and never while a rank process holds one of its
// slots. Forgotten, it is gone from every view, and its node registers as a new worker.
TEST(WorkerRegistryTest, AWorkerAwayLongerThanTheExpiryIsForgotten) {
  constexpr int64_t kExpiryMs = 60'000;
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  bool fresh = false;
  const std::string a = (*registry.Register(Request("a", 2), 0, write, &fresh))->id();
  const std::string b = (*registry.Register(Request("b", 1), 0, write, &fresh))->id();
  auto session_a = Session();
  for (const auto& [id, session] : {std::pair{a, session_a}, std::pair{b, Session()}}) {
    registry.OpenSession(session, 0);
    ASSERT_TRUE(registry.Hello(session, HelloAs(id), 0, write).ok());
  }
  WorkerEntry* worker_a = registry.Find(a);
  EXPECT_EQ(worker_a->lost_since_ms, 0) << "READY";
  // a's session ends at 1000, its last message at 900: away since 900, stored with its row.
  worker_a->last_message_ms = 900;
  registry.ForgetSession(session_a);
  ASSERT_EQ(registry.Disconnect(a, session_a, 1000), worker_a);
  StoreWrite lost;
  registry.MarkLost(*worker_a, "session ended", lost);
  EXPECT_EQ(worker_a->lost_since_ms, 900);
  ASSERT_EQ(lost.workers.size(), 1u);
  EXPECT_EQ(lost.workers[0].lost_since_ms, 900);

  EXPECT_TRUE(registry.ForgettableWorkers(900 + kExpiryMs, kExpiryMs).empty()) << "not longer";
  // A rank process still holds a slot (a stray one exiting, or a live attempt's): kept.
  worker_a->occupied[0] = RankKey{"job-1", 1, 0};
  EXPECT_TRUE(registry.ForgettableWorkers(900 + kExpiryMs + 1, kExpiryMs).empty());
  worker_a->occupied.clear();
  std::vector<WorkerEntry*> due = registry.ForgettableWorkers(900 + kExpiryMs + 1, kExpiryMs);
  ASSERT_EQ(due.size(), 1u) << "b is READY";
  EXPECT_EQ(due[0], worker_a);

  // A registration is a sign of life: away from then on (and within its lease it is never due).
  v1::RegisterWorkerRequest again = Request("a", 2);
  ASSERT_TRUE(registry.Register(again, 50'000, write, &fresh).ok());
  EXPECT_EQ(worker_a->lost_since_ms, 50'000);
  EXPECT_TRUE(registry.ForgettableWorkers(50'000 + kExpiryMs, kExpiryMs).empty());
  ASSERT_EQ(registry.ForgettableWorkers(50'000 + kExpiryMs + 1, kExpiryMs).size(), 1u);

  StoreWrite forgotten;
  registry.Forget(a, 50'000 + 3'600'000, kExpiryMs, forgotten);
  EXPECT_EQ(registry.Find(a), nullptr);
  EXPECT_THAT(forgotten.forgotten_workers, ElementsAre(a));
  EXPECT_EQ(forgotten.last_worker_number, 2) << "worker-0002 the highest given";
  ASSERT_EQ(forgotten.events.size(), 1u);
  EXPECT_EQ(forgotten.events[0].type(), "WorkerForgotten");
  EXPECT_EQ(forgotten.events[0].job_id(), "");
  EXPECT_THAT(forgotten.events[0].message(),
              HasSubstr("worker-0001 (node a): away for 1h (since 1970-01-01T00:00:50Z), "
                        "longer than --lost-worker-expiry 1m; forgotten"));
  ASSERT_EQ(registry.List().size(), 1u);
  EXPECT_EQ(registry.List()[0].id(), b);
  ASSERT_EQ(registry.KnownCapacity().size(), 1u) << "no longer capacity a job waits for";
  EXPECT_EQ(registry.Count().lost, 0);

  // Its node comes back: a new worker, with an id never given before; it says hello as that.
  const v1::Worker& back = **registry.Register(Request("a", 2), 4'000'000, write, &fresh);
  EXPECT_TRUE(fresh);
  EXPECT_EQ(back.id(), "worker-0003");
  auto session = Session();
  registry.OpenSession(session, 4'000'000);
  EXPECT_TRUE(absl::IsNotFound(registry.Hello(session, HelloAs(a), 4'000'000, write).status()))
      << "the old id is unknown";
  ASSERT_TRUE(registry.Hello(session, HelloAs("worker-0003"), 4'000'000, write).ok());
  EXPECT_EQ(registry.Capacity(4'000'000).size(), 2u);
}

// After a restart every worker is LOST until it says Hello. One stored LOST stays away since its
// stored time (its absence goes on across the restart) but is never due within a lease of the
// restart, so a live daemon gets back in first; one stored READY (connected when the last
// coordinator stopped), or stored without a time (a file older than schema 5), is away from the
// restart: the coordinator's downtime does not count against it. A second restart keeps what the
// first stored, and ids continue after every number given, forgotten workers' too.
TEST(WorkerRegistryTest, RestartKeepsHowLongAWorkerHasBeenAway) {
  constexpr int64_t kExpiryMs = 600'000;
  constexpr int64_t kRestartMs = 10'000'000;
  auto stored = [](const std::string& id, v1::WorkerState state, int64_t lost_since_ms) {
    WorkerRecord row;
    row.info.set_id(id);
    row.info.set_node(absl::StrCat("node-", id));
    row.info.set_state(state);
    row.lost_since_ms = lost_since_ms;
    return row;
  };
  ActiveState state;
  state.workers = {stored("worker-0001", v1::WORKER_STATE_READY, 0),
                   stored("worker-0002", v1::WORKER_STATE_LOST, 1'000'000),
                   stored("worker-0003", v1::WORKER_STATE_LOST, 0)};
  state.last_worker_number = 9;  // worker-0009 was forgotten before
  WorkerRegistry registry(kLeaseMs);
  StoreWrite write;
  registry.Restore(state, kRestartMs, write);
  EXPECT_EQ(registry.Find("worker-0001")->lost_since_ms, kRestartMs);
  EXPECT_EQ(registry.Find("worker-0002")->lost_since_ms, 1'000'000);
  EXPECT_EQ(registry.Find("worker-0003")->lost_since_ms, kRestartMs);
  // The rows whose time changed are stored, so the next restart does not move it again.
  ASSERT_EQ(write.workers.size(), 2u);
  EXPECT_EQ(write.workers[0].info.id(), "worker-0001");
  EXPECT_EQ(write.workers[0].info.state(), v1::WORKER_STATE_LOST);
  EXPECT_EQ(write.workers[0].lost_since_ms, kRestartMs);
  EXPECT_EQ(write.workers[1].info.id(), "worker-0003");

  // worker-0002, away far longer than the expiry: due only once two leases have passed since the
  // restart (a live daemon, or a new run of it, gets in meanwhile).
  EXPECT_TRUE(registry.ForgettableWorkers(kRestartMs + kLeaseMs + 1, kExpiryMs).empty());
  EXPECT_TRUE(registry.ForgettableWorkers(kRestartMs + 2 * kLeaseMs, kExpiryMs).empty());
  std::vector<WorkerEntry*> due =
      registry.ForgettableWorkers(kRestartMs + 2 * kLeaseMs + 1, kExpiryMs);
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0]->info.id(), "worker-0002");
  // The others: a whole expiry after the restart.
  EXPECT_EQ(registry.ForgettableWorkers(kRestartMs + kExpiryMs, kExpiryMs).size(), 1u);
  EXPECT_EQ(registry.ForgettableWorkers(kRestartMs + kExpiryMs + 1, kExpiryMs).size(), 3u);

  // Restarted again later, from what the first restart stored: nothing moves.
  ActiveState again;
  again.workers = {stored("worker-0001", v1::WORKER_STATE_LOST, kRestartMs),
                   stored("worker-0002", v1::WORKER_STATE_LOST, 1'000'000)};
  again.last_worker_number = 9;
  WorkerRegistry second(kLeaseMs);
  StoreWrite untouched;
  second.Restore(again, kRestartMs + 300'000, untouched);
  EXPECT_TRUE(untouched.workers.empty());
  EXPECT_EQ(second.Find("worker-0001")->lost_since_ms, kRestartMs);
  bool fresh = false;
  EXPECT_EQ((*second.Register(Request("new", 1), kRestartMs + 300'000, untouched, &fresh))->id(),
            "worker-0010");
}

TEST(WorkerRegistryTest, StrayCancellationsAreRateLimited) {
  WorkerRegistry registry(kLeaseMs);
  EXPECT_TRUE(registry.TakeStrayCancelTurn("w", "job-1", 1, 10'000));
  EXPECT_FALSE(registry.TakeStrayCancelTurn("w", "job-1", 1, 12'000));
  EXPECT_TRUE(registry.TakeStrayCancelTurn("w", "job-1", 2, 12'000));
  EXPECT_TRUE(registry.TakeStrayCancelTurn("w", "job-1", 1, 15'000));
}

}  // namespace
}  // namespace dropless::coordinator
