// FakeCpuWorker: speaks the worker side of WorkerService to a real coordinator (register, Hello,
// heartbeats, rank status) without starting rank processes, so a test can hold a job attempt
// active and use its rendezvous keyspace from threads of the test itself.
#ifndef DROPLESS_TESTS_INTEGRATION_TRANSPORT_FAKE_CPU_WORKER_H_
#define DROPLESS_TESTS_INTEGRATION_TRANSPORT_FAKE_CPU_WORKER_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "dropless/v1/worker_service.grpc.pb.h"

namespace dropless::testing {

struct AttemptScope {
  std::string job_id;
  int attempt = 0;
  std::string secret;  // Assignment.rendezvous_secret
};

class FakeCpuWorker {
 public:
  // Registers `node` with `slots` CPU slots and opens its session.
  static absl::StatusOr<std::unique_ptr<FakeCpuWorker>> Start(const std::string& coordinator,
                                                             const std::string& node, int slots);
  ~FakeCpuWorker();

  // Waits for the first Assignment, reports its ranks RUNNING, returns its scope.
  absl::StatusOr<AttemptScope> WaitForAssignment(absl::Duration timeout);

 private:
  FakeCpuWorker() = default;
  void ReadLoop();
  void HeartbeatLoop();
  bool Write(const v1::WorkerMessage& message) ABSL_LOCKS_EXCLUDED(write_mu_);

  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>> stream_;
  std::string worker_id_;
  absl::Duration heartbeat_interval_;
  absl::Mutex write_mu_;
  absl::Mutex mu_;
  std::optional<v1::Assignment> assignment_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_TRANSPORT_FAKE_CPU_WORKER_H_
