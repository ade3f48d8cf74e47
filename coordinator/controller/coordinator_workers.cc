// Coordinator: worker registration, sessions (Hello reconciliation, heartbeats, rank status,
// metrics, logs) and lease expiry.
#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"
#include "common/log.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/util/clock.h"
#include "google/protobuf/util/time_util.h"

namespace dropless::coordinator {

using google::protobuf::util::TimeUtil;

namespace {

constexpr size_t kMaxNameBytes = 253;
constexpr size_t kMaxDevices = 4096;
constexpr int64_t kStrayCancelIntervalMs = 5000;

bool RankEnded(v1::RankState state) {
  return state == v1::RANK_STATE_SUCCEEDED || state == v1::RANK_STATE_FAILED ||
         state == v1::RANK_STATE_KILLED;
}

absl::Status CheckName(const std::string& value, absl::string_view field, bool required) {
  if (value.empty()) {
    return required ? absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"))
                    : absl::OkStatus();
  }
  if (value.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": longer than ", kMaxNameBytes,
                                                   " bytes"));
  }
  for (char c : value) {
    if (!absl::ascii_isgraph(static_cast<unsigned char>(c))) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": only printable characters without spaces are allowed"));
    }
  }
  return absl::OkStatus();
}

std::string StrayKey(const std::string& worker_id, const std::string& job_id, int32_t attempt) {
  return absl::StrCat(worker_id, "|", job_id, "|", attempt);
}

}  // namespace

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (absl::Status s = CheckName(request.node(), "node", true); !s.ok()) return s;
  if (absl::Status s = CheckName(request.address(), "address", false); !s.ok()) return s;
  if (request.slot_kind() != "cpu" && request.slot_kind() != "cuda") {
    return absl::InvalidArgumentError(
        absl::StrCat("slot_kind: must be cpu or cuda (got \"", request.slot_kind(), "\")"));
  }
  if (request.devices().empty()) {
    return absl::InvalidArgumentError("devices: a worker needs at least one slot");
  }
  if (static_cast<size_t>(request.devices_size()) > kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("devices: more than ", kMaxDevices, " slots"));
  }
  for (const std::string& device : request.devices()) {
    if (device.size() > 256) return absl::InvalidArgumentError("devices: entry longer than 256 bytes");
  }
  if (request.metrics_port() < 0 || request.metrics_port() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port: must be 0..65535 (got ", request.metrics_port(), ")"));
  }

  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  const int64_t now = NowMs();
  StoreWrite write;
  auto known = worker_by_node_.find(request.node());
  bool fresh = known == worker_by_node_.end();
  std::string id = fresh ? absl::StrFormat("worker-%04d", next_worker_number_++) : known->second;
  WorkerEntry& worker = workers_[id];
  v1::Worker& info = worker.info;
  if (fresh) {
    info.set_id(id);
    info.set_node(request.node());
    info.set_state(v1::WORKER_STATE_LOST);  // READY once its session says Hello
    info.set_registered_time_ms(now);
    worker_by_node_[request.node()] = id;
  }
  info.set_address(request.address());
  info.set_metrics_port(request.metrics_port());
  info.set_slot_kind(request.slot_kind());
  *info.mutable_devices() = request.devices();
  info.set_slots(request.devices_size());
  worker.last_message_ms = now;
  write.workers.push_back(info);
  AddEvent(write, "", 0, fresh ? "WorkerRegistered" : "WorkerReregistered",
           absl::StrFormat("%s: node %s, %d %s slots, version %s", id, request.node(),
                           request.devices_size(), request.slot_kind(),
                           request.version().empty() ? "unknown" : request.version()));
  if (absl::Status s = CommitLocked(write); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("the worker could not be stored: ", s.message()));
  }
  LogInfo(absl::StrFormat("%s %s: node %s, %d %s slots", fresh ? "registered" : "re-registered",
                          id, request.node(), request.devices_size(), request.slot_kind()));
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(options_.heartbeat_interval_ms);
  response.set_lease_timeout_ms(options_.lease_timeout_ms);
  *response.mutable_heartbeat_interval() =
      TimeUtil::MillisecondsToDuration(options_.heartbeat_interval_ms);
  *response.mutable_lease_timeout() = TimeUtil::MillisecondsToDuration(options_.lease_timeout_ms);
  response.set_acknowledges(true);
  return response;
}

