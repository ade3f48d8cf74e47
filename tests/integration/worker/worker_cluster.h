// A coordinator and workers on loopback for the worker integration tests: real binaries started
// with the test harness, plus a JobService client.
#ifndef DROPLESS_TESTS_INTEGRATION_WORKER_WORKER_CLUSTER_H_
#define DROPLESS_TESTS_INTEGRATION_WORKER_WORKER_CLUSTER_H_

#include <sys/types.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "tests/integration/harness/process.h"

namespace dropless::testing {

// pids of the rank processes of `job_id` of the coordinator at `coordinator` running on this
// machine (found by their command line; tests running in parallel share job ids).
std::vector<pid_t> RankPids(const std::string& coordinator, const std::string& job_id);

class WorkerCluster {
 public:
  WorkerCluster();
  ~WorkerCluster();

  // Starts (or restarts, on the same port and database) the coordinator, with `extra_flags` after
  // the cluster's own.
  absl::Status StartCoordinator(const std::vector<std::string>& extra_flags = {});
  // The coordinator's worker lease from the next StartCoordinator on (5 s unless set). Tests that
  // restart the coordinator and then their daemons, which must say Hello within the lease of the
  // restart, take a longer one so that a loaded machine does not fail the attempt.
  void set_lease_timeout(absl::Duration lease) { lease_ = lease; }
  // SIGKILLs the coordinator and waits for it.
  void KillCoordinator();
  Process* coordinator() { return coordinator_.get(); }
  // Starts a worker daemon with one CPU slot and its own /metrics port, its work dir
  // worker_dir(node); `env` is added to its environment (and its ranks'), `extra_flags` after the
  // cluster's own flags (a repeated flag's last value wins).
  absl::Status StartWorker(const std::string& node,
                           const std::map<std::string, std::string>& env = {},
                           const std::vector<std::string>& extra_flags = {});
  std::string worker_dir(const std::string& node) const { return dir_ + "/" + node; }
  Process* worker(const std::string& node) { return workers_.at(node).process.get(); }
  int metrics_port(const std::string& node) const { return workers_.at(node).metrics_port; }

  // The worker of `node` as ListWorkers shows it, once `accept` holds (or nullopt at timeout).
  std::optional<dropless::v1::Worker> WaitForWorker(
      const std::string& node, const std::function<bool(const dropless::v1::Worker&)>& accept,
      absl::Duration timeout);

  absl::StatusOr<dropless::v1::Job> Submit(const std::string& spec_yaml);
  absl::StatusOr<dropless::v1::Job> Get(const std::string& job_id);
  absl::StatusOr<dropless::v1::Job> Cancel(const std::string& job_id);
  absl::StatusOr<std::vector<dropless::v1::Event>> Events(const std::string& job_id);
  // Every stored log line of the job's ranks, oldest first.
  absl::StatusOr<std::vector<dropless::v1::LogLine>> Logs(const std::string& job_id);
  // Every stored step metrics record of the job, oldest first.
  absl::StatusOr<std::vector<dropless::v1::StepMetrics>> StepMetrics(const std::string& job_id);
  // The job once its state is one of `states` (or the last state seen at timeout).
  absl::StatusOr<dropless::v1::Job> WaitForState(const std::string& job_id,
                                                 std::vector<dropless::v1::JobState> states,
                                                 absl::Duration timeout);
  // Follows WatchJob to the job's end; returns every StepMetrics seen and the final job.
  absl::StatusOr<dropless::v1::Job> Watch(const std::string& job_id, absl::Duration timeout,
                                          std::vector<dropless::v1::StepMetrics>* metrics);

  // Output of every process, for failure messages.
  std::string Diagnostics() const;

  // Rank processes of one of this cluster's jobs.
  std::vector<pid_t> RankPidsOf(const std::string& job_id) const {
    return RankPids(coordinator_address(), job_id);
  }

  const std::string& dir() const { return dir_; }
  std::string coordinator_address() const;

 private:
  struct Worker {
    std::unique_ptr<Process> process;
    int metrics_port = 0;
  };
  std::string dir_;
  int port_;
  absl::Duration lease_ = absl::Seconds(5);
  std::unique_ptr<Process> coordinator_;
  std::vector<std::string> old_coordinator_output_;
  std::map<std::string, Worker> workers_;
  std::unique_ptr<dropless::v1::JobService::Stub> stub_;
};

// tiny-cpu.yaml from configs/jobs with `steps` replaced.
std::string TinyCpuSpec(int steps = 0);

// True once none of `pids` exists, false after timeout.
bool WaitGone(const std::vector<pid_t>& pids, absl::Duration timeout);

}  // namespace dropless::testing

#endif  // DROPLESS_TESTS_INTEGRATION_WORKER_WORKER_CLUSTER_H_
