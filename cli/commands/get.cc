// dropless get jobs [ID] [--state S,...] [-l k=v,...] [--owner NAME] [--chunk-size N] [-w] |
// get job ID |
// get workers [ID]: tables by default, -o json|yaml for scripts. A list prints {"jobs": [...]} /
// {"workers": [...]}; a single object prints itself. The list is read a page (--chunk-size, 500)
// at a time. -w (kubectl's watch): the list, then, polling every second until interrupted, a row
// (or with -o one object) for each job that appeared or changed state, attempt or step.
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <memory>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/table.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"
#include "cli/reconnect.h"
#include "common/byte_text.h"
#include "common/job_spec.h"

namespace dropless::cli {
namespace {

constexpr absl::Duration kWatchPollInterval = absl::Seconds(1);
constexpr int kDefaultChunkSize = 500;

// Every page of the list, following next_page_token.
grpc::Status ListAllJobs(Client& client, v1::ListJobsRequest request, v1::ListJobsResponse* all) {
  all->Clear();
  do {
    v1::ListJobsResponse page;
    grpc::Status status = client.jobs().ListJobs(client.UnaryContext().get(), request, &page);
    if (!status.ok()) return status;
    for (v1::Job& job : *page.mutable_jobs()) *all->add_jobs() = std::move(job);
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty());
  return grpc::Status::OK;
}

// -l team=search,tier=gold: jobs with every one of these labels.
absl::Status ParseLabelSelector(const std::string& text, v1::ListJobsRequest* request) {
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    std::vector<std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || absl::StripAsciiWhitespace(kv[0]).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("-l: want key=value[,key=value...], got '", pair, "'"));
    }
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    const std::string value(absl::StripAsciiWhitespace(kv[1]));
    if (absl::Status s = CheckLabel(absl::StrCat("-l ", key.substr(0, 80)), key, value); !s.ok()) {
      return s;
    }
    (*request->mutable_labels())[key] = value;
  }
  if (request->labels().empty()) return absl::InvalidArgumentError("-l: no label given");
  return absl::OkStatus();
}

Table JobTable(const std::vector<const v1::Job*>& jobs) {
  Table table({"ID", "NAME", "STATE", "ATTEMPT", "STEP/STEPS", "AGE"});
  const int64_t now = NowMs();
  for (const v1::Job* job : jobs) {
    table.AddRow({job->id(), job->name(), JobStateName(job->state()), absl::StrCat(job->attempt()),
                  StepText(*job), AgeText(job->create_time_ms(), now)});
  }
  return table;
}

void PrintJobTable(const std::vector<const v1::Job*>& jobs) {
  std::cout << ForDisplay(JobTable(jobs).Render(), STDOUT_FILENO);
}

// Polls the list and prints what changed, until interrupted (or a call fails).
int WatchJobs(const Invocation& inv, Client& client, const v1::ListJobsRequest& request) {
  std::map<std::string, std::string> shown;  // job id -> what its last printed line showed
  std::unique_ptr<Table> first;              // the first listing sets the columns
  Reconnection reconnection("get -w");       // rides out a coordinator restart, as `watch` does
  bool listed = false;
  while (true) {
    v1::ListJobsResponse response;
    grpc::Status status = ListAllJobs(client, request, &response);
    if (!status.ok()) {
      if (listed && status.error_code() == grpc::UNAVAILABLE && reconnection.Retry(status))
        continue;
      return client.Fail(status);
    }
    listed = true;
    reconnection.Connected();
    std::vector<const v1::Job*> changed;
    for (const v1::Job& job : response.jobs()) {
      std::string key = absl::StrCat(job.state(), "/", job.attempt(), "/", StepText(job));
      auto [it, added] = shown.emplace(job.id(), key);
      if (!added && it->second == key) continue;
      it->second = std::move(key);
      changed.push_back(&job);
    }
    if (inv.options.output != OutputFormat::kText) {
      for (const v1::Job* job : changed) PrintStructured(JobView(*job), inv.options.output);
    } else if (first == nullptr) {
      first = std::make_unique<Table>(JobTable(changed));
      std::cout << ForDisplay(first->Render(), STDOUT_FILENO);
    } else if (!changed.empty()) {
      std::cout << ForDisplay(JobTable(changed).RenderRowsLike(*first), STDOUT_FILENO);
    }
    std::cout.flush();
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(kWatchPollInterval));
  }
}

void PrintWorkerTable(const std::vector<const v1::Worker*>& workers) {
  Table table({"ID", "NODE", "STATE", "KIND", "BUSY/SLOTS", "DEVICES", "HEARTBEAT", "AGE"});
  const int64_t now = NowMs();
  for (const v1::Worker* w : workers) {
    std::vector<std::string> devices(w->devices().begin(), w->devices().end());
    std::string device_text = devices.empty() ? "-" : devices[0];
    if (!w->device_memory_bytes().empty()) {  // the smallest and largest GPU's memory
      const auto [least, most] =
          std::minmax_element(w->device_memory_bytes().begin(), w->device_memory_bytes().end());
      if (*least > 0) {
        absl::StrAppend(&device_text, " (", GibText(*least),
                        *most != *least ? absl::StrCat(" to ", GibText(*most)) : "", ")");
      }
    }
    if (devices.size() > 1) absl::StrAppend(&device_text, " x", devices.size());
    table.AddRow({w->id(), w->node(), WorkerStateName(w->state()), w->slot_kind(),
                  absl::StrCat(w->slots_busy(), "/", w->slots()), device_text,
                  AgeText(w->last_heartbeat_ms(), now) + (w->last_heartbeat_ms() > 0 ? " ago" : ""),
                  AgeText(w->registered_time_ms(), now)});
  }
  std::cout << ForDisplay(table.Render(), STDOUT_FILENO);
}