void Coordinator::AddSession(const std::shared_ptr<WorkerSession>& session) {
  absl::MutexLock lock(&mu_);
  sessions_[session] = SessionEntry{"", NowMs()};
  if (shutting_down_) session->Close();
}

void Coordinator::RemoveSession(const std::shared_ptr<WorkerSession>& session) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return;
  std::string worker_id = it->second.worker_id;
  sessions_.erase(it);
  if (shutting_down_ || worker_id.empty()) return;
  auto worker = workers_.find(worker_id);
  if (worker == workers_.end() || worker->second.session != session) return;  // superseded
  worker->second.session = nullptr;
  // Its ranks keep their slots and attempts until the lease runs out; it may reconnect.
  StoreWrite write;
  write.durable = false;
  MarkWorkerLostLocked(worker->second, "session ended", write);
  (void)CommitLocked(write);
}

absl::Status Coordinator::HandleWorkerMessage(const std::shared_ptr<WorkerSession>& session,
                                              const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return absl::AbortedError("session is closed");
  if (it->second.worker_id.empty()) {
    if (!message.has_hello()) {
      return absl::InvalidArgumentError(
          "the first message of a session must be hello (register, then say hello)");
    }
    return HandleHelloLocked(session, message.hello());
  }
  if (message.has_hello()) return absl::InvalidArgumentError("hello: sent twice on one session");
  WorkerEntry& worker = workers_.at(it->second.worker_id);
  if (worker.session != session) {
    return absl::AbortedError("superseded by a newer session of this worker");
  }
  worker.last_message_ms = NowMs();
  const uint64_t seq = message.seq();
  if (seq != 0 && seq <= worker.last_seq) {
    // Sent again after a reconnect, already stored: acknowledge it again, store nothing.
    session->Acknowledge(seq);
    return absl::OkStatus();
  }
  bool stored = true;
  switch (message.msg_case()) {
    case v1::WorkerMessage::kHeartbeat:
      HandleHeartbeatLocked(worker, message.heartbeat());
      break;
    case v1::WorkerMessage::kRankStatus:
      HandleRankStatusLocked(worker, message.rank_status(), /*from_list=*/false);
      break;
    case v1::WorkerMessage::kMetrics:
      stored = HandleMetricsLocked(worker, message.metrics());
      break;
    case v1::WorkerMessage::kLogs:
      stored = HandleLogsLocked(worker, message.logs());
      break;
    default:
      break;  // a newer worker's message kind: the lease renewal is all it means to us
  }
  if (!stored) {
    // Not acknowledged (acknowledgements are cumulative, so nothing after it may be either): the
    // session ends and the worker sends it again from its queue on the next one.
    return absl::UnavailableError("the coordinator could not store a message; send it again");
  }
  if (seq != 0) {
    // The handlers above wrote to the store synchronously: the message is stored.
    worker.last_seq = seq;
    session->Acknowledge(seq);
  }
  return absl::OkStatus();
}

