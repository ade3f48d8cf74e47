// Coordinator: start-up and reconciliation, the ticker, and the user-facing job API (SubmitJob in
// coordinator_submit.cc).
#include "coordinator/controller/coordinator.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/utf8.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {
namespace {

constexpr int kDefaultEventLimit = 1000;
constexpr int kMaxEventLimit = 100000;
constexpr int kMaxJobsPerPage = 1000;     // page_size and limit of ListJobs
constexpr int kDefaultJobsPerPage = 100;  // page_size 0
constexpr int kMaxLabelFilters = 16;      // ListJobsRequest.labels

std::string PageToken(int64_t after_seq) {
  return absl::WebSafeBase64Escape(absl::StrCat("after:", after_seq));
}

absl::Status RequireId(const std::string& id, absl::string_view field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"));
  if (id.size() > 256) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": longer than 256 bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(std::unique_ptr<JobStore> store,
                                                                 CoordinatorOptions options,
                                                                 CoordinatorMetrics* metrics) {
  if (options.heartbeat_interval_ms <= 0) {
    return absl::InvalidArgumentError("heartbeat_interval_ms: must be positive");
  }
  if (options.lease_timeout_ms <= options.heartbeat_interval_ms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "lease_timeout_ms: must be larger than heartbeat_interval_ms (got %d <= %d)",
        options.lease_timeout_ms, options.heartbeat_interval_ms));
  }
  std::unique_ptr<Coordinator> coordinator(
      new Coordinator(std::move(store), options, metrics));
  if (absl::Status s = coordinator->Load(); !s.ok()) return s;
  return coordinator;
}

Coordinator::~Coordinator() { Shutdown(); }

absl::Status Coordinator::Load() {
  absl::MutexLock lock(&mu_);
  absl::StatusOr<ActiveState> active = store_->LoadActive();
  if (!active.ok()) return active.status();
  const int64_t now = NowMs();
  StoreWrite write;

  // Workers are LOST until they say Hello on a new session; their lease runs from now.
  // Away since: docs/coordinator_store.md, "Lost workers".
  workers_.Restore(*active, now, write);

  for (JobRecord& record : active->jobs) {
    ActiveJob& job = jobs_.jobs()[record.job.id()];
    job.record = std::move(record);
    absl::StatusOr<std::vector<v1::StepMetrics>> latest =
        store_->LatestStepMetrics(job.record.job.id());
    if (!latest.ok()) return latest.status();
    if (!latest->empty()) *job.record.job.mutable_latest() = latest->front();
  }
  for (AttemptRecord& attempt : active->attempts) {
    ActiveJob* found = jobs_.Find(attempt.job_id);
    if (found == nullptr) continue;
    ActiveJob& job = *found;
    for (const RankRecord& rank : attempt.ranks) {
      v1::RankPlacement* p = job.record.job.add_placement();
      p->set_rank(rank.rank);
      p->set_worker_id(rank.worker_id);
      p->set_node(rank.node);
      p->set_slot(rank.slot);
      WorkerEntry* worker = workers_.Find(rank.worker_id);
      if (worker != nullptr && !RankEnded(rank.state)) {
        worker->occupied[rank.slot] = RankKey{attempt.job_id, attempt.attempt, rank.rank,
                                              rank.state != v1::RANK_STATE_UNSPECIFIED};
        // The run that holds the work owns the node, whatever the receipt says: a receipt is
        // written only with a stored log line or metrics message, so a run that got its ranks
        // before sending one is named by them alone (none, or an earlier run's). It has stored
        // no queued message, so none of its seqs is handled yet.
        if (!rank.boot_id.empty() && worker->boot_id != rank.boot_id) {
          worker->boot_id = rank.boot_id;
          worker->last_seq = 0;
        }
      }
    }
    rendezvous_.Open(attempt.job_id, attempt.attempt, attempt.rendezvous_secret);
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> keys =
        store_->RendezvousKeys(attempt.job_id, attempt.attempt);
    if (!keys.ok()) return keys.status();
    for (auto& [key, value] : *keys) {
      if (absl::Status s = rendezvous_.Put(attempt.job_id, attempt.attempt, key, std::move(value));
          !s.ok()) {
        LogWarning(absl::StrCat("rendezvous key \"", key, "\" of job ", attempt.job_id,
                                " not restored: ", s.message()));
      }
    }
    job.attempt = std::move(attempt);
  }
  int attempts = 0;
  for (const auto& [id, job] : jobs_.jobs()) attempts += job.attempt.has_value() ? 1 : 0;
  AddEvent(write, "", 0, "CoordinatorStarted",
           absl::StrFormat("reloaded %d unfinished jobs (%d with a running attempt) and %d workers",
                           jobs_.jobs().size(), attempts, workers_.size()));
  write.durable = false;
  if (absl::Status s = store_->Commit(write); !s.ok()) return s;
  LogInfo(absl::StrFormat("job store loaded: %d unfinished jobs, %d active attempts, %d workers",
                          jobs_.jobs().size(), attempts, workers_.size()));
  RefreshGaugesLocked();
  return absl::OkStatus();
}