int GetJobs(const Invocation& inv, Client& client) {
  const std::vector<std::string>& pos = inv.args.positional();
  if (pos.size() == 2) {
    v1::GetJobRequest request;
    request.set_id(pos[1]);
    v1::Job job;
    grpc::Status status = client.jobs().GetJob(client.UnaryContext().get(), request, &job);
    if (!status.ok()) return client.Fail(status);
    if (inv.options.output == OutputFormat::kText) {
      PrintJobTable({&job});
    } else {
      PrintStructured(JobView(job), inv.options.output);
    }
    return kExitOk;
  }
  v1::ListJobsRequest request;
  if (inv.args.Has("state")) {
    absl::StatusOr<std::vector<v1::JobState>> states = ParseJobStates(inv.args.Get("state"));
    if (!states.ok()) return UsageError(std::string(states.status().message()));
    for (v1::JobState s : *states) request.add_states(s);
  }
  if (inv.args.Has("selector")) {
    if (absl::Status s = ParseLabelSelector(inv.args.Get("selector"), &request); !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  }
  if (inv.args.Has("owner")) {
    std::string owner(absl::StripAsciiWhitespace(inv.args.Get("owner")));
    if (owner.empty()) return UsageError("--owner: no user name given");
    request.set_owner(std::move(owner));
  }
  int32_t chunk = kDefaultChunkSize;
  if (inv.args.Has("chunk-size") &&
      (!absl::SimpleAtoi(inv.args.Get("chunk-size"), &chunk) || chunk < 1 || chunk > 1000)) {
    return UsageError(absl::StrCat("--chunk-size: want 1..1000, got '", inv.args.Get("chunk-size"),
                                   "'"));
  }
  request.set_page_size(chunk);
  if (inv.args.Has("watch")) return WatchJobs(inv, client, request);
  v1::ListJobsResponse response;
  grpc::Status status = ListAllJobs(client, request, &response);
  if (!status.ok()) return client.Fail(status);
  if (inv.options.output == OutputFormat::kText) {
    std::vector<const v1::Job*> jobs;
    for (const v1::Job& job : response.jobs()) jobs.push_back(&job);
    if (jobs.empty()) {
      std::cerr << "No jobs.\n";
    } else {
      PrintJobTable(jobs);
    }
    return kExitOk;
  }
  Value list = Value::Array();
  for (const v1::Job& job : response.jobs()) list.Push(JobView(job));
  PrintStructured(Value::Object().Set("jobs", std::move(list)), inv.options.output);
  return kExitOk;
}

int GetWorkers(const Invocation& inv, Client& client) {
  const std::vector<std::string>& pos = inv.args.positional();
  v1::ListWorkersResponse response;
  grpc::Status status =
      client.jobs().ListWorkers(client.UnaryContext().get(), v1::ListWorkersRequest(), &response);
  if (!status.ok()) return client.Fail(status);
  std::vector<const v1::Worker*> workers;
  for (const v1::Worker& w : response.workers()) {
    if (pos.size() < 2 || w.id() == pos[1] || w.node() == pos[1]) workers.push_back(&w);
  }
  if (pos.size() == 2 && workers.empty()) {
    std::cerr << "error: worker " << pos[1] << " not found\n";
    return kExitNotFound;
  }
  if (inv.options.output == OutputFormat::kText) {
    if (workers.empty()) {
      std::cerr << "No workers.\n";
    } else {
      PrintWorkerTable(workers);
    }
    return kExitOk;
  }
  if (pos.size() == 2) {
    PrintStructured(WorkerView(*workers[0]), inv.options.output);
    return kExitOk;
  }
  Value list = Value::Array();
  for (const v1::Worker* w : workers) list.Push(WorkerView(*w));
  PrintStructured(Value::Object().Set("workers", std::move(list)), inv.options.output);
  return kExitOk;
}

}  // namespace

absl::StatusOr<std::vector<v1::JobState>> ParseJobStates(const std::string& text) {
  std::vector<v1::JobState> states;
  for (absl::string_view word : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    v1::JobState state;
    const std::string name =
        absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(absl::StripAsciiWhitespace(word)));
    if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--state: unknown job state '", word,
          "' (pending, scheduled, running, succeeded, failed, cancelled)"));
    }
    states.push_back(state);
  }
  if (states.empty()) return absl::InvalidArgumentError("--state: no job state given");
  return states;
}

int RunGet(const Invocation& inv) {
  const std::vector<std::string>& pos = inv.args.positional();
  if (pos.empty()) return UsageError("get needs a resource: jobs, job ID, workers");
  if (pos.size() > 2) return UsageError(absl::StrCat("get: unexpected argument '", pos[2], "'"));
  const std::string& resource = pos[0];
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  const bool list_flags = inv.args.Has("state") || inv.args.Has("watch") ||
                          inv.args.Has("selector") || inv.args.Has("chunk-size") ||
                          inv.args.Has("owner");
  if (resource == "jobs" || resource == "job") {
    if (resource == "job" && pos.size() < 2) return UsageError("get job needs a job ID");
    if (pos.size() == 2 && list_flags) {
      return UsageError("get: --state, -l, --owner, --chunk-size and -w list jobs; drop the ID");
    }
    return GetJobs(inv, client);
  }
  if (list_flags) {
    return UsageError("get: --state, -l, --owner, --chunk-size and -w apply to `get jobs`");
  }
  if (resource == "workers" || resource == "worker") return GetWorkers(inv, client);
  return UsageError(absl::StrCat("get: unknown resource '", resource, "' (jobs, job ID, workers)"));
}

}  // namespace dropless::cli