absl::Status Coordinator::HandleHelloLocked(const std::shared_ptr<WorkerSession>& session,
                                            const v1::Hello& hello) {
  if (hello.worker_id().empty()) {
    return absl::InvalidArgumentError("hello.worker_id: must not be empty");
  }
  auto found = workers_.find(hello.worker_id());
  if (found == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("worker \"", hello.worker_id(),
                                            "\" is not registered; call RegisterWorker first"));
  }
  WorkerEntry& worker = found->second;
  if (!session->certified_node().empty() && session->certified_node() != worker.info.node()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "hello: worker ", hello.worker_id(), " is node \"", worker.info.node(),
        "\" but the client certificate is node \"", session->certified_node(),
        "\": a worker may only report as itself"));
  }
  if (worker.session != nullptr && worker.session != session) worker.session->Close();
  if (hello.boot_id() != worker.boot_id) {  // a new numbering: seq starts from 1 again
    worker.boot_id = hello.boot_id();
    worker.last_seq = 0;
  }
  sessions_[session].worker_id = worker.info.id();
  worker.session = session;
  worker.last_message_ms = NowMs();
  worker.lease_expired = false;

  StoreWrite write;
  write.durable = false;
  if (worker.info.state() != v1::WORKER_STATE_READY) {
    worker.info.set_state(v1::WORKER_STATE_READY);
    write.workers.push_back(worker.info);
    AddEvent(write, "", 0, "WorkerReady",
             absl::StrFormat("%s (node %s): session open, %d ranks alive", worker.info.id(),
                             worker.info.node(), hello.ranks_size()));
  }
  (void)CommitLocked(write);
  LogInfo(absl::StrFormat("%s (node %s) said hello with %d live ranks", worker.info.id(),
                          worker.info.node(), hello.ranks_size()));

  // Reconcile: reported ranks of current attempts are kept, others are cancelled ...
  std::set<std::tuple<std::string, int32_t, int32_t>> alive;
  for (const v1::RankStatus& status : hello.ranks()) {
    alive.insert({status.job_id(), status.attempt(), status.rank()});
    // A rank listed as ended ended while the worker had no session: it is listed so that it is
    // not taken for missing below, but its end is applied when its queued RankStatus arrives,
    // behind the step metrics and log lines it reported before it. Ending the attempt here would
    // finish the job first, and those would then be dropped as reports of an ended attempt.
    if (RankEnded(status.state())) continue;
    HandleRankStatusLocked(worker, status, /*from_list=*/true);
  }
  // ... and a rank of an active attempt placed here but not reported is gone: its attempt fails.
  StoreWrite failures;
  for (auto& [id, job] : jobs_) {
    if (!job.attempt.has_value() || IsTerminal(job.record.job.state())) continue;
    for (const RankRecord& rank : job.attempt->ranks) {
      if (rank.worker_id != worker.info.id() || RankEnded(rank.state) ||
          alive.count({id, job.attempt->attempt, rank.rank}) != 0) {
        continue;
      }
      worker.occupied.erase(rank.slot);
      FailAttemptLocked(job,
                        absl::StrFormat("rank %d was not running on node %s when its worker "
                                        "reconnected",
                                        rank.rank, worker.info.node()),
                        failures);
      break;
    }
  }
  // Slots of ended attempts whose ranks are not alive any more are free again.
  for (auto slot = worker.occupied.begin(); slot != worker.occupied.end();) {
    const RankKey& key = slot->second;
    bool active = FindActiveAttempt(key.job_id, key.attempt) != nullptr;
    if (!active && alive.count({key.job_id, key.attempt, key.rank}) == 0) {
      slot = worker.occupied.erase(slot);
    } else {
      ++slot;
    }
  }
  (void)CommitLocked(failures);
  PublishLocked(failures);
  RetireFinishedJobsLocked();
  ScheduleLocked();
  return absl::OkStatus();
}

