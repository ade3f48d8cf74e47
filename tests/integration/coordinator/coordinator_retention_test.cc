// Retention on the real coordinator (--job-retention): a finished job older than the retention is
// deleted by the sweep at start, after which the API answers for it as for an id never given
// (NOT_FOUND; ListJobs leaves it out), /metrics counts it, unfinished jobs stay, and its id is
// not given again; cluster-wide events as old go too. The job's end (and those events) are moved
// 31 days back in the stopped coordinator's database file, and it restarts with the default
// retention (720h). A retention shorter than an hour is refused.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/coordinator/coordinator_test_support.h"

namespace dropless::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<std::string> ListedIds(CoordinatorUnderTest& c) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListJobsResponse response;
  grpc::Status status = c.jobs().ListJobs(&context, v1::ListJobsRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> ids;
  for (const v1::Job& job : response.jobs()) ids.push_back(job.id());
  return ids;
}

grpc::StatusCode ListEventsCode(CoordinatorUnderTest& c, const std::string& job_id) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::ListEventsRequest request;
  request.set_job_id(job_id);
  v1::ListEventsResponse response;
  return c.jobs().ListEvents(&context, request, &response).error_code();
}

// The status GetLogs ends with, and the lines it sent.
grpc::StatusCode GetLogsCode(CoordinatorUnderTest& c, const std::string& job_id,
                             std::vector<std::string>* texts) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::GetLogsRequest request;
  request.set_job_id(job_id);
  auto reader = c.jobs().GetLogs(&context, request);
  v1::LogLine line;
  while (reader->Read(&line)) texts->push_back(line.text());
  return reader->Finish().error_code();
}

TEST(CoordinatorRetentionTest, ExpiredJobDisappearsFromTheApiAndIsCounted) {
  auto c = CoordinatorUnderTest::Start();
  auto w = std::make_unique<FakeWorker>(c->channel(), "node-keep", 1);
  ASSERT_TRUE(w->Join().ok());
  // Two ranks on a cluster of one slot: PENDING for good (it waits, blocking nothing).
  absl::StatusOr<v1::Job> waiting = c->Submit(TinySpec(2), "waiting");
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  // The newest job runs, logs and succeeds.
  absl::StatusOr<v1::Job> done = SubmitRunning(*c, *w, TinySpec(1, 1, "done"));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_TRUE(w->ReportLog(done->id(), 1, 0, "hello from rank 0").ok());
  ASSERT_TRUE(w->ReportMetrics(done->id(), 1, 0, 5, 5, 1.25).ok());
  ASSERT_TRUE(w->ReportRank(done->id(), 1, 0, v1::RANK_STATE_SUCCEEDED).ok());
  c->WaitForState(done->id(), v1::JOB_STATE_SUCCEEDED);
  std::vector<std::string> lines;
  ASSERT_EQ(GetLogsCode(*c, done->id(), &lines), grpc::StatusCode::OK);
  ASSERT_THAT(lines, ElementsAre("hello from rank 0"));
  // The default retention (720h) keeps it.
  EXPECT_EQ(JobsExpired(*c), 0);
  w.reset();  // its stream and channel gone, the coordinator stops without waiting for it

  EXPECT_TRUE(HasEvent(*c, "", "WorkerRegistered"));

  // Stopped (SIGTERM: the sweeper stops cleanly, exit 0); the job ended, and the cluster-wide
  // events so far were stored, 31 days ago as the file now says (the sweep reads the jobs'
  // end_time_ms column and the events' time_ms, never the job's blob); started again with the
  // default retention: the sweep at start deletes them.
  const std::string db = c->db();
  c.reset();
  const int64_t month_ms = absl::ToInt64Milliseconds(absl::Hours(31 * 24));
  ASSERT_TRUE(ExecStoreSql(db, absl::StrCat("UPDATE jobs SET end_time_ms = end_time_ms - ",
                                            month_ms, " WHERE id = '", done->id(),
                                            "'; UPDATE events SET time_ms = time_ms - ", month_ms,
                                            " WHERE job_id = ''"))
                  .ok());
  c = CoordinatorUnderTest::Start(db);
  absl::StatusOr<v1::Job> gone = c->Get(done->id());
  for (absl::Time deadline = absl::Now() + absl::Seconds(20); gone.ok() && absl::Now() < deadline;
       gone = c->Get(done->id())) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_THAT(gone.status().message(), HasSubstr(done->id()));
  EXPECT_EQ(JobsExpired(*c), 1);
  EXPECT_THAT(ListedIds(*c), ElementsAre(waiting->id()));
  EXPECT_EQ(ListEventsCode(*c, done->id()), grpc::StatusCode::NOT_FOUND);
  // The cluster-wide events of before go next (the same sweep, after the jobs); this start's
  // stays.
  for (absl::Time deadline = absl::Now() + absl::Seconds(20);
       HasEvent(*c, "", "WorkerRegistered") && absl::Now() < deadline;) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_FALSE(HasEvent(*c, "", "WorkerRegistered"));
  EXPECT_TRUE(HasEvent(*c, "", "CoordinatorStarted"));
  lines.clear();
  EXPECT_EQ(GetLogsCode(*c, done->id(), &lines), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(lines.empty());
  // Unfinished, however old: kept.
  absl::StatusOr<v1::Job> still = c->Get(waiting->id());
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::JOB_STATE_PENDING);

  // The deleted job was the newest: its id is not given again.
  absl::StatusOr<v1::Job> next = c->Submit(TinySpec(2), "next");
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(next->id(), done->id());
  EXPECT_GT(next->id(), done->id());  // job-NNNNNN: ordered as text
}

// Shorter than an hour (but 0) could delete a cancelled job whose ranks are still stopping when
// the coordinator restarts, and free their slots for a new gang (coordinator_config.h).
TEST(CoordinatorRetentionTest, RetentionUnderAnHourIsRefusedNamingTheFlag) {
  for (const char* retention : {"1s", "-5m"}) {
    absl::StatusOr<std::unique_ptr<Process>> process =
        Process::Start({BinaryPath("dropless-coordinator"), "--insecure", "--listen=127.0.0.1:0",
                        absl::StrCat("--db=", MakeTempDir(), "/c.db"), "--metrics-port=0",
                        absl::StrCat("--job-retention=", retention)});
    ASSERT_TRUE(process.ok()) << process.status();
    absl::StatusOr<int> code = (*process)->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 2) << retention;
    EXPECT_THAT((*process)->Output(),
                HasSubstr(absl::StrCat("job_retention (--job-retention): 0 (finished jobs kept "
                                       "for good) or at least 1h (got ",
                                       retention, ")")));
  }
}

}  // namespace
}  // namespace dropless::testing
