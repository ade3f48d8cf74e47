// A rank that ran out of GPU memory (kRankExitDeviceTooSmall) reported after a peer's failure
// ended its attempt (the peer's NCCL "connection closed by peer", handled first), through the
// Coordinator with a real JobStore and no gRPC: its report still moves the job to larger GPUs
// without spending an attempt, or fails it with the reason when no known worker has them, once,
// across restarts too. A report of an older attempt, or of a job the peer's failure finished,
// changes nothing but the record: every late rank failure is a RankExited event once.
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_error.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/metrics/coordinator_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

std::string TempDbPath() {
  std::string dir = ::testing::TempDir();
  std::string pattern = absl::StrCat(dir, dir.empty() || dir.back() != '/' ? "/" : "",
                                     "coordinator_device_too_small_test_XXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern + "/dropless.db";
}

// `ranks` cuda ranks (ep) that may run `max_attempts` times.
std::string CudaSpec(int ranks, int max_attempts) {
  return absl::StrFormat(R"yaml(name: tiny
max_attempts: %d
model: {hidden: 64, ffn: 128, experts: 8, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: %d, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
resources: {backend: cuda}
)yaml",
                         max_attempts, ranks);
}

v1::RankStatus StatusOf(const std::string& job_id, int attempt, int rank, v1::RankState state,
                        int exit_code = 0) {
  v1::RankStatus status;
  status.set_job_id(job_id);
  status.set_attempt(attempt);
  status.set_rank(rank);
  status.set_state(state);
  status.set_exit_code(exit_code);
  return status;
}

class CoordinatorDeviceTooSmallTest : public ::testing::Test {
 protected:
  void Open(const std::string& path) {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    absl::StatusOr<std::unique_ptr<Coordinator>> created =
        Coordinator::Create(*std::move(store), CoordinatorOptions{}, &metrics_);
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
  }

  // Registers the node (cuda slots of `gib` GiB each) and says hello on a new session, listing
  // `live` (ranks its daemon still runs); the session.
  std::shared_ptr<WorkerSession> Join(const std::string& node, int slots, int64_t gib,
                                      const std::vector<v1::RankStatus>& live = {}) {
    v1::RegisterWorkerRequest request;
    request.set_node(node);
    request.set_slot_kind("cuda");
    for (int i = 0; i < slots; ++i) {
      request.add_devices("gpu");
      request.add_device_memory_bytes(gib * kGiB);
    }
    absl::StatusOr<v1::RegisterWorkerResponse> registered = coordinator_->RegisterWorker(request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return nullptr;
    auto session = std::make_shared<WorkerSession>("peer", nullptr);
    coordinator_->AddSession(session);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(registered->worker_id());
    for (const v1::RankStatus& status : live) *hello.mutable_hello()->add_ranks() = status;
    EXPECT_TRUE(coordinator_->HandleWorkerMessage(session, hello).ok());
    return session;
  }

  void Report(const std::shared_ptr<WorkerSession>& session, const std::string& job_id, int attempt,
              int rank, v1::RankState state, int exit_code = 0) {
    v1::WorkerMessage message;
    *message.mutable_rank_status() = StatusOf(job_id, attempt, rank, state, exit_code);
    EXPECT_TRUE(coordinator_->HandleWorkerMessage(session, message).ok());
  }

  std::string Submit(const std::string& spec) {
    v1::SubmitJobRequest request;
    request.set_spec_yaml(spec);
    absl::StatusOr<v1::Job> job = coordinator_->SubmitJob(request);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  v1::Job Get(const std::string& id) {
    absl::StatusOr<v1::Job> job = coordinator_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job{};
  }

  // The events of `type` of the job whose message has `text`.
  int EventsSay(const std::string& id, const std::string& type, const std::string& text) {
    absl::StatusOr<std::vector<v1::Event>> events = coordinator_->ListEvents(id, 0);
    EXPECT_TRUE(events.ok()) << events.status();
    int found = 0;
    for (const v1::Event& e : *events) {
      found += e.type() == type && absl::StrContains(e.message(), text);
    }
    return found;
  }
  int RetryingSays(const std::string& id, const std::string& text) {
    return EventsSay(id, "Retrying", text);
  }

  // A 2-rank job of `max_attempts` running on `small` (2 GPUs of 80 GiB), whose rank 1 failed
  // with exit code 1 first: PENDING again, rank 0's slot still busy. Its id.
  std::string PeerFailedFirst(const std::shared_ptr<WorkerSession>& small, int max_attempts) {
    const std::string job = Submit(CudaSpec(2, max_attempts));
    v1::Job placed = Get(job);
    EXPECT_EQ(placed.state(), v1::JOB_STATE_SCHEDULED) << placed.message();
    EXPECT_EQ(placed.placement_size(), 2);
    if (placed.placement_size() > 0) EXPECT_EQ(placed.placement(0).node(), "node-h100");
    Report(small, job, 1, 0, v1::RANK_STATE_RUNNING);
    Report(small, job, 1, 1, v1::RANK_STATE_RUNNING);
    Report(small, job, 1, 1, v1::RANK_STATE_FAILED, 1);
    return job;
  }

  CoordinatorMetrics metrics_;
  std::unique_ptr<Coordinator> coordinator_;
};

constexpr char kRanOutOfMemory[] =
    "attempt 1 ran out of memory on a GPU of 80.0 GiB; queued for attempt 2 on GPUs with more "
    "memory (not counted against max_attempts)";

TEST_F(CoordinatorDeviceTooSmallTest, ALateOutOfMemoryReportMovesTheJobToLargerGpus) {
  ASSERT_NO_FATAL_FAILURE(Open(TempDbPath()));
  // A larger worker that is away for now still counts: the job waits for it.
  coordinator_->RemoveSession(Join("node-h200", 2, 141));
  std::shared_ptr<WorkerSession> small = Join("node-h100", 2, 80);
  const std::string job = PeerFailedFirst(small, /*max_attempts=*/2);
  v1::Job retried = Get(job);
  ASSERT_EQ(retried.state(), v1::JOB_STATE_PENDING) << retried.message();
  EXPECT_EQ(retried.uncounted_attempts(), 0);

  Report(small, job, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  v1::Job moved = Get(job);
  EXPECT_EQ(moved.state(), v1::JOB_STATE_PENDING) << moved.message();
  EXPECT_EQ(moved.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(moved.uncounted_attempts(), 1) << "the peer's failure counted attempt 1";
  EXPECT_EQ(moved.message(), "attempt 1 failed: rank 0 on node node-h100 failed with exit code 79");
  EXPECT_EQ(RetryingSays(job, kRanOutOfMemory), 1);
  // Sent again (its acknowledgement lost): once is all.
  Report(small, job, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  EXPECT_EQ(Get(job).uncounted_attempts(), 1);
  EXPECT_EQ(RetryingSays(job, kRanOutOfMemory), 1);

  // Both small GPUs are free, and not for this job: the larger worker's, once it is back.
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  std::shared_ptr<WorkerSession> large = Join("node-h200", 2, 141);
  v1::Job second = Get(job);
  EXPECT_EQ(second.attempt(), 2);
  ASSERT_EQ(second.placement_size(), 2);
  EXPECT_EQ(second.placement(0).node(), "node-h200");

  // Attempt 1 is not counted: with max_attempts 2, a failed attempt 2 still has a retry.
  Report(large, job, 2, 1, v1::RANK_STATE_FAILED, 1);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING) << Get(job).message();
  EXPECT_EQ(RetryingSays(job, "attempt 2 (1 of 2 counted) failed; queued for attempt 3"), 1);
}

TEST_F(CoordinatorDeviceTooSmallTest, WithoutALargerGpuTheLateReportFailsTheJobWithTheReason) {
  ASSERT_NO_FATAL_FAILURE(Open(TempDbPath()));
  std::shared_ptr<WorkerSession> small = Join("node-h100", 2, 80);
  const std::string job = PeerFailedFirst(small, /*max_attempts=*/3);
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);

  Report(small, job, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  v1::Job failed = Get(job);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  // FailAttemptOnTooSmallDevice's words, as if this report had come first.
  EXPECT_EQ(failed.message(),
            "attempt 1 failed: rank 0 on node node-h100 failed with exit code 79; not retried: "
            "no known cuda worker has 2 GPU(s) with more than 80.0 GiB on one node (submit it "
            "again once one has joined)");
  EXPECT_EQ(failed.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(failed.attempt(), 1);
}

// Both ends in one worker message batch (one commit): the same.
TEST_F(CoordinatorDeviceTooSmallTest, BothEndsInOneBatchAreTheSame) {
  ASSERT_NO_FATAL_FAILURE(Open(TempDbPath()));
  coordinator_->RemoveSession(Join("node-h200", 2, 141));
  std::shared_ptr<WorkerSession> small = Join("node-h100", 2, 80);
  const std::string job = Submit(CudaSpec(2, /*max_attempts=*/2));
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_SCHEDULED);
  std::vector<v1::WorkerMessage> batch(2);
  *batch[0].mutable_rank_status() = StatusOf(job, 1, 1, v1::RANK_STATE_FAILED, 1);
  *batch[1].mutable_rank_status() =
      StatusOf(job, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  ASSERT_TRUE(coordinator_->HandleWorkerMessages(small, batch).ok());
  v1::Job moved = Get(job);
  EXPECT_EQ(moved.state(), v1::JOB_STATE_PENDING) << moved.message();
  EXPECT_EQ(moved.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(moved.uncounted_attempts(), 1);
  EXPECT_EQ(RetryingSays(job, kRanOutOfMemory), 1);
}

// What the store holds decides it after a restart: the ended attempt is read back, and the
// report's effect, stored with the rank's end in the attempt's row, is not applied twice.
TEST_F(CoordinatorDeviceTooSmallTest, TheLateReportCountsOnceAcrossRestarts) {
  const std::string path = TempDbPath();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  coordinator_->RemoveSession(Join("node-h200", 2, 141));
  std::shared_ptr<WorkerSession> small = Join("node-h100", 2, 80);
  const std::string job = PeerFailedFirst(small, /*max_attempts=*/2);
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);

  // Restarted before rank 0's end arrives; its daemon lists it as still running.
  coordinator_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  small = Join("node-h100", 2, 80, {StatusOf(job, 1, 0, v1::RANK_STATE_RUNNING)});
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  Report(small, job, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  v1::Job moved = Get(job);
  EXPECT_EQ(moved.state(), v1::JOB_STATE_PENDING) << moved.message();
  EXPECT_EQ(moved.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(moved.uncounted_attempts(), 1);

  // Restarted again, and the report comes again: nothing more.
  coordinator_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  small = Join("node-h100", 2, 80);
  Report(small, job, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  v1::Job stored = Get(job);
  EXPECT_EQ(stored.state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(stored.needs_device_memory_above_bytes(), 80 * kGiB);
  EXPECT_EQ(stored.uncounted_attempts(), 1);
  EXPECT_EQ(RetryingSays(job, kRanOutOfMemory), 1);
}

// As before: once the job was placed again, attempt 1's report is an older attempt's; once the
// peer's failure finished the job (its last attempt), its end stays (it was stored and announced:
// watchers ended, `submit --wait` returned).
TEST_F(CoordinatorDeviceTooSmallTest, AnOlderAttemptOrAFinishedJobIsNotChanged) {
  ASSERT_NO_FATAL_FAILURE(Open(TempDbPath()));
  std::shared_ptr<WorkerSession> small = Join("node-h100", 2, 80);
  std::shared_ptr<WorkerSession> large = Join("node-h200", 2, 141);
  const std::string moved = PeerFailedFirst(small, /*max_attempts=*/2);
  ASSERT_EQ(Get(moved).attempt(), 2) << "placed again at once, on the free larger GPUs";
  Report(small, moved, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  v1::Job second = Get(moved);
  EXPECT_EQ(second.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(second.needs_device_memory_above_bytes(), 0);
  EXPECT_EQ(second.uncounted_attempts(), 0);

  const std::string finished = PeerFailedFirst(small, /*max_attempts=*/1);
  ASSERT_EQ(Get(finished).state(), v1::JOB_STATE_FAILED);
  const std::string message = Get(finished).message();
  EXPECT_THAT(message, HasSubstr("attempt 1 of 1 failed: rank 1"));
  Report(small, finished, 1, 0, v1::RANK_STATE_FAILED, kRankExitDeviceTooSmall);
  v1::Job still = Get(finished);
  EXPECT_EQ(still.state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(still.message(), message);
  EXPECT_EQ(still.needs_device_memory_above_bytes(), 0);
  // Its own reason is on record all the same.
  EXPECT_EQ(EventsSay(finished, "RankExited",
                      absl::StrFormat("rank 0 on node node-h100 failed with exit code %d",
                                      kRankExitDeviceTooSmall)),
            1);
}

// Every rank's own failure is on record, whenever it comes: the peer whose report came second
// (its NCCL error, or the root cause) gets a RankExited event that says its attempt had ended,
// and its end is in the attempt's row: once, across report resends and restarts, for a job that
// finished (retired from memory too) as for one queued again, for an older attempt too. Kills
// (the cancellation reaching the rank) are not news.
TEST_F(CoordinatorDeviceTooSmallTest, ALateRankFailureIsRecordedOnce) {
  const std::string path = TempDbPath();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  std::shared_ptr<WorkerSession> small = Join("node-h100", 4, 80);
  const std::string finished = PeerFailedFirst(small, /*max_attempts=*/1);
  ASSERT_EQ(Get(finished).state(), v1::JOB_STATE_FAILED);
  const std::string late = "rank 0 on node node-h100 failed with exit code 3";
  EXPECT_EQ(EventsSay(finished, "RankExited", late), 0);
  Report(small, finished, 1, 0, v1::RANK_STATE_FAILED, 3);
  Report(small, finished, 1, 0, v1::RANK_STATE_FAILED, 3);  // sent again
  EXPECT_EQ(EventsSay(finished, "RankExited", late + " (after attempt 1 had ended)"), 1);
  EXPECT_EQ(Get(finished).state(), v1::JOB_STATE_FAILED);

  // A job queued again: attempt 1's late end is recorded; the job goes on as before (placed
  // again on the slot the end freed, nothing uncounted, no larger GPUs asked for). A kill is not
  // recorded.
  const std::string queued = PeerFailedFirst(small, /*max_attempts=*/3);
  Report(small, queued, 1, 0, v1::RANK_STATE_KILLED);
  EXPECT_EQ(EventsSay(queued, "RankExited", "rank 0 on node node-h100 was killed"), 0);
  Report(small, queued, 1, 0, v1::RANK_STATE_FAILED, 1);
  EXPECT_EQ(EventsSay(queued, "RankExited",
                      "rank 0 on node node-h100 failed with exit code 1 (after attempt 1"),
            1);
  const v1::Job next = Get(queued);
  EXPECT_EQ(next.attempt(), 2);
  EXPECT_EQ(next.state(), v1::JOB_STATE_SCHEDULED);
  EXPECT_EQ(next.uncounted_attempts(), 0);
  EXPECT_EQ(next.needs_device_memory_above_bytes(), 0);

  // A finished job whose peer reports only after a restart (the job retired from memory: read
  // from the store): recorded then, once; the ends recorded before the restart are not again.
  const std::string later = PeerFailedFirst(small, /*max_attempts=*/1);
  ASSERT_EQ(Get(later).state(), v1::JOB_STATE_FAILED);
  coordinator_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  std::shared_ptr<WorkerSession> again = Join("node-h100", 4, 80);
  for (int round = 0; round < 2; ++round) {
    Report(again, later, 1, 0, v1::RANK_STATE_FAILED, 2);
    Report(again, finished, 1, 0, v1::RANK_STATE_FAILED, 3);
    Report(again, queued, 1, 0, v1::RANK_STATE_FAILED, 1);
  }
  EXPECT_EQ(EventsSay(later, "RankExited",
                      "rank 0 on node node-h100 failed with exit code 2 (after attempt 1"),
            1);
  EXPECT_EQ(EventsSay(finished, "RankExited", late), 1);
  EXPECT_EQ(EventsSay(queued, "RankExited", "failed with exit code 1 (after attempt 1"), 1);
}

// Late ends of several ranks of a retired job in one batch of statuses (each read from the store)
// all land in the attempt's row: the same reports after a restart change nothing.
TEST_F(CoordinatorDeviceTooSmallTest, LateEndsInOneBatchAreAllRecorded) {
  const std::string path = TempDbPath();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  std::shared_ptr<WorkerSession> node = Join("node-h100", 4, 80);
  const std::string job = Submit(CudaSpec(4, /*max_attempts=*/1));
  for (int rank = 0; rank < 4; ++rank) Report(node, job, 1, rank, v1::RANK_STATE_RUNNING);
  Report(node, job, 1, 3, v1::RANK_STATE_FAILED, kRankExitJobError);
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  std::vector<v1::WorkerMessage> batch(3);
  for (int rank = 0; rank < 3; ++rank) {
    *batch[rank].mutable_rank_status() = StatusOf(job, 1, rank, v1::RANK_STATE_FAILED, 1);
  }
  ASSERT_TRUE(coordinator_->HandleWorkerMessages(node, batch).ok());
  coordinator_.reset();
  ASSERT_NO_FATAL_FAILURE(Open(path));
  std::shared_ptr<WorkerSession> again = Join("node-h100", 4, 80);
  for (int rank = 0; rank < 3; ++rank) Report(again, job, 1, rank, v1::RANK_STATE_FAILED, 1);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(EventsSay(job, "RankExited",
                        absl::StrFormat("rank %d on node node-h100 failed with exit code 1 (after "
                                        "attempt 1 had ended)",
                                        rank)),
              1)
        << "rank " << rank;
  }
}

}  // namespace
}  // namespace dropless::coordinator
