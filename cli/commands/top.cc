// dropless top ID [-w]: the latest step of every rank of a job, one row per rank: node, step,
// step time, TFLOP/s, MFU, memory, expert load (min/median/max tokens per expert over the EP
// group, and the imbalance max/mean) and loss, from the coordinator's stored step metrics.
// -w redraws every 2 seconds until the job ends.
// -o json|yaml: {"job_id", "state", "ranks": [<metrics object per rank>]}.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/expert_load.h"
#include "cli/output/table.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"
#include "cli/reconnect.h"

namespace dropless::cli {
namespace {

constexpr absl::Duration kRefresh = absl::Seconds(2);
// Stored metrics read per rank to find each rank's latest (ranks step in lockstep, give or take).
constexpr int kRecordsPerRank = 4;

std::string BytesText(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(bytes, "B") : absl::StrFormat("%.1f%s", v, units[u]);
}

// One snapshot, printed once both calls answered; the status of the call that failed.
grpc::Status Show(const Invocation& inv, Client& client, const std::string& id,
                  v1::JobState* state) {
  v1::GetJobRequest job_request;
  job_request.set_id(id);
  v1::Job job;
  grpc::Status status = client.jobs().GetJob(client.UnaryContext().get(), job_request, &job);
  if (!status.ok()) return status;
  *state = job.state();
  v1::ListStepMetricsRequest request;
  request.set_job_id(id);
  request.set_limit(std::max(1, job.world_size()) * kRecordsPerRank);
  v1::ListStepMetricsResponse response;
  status = client.jobs().ListStepMetrics(client.UnaryContext().get(), request, &response);
  if (!status.ok()) return status;
  std::map<int, const v1::StepMetrics*> latest;  // oldest first: later records win
  for (const v1::StepMetrics& m : response.metrics()) {
    if (m.attempt() == job.attempt()) latest[m.rank()] = &m;
  }
  if (inv.options.output != OutputFormat::kText) {
    Value ranks = Value::Array();
    for (const auto& [rank, m] : latest) ranks.Push(MetricsView(*m));
    PrintStructured(Value::Object()
                        .Set("job_id", Value::String(job.id()))
                        .Set("state", Value::String(JobStateName(job.state())))
                        .Set("ranks", std::move(ranks)),
                    inv.options.output);
    return grpc::Status::OK;
  }
  std::cout << ForDisplay(
      absl::StrCat("job ", job.id(), " (", job.name(), ") ", JobStateName(job.state()),
                   ", attempt ", job.attempt(), ", ", job.world_size(), " ranks\n"),
      STDOUT_FILENO);
  if (latest.empty()) {
    std::cout << "No step metrics yet.\n";
    return grpc::Status::OK;
  }
  Table table({"RANK", "NODE", "STEP", "STEP_TIME", "TFLOP/S", "MFU", "MEMORY",
               "EXPERT_TOKENS(MIN/MED/MAX)", "LOAD_IMBALANCE", "LOSS"});
  for (const auto& [rank, m] : latest) {
    table.AddRow({absl::StrCat(rank), m->node(), absl::StrCat(m->step(), "/", m->steps()),
                  absl::StrFormat("%.1fms", m->step_seconds() * 1e3),
                  absl::StrFormat("%.3g", m->tflops()), absl::StrFormat("%.1f%%", m->mfu() * 100),
                  BytesText(m->device_memory_bytes()), ExpertLoadCell(*m),
                  absl::StrFormat("%.3f", m->load_imbalance()),
                  absl::StrFormat("%.6g", m->loss())});
  }
  std::cout << ForDisplay(table.Render(), STDOUT_FILENO);  // node names are the workers'
  return grpc::Status::OK;
}

}  // namespace

int RunTop(const Invocation& inv) {
  std::vector<std::string> pos = inv.args.positional();
  if (pos.size() == 2 && (pos[0] == "job" || pos[0] == "jobs")) pos.erase(pos.begin());
  if (pos.size() != 1) return UsageError("usage: dropless top ID [-w]");
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  const bool watch = inv.args.Has("watch");
  Reconnection reconnection("top");  // -w rides out a coordinator restart, as `watch` does
  bool shown = false;
  while (true) {
    v1::JobState state = v1::JOB_STATE_UNSPECIFIED;
    grpc::Status status = Show(inv, client, pos[0], &state);
    if (!status.ok()) {
      if (watch && shown && status.error_code() == grpc::UNAVAILABLE &&
          reconnection.Retry(status)) {
        continue;
      }
      return client.Fail(status);
    }
    shown = true;
    reconnection.Connected();
    std::cout.flush();
    if (!watch || IsTerminal(state)) return kExitOk;
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(kRefresh));
    if (inv.options.output == OutputFormat::kText) std::cout << "\n";
  }
}

}  // namespace dropless::cli
