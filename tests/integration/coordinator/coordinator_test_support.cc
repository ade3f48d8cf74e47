#include "tests/integration/coordinator/coordinator_test_support.h"

#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <sqlite3.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace dropless::testing {

std::string TinySpec(int ranks, int max_attempts, const std::string& name) {
  return absl::StrFormat(R"yaml(name: %s
priority: 0
max_attempts: %d
model: {hidden: 64, ffn: 128, experts: %d, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: %d, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
dispatcher: auto
data: {distribution: uniform, seed: 7}
resources: {backend: cpu}
)yaml",
                         name, max_attempts, 4 * ranks, ranks);
}

std::unique_ptr<CoordinatorUnderTest> CoordinatorUnderTest::Start(
    const std::string& db, int64_t lease_ms, std::vector<std::string> extra_flags) {
  auto c = std::unique_ptr<CoordinatorUnderTest>(new CoordinatorUnderTest());
  c->db_ = db.empty() ? MakeTempDir() + "/coordinator.db" : db;
  c->lease_ms_ = lease_ms;
  c->extra_flags_ = std::move(extra_flags);
  c->grpc_port_ = PickFreePort();
  c->metrics_port_ = PickFreePort();
  c->Launch();
  return c;
}

void CoordinatorUnderTest::Launch() {
  std::vector<std::string> argv = {BinaryPath("dropless-coordinator"),
                                   "--insecure",
                                   absl::StrCat("--listen=127.0.0.1:", grpc_port_),
                                   absl::StrCat("--db=", db_),
                                   absl::StrCat("--metrics-port=", metrics_port_),
                                   "--metrics-address=127.0.0.1",
                                   absl::StrCat("--heartbeat-interval-ms=", kHeartbeatMs),
                                   absl::StrCat("--lease-timeout-ms=", lease_ms_)};
  argv.insert(argv.end(), extra_flags_.begin(), extra_flags_.end());
  auto process = Process::Start(std::move(argv));
  ASSERT_TRUE(process.ok()) << process.status();
  process_ = std::move(*process);
  ASSERT_TRUE(WaitForTcpPort(grpc_port_, absl::Seconds(20))) << process_->Output();
  channel_ = grpc::CreateChannel(address(), grpc::InsecureChannelCredentials());
  // Generous: on a loaded 2-core CI machine a fresh coordinator took over 10 s once.
  ASSERT_TRUE(channel_->WaitForConnected(std::chrono::system_clock::now() +
                                         std::chrono::seconds(30)));
  jobs_ = v1::JobService::NewStub(channel_);
  rendezvous_ = v1::RendezvousService::NewStub(channel_);
}

CoordinatorUnderTest::~CoordinatorUnderTest() {
  // Close the test's connection first: the server's shutdown waits for its clients to go.
  jobs_.reset();
  rendezvous_.reset();
  channel_.reset();
  if (process_ != nullptr && process_->Running()) {
    (void)process_->Signal(SIGTERM);
    absl::StatusOr<int> code = process_->Wait(absl::Seconds(15));
    EXPECT_TRUE(code.ok()) << "coordinator did not stop on SIGTERM";
    if (code.ok()) EXPECT_EQ(*code, 0) << process_->Output();
    if (getenv("DROPLESS_TEST_VERBOSE") != nullptr) std::cerr << process_->Output();
  }
}

void CoordinatorUnderTest::KillAndRestart() {
  ASSERT_NO_FATAL_FAILURE(Kill());
  Launch();
}

void CoordinatorUnderTest::Kill() {
  ASSERT_TRUE(process_->Signal(SIGKILL).ok());
  ASSERT_TRUE(process_->Wait(absl::Seconds(10)).ok());
}

absl::StatusOr<v1::Job> CoordinatorUnderTest::Submit(const std::string& spec,
                                                     const std::string& name, int priority) {
  grpc::ClientContext context;
  v1::SubmitJobRequest request;
  request.set_spec_yaml(spec);
  request.set_name(name);
  request.set_priority(priority);
  v1::Job job;
  grpc::Status status = jobs_->SubmitJob(&context, request, &job);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return job;
}

