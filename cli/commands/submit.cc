// dropless submit -f FILE [--name NAME] [--priority N] [--dry-run | --wait]: validates the spec
// locally with the same parser the coordinator uses (so a bad spec fails before any network call,
// with the same message), then submits it and prints the new job's id alone on stdout.
// --dry-run: the coordinator validates the spec and answers the job it would create; nothing is
// created (prints "<name> validated (dry run)" or the job object with -o). --wait: after the id,
// follows the job like `watch` and exits with its end state (0 / 5 / 6); --timeout bounds the
// watch stream's first answer as it bounds the submit, never the wait for the job's end.
//
// Every submit carries a request id (--request-id, else 128 random bits): a submit whose answer
// was lost (coordinator restart, network) is sent again with the same id until --timeout runs
// out, and the coordinator answers with the job the first one made instead of making a second.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"
#include "common/job_spec.h"

namespace dropless::cli {
namespace {

// Reads at most one byte past the spec limit: a larger file is refused without reading it all.
bool ReadSpecFile(const std::string& path, std::string* text, std::string* error) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) {
      *error = absl::StrCat("cannot read ", path, ": ", std::strerror(errno));
      return false;
    }
    in = &file;
  }
  text->resize(kMaxJobSpecBytes + 1);
  in->read(text->data(), static_cast<std::streamsize>(text->size()));
  if (in->bad()) {
    *error = absl::StrCat("cannot read ", path, ": ", std::strerror(errno));
    return false;
  }
  text->resize(static_cast<size_t>(in->gcount()));
  if (text->size() > kMaxJobSpecBytes) {
    *error = absl::StrCat(path == "-" ? "<stdin>" : path, ": a job spec may be at most ",
                          kMaxJobSpecBytes, " bytes; this one is larger");
    return false;
  }
  return true;
}

std::string NewRequestId() {
  std::random_device rd;
  return absl::StrFormat("cli-%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

bool Retryable(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

// Sends the request until it is answered or --timeout has passed since the first try.
grpc::Status SubmitWithRetries(Client& client, absl::Duration timeout,
                               const v1::SubmitJobRequest& request, v1::Job* job) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration backoff = absl::Milliseconds(200);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status status = client.jobs().SubmitJob(&context, request, job);
    if (status.ok() || !Retryable(status) || absl::Now() + backoff >= deadline) return status;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
}

}  // namespace

int RunSubmit(const Invocation& inv) {
  if (!inv.args.Has("filename")) return UsageError("submit needs -f FILE (or -f - for stdin)");
  if (!inv.args.positional().empty()) {
    return UsageError(absl::StrCat("submit: unexpected argument '", inv.args.positional()[0], "'"));
  }
  const std::string path = inv.args.Get("filename");
  std::string text, error;
  if (!ReadSpecFile(path, &text, &error)) {
    std::cerr << "error: " << error << "\n";
    return kExitError;
  }
  absl::StatusOr<JobSpec> spec = ParseSubmittedJobSpec(text);
  if (!spec.ok()) {
    std::cerr << "error: " << (path == "-" ? "<stdin>" : path) << ": " << spec.status().message()
              << "\n";
    return kExitError;
  }

  v1::SubmitJobRequest request;
  request.set_spec_yaml(text);
  JobSpecOverrides overrides;
  if (inv.args.Has("name")) overrides.name = inv.args.Get("name");
  if (inv.args.Has("priority")) {
    int32_t priority = 0;
    if (!absl::SimpleAtoi(inv.args.Get("priority"), &priority)) {
      return UsageError(absl::StrCat("--priority: not an integer: '", inv.args.Get("priority"), "'"));
    }
    overrides.priority = priority;
  }
  // The overrides go through the same validation as the file (name pattern, priority range).
  if (absl::Status s = ApplyJobSpecOverrides(overrides, &*spec); !s.ok()) {
    std::cerr << "error: " << s.message() << " (from --name/--priority)\n";
    return kExitError;
  }
  if (overrides.name.has_value()) request.set_name(spec->name);
  if (overrides.priority.has_value()) {
    request.set_priority(spec->priority);
    // A priority of 0 in the request means "keep the spec's": send the overridden spec instead.
    if (spec->priority == 0) request.set_spec_yaml(JobSpecToYaml(*spec));
  }

  request.set_request_id(inv.args.Has("request-id") ? inv.args.Get("request-id") : NewRequestId());
  const bool dry_run = inv.args.Has("dry-run");
  if (dry_run && inv.args.Has("wait")) {
    return UsageError("submit: --dry-run and --wait exclude each other");
  }
  request.set_dry_run(dry_run);

  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  v1::Job job;
  grpc::Status status = SubmitWithRetries(client, inv.options.timeout, request, &job);
  if (!status.ok()) return client.Fail(status);
  if (inv.options.output != OutputFormat::kText) {
    PrintStructured(JobView(job), inv.options.output);
  } else if (dry_run) {
    std::cout << ForDisplay(
        absl::StrCat(job.name().empty() ? "job" : job.name(),
                     " validated (dry run): ", job.world_size(), " ", job.backend(), " ranks, ",
                     job.steps(), " steps; nothing created\n"),
        STDOUT_FILENO);
  } else {
    std::cout << ForDisplay(job.id(), STDOUT_FILENO) << "\n";
  }
  std::cout.flush();
  if (!inv.args.Has("wait")) return kExitOk;
  return FollowJobToEnd(inv.options, client, job.id());
}

}  // namespace dropless::cli
