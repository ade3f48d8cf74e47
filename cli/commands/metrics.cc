// dropless metrics ID [--rank R] [--limit N]: a job's stored step metrics, oldest first (the
// coordinator keeps the most recent 5000 per job): a table of step, rank, loss, step time,
// TFLOP/s, MFU and tokens/s; -o json|yaml prints one object per step and rank with every field.
#include <unistd.h>

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/table.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"

namespace dropless::cli {

int RunMetrics(const Invocation& inv) {
  std::vector<std::string> pos = inv.args.positional();
  if (pos.size() == 2 && (pos[0] == "job" || pos[0] == "jobs")) pos.erase(pos.begin());
  if (pos.size() != 1) return UsageError("usage: dropless metrics ID [--rank R] [--limit N]");
  v1::ListStepMetricsRequest request;
  request.set_job_id(pos[0]);
  if (inv.args.Has("rank")) {
    int32_t rank = 0;
    if (!absl::SimpleAtoi(inv.args.Get("rank"), &rank) || rank < 0) {
      return UsageError(absl::StrCat("--rank: not a rank number: '", inv.args.Get("rank"), "'"));
    }
    request.set_rank(rank);
  }
  if (inv.args.Has("limit")) {
    int32_t limit = 0;
    if (!absl::SimpleAtoi(inv.args.Get("limit"), &limit) || limit <= 0) {
      return UsageError(absl::StrCat("--limit: not a positive number: '", inv.args.Get("limit"),
                                     "'"));
    }
    request.set_limit(limit);
  }
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  std::unique_ptr<grpc::ClientContext> context = client.UnaryContext();
  v1::ListStepMetricsResponse response;
  grpc::Status status = client.jobs().ListStepMetrics(context.get(), request, &response);
  if (!status.ok()) return client.Fail(status);
  if (inv.options.output != OutputFormat::kText) {
    for (const v1::StepMetrics& m : response.metrics()) {
      Value v = MetricsView(m);
      v.Set("job_id", Value::String(m.job_id()));
      PrintStructured(v, inv.options.output);
    }
    return kExitOk;
  }
  Table table({"STEP", "RANK", "ATTEMPT", "LOSS", "AUX_LOSS", "STEP_TIME", "TFLOP/S", "MFU",
               "TOKENS/S", "LOAD_IMBALANCE"});
  for (const v1::StepMetrics& m : response.metrics()) {
    table.AddRow({absl::StrCat(m.step(), "/", m.steps()), absl::StrCat(m.rank()),
                  absl::StrCat(m.attempt()), absl::StrFormat("%.6g", m.loss()),
                  absl::StrFormat("%.4g", m.aux_loss()),
                  absl::StrFormat("%.1fms", m.step_seconds() * 1e3),
                  absl::StrFormat("%.3g", m.tflops()), absl::StrFormat("%.1f%%", m.mfu() * 100),
                  absl::StrFormat("%.0f", m.tokens_per_second()),
                  absl::StrFormat("%.3f", m.load_imbalance())});
  }
  std::cout << ForDisplay(table.Render(), STDOUT_FILENO);
  return kExitOk;
}

}  // namespace dropless::cli