void Coordinator::Start() {
  ticker_ = std::thread([this] { TickLoop(); });
  if (RetentionOn()) {
    retention_ = std::thread([this] { RetentionLoop(); });
  } else {
    LogInfo("job retention off: finished jobs are kept for good");
  }
  if (LostWorkerExpiryOn()) {
    LogInfo(absl::StrCat("lost-worker expiry: a worker LOST for longer than ",
                         absl::FormatDuration(options_.lost_worker_expiry), " is forgotten"));
  } else {
    LogInfo("lost-worker expiry off: lost workers are kept for good");
  }
}

void Coordinator::TickLoop() {
  while (!stop_.WaitForNotificationWithTimeout(options_.tick)) {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) break;
    ExpireLeasesLocked(NowMs());
    ForgetLostWorkersLocked(NowMs());
    jobs_.EnforceTimeLimits(NowMs());
    jobs_.StoreUnstored();
    // The step metrics and log lines are stored as workers send them, not by the ticker: the
    // line saying their failures are over comes here once success has lasted.
    if (auto line = message_store_log_.Recovered(absl::Now())) LogInfo(*line);
    ScheduleLocked();
    jobs_.RetireFinished();
    RefreshGaugesLocked();
  }
}

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) {
      shutting_down_ = true;
      workers_.CloseAllSessions();
      hub_.CloseAll();
    }
  }
  rendezvous_.Shutdown();
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  if (retention_.joinable()) retention_.join();
}

void Coordinator::ScheduleLocked() {
  if (!shutting_down_) jobs_.Schedule();
}

void Coordinator::RefreshGaugesLocked() {
  if (metrics_ == nullptr) return;
  absl::StatusOr<std::map<v1::JobState, int64_t>> counts = store_->CountJobsByState();
  if (counts.ok()) metrics_->SetJobCounts(*counts);
  const WorkerRegistry::Counts workers = workers_.Count();
  metrics_->SetWorkerCounts(workers.ready, workers.lost);
  metrics_->SetSlots(workers.busy_slots, workers.free_slots);
}

