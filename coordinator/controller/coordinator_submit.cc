// Coordinator: SubmitJob, the making of a job from a SubmitJobRequest: the spec parsed once, the
// request's overrides applied, then (unless a dry run) the earlier submit of the same request_id
// answered again, else the caller's priority limit and job quota checked and the job stored.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {
namespace {

constexpr size_t kMaxRequestIdBytes = 128;

absl::Status CheckRequestId(const std::string& id) {
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: longer than ", kMaxRequestIdBytes, " bytes"));
  }
  for (char c : id) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != ':' && c != '-') {
      return absl::InvalidArgumentError(
          "request_id: only letters, digits and . _ : - are allowed");
    }
  }
  return absl::OkStatus();
}

// PermissionDenied when the job's final priority (the request's override, else the spec's) is
// above the owner's limit (nullopt: none, an admin's).
absl::Status CheckPriorityLimit(const std::string& owner, int32_t priority,
                                std::optional<int32_t> max_priority) {
  if (!max_priority.has_value() || priority <= *max_priority) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "priority: user ", owner, " may give a job a priority of at most ", *max_priority,
      " (--max-user-priority), not ", priority, "; higher priorities need role admin"));
}

}  // namespace

absl::StatusOr<v1::Job> Coordinator::SubmitJob(const v1::SubmitJobRequest& request,
                                               const std::string& owner,
                                               std::optional<int32_t> max_priority) {
  if (request.spec_yaml().empty()) {
    return absl::InvalidArgumentError("spec_yaml: must not be empty");
  }
  if (absl::Status s = CheckRequestId(request.request_id()); !s.ok()) return s;
  absl::StatusOr<JobSpec> spec = ParseSubmittedJobSpec(request.spec_yaml());
  if (!spec.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("invalid job spec: ", spec.status().message()));
  }
  // The overrides end up in the stored spec, which every rank parses again: common/ checks them
  // by the same rules as the file (name pattern, priority range).
  JobSpecOverrides overrides;
  if (!request.name().empty()) overrides.name = request.name();
  if (request.priority() != 0) overrides.priority = request.priority();
  if (absl::Status s = ApplyJobSpecOverrides(overrides, &*spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid name or priority override: ", s.message()));
  }

  const int64_t now = NowMs();
  // The job as it is created; a dry run answers it as it is (no id, nothing stored).
  v1::Job proposed;
  proposed.set_name(spec->name);
  proposed.set_priority(spec->priority);
  proposed.set_state(v1::JOB_STATE_PENDING);
  proposed.set_spec_yaml(JobSpecToYaml(*spec));
  proposed.set_world_size(static_cast<int32_t>(spec->world_size()));
  proposed.set_steps(spec->steps);
  proposed.set_backend(std::string(ToString(spec->resources.backend)));
  proposed.set_create_time_ms(now);
  proposed.set_owner(owner);
  proposed.mutable_labels()->insert(spec->labels.begin(), spec->labels.end());
  if (spec->time_limit_seconds > 0) {
    proposed.mutable_time_limit()->set_seconds(spec->time_limit_seconds);
  }
  if (request.dry_run()) {
    if (absl::Status s = CheckPriorityLimit(owner, proposed.priority(), max_priority); !s.ok()) {
      return s;
    }
    return proposed;
  }

  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  if (!request.request_id().empty()) {
    absl::StatusOr<std::optional<v1::Job>> earlier =
        FindSubmittedLocked(owner, request.request_id(), proposed.spec_yaml());
    if (!earlier.ok()) return earlier.status();
    if (earlier->has_value()) return **earlier;
  }
  // After the request_id lookup: a retry of a submit that was accepted gets its job, even when the
  // limit was lowered in between (the proto's promise of idempotent submits).
  if (absl::Status s = CheckPriorityLimit(owner, proposed.priority(), max_priority); !s.ok()) {
    return s;
  }
  // Unfinished jobs are held in memory and looked at by every scheduling pass: one user may not
  // queue without bound (jobs that can never be placed included).
  if (!owner.empty() && options_.max_unfinished_jobs_per_user > 0) {
    int64_t unfinished = 0;
    for (const auto& [other_id, other] : jobs_.jobs()) {
      unfinished += other.record.job.owner() == owner && !IsTerminal(other.record.job.state());
    }
    if (unfinished >= options_.max_unfinished_jobs_per_user) {
      return absl::ResourceExhaustedError(absl::StrCat("user ", owner, " has ", unfinished,
                                                       " unfinished jobs, the limit per user "
                                                       "(--max-unfinished-jobs-per-user ",
                                                       options_.max_unfinished_jobs_per_user,
                                                       "); cancel some or wait for them to end"));
    }
  }
  ActiveJob job;
  JobRecord& record = job.record;
  v1::Job& j = record.job;
  j = std::move(proposed);
  j.set_id(store_->NextJobId(&record.seq));
  if (j.name().empty()) j.set_name(j.id());
  record.max_attempts = std::max(1, spec->max_attempts);
  record.queued_time_ms = now;

  const std::string id = j.id();
  StoreWrite write;
  AddEvent(write, id, 0, "Submitted",
           absl::StrFormat("accepted: %d ranks (ep %d x dp %d) on %s, %d steps, priority %d, "
                           "up to %d attempts",
                           j.world_size(), spec->parallel.ep, spec->parallel.dp, j.backend(),
                           j.steps(), j.priority(), record.max_attempts));
  if (!request.request_id().empty()) {
    write.submit_requests.push_back(SubmitRequestRecord{owner, request.request_id(), id});
  }
  ActiveJob& stored = jobs_.jobs()[id] = std::move(job);
  jobs_.MarkDirty(stored);
  if (absl::Status s = jobs_.Commit(write, JobController::IfNotStored::kForget); !s.ok()) {
    jobs_.jobs().erase(id);  // the transaction rolled back: the job was never accepted
    return absl::UnavailableError(absl::StrCat("the job could not be stored: ", s.message()));
  }
  LogInfo(absl::StrFormat("job %s submitted: %s, %d %s ranks", id, stored.record.job.name(),
                          stored.record.job.world_size(), stored.record.job.backend()));
  ScheduleLocked();
  if (const ActiveJob* active = jobs_.Find(id); active != nullptr) return active->record.job;
  return store_->GetJob(id);
}

absl::StatusOr<std::optional<v1::Job>> Coordinator::FindSubmittedLocked(
    const std::string& owner, const std::string& request_id, const std::string& spec_yaml) {
  absl::StatusOr<std::optional<std::string>> job_id =
      store_->FindSubmitRequest(owner, request_id);
  if (!job_id.ok()) {
    return absl::UnavailableError(
        absl::StrCat("request_id: the earlier submits could not be read: ",
                     job_id.status().message()));
  }
  if (!job_id->has_value()) return std::optional<v1::Job>();
  const ActiveJob* active = jobs_.Find(**job_id);
  absl::StatusOr<v1::Job> job =
      active != nullptr ? absl::StatusOr<v1::Job>(active->record.job) : store_->GetJob(**job_id);
  if (!job.ok()) return job.status();
  if (job->spec_yaml() != spec_yaml) {
    return absl::AlreadyExistsError(absl::StrCat("request_id: \"", request_id,
                                                 "\" already submitted job ", job->id(),
                                                 " with a different spec"));
  }
  LogInfo(absl::StrFormat("submit with request_id %s repeated: job %s", request_id, job->id()));
  return std::optional<v1::Job>(*std::move(job));
}

}  // namespace dropless::coordinator
