#include "cli/output/views.h"

#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/output/terminal_text.h"

namespace dropless::cli {

std::string JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING: return "PENDING";
    case v1::JOB_STATE_SCHEDULED: return "SCHEDULED";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNKNOWN";
  }
}

std::string WorkerStateName(v1::WorkerState state) {
  switch (state) {
    case v1::WORKER_STATE_READY: return "READY";
    case v1::WORKER_STATE_LOST: return "LOST";
    default: return "UNKNOWN";
  }
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

std::string TimeText(int64_t unix_ms) {
  if (unix_ms <= 0) return "-";
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

Value TimeValue(int64_t unix_ms) {
  return unix_ms <= 0 ? Value() : Value::String(TimeText(unix_ms));
}

std::string AgeText(int64_t since_ms, int64_t now_ms) {
  if (since_ms <= 0) return "-";
  const int64_t s = std::max<int64_t>(0, (now_ms - since_ms) / 1000);
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 120 * 60) return absl::StrCat(s / 60, "m");
  if (s < 48 * 3600) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string DurationText(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  if (seconds < 10) return absl::StrFormat("%.3gs", seconds);
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string StepText(const v1::Job& job) {
  const std::string step = job.has_latest() && job.latest().step() > 0
                               ? absl::StrCat(job.latest().step())
                               : std::string("-");
  return absl::StrCat(step, "/", job.steps());
}

std::string LogLineText(const v1::LogLine& line, bool with_rank, bool terminal_safe) {
  std::string out = with_rank ? absl::StrCat("[rank ", line.rank(), "] ") : "";
  out += terminal_safe ? TerminalSafe(line.text()) : line.text();
  if (line.text().empty() || line.text().back() != '\n') out += "\n";
  return out;
}

Value MetricsView(const v1::StepMetrics& m) {
  Value expert_tokens = Value::Array();
  for (int64_t tokens : m.expert_tokens()) expert_tokens.Push(Value::Int(tokens));
  Value v = Value::Object();
  v.Set("rank", Value::Int(m.rank()))
      .Set("attempt", Value::Int(m.attempt()))
      .Set("step", Value::Int(m.step()))
      .Set("steps", Value::Int(m.steps()))
      .Set("loss", Value::Double(m.loss()))
      .Set("aux_loss", Value::Double(m.aux_loss()))
      .Set("step_seconds", Value::Double(m.step_seconds()))
      .Set("tflops", Value::Double(m.tflops()))
      .Set("mfu", Value::Double(m.mfu()))
      .Set("tokens_per_second", Value::Double(m.tokens_per_second()))
      .Set("dispatch_seconds", Value::Double(m.dispatch_seconds()))
      .Set("combine_seconds", Value::Double(m.combine_seconds()))
      .Set("gemm_seconds", Value::Double(m.gemm_seconds()))
      .Set("gemm_forward_seconds", Value::Double(m.gemm_forward_seconds()))
      .Set("gemm_dgrad_seconds", Value::Double(m.gemm_dgrad_seconds()))
      .Set("gemm_wgrad_seconds", Value::Double(m.gemm_wgrad_seconds()))
      .Set("load_imbalance", Value::Double(m.load_imbalance()))
      .Set("expert_tokens", std::move(expert_tokens))
      .Set("dispatch_bytes", Value::Int(m.dispatch_bytes()))
      .Set("combine_bytes", Value::Int(m.combine_bytes()))
      .Set("device_memory_bytes", Value::Int(m.device_memory_bytes()))
      .Set("node", Value::String(m.node()))
      .Set("time", TimeValue(m.time_ms()));
  return v;
}

Value EventView(const v1::Event& e) {
  Value v = Value::Object();
  v.Set("id", Value::Int(e.id()))
      .Set("time", TimeValue(e.time_ms()))
      .Set("job_id", Value::String(e.job_id()))
      .Set("attempt", Value::Int(e.attempt()))
      .Set("type", Value::String(e.type()))
      .Set("message", Value::String(e.message()));
  return v;
}

Value JobView(const v1::Job& job) {
  Value placement = Value::Array();
  for (const v1::RankPlacement& p : job.placement()) {
    Value r = Value::Object();
    r.Set("rank", Value::Int(p.rank()))
        .Set("worker_id", Value::String(p.worker_id()))
        .Set("node", Value::String(p.node()))
        .Set("slot", Value::Int(p.slot()));
    placement.Push(std::move(r));
  }
  const bool has_step = job.has_latest() && job.latest().step() > 0;
  Value labels = Value::Object();
  // Sorted, so that the output does not depend on the map's order.
  std::map<std::string, std::string> sorted(job.labels().begin(), job.labels().end());
  for (const auto& [key, value] : sorted) labels.Set(key, Value::String(value));
  Value v = Value::Object();
  v.Set("id", Value::String(job.id()))
      .Set("name", Value::String(job.name()))
      .Set("owner", Value::String(job.owner()))
      .Set("labels", std::move(labels))
      .Set("state", Value::String(JobStateName(job.state())))
      .Set("priority", Value::Int(job.priority()))
      .Set("attempt", Value::Int(job.attempt()))
      .Set("uncounted_attempts", Value::Int(job.uncounted_attempts()))
      .Set("needs_device_memory_above_bytes", Value::Int(job.needs_device_memory_above_bytes()))
      .Set("world_size", Value::Int(job.world_size()))
      .Set("backend", Value::String(job.backend()))
      .Set("step", Value::Int(has_step ? job.latest().step() : 0))
      .Set("steps", Value::Int(job.steps()))
      .Set("time_limit_seconds",
           job.has_time_limit() ? Value::Int(job.time_limit().seconds()) : Value())
      .Set("create_time", TimeValue(job.create_time_ms()))
      .Set("start_time", TimeValue(job.start_time_ms()))
      .Set("end_time", TimeValue(job.end_time_ms()))
      .Set("message", Value::String(job.message()))
      .Set("placement", std::move(placement))
      .Set("latest", has_step ? MetricsView(job.latest()) : Value())
      .Set("spec_yaml", Value::String(job.spec_yaml()));
  return v;
}

Value WorkerView(const v1::Worker& w) {
  Value devices = Value::Array();
  for (const std::string& d : w.devices()) devices.Push(Value::String(d));
  Value memory = Value::Array();
  for (int64_t bytes : w.device_memory_bytes()) memory.Push(Value::Int(bytes));
  Value v = Value::Object();
  v.Set("id", Value::String(w.id()))
      .Set("node", Value::String(w.node()))
      .Set("state", Value::String(WorkerStateName(w.state())))
      .Set("address", Value::String(w.address()))
      .Set("metrics_port", Value::Int(w.metrics_port()))
      .Set("slot_kind", Value::String(w.slot_kind()))
      .Set("slots", Value::Int(w.slots()))
      .Set("slots_busy", Value::Int(w.slots_busy()))
      .Set("devices", std::move(devices))
      .Set("device_memory_bytes", std::move(memory))
      .Set("registered_time", TimeValue(w.registered_time_ms()))
      .Set("last_heartbeat", TimeValue(w.last_heartbeat_ms()));
  return v;
}

Value WatchUpdateView(const v1::JobUpdate& update) {
  const v1::Job& job = update.job();
  Value v = Value::Object();
  v.Set("id", Value::String(job.id()))
      .Set("name", Value::String(job.name()))
      .Set("state", Value::String(JobStateName(job.state())))
      .Set("attempt", Value::Int(job.attempt()))
      .Set("steps", Value::Int(job.steps()))
      .Set("message", Value::String(job.message()));
  const v1::StepMetrics* m = update.has_metrics() ? &update.metrics()
                             : (job.has_latest() && job.latest().step() > 0) ? &job.latest()
                                                                             : nullptr;
  if (m != nullptr) {
    const int64_t left = std::max<int64_t>(0, job.steps() - m->step());
    v.Set("rank", Value::Int(m->rank()))
        .Set("step", Value::Int(m->step()))
        .Set("loss", Value::Double(m->loss()))
        .Set("aux_loss", Value::Double(m->aux_loss()))
        .Set("step_seconds", Value::Double(m->step_seconds()))
        .Set("tflops", Value::Double(m->tflops()))
        .Set("mfu", Value::Double(m->mfu()))
        .Set("tokens_per_second", Value::Double(m->tokens_per_second()))
        .Set("eta_seconds", Value::Double(left * m->step_seconds()));
  }
  if (update.has_event()) v.Set("event", EventView(update.event()));
  return v;
}

}  // namespace dropless::cli