absl::StatusOr<v1::Job> Coordinator::GetJob(const std::string& id) {
  if (absl::Status s = RequireId(id, "id"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (const ActiveJob* active = jobs_.Find(id); active != nullptr) return active->record.job;
  return store_->GetJob(id);
}

absl::StatusOr<v1::ListJobsResponse> Coordinator::ListJobs(const v1::ListJobsRequest& request,
                                                          const std::string* owner) {
  if (request.limit() < 0) return absl::InvalidArgumentError("limit: must not be negative");
  if (request.page_size() < 0 || request.page_size() > kMaxJobsPerPage) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be between 0 and ", kMaxJobsPerPage));
  }
  if (request.limit() > 0 && (request.page_size() > 0 || !request.page_token().empty())) {
    return absl::InvalidArgumentError("limit: not with page_size or page_token");
  }
  int64_t after_seq = 0;
  if (!request.page_token().empty()) {
    std::string decoded;
    const bool decodes = absl::WebSafeBase64Unescape(request.page_token(), &decoded);
    absl::string_view seq = decoded;
    if (!decodes || !absl::ConsumePrefix(&seq, "after:") || !absl::SimpleAtoi(seq, &after_seq) ||
        after_seq <= 0) {
      return absl::InvalidArgumentError("page_token: not a token of a previous ListJobs");
    }
  }
  if (request.labels_size() > kMaxLabelFilters) {
    return absl::InvalidArgumentError(absl::StrCat(
        "labels: at most ", kMaxLabelFilters, " label filters (got ", request.labels_size(), ")"));
  }
  for (const auto& [key, value] : request.labels()) {
    // A selector no job's labels can satisfy is an error, not an empty list.
    if (absl::Status s = CheckLabel(absl::StrCat("labels.", key.substr(0, 80)), key, value);
        !s.ok()) {
      return s;
    }
  }
  std::vector<v1::JobState> states;  // each state once, however often the request repeats it
  for (int state : request.states()) {
    if (!v1::JobState_IsValid(state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(absl::StrCat("states: unknown job state ", state));
    }
    const auto s = static_cast<v1::JobState>(state);
    if (std::find(states.begin(), states.end(), s) == states.end()) states.push_back(s);
  }
  // `limit` (the most recent jobs, one query) is at most a page; otherwise a page of page_size
  // (default kDefaultJobsPerPage) is read from the store in batches, as far as it needs (one more
  // match ends it) and at most options_.max_jobs_scanned_per_list rows: a label filter that matches
  // little ends a call early with a token to go on from. mu_ is taken per batch, not for the call.
  const int limit = std::min(request.limit(), kMaxJobsPerPage);
  const int page_size = limit > 0                 ? 0
                        : request.page_size() > 0 ? request.page_size()
                                                  : kDefaultJobsPerPage;
  const int batch = limit > 0                  ? 0
                    : request.labels().empty() ? page_size + 1
                                               : std::max(page_size + 1, 256);
  v1::ListJobsResponse response;
  int64_t last_taken_seq = 0;
  int64_t scanned = 0;
  for (int64_t read_after = after_seq;;) {
    std::vector<int64_t> seqs;
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::vector<v1::Job>> jobs =
        store_->ListJobs(states, limit, read_after, &seqs, owner, batch);
    if (!jobs.ok()) return jobs.status();
    for (size_t i = 0; i < jobs->size(); ++i) {
      v1::Job& job = (*jobs)[i];
      const ActiveJob* active = jobs_.Find(job.id());
      if (active != nullptr) job = active->record.job;  // the same, plus anything in flight
      bool match = true;
      for (const auto& [key, value] : request.labels()) {
        auto label = job.labels().find(key);
        match = match && label != job.labels().end() && label->second == value;
      }
      if (!match) continue;
      if (page_size > 0 && response.jobs_size() == page_size) {
        // One more matches: the page ends at the last job taken.
        response.set_next_page_token(PageToken(last_taken_seq));
        return response;
      }
      *response.add_jobs() = std::move(job);
      last_taken_seq = seqs[i];
    }
    if (batch == 0 || static_cast<int>(jobs->size()) < batch) break;
    read_after = seqs.back();
    scanned += batch;
    if (scanned >= options_.max_jobs_scanned_per_list) {
      // Rows past the last one taken did not match: the next call starts after them.
      response.set_next_page_token(PageToken(read_after));
      break;
    }
  }
  return response;
}

absl::StatusOr<v1::Job> Coordinator::CancelJob(const std::string& id, const std::string& reason) {
  if (absl::Status s = RequireId(id, "id"); !s.ok()) return s;
  // The reason is stored and printed by `dropless describe`/`watch`: a control character (a
  // newline, a terminal escape) would forge lines there.
  if (HasControlCharacters(reason)) {
    return absl::InvalidArgumentError(
        "reason: must not contain control characters (newlines, tabs, escapes)");
  }
  absl::MutexLock lock(&mu_);
  ActiveJob* found = jobs_.Find(id);
  if (found != nullptr && found->record.job.state() == v1::JOB_STATE_CANCELLED &&
      jobs_.IsDirty(id)) {
    // An earlier cancel whose commit failed (its caller got UNAVAILABLE): this one succeeds once
    // that cancel is stored, and not before, for a restart would forget it.
    v1::Job result = found->record.job;
    if (absl::Status s = jobs_.StoreIfDirty(id); !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the cancellation could not be stored: ", s.message()));
    }
    jobs_.RetireFinished();
    return result;
  }
  if (found == nullptr || IsTerminal(found->record.job.state())) {
    absl::StatusOr<v1::Job> stored = store_->GetJob(id);
    if (!stored.ok()) return stored.status();
    // A cancel again (its caller did not hear the answer, or heard UNAVAILABLE and a later commit
    // stored it): the cancelled job, as for the cancel that stored it.
    if (stored->state() == v1::JOB_STATE_CANCELLED) return *stored;
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " already finished (",
                                                      JobStateName(stored->state()),
                                                      "); nothing to cancel"));
  }
  ActiveJob& job = *found;
  std::string message = reason.empty() ? "cancelled by user" : absl::StrCat("cancelled: ", reason);
  message = TruncateUtf8(message, 1024);
  StoreWrite write;
  jobs_.StopJob(job, v1::JOB_STATE_CANCELLED, message, write);
  v1::Job result = job.record.job;
  // The Cancellations go out even if the commit fails (JobController::Commit says why), and the
  // job stays CANCELLED in memory, stored by the next commit that succeeds; but until then a
  // restart would bring it back, so the caller hears UNAVAILABLE and cancels again.
  absl::Status committed = jobs_.Commit(write);
  jobs_.RetireFinished();
  ScheduleLocked();
  if (!committed.ok()) {
    return absl::UnavailableError(absl::StrCat("the cancellation could not be stored: ",
                                               committed.message()));
  }
  return result;
}

