// dropless describe job ID: everything about one job for a human (spec summary, progress,
// expert load of the latest step, placement, events with times); -o json|yaml gives the job object
// plus "events".
#include <unistd.h>

#include <iostream>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/expert_load.h"
#include "cli/output/table.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"
#include "common/job_spec.h"

namespace dropless::cli {
namespace {

constexpr int kMaxEvents = 1000;

std::string Field(const std::string& label, const std::string& value) {
  return absl::StrFormat("%-16s%s\n", label + ":", value);
}

std::string SpecSummary(const std::string& spec_yaml) {
  absl::StatusOr<JobSpec> spec = ParseJobSpec(spec_yaml);
  if (!spec.ok()) return absl::StrCat("  (spec not readable: ", spec.status().message(), ")\n");
  const ModelSpec& m = spec->model;
  const OptimizerSpec& o = spec->optimizer;
  std::string out;
  out += Field("  model", absl::StrFormat(
                              "hidden %d, ffn %d, %d experts, top-%d %s%s, %d shared, %d layer%s",
                              m.hidden, m.ffn, m.experts, m.topk, std::string(ToString(m.router)),
                              m.renormalize ? " (renormalized)" : "", m.shared_experts, m.layers,
                              m.layers == 1 ? "" : "s"));
  out += Field("  parallel", absl::StrFormat("ep %d x dp %d = %d ranks", spec->parallel.ep,
                                             spec->parallel.dp, spec->world_size()));
  out += Field("  precision", std::string(ToString(spec->precision)));
  out += Field("  tokens/rank", absl::StrCat(spec->tokens_per_rank));
  out += Field("  optimizer",
               absl::StrFormat("%s lr %g betas (%g, %g) weight_decay %g warmup %d moment_dtype %s",
                               o.name, o.lr, o.beta1, o.beta2, o.weight_decay, o.warmup_steps,
                               std::string(ToString(o.moment_dtype))));
  out += Field("  dispatcher",
               absl::StrFormat("%s, overlap %s, activation offload %s",
                               std::string(ToString(spec->dispatcher)),
                               spec->overlap ? "on" : "off",
                               spec->activation_offload ? "on" : "off"));
  out += Field("  data", spec->data.distribution == RoutingDistribution::kZipf
                             ? absl::StrFormat("zipf (exponent %g), seed %d",
                                               spec->data.zipf_exponent, spec->data.seed)
                             : absl::StrFormat("uniform, seed %d", spec->data.seed));
  if (!spec->checkpoint.dir.empty()) {
    out += Field("  checkpoint",
                 absl::StrFormat("%s every %d steps", spec->checkpoint.dir, spec->checkpoint.every));
  }
  return out;
}

std::string Progress(const v1::Job& job) {
  if (!job.has_latest() || job.latest().step() <= 0) return absl::StrCat("-/", job.steps(), " steps");
  const v1::StepMetrics& m = job.latest();
  return absl::StrFormat("%d/%d steps, loss %.4g, step %s, %.3g TFLOP/s, MFU %.1f%%", m.step(),
                         job.steps(), m.loss(), DurationText(m.step_seconds()), m.tflops(),
                         100.0 * m.mfu());
}

void PrintText(const v1::Job& job, const v1::ListEventsResponse& events) {
  const int64_t now = NowMs();
  auto when = [&](int64_t ms) {
    return ms <= 0 ? std::string("-") : absl::StrCat(TimeText(ms), " (", AgeText(ms, now), " ago)");
  };
  std::string out;
  out += Field("Name", job.name());
  out += Field("ID", job.id());
  out += Field("State", JobStateName(job.state()));
  if (!job.message().empty()) out += Field("Message", job.message());
  std::map<std::string, std::string> labels(job.labels().begin(), job.labels().end());
  std::vector<std::string> pairs;
  for (const auto& [key, value] : labels) pairs.push_back(absl::StrCat(key, "=", value));
  out += Field("Labels", pairs.empty() ? "<none>" : absl::StrJoin(pairs, ","));
  out += Field("Priority", absl::StrCat(job.priority()));
  if (job.has_time_limit()) {
    out += Field("Time limit", DurationText(static_cast<double>(job.time_limit().seconds())));
  }
  out += Field("Attempt", absl::StrCat(job.attempt()));
  out += Field("Backend", absl::StrCat(job.backend(), ", ", job.world_size(), " ranks"));
  out += Field("Created", when(job.create_time_ms()));
  out += Field("Started", when(job.start_time_ms()));
  out += Field("Ended", when(job.end_time_ms()));
  out += Field("Progress", Progress(job));
  if (std::optional<ExpertLoadSummary> load = SummarizeExpertLoad(job.latest())) {
    out += Field("Expert load",
                 absl::StrCat("step ", job.latest().step(), ": ", ExpertLoadSummaryLine(*load)));
    out += ExpertLoadHistogram(job.latest(), *load);
  }
  out += "Spec:\n" + SpecSummary(job.spec_yaml());
  out += "Placement:";
  if (job.placement().empty()) {
    out += " none\n";
  } else {
    out += "\n";
    Table table({"  RANK", "WORKER", "NODE", "SLOT"});
    for (const v1::RankPlacement& p : job.placement()) {
      table.AddRow({absl::StrCat("  ", p.rank()), p.worker_id(), p.node(), absl::StrCat(p.slot())});
    }
    out += table.Render();
  }
  out += "Events:";
  if (events.events().empty()) {
    out += " none\n";
  } else {
    out += "\n";
    Table table({"  TIME", "AGE", "ATTEMPT", "TYPE", "MESSAGE"});
    for (const v1::Event& e : events.events()) {
      table.AddRow({"  " + TimeText(e.time_ms()), AgeText(e.time_ms(), now),
                    absl::StrCat(e.attempt()), e.type(), e.message()});
    }
    out += table.Render();
  }
  // Names, labels, messages and event text are users': a terminal gets them without control
  // characters.
  std::cout << ForDisplay(out, STDOUT_FILENO);
}

}  // namespace

int RunDescribe(const Invocation& inv) {
  const std::vector<std::string>& pos = inv.args.positional();
  if (pos.size() != 2 || (pos[0] != "job" && pos[0] != "jobs")) {
    return UsageError("usage: dropless describe job ID");
  }
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  v1::GetJobRequest get;
  get.set_id(pos[1]);
  v1::Job job;
  grpc::Status status = client.jobs().GetJob(client.UnaryContext().get(), get, &job);
  if (!status.ok()) return client.Fail(status);
  v1::ListEventsRequest list;
  list.set_job_id(job.id());
  list.set_limit(kMaxEvents);
  v1::ListEventsResponse events;
  status = client.jobs().ListEvents(client.UnaryContext().get(), list, &events);
  if (!status.ok()) return client.Fail(status);

  if (inv.options.output == OutputFormat::kText) {
    PrintText(job, events);
    return kExitOk;
  }
  Value view = JobView(job);
  Value event_list = Value::Array();
  for (const v1::Event& e : events.events()) event_list.Push(EventView(e));
  view.Set("events", std::move(event_list));
  PrintStructured(view, inv.options.output);
  return kExitOk;
}

}  // namespace dropless::cli