void Coordinator::HandleRankStatusLocked(WorkerEntry& worker, const v1::RankStatus& status,
                                         bool from_list) {
  if (status.state() == v1::RANK_STATE_UNSPECIFIED || !v1::RankState_IsValid(status.state())) {
    return;
  }
  ActiveJob* job = FindActiveAttempt(status.job_id(), status.attempt());
  RankRecord* rank = nullptr;
  if (job != nullptr) {
    for (RankRecord& r : job->attempt->ranks) {
      if (r.rank == status.rank()) rank = &r;
    }
  }
  if (rank == nullptr || rank->worker_id != worker.info.id()) {
    CancelStrayRankLocked(worker, status);
    return;
  }
  if (RankEnded(rank->state)) return;                          // no way back from an end
  if (status.state() < rank->state) return;  // a late or resent older report (STARTING after RUNNING)
  if (from_list && status.state() == rank->state) return;      // lists only move ranks forward
  rank->state = status.state();
  rank->exit_code = status.exit_code();
  if (RankEnded(status.state())) worker.occupied.erase(rank->slot);

  StoreWrite write;
  write.durable = false;
  v1::Job& j = job->record.job;
  const int32_t rank_number = rank->rank;
  MarkDirty(*job);
  if (status.state() == v1::RANK_STATE_FAILED || status.state() == v1::RANK_STATE_KILLED) {
    std::string reason =
        status.state() == v1::RANK_STATE_FAILED
            ? absl::StrFormat("rank %d on node %s failed with exit code %d", rank_number,
                              worker.info.node(), status.exit_code())
            : absl::StrFormat("rank %d on node %s was killed", rank_number, worker.info.node());
    if (!status.message().empty()) absl::StrAppend(&reason, ": ", TruncateUtf8(status.message(), 512));
    AddEvent(write, j.id(), status.attempt(), "RankExited", reason);
    FailAttemptLocked(*job, reason, write);
    write.durable = true;
  } else {
    bool all_running = true, all_succeeded = true;
    for (const RankRecord& r : job->attempt->ranks) {
      all_running &= r.state == v1::RANK_STATE_RUNNING || r.state == v1::RANK_STATE_SUCCEEDED;
      all_succeeded &= r.state == v1::RANK_STATE_SUCCEEDED;
    }
    if (all_running && j.state() == v1::JOB_STATE_SCHEDULED) {
      j.set_state(v1::JOB_STATE_RUNNING);
      job->attempt->state = v1::JOB_STATE_RUNNING;
      if (j.start_time_ms() == 0) j.set_start_time_ms(NowMs());
      AddEvent(write, j.id(), status.attempt(), "Running",
               absl::StrFormat("all %d ranks running", j.world_size()));
      write.durable = true;
    }
    if (all_succeeded) {
      EndAttemptLocked(*job, v1::JOB_STATE_SUCCEEDED, "", write);
      FinishJobLocked(*job, v1::JOB_STATE_SUCCEEDED, "", write);
      write.durable = true;
    }
  }
  (void)CommitLocked(write);
  PublishLocked(write);
  if (RankEnded(status.state())) {
    RetireFinishedJobsLocked();
    ScheduleLocked();
  }
}

void Coordinator::CancelStrayRankLocked(WorkerEntry& worker, const v1::RankStatus& status) {
  auto holds = [&](const std::pair<const int32_t, RankKey>& slot) {
    return slot.second.job_id == status.job_id() && slot.second.attempt == status.attempt() &&
           slot.second.rank == status.rank();
  };
  if (RankEnded(status.state())) {
    for (auto it = worker.occupied.begin(); it != worker.occupied.end();) {
      it = holds(*it) ? worker.occupied.erase(it) : std::next(it);
    }
    ScheduleLocked();
    return;
  }
  const int64_t now = NowMs();
  int64_t& last = stray_cancels_[StrayKey(worker.info.id(), status.job_id(), status.attempt())];
  if (now - last < kStrayCancelIntervalMs) return;
  last = now;
  LogInfo(absl::StrFormat("%s runs rank %d of %s attempt %d, which is not active here: "
                          "cancelling it",
                          worker.info.id(), status.rank(), status.job_id(), status.attempt()));
  if (worker.session != nullptr) {
    v1::CoordinatorMessage message;
    v1::Cancellation* c = message.mutable_cancellation();
    c->set_job_id(status.job_id());
    c->set_attempt(status.attempt());
    c->set_reason("this attempt is not active on the coordinator");
    worker.session->Send(std::move(message));
  }
  // Until it exits, the process holds its slot: find which one from the stored placement.
  if (std::any_of(worker.occupied.begin(), worker.occupied.end(), holds)) return;
  absl::StatusOr<AttemptRecord> attempt = store_->GetAttempt(status.job_id(), status.attempt());
  if (!attempt.ok()) return;
  for (const RankRecord& r : attempt->ranks) {
    if (r.rank == status.rank() && r.worker_id == worker.info.id() &&
        worker.occupied.count(r.slot) == 0) {
      worker.occupied[r.slot] = RankKey{status.job_id(), status.attempt(), status.rank()};
    }
  }
}