absl::StatusOr<std::vector<v1::Event>> Coordinator::ListEvents(const std::string& job_id,
                                                               int limit) {
  if (limit < 0) return absl::InvalidArgumentError("limit: must not be negative");
  if (limit == 0) limit = kDefaultEventLimit;
  limit = std::min(limit, kMaxEventLimit);
  absl::MutexLock lock(&mu_);
  if (!job_id.empty()) {
    if (absl::Status s = jobs_.CheckJobRank(job_id, std::nullopt); !s.ok()) return s;
  }
  return store_->ListEvents(job_id, limit);
}

absl::StatusOr<std::vector<v1::StepMetrics>> Coordinator::ListStepMetrics(
    const std::string& job_id, std::optional<int32_t> rank, int limit) {
  if (absl::Status s = RequireId(job_id, "job_id"); !s.ok()) return s;
  if (limit < 0) return absl::InvalidArgumentError("limit: must not be negative");
  absl::MutexLock lock(&mu_);
  if (absl::Status s = jobs_.CheckJobRank(job_id, rank); !s.ok()) return s;
  // The history is bounded per job, so one rank's rows are filtered here rather than in SQL.
  absl::StatusOr<std::vector<v1::StepMetrics>> all =
      store_->StepMetricsHistory(job_id, rank.has_value() ? 0 : limit);
  if (!all.ok() || !rank.has_value()) return all;
  std::vector<v1::StepMetrics> out;
  for (v1::StepMetrics& m : *all) {
    if (m.rank() == *rank) out.push_back(std::move(m));
  }
  if (limit > 0 && out.size() > static_cast<size_t>(limit)) {
    out.erase(out.begin(), out.end() - limit);
  }
  return out;
}

std::vector<v1::Worker> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  return workers_.List();
}

