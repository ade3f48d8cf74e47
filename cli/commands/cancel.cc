// dropless cancel ID [--reason TEXT]: the job becomes CANCELLED at once; its ranks are stopped.
#include <unistd.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"

namespace dropless::cli {

int RunCancel(const Invocation& inv) {
  std::vector<std::string> pos = inv.args.positional();
  if (pos.size() == 2 && (pos[0] == "job" || pos[0] == "jobs")) pos.erase(pos.begin());
  if (pos.size() != 1 || pos[0].empty()) {
    return UsageError("usage: dropless cancel ID [--reason TEXT]");
  }
  v1::CancelJobRequest request;
  request.set_id(pos[0]);
  // The coordinator records "cancelled: <reason>".
  request.set_reason(inv.args.Get("reason", "by the user (dropless cancel)"));
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  v1::Job job;
  grpc::Status status = client.jobs().CancelJob(client.UnaryContext().get(), request, &job);
  if (!status.ok()) return client.Fail(status);
  if (inv.options.output == OutputFormat::kText) {
    std::cout << ForDisplay(absl::StrCat("job ", job.id(), " ", JobStateName(job.state()), "\n"),
                            STDOUT_FILENO);
  } else {
    PrintStructured(JobView(job), inv.options.output);
  }
  return kExitOk;
}

}  // namespace dropless::cli