void Coordinator::HandleHeartbeatLocked(WorkerEntry& worker, const v1::Heartbeat& heartbeat) {
  std::set<std::tuple<std::string, int32_t, int32_t>> alive;
  for (const v1::RankStatus& status : heartbeat.ranks()) {
    alive.insert({status.job_id(), status.attempt(), status.rank()});
    HandleRankStatusLocked(worker, status, /*from_list=*/true);
  }
  CheckProgressLocked(worker, heartbeat);
  bool released = false;
  for (auto slot = worker.occupied.begin(); slot != worker.occupied.end();) {
    const RankKey& key = slot->second;
    if (FindActiveAttempt(key.job_id, key.attempt) == nullptr &&
        alive.count({key.job_id, key.attempt, key.rank}) == 0) {
      slot = worker.occupied.erase(slot);
      released = true;
    } else {
      ++slot;
    }
  }
  if (released) ScheduleLocked();
}

bool Coordinator::HandleMetricsLocked(WorkerEntry& worker, v1::StepMetrics metrics) {
  ActiveJob* job = FindActiveAttempt(metrics.job_id(), metrics.attempt());
  if (job == nullptr) return true;  // a late report of an attempt that ended
  bool placed_here = false;
  for (const RankRecord& r : job->attempt->ranks) {
    placed_here |= r.rank == metrics.rank() && r.worker_id == worker.info.id();
  }
  if (!placed_here) return true;
  if (metrics.node().empty()) metrics.set_node(worker.info.node());
  if (metrics.time_ms() == 0) metrics.set_time_ms(NowMs());
  job->step_times.Add(metrics.step_seconds());
  v1::Job& j = job->record.job;
  if (!j.has_latest() || j.latest().attempt() != metrics.attempt() ||
      metrics.rank() <= j.latest().rank()) {
    *j.mutable_latest() = metrics;
  }
  bool stored = true;
  if (absl::Status s = store_->PutStepMetrics(metrics); !s.ok()) {
    LogError(absl::StrCat("storing step metrics failed: ", s.ToString()));
    stored = false;
  }
  if (!hub_.Watched(j.id())) return stored;
  v1::JobUpdate update;
  *update.mutable_job() = j;
  *update.mutable_metrics() = std::move(metrics);
  hub_.Publish(j.id(), std::move(update));
  return stored;
}

bool Coordinator::HandleLogsLocked(WorkerEntry& worker, const v1::LogBatch& batch) {
  std::vector<v1::LogLine> lines;
  std::set<std::string> known, unknown;
  for (const v1::LogLine& in : batch.lines()) {
    if (lines.size() >= options_.max_log_lines_per_batch) break;
    const std::string& id = in.job_id();
    if (id.empty() || unknown.count(id) != 0) continue;
    if (known.count(id) == 0) {
      if (jobs_.count(id) == 0 && !store_->GetJobRecord(id).ok()) {
        unknown.insert(id);
        continue;
      }
      known.insert(id);
    }
    v1::LogLine& line = lines.emplace_back(in);
    if (line.text().size() > options_.max_log_line_bytes) {
      line.set_text(TruncateUtf8(line.text(), options_.max_log_line_bytes));
    }
    if (line.time_ms() == 0) line.set_time_ms(NowMs());
  }
  if (!unknown.empty()) {
    LogWarning(absl::StrFormat("%s sent log lines of %d unknown jobs; dropped", worker.info.id(),
                               unknown.size()));
  }
  absl::StatusOr<int64_t> first_seq = store_->AppendLogs(lines);
  const bool stored = first_seq.ok();
  if (!first_seq.ok()) {
    LogError(absl::StrCat("storing log lines failed: ", first_seq.status().ToString()));
  } else {
    for (size_t i = 0; i < lines.size(); ++i) lines[i].set_seq(*first_seq + static_cast<int64_t>(i));
  }
  if (!stored) return false;  // the worker sends them again; followers see them then
  for (const v1::LogLine& line : lines) {
    if (jobs_.count(line.job_id()) == 0) continue;
    hub_.PublishLog(line);
  }
  return true;
}