absl::StatusOr<v1::Job> CoordinatorUnderTest::Get(const std::string& id) {
  grpc::ClientContext context;
  v1::GetJobRequest request;
  request.set_id(id);
  v1::Job job;
  grpc::Status status = jobs_->GetJob(&context, request, &job);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  return job;
}

v1::Job CoordinatorUnderTest::WaitForJob(const std::string& id,
                                         const std::function<bool(const v1::Job&)>& pred,
                                         absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  v1::Job last;
  while (absl::Now() < deadline) {
    absl::StatusOr<v1::Job> job = Get(id);
    if (job.ok()) {
      last = *job;
      if (pred(last)) return last;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  return last;
}

v1::Job CoordinatorUnderTest::WaitForState(const std::string& id, v1::JobState state,
                                           absl::Duration timeout) {
  v1::Job job = WaitForJob(
      id, [state](const v1::Job& j) { return j.state() == state; }, timeout);
  EXPECT_EQ(v1::JobState_Name(job.state()), v1::JobState_Name(state))
      << "job " << id << ": " << job.message();
  return job;
}

std::vector<v1::Event> CoordinatorUnderTest::Events(const std::string& job_id) {
  grpc::ClientContext context;
  v1::ListEventsRequest request;
  request.set_job_id(job_id);
  v1::ListEventsResponse response;
  grpc::Status status = jobs_->ListEvents(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return {response.events().begin(), response.events().end()};
}

std::vector<v1::Worker> CoordinatorUnderTest::Workers() {
  grpc::ClientContext context;
  v1::ListWorkersResponse response;
  grpc::Status status = jobs_->ListWorkers(&context, v1::ListWorkersRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return {response.workers().begin(), response.workers().end()};
}

bool CoordinatorUnderTest::WaitForWorkerState(const std::string& node, v1::WorkerState state) {
  for (absl::Time until = absl::Now() + absl::Seconds(20); absl::Now() < until;) {
    for (const v1::Worker& w : Workers()) {
      if (w.node() == node && w.state() == state) return true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

FakeWorker::FakeWorker(std::shared_ptr<grpc::Channel> channel, std::string node, int slots,
                       std::string slot_kind)
    : stub_(v1::WorkerService::NewStub(channel)),
      node_(std::move(node)),
      slots_(slots),
      slot_kind_(std::move(slot_kind)) {}

FakeWorker::~FakeWorker() { Disconnect(); }

absl::Status FakeWorker::Register(std::optional<std::string> boot_id) {
  if (boot_id.has_value()) boot_id_ = *boot_id;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::RegisterWorkerRequest request;
  request.set_node(node_);
  request.set_address("127.0.0.1");
  request.set_metrics_port(0);
  request.set_slot_kind(slot_kind_);
  for (int i = 0; i < slots_; ++i) {
    request.add_devices(slot_kind_ == "cpu" ? "cpu" : "fake gpu");
    if (gpu_memory_bytes_ > 0) request.add_device_memory_bytes(gpu_memory_bytes_);
  }
  request.set_version("test");
  request.set_boot_id(boot_id_);
  v1::RegisterWorkerResponse response;
  grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        status.error_message());
  }
  worker_id_ = response.worker_id();
  return absl::OkStatus();
}

absl::Status FakeWorker::Join(const std::string& boot_id) {
  if (absl::Status registered = Register(boot_id); !registered.ok()) return registered;
  return Connect(boot_id);
}

absl::Status FakeWorker::Connect(const std::string& boot_id,
                                 const std::vector<v1::RankStatus>& also_list) {
  Disconnect();
  boot_id_ = boot_id;
  stop_ = false;
  context_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Session(context_.get());
  session_ended_ = false;
  {
    absl::MutexLock lock(&mu_);
    final_status_.reset();
  }
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker_id_);
  hello.mutable_hello()->set_boot_id(boot_id);
  hello.mutable_hello()->set_takes_resent_assignments(takes_resent_assignments_);
  for (const v1::RankStatus& rank : LiveRanks()) *hello.mutable_hello()->add_ranks() = rank;
  for (const v1::RankStatus& rank : also_list) *hello.mutable_hello()->add_ranks() = rank;
  absl::Status sent = Send(hello);
  reader_ = std::thread([this] {
    v1::CoordinatorMessage message;
    while (stream_->Read(&message)) {
      absl::MutexLock lock(&mu_);
      inbox_.push_back(message);
    }
    grpc::Status status = stream_->Finish();
    {
      absl::MutexLock lock(&mu_);
      final_status_ = status;
    }
    session_ended_ = true;  // after the status, so a closed session always has one
  });
  heartbeats_on_ = true;
  heartbeat_ = std::thread([this] {
    while (!stop_) {
      absl::SleepFor(absl::Milliseconds(kHeartbeatMs));
      if (!heartbeats_on_ || stop_) continue;
      v1::WorkerMessage beat;
      beat.mutable_heartbeat()->set_time_ms(absl::ToUnixMillis(absl::Now()));
      for (const v1::RankStatus& rank : LiveRanks()) {
        *beat.mutable_heartbeat()->add_ranks() = rank;
      }
      (void)Send(beat);
    }
  });
  return sent;
}

void FakeWorker::StopThreads() {
  stop_ = true;
  if (heartbeat_.joinable()) heartbeat_.join();
  if (reader_.joinable()) reader_.join();
}

void FakeWorker::Disconnect() {
  if (context_ == nullptr) return;
  context_->TryCancel();
  StopThreads();
  stream_.reset();
  context_.reset();
}

absl::Status FakeWorker::Send(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  if (stream_ == nullptr || !stream_->Write(message)) {
    return absl::UnavailableError("session stream is closed");
  }
  return absl::OkStatus();
}

absl::Status FakeWorker::SendAll(const std::vector<v1::WorkerMessage>& messages) {
  absl::MutexLock lock(&write_mu_);
  for (size_t i = 0; i < messages.size(); ++i) {
    grpc::WriteOptions options;
    if (i + 1 < messages.size()) options.set_buffer_hint();
    if (stream_ == nullptr || !stream_->Write(messages[i], options)) {
      return absl::UnavailableError("session stream is closed");
    }
  }
  return absl::OkStatus();
}

std::optional<grpc::Status> FakeWorker::SessionStatus() {
  absl::MutexLock lock(&mu_);
  return final_status_;
}

std::vector<v1::RankStatus> FakeWorker::LiveRanks() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::RankStatus> out;
  for (const auto& [key, state] : ranks_) {
    if (state != v1::RANK_STATE_STARTING && state != v1::RANK_STATE_RUNNING) continue;
    v1::RankStatus& status = out.emplace_back();
    status.set_job_id(std::get<0>(key));
    status.set_attempt(std::get<1>(key));
    status.set_rank(std::get<2>(key));
    status.set_state(state);
  }
  return out;
}

std::optional<v1::CoordinatorMessage> FakeWorker::Next(
    const std::function<bool(const v1::CoordinatorMessage&)>& match, absl::Duration timeout) {
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
        if (match(*it)) {
          v1::CoordinatorMessage found = *it;
          inbox_.erase(it);
          return found;
        }
      }
    }
    if (absl::Now() >= deadline) return std::nullopt;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

std::optional<v1::Assignment> FakeWorker::NextAssignment(absl::Duration timeout) {
  auto m = Next([](const v1::CoordinatorMessage& m) { return m.has_assignment(); }, timeout);
  if (!m.has_value()) return std::nullopt;
  return m->assignment();
}

std::optional<v1::Cancellation> FakeWorker::NextCancellation(absl::Duration timeout) {
  auto m = Next([](const v1::CoordinatorMessage& m) { return m.has_cancellation(); }, timeout);
  if (!m.has_value()) return std::nullopt;
  return m->cancellation();
}

absl::Status FakeWorker::ReportRank(const std::string& job_id, int attempt, int rank,
                                    v1::RankState state, int exit_code) {
  {
    absl::MutexLock lock(&mu_);
    ranks_[RankKey(job_id, attempt, rank)] = state;
  }
  v1::WorkerMessage message;
  v1::RankStatus* status = message.mutable_rank_status();
  status->set_job_id(job_id);
  status->set_attempt(attempt);
  status->set_rank(rank);
  status->set_state(state);
  status->set_exit_code(exit_code);
  if (state == v1::RANK_STATE_FAILED) status->set_message("simulated failure");
  return Send(message);
}

absl::Status FakeWorker::ReportMetrics(const std::string& job_id, int attempt, int rank,
                                       int64_t step, int64_t steps, double loss) {
  v1::WorkerMessage message;
  v1::StepMetrics* m = message.mutable_metrics();
  m->set_job_id(job_id);
  m->set_attempt(attempt);
  m->set_rank(rank);
  m->set_step(step);
  m->set_steps(steps);
  m->set_loss(loss);
  m->set_step_seconds(0.01);
  m->set_tflops(1.5);
  return Send(message);
}

absl::Status FakeWorker::ReportLog(const std::string& job_id, int attempt, int rank,
                                   const std::string& text) {
  v1::WorkerMessage message;
  v1::LogLine* line = message.mutable_logs()->add_lines();
  line->set_job_id(job_id);
  line->set_attempt(attempt);
  line->set_rank(rank);
  line->set_text(text);
  return Send(message);
}

grpc::Status RawUnaryCall(grpc::Channel* channel, const std::string& method,
                          const std::string& request, std::string* response) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);
  grpc::ByteBuffer out;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &in, &out,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  response->clear();
  std::vector<grpc::Slice> slices;
  if (status.ok() && out.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

grpc::Status RawBidiExchange(grpc::Channel* channel, const std::string& method,
                             const std::string& request, std::string* response) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::CompletionQueue cq;
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t expected) {
    return cq.Next(&tag, &ok) && ok && reinterpret_cast<intptr_t>(tag) == expected;
  };
  auto call = stub.PrepareCall(&context, method, &cq);
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(1)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "start failed");
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1);
  call->Write(in, reinterpret_cast<void*>(2));
  if (!step(2)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed");
  call->WritesDone(reinterpret_cast<void*>(3));
  if (!step(3)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "writes done failed");
  grpc::ByteBuffer out;
  call->Read(&out, reinterpret_cast<void*>(4));
  bool got = step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  response->clear();
  std::vector<grpc::Slice> slices;
  if (got && out.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      response->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

v1::RankStatus RankStatusOf(const std::string& job_id, int attempt, int rank, v1::RankState state) {
  v1::RankStatus status;
  status.set_job_id(job_id);
  status.set_attempt(attempt);
  status.set_rank(rank);
  status.set_state(state);
  return status;
}

v1::WorkerMessage QueuedMessage(const v1::RankStatus& status, uint64_t seq) {
  v1::WorkerMessage message;
  *message.mutable_rank_status() = status;
  message.set_seq(seq);
  return message;
}

bool NextAck(FakeWorker& w, uint64_t seq, absl::Duration timeout) {
  auto is_ack = [seq](const v1::CoordinatorMessage& m) {
    return m.has_ack() && m.ack().seq() == seq;
  };
  return w.Next(is_ack, timeout).has_value();
}

absl::Status RegisterAgain(FakeWorker& w, const std::string& boot_id) {
  absl::Status registered = w.Register(boot_id);
  for (int i = 0; i < 100 && !registered.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(100));
    registered = w.Register(boot_id);
  }
  return registered;
}

absl::StatusOr<v1::Job> SubmitRunning(CoordinatorUnderTest& coordinator, FakeWorker& w,
                                      const std::string& spec) {
  absl::StatusOr<v1::Job> job = coordinator.Submit(spec);
  if (!job.ok()) return job.status();
  std::optional<v1::Assignment> assignment = w.NextAssignment();
  if (!assignment.has_value()) return absl::DeadlineExceededError("no Assignment came");
  for (const v1::RankAssignment& r : assignment->ranks()) {
    if (absl::Status s = w.ReportRank(job->id(), 1, r.rank(), v1::RANK_STATE_RUNNING); !s.ok()) {
      return s;
    }
  }
  v1::Job running = coordinator.WaitForState(job->id(), v1::JOB_STATE_RUNNING);
  if (running.state() != v1::JOB_STATE_RUNNING) {
    return absl::DeadlineExceededError(absl::StrCat(job->id(), " did not start running"));
  }
  return job;
}

void LimitFileSize(Process& process, rlim_t bytes) {
  rlimit limit{};
  ASSERT_EQ(prlimit(process.pid(), RLIMIT_FSIZE, nullptr, &limit), 0);
  limit.rlim_cur = std::min(bytes, limit.rlim_max);
  ASSERT_EQ(prlimit(process.pid(), RLIMIT_FSIZE, &limit, nullptr), 0);
}

bool HasEvent(CoordinatorUnderTest& coordinator, const std::string& job_id,
              const std::string& type) {
  for (const v1::Event& e : coordinator.Events(job_id)) {
    if (e.type() == type) return true;
  }
  return false;
}

namespace {

// The value of a counter series ("name{labels} " or "name ") as /metrics shows it; -1 if absent.
int64_t CounterValue(CoordinatorUnderTest& coordinator, const std::string& series) {
  const std::string text = HttpGet(coordinator.metrics_port(), "/metrics");
  const size_t at = text.find(series);
  if (at == std::string::npos) return -1;
  return static_cast<int64_t>(std::strtod(text.c_str() + at + series.size(), nullptr));
}

}  // namespace

int64_t StoreCommits(CoordinatorUnderTest& coordinator, const std::string& sync) {
  return CounterValue(
      coordinator, absl::StrCat("dropless_coordinator_store_commits_total{sync=\"", sync, "\"} "));
}

int64_t StoreCommitFailures(CoordinatorUnderTest& coordinator) {
  return CounterValue(coordinator, "\ndropless_coordinator_store_commit_failures_total ");
}

int64_t JobsExpired(CoordinatorUnderTest& coordinator) {
  return CounterValue(coordinator, "\ndropless_coordinator_jobs_expired_total ");
}

int64_t WorkersForgotten(CoordinatorUnderTest& coordinator) {
  return CounterValue(coordinator, "\ndropless_coordinator_workers_forgotten_total ");
}

absl::StatusOr<v1::JobState> StoredAttemptState(const std::string& db, const std::string& job_id,
                                                int attempt) {
  sqlite3* handle = nullptr;
  if (sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    std::string error = handle != nullptr ? sqlite3_errmsg(handle) : "out of memory";
    sqlite3_close(handle);
    return absl::InternalError(absl::StrCat("opening ", db, ": ", error));
  }
  sqlite3_stmt* statement = nullptr;
  absl::StatusOr<v1::JobState> state =
      absl::NotFoundError(absl::StrCat("no row of ", job_id, " attempt ", attempt, " in ", db));
  if (sqlite3_prepare_v2(handle, "SELECT state FROM attempts WHERE job_id = ?1 AND attempt = ?2",
                         -1, &statement, nullptr) != SQLITE_OK) {
    state = absl::InternalError(sqlite3_errmsg(handle));
  } else {
    sqlite3_bind_text(statement, 1, job_id.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(statement, 2, attempt);
    if (sqlite3_step(statement) == SQLITE_ROW) {
      state = static_cast<v1::JobState>(sqlite3_column_int(statement, 0));
    }
  }
  sqlite3_finalize(statement);
  sqlite3_close(handle);
  return state;
}

absl::Status ExecStoreSql(const std::string& db, const std::string& sql) {
  sqlite3* handle = nullptr;
  absl::Status status;
  if (sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
    status = absl::InternalError(absl::StrCat(
        "opening ", db, ": ", handle != nullptr ? sqlite3_errmsg(handle) : "out of memory"));
  } else if (char* error = nullptr;
             sqlite3_exec(handle, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
    status = absl::InternalError(
        absl::StrCat(sql, " on ", db, ": ", error != nullptr ? error : sqlite3_errmsg(handle)));
    sqlite3_free(error);
  }
  sqlite3_close(handle);
  return status;
}

}  // namespace dropless::testing
