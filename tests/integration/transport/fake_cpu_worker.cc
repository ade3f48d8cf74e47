#include "tests/integration/transport/fake_cpu_worker.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace dropless::testing {

absl::StatusOr<std::unique_ptr<FakeCpuWorker>> FakeCpuWorker::Start(const std::string& coordinator,
                                                                   const std::string& node,
                                                                   int slots) {
  std::unique_ptr<FakeCpuWorker> worker(new FakeCpuWorker());
  worker->stub_ = v1::WorkerService::NewStub(
      grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()));
  v1::RegisterWorkerRequest request;
  request.set_node(node);
  request.set_address("127.0.0.1");
  request.set_slot_kind("cpu");
  for (int s = 0; s < slots; ++s) request.add_devices(absl::StrCat("cpu", s));
  request.set_version("transport-test");
  v1::RegisterWorkerResponse response;
  grpc::ClientContext register_context;
  register_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status status = worker->stub_->RegisterWorker(&register_context, request, &response);
  if (!status.ok()) {
    return absl::UnavailableError(absl::StrCat("RegisterWorker: ", status.error_message()));
  }
  worker->worker_id_ = response.worker_id();
  worker->heartbeat_interval_ = absl::Milliseconds(std::max<int64_t>(response.heartbeat_interval_ms(), 50));

  worker->stream_ = worker->stub_->Session(&worker->context_);
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker->worker_id_);
  if (!worker->Write(hello)) return absl::UnavailableError("Session: could not send Hello");
  worker->reader_ = std::thread([w = worker.get()] { w->ReadLoop(); });
  worker->heartbeat_ = std::thread([w = worker.get()] { w->HeartbeatLoop(); });
  return worker;
}

FakeCpuWorker::~FakeCpuWorker() {
  stop_.Notify();
  if (heartbeat_.joinable()) heartbeat_.join();
  context_.TryCancel();
  if (reader_.joinable()) reader_.join();
  if (stream_ != nullptr) stream_->Finish();
}

bool FakeCpuWorker::Write(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&write_mu_);
  return stream_->Write(message);
}

void FakeCpuWorker::ReadLoop() {
  v1::CoordinatorMessage message;
  while (stream_->Read(&message)) {
    if (message.has_assignment()) {
      absl::MutexLock lock(&mu_);
      if (!assignment_.has_value()) assignment_ = message.assignment();
    }
  }
}

void FakeCpuWorker::HeartbeatLoop() {
  while (!stop_.WaitForNotificationWithTimeout(heartbeat_interval_)) {
    v1::WorkerMessage message;
    v1::Heartbeat* heartbeat = message.mutable_heartbeat();
    heartbeat->set_time_ms(absl::ToUnixMillis(absl::Now()));
    {
      absl::MutexLock lock(&mu_);
      if (assignment_.has_value()) {
        for (const v1::RankAssignment& rank : assignment_->ranks()) {
          v1::RankStatus* status = heartbeat->add_ranks();
          status->set_job_id(assignment_->job_id());
          status->set_attempt(assignment_->attempt());
          status->set_rank(rank.rank());
          status->set_state(v1::RANK_STATE_RUNNING);
        }
      }
    }
    if (!Write(message)) return;
  }
}

absl::StatusOr<AttemptScope> FakeCpuWorker::WaitForAssignment(absl::Duration timeout) {
  v1::Assignment assignment;
  {
    absl::MutexLock lock(&mu_);
    auto assigned = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return assignment_.has_value(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&assigned), timeout)) {
      return absl::DeadlineExceededError("no Assignment from the coordinator");
    }
    assignment = *assignment_;
  }
  for (const v1::RankAssignment& rank : assignment.ranks()) {
    v1::WorkerMessage message;
    v1::RankStatus* status = message.mutable_rank_status();
    status->set_job_id(assignment.job_id());
    status->set_attempt(assignment.attempt());
    status->set_rank(rank.rank());
    status->set_state(v1::RANK_STATE_RUNNING);
    if (!Write(message)) return absl::UnavailableError("Session: could not send RankStatus");
  }
  return AttemptScope{assignment.job_id(), assignment.attempt(), assignment.rendezvous_secret()};
}

}  // namespace dropless::testing