void Coordinator::MarkWorkerLostLocked(WorkerEntry& worker, const std::string& why,
                                       StoreWrite& write) {
  if (worker.info.state() == v1::WORKER_STATE_LOST) return;
  worker.info.set_state(v1::WORKER_STATE_LOST);
  write.workers.push_back(worker.info);
  AddEvent(write, "", 0, "WorkerLost",
           absl::StrFormat("%s (node %s): %s", worker.info.id(), worker.info.node(), why));
  LogWarning(absl::StrFormat("%s (node %s) lost: %s", worker.info.id(), worker.info.node(), why));
}

void Coordinator::FailAttemptsOnWorkerLocked(WorkerEntry& worker, const std::string& reason,
                                             StoreWrite& write) {
  for (auto& [id, job] : jobs_) {
    if (!job.attempt.has_value() || IsTerminal(job.record.job.state())) continue;
    bool placed_here = false;
    for (const RankRecord& rank : job.attempt->ranks) {
      placed_here |= rank.worker_id == worker.info.id() && !RankEnded(rank.state);
    }
    if (placed_here) FailAttemptLocked(job, reason, write);
  }
}

void Coordinator::ExpireLeasesLocked(int64_t now_ms) {
  std::vector<WorkerLease> leases;
  for (const auto& [id, worker] : workers_) {
    if (!worker.lease_expired) leases.push_back({id, worker.last_message_ms});
  }
  StoreWrite write;
  for (const std::string& id : ExpiredLeases(leases, now_ms, options_.lease_timeout_ms)) {
    WorkerEntry& worker = workers_.at(id);
    worker.lease_expired = true;
    bool had_work = !worker.occupied.empty();
    for (const auto& [job_id, job] : jobs_) {
      if (!job.attempt.has_value()) continue;
      for (const RankRecord& rank : job.attempt->ranks) had_work |= rank.worker_id == id;
    }
    bool was_ready = worker.info.state() == v1::WORKER_STATE_READY;
    if (worker.session != nullptr) {
      worker.session->Close();
      worker.session = nullptr;
    }
    if (!had_work && !was_ready) continue;  // gone quietly, nothing to account for
    if (metrics_ != nullptr) metrics_->CountLeaseExpiry();
    std::string reason = absl::StrFormat("worker %s (node %s) lost: no message for %d ms",
                                         id, worker.info.node(), now_ms - worker.last_message_ms);
    MarkWorkerLostLocked(worker, absl::StrFormat("lease expired (no message for %d ms)",
                                                 now_ms - worker.last_message_ms),
                         write);
    FailAttemptsOnWorkerLocked(worker, reason, write);
    worker.occupied.clear();
  }
  // Sessions that never said Hello.
  for (auto& [session, entry] : sessions_) {
    if (entry.worker_id.empty() && now_ms - entry.opened_ms > options_.lease_timeout_ms) {
      session->Close();
    }
  }
  for (auto it = stray_cancels_.begin(); it != stray_cancels_.end();) {
    it = now_ms - it->second > 60'000 ? stray_cancels_.erase(it) : std::next(it);
  }
  if (write.empty() && dirty_jobs_.empty()) return;
  write.durable = true;
  (void)CommitLocked(write);
  PublishLocked(write);
  RetireFinishedJobsLocked();
}

}  // namespace dropless::coordinator