absl::StatusOr<JobWatch> Coordinator::WatchJob(const std::string& id) {
  if (absl::Status s = RequireId(id, "id"); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  JobWatch watch;
  const ActiveJob* active = jobs_.Find(id);
  if (active == nullptr || IsTerminal(active->record.job.state())) {
    absl::StatusOr<v1::Job> stored = store_->GetJob(id);
    if (!stored.ok()) return stored.status();
    watch.snapshot = std::move(*stored);
    return watch;
  }
  watch.snapshot = active->record.job;
  watch.updates = hub_.Watch(id);  // under mu_: the job cannot be retired in between
  return watch;
}

void Coordinator::EndWatch(const std::string& id,
                           const std::shared_ptr<Mailbox<v1::JobUpdate>>& updates) {
  hub_.EndWatch(id, updates);
}

absl::StatusOr<LogStream> Coordinator::OpenLogs(const std::string& job_id,
                                                std::optional<int32_t> rank, bool follow,
                                                int64_t after_seq, int tail_lines,
                                                int64_t oldest_time_ms) {
  if (absl::Status s = RequireId(job_id, "job_id"); !s.ok()) return s;
  if (after_seq < 0) return absl::InvalidArgumentError("after_seq: must not be negative");
  if (tail_lines < 0) return absl::InvalidArgumentError("tail_lines: must not be negative");
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  if (absl::Status s = jobs_.CheckJobRank(job_id, rank); !s.ok()) return s;
  const ActiveJob* active = jobs_.Find(job_id);
  LogStream stream;
  stream.job_id = job_id;
  stream.rank = rank;
  stream.oldest_time_ms = oldest_time_ms;
  absl::StatusOr<std::pair<int64_t, int64_t>> range =
      store_->LogTailStart(job_id, rank, tail_lines, after_seq, oldest_time_ms);
  if (!range.ok()) return range.status();
  std::tie(stream.after_seq, stream.up_to_seq) = *range;
  // Lines stored from now on reach a follower through `live` only.
  stream.backlog_done = stream.up_to_seq <= stream.after_seq;
  if (follow && active != nullptr && !IsTerminal(active->record.job.state())) {
    stream.live = hub_.FollowLogs(job_id, rank);
  }
  return stream;
}

absl::StatusOr<std::vector<v1::LogLine>> Coordinator::NextLogPage(LogStream* stream) {
  if (stream->backlog_done) return std::vector<v1::LogLine>();
  absl::MutexLock lock(&mu_);
  absl::StatusOr<std::vector<v1::LogLine>> page = store_->ListLogsPage(
      stream->job_id, stream->rank, stream->after_seq, stream->up_to_seq, stream->oldest_time_ms,
      options_.log_page_lines, options_.log_page_bytes);
  if (!page.ok()) return page.status();
  // Deleted by retention meanwhile, or read to the end: done.
  if (page->empty()) stream->backlog_done = true;
  if (!page->empty()) stream->after_seq = page->back().seq();
  if (stream->after_seq >= stream->up_to_seq) stream->backlog_done = true;
  return page;
}

absl::Status Coordinator::RendezvousPut(const std::string& job_id, int32_t attempt,
                                        const std::string& key, std::string value) {
  // Under mu_, so the attempt cannot end (and its stored keys be deleted) between the write and
  // the put.
  absl::MutexLock lock(&mu_);
  if (absl::Status s = rendezvous_.CheckPut(job_id, attempt, key, value.size()); !s.ok()) return s;
  if (absl::Status s = store_->PutRendezvousKey(job_id, attempt, key, value); !s.ok()) {
    LogError(absl::StrCat("storing a rendezvous key failed: ", s.ToString()));
    return absl::UnavailableError(absl::StrCat("rendezvous key not stored: ", s.message()));
  }
  return rendezvous_.Put(job_id, attempt, key, std::move(value));
}

void Coordinator::EndLogs(const std::string& job_id,
                          const std::shared_ptr<Mailbox<v1::LogLine>>& live) {
  hub_.EndLogs(job_id, live);
}

}  // namespace dropless::coordinator
