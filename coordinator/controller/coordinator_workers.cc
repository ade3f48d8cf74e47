// Coordinator: what the workers' messages mean for the jobs: registration and sessions through
// the WorkerRegistry, Hello reconciliation, heartbeats, rank status, metrics, logs, and what an
// expired lease does to the attempts placed on the worker.
#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/api_metadata.h"
#include "common/job_error.h"
#include "common/log.h"
#include "common/utf8.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/util/clock.h"
#include "google/protobuf/util/time_util.h"

namespace dropless::coordinator {

using google::protobuf::util::TimeUtil;

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  if (absl::Status s = WorkerRegistry::CheckRegistration(request); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  StoreWrite write;
  bool fresh = false;
  absl::StatusOr<const v1::Worker*> registered = workers_.Register(request, NowMs(), write, &fresh);
  if (!registered.ok()) {
    LogWarning(absl::StrCat("refused a registration: ", registered.status().message()));
    return registered.status();
  }
  const std::string id = (*registered)->id();
  if (absl::Status s = jobs_.Commit(write); !s.ok()) {
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
  workers_.OpenSession(session, NowMs());
  if (shutting_down_) session->Close();
}

void Coordinator::RemoveSession(const std::shared_ptr<WorkerSession>& session) {
  absl::MutexLock lock(&mu_);
  const std::string worker_id = workers_.ForgetSession(session);
  if (shutting_down_ || worker_id.empty()) return;
  const int64_t now_ms = NowMs();
  WorkerEntry* worker = workers_.Disconnect(worker_id, session, now_ms);
  if (worker == nullptr) return;  // superseded
  // Its ranks keep their slots and attempts until the lease runs out; it may reconnect.
  StoreWrite write;
  write.durable = false;
  worker->disconnected_ms = now_ms;
  workers_.MarkLost(*worker, "session ended", write);
  if (worker->leaving.empty()) {  // a daemon that said Goodbye is accounted for already
    NoteWorkerGoneLocked(*worker, "WorkerDisconnected",
                         absl::StrFormat("disconnected; its ranks keep their slots until its "
                                         "lease runs out (%d ms) unless it reconnects",
                                         options_.lease_timeout_ms),
                         write);
  }
  (void)jobs_.Commit(write);
}

absl::Status Coordinator::HandleWorkerMessages(const std::shared_ptr<WorkerSession>& session,
                                               const std::vector<v1::WorkerMessage>& messages) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("coordinator is shutting down");
  RankStatusCommit statuses;
  // Not acknowledged (acknowledgements are cumulative, so nothing after it may be either): the
  // session ends and the worker sends it again from its queue on the next one.
  const absl::Status not_stored =
      absl::UnavailableError("the coordinator could not store a message; send it again");
  // The statuses so far are stored before a message of another kind is handled, so that what
  // it means is judged against stored state and the order of acknowledgements is kept.
  auto commit_statuses = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t seq = statuses.ack_seq;
    if (!CommitRankStatusesLocked(statuses)) return false;
    if (seq != 0) {
      // Every status up to it is in the store (a change of a rank's state with fsync).
      const std::string* worker_id = workers_.SessionWorker(session);
      if (WorkerEntry* worker = worker_id != nullptr ? workers_.Find(*worker_id) : nullptr;
          worker != nullptr && worker->session == session) {
        worker->last_seq = seq;
        session->Acknowledge(seq);
      }
    }
    return true;
  };
  for (const v1::WorkerMessage& message : messages) {
    if (!message.has_rank_status() && !commit_statuses()) return not_stored;
    absl::Status handled = HandleWorkerMessageLocked(session, message, statuses);
    if (!handled.ok()) {
      (void)commit_statuses();  // the statuses before it are stored and acknowledged
      // A queued message refused as malformed is named, so that the daemon drops exactly it
      // rather than resend it ahead of everything behind it (kRefusedSeqMetadata).
      if (absl::IsInvalidArgument(handled) && !message.has_hello() && message.seq() != 0) {
        handled.SetPayload(kRefusedSeqMetadata, absl::Cord(absl::StrCat(message.seq())));
      }
      return handled;
    }
  }
  return commit_statuses() ? absl::OkStatus() : not_stored;
}

absl::Status Coordinator::HandleWorkerMessageLocked(const std::shared_ptr<WorkerSession>& session,
                                                    const v1::WorkerMessage& message,
                                                    RankStatusCommit& statuses) {
  // Store lookups for stray ranks (HoldStraySlotLocked) are bounded per message: a Hello or a
  // heartbeat listing many made-up ranks would otherwise do one each under the lock.
  stray_lookups_left_ = kMaxStrayLookupsPerMessage;
  stray_attempts_.clear();
  const std::string* worker_id = workers_.SessionWorker(session);
  if (worker_id == nullptr) return absl::AbortedError("session is closed");
  if (worker_id->empty()) {
    if (!message.has_hello()) {
      return absl::InvalidArgumentError(
          "the first message of a session must be hello (register, then say hello)");
    }
    return HandleHelloLocked(session, message.hello());
  }
  if (message.has_hello()) return absl::InvalidArgumentError("hello: sent twice on one session");
  WorkerEntry* found = workers_.Find(*worker_id);
  if (found == nullptr) return absl::AbortedError("session is closed");  // the worker forgotten
  WorkerEntry& worker = *found;
  if (worker.session != session) {
    return absl::AbortedError("superseded by a newer session of this worker");
  }
  worker.last_message_ms = NowMs();
  const uint64_t seq = message.seq();
  if (WorkerRegistry::Handled(worker, seq)) {
    // Sent again after a reconnect, already stored: acknowledge it again, store nothing.
    session->Acknowledge(seq);
    return absl::OkStatus();
  }
  bool stored = true;
  // Metrics and log lines are appended, not upserted: the message is recorded as stored in their
  // transaction, so that a restarted coordinator acknowledges its resend without a second copy.
  const WorkerReceipt receipt{worker.info.id(), worker.boot_id, seq};
  const WorkerReceipt* receipt_of_seq = seq != 0 ? &receipt : nullptr;
  switch (message.msg_case()) {
    case v1::WorkerMessage::kHeartbeat:
      HandleHeartbeatLocked(worker, message.heartbeat());
      break;
    case v1::WorkerMessage::kRankStatus:
      // Acknowledged by HandleWorkerMessages once committed with the statuses after it.
      ApplyRankStatusLocked(worker, message.rank_status(), /*from_list=*/false, statuses);
      if (seq != 0) statuses.ack_seq = seq;
      return absl::OkStatus();
    case v1::WorkerMessage::kMetrics:
      if (message.metrics().expert_tokens_size() > kMaxExpertTokens) {
        return absl::InvalidArgumentError(
            absl::StrCat("metrics.expert_tokens: at most ", kMaxExpertTokens,
                         " entries (one per expert; a spec has at most that many experts), got ",
                         message.metrics().expert_tokens_size()));
      }
      stored = HandleMetricsLocked(worker, message.metrics(), receipt_of_seq);
      break;
    case v1::WorkerMessage::kLogs:
      stored = HandleLogsLocked(worker, message.logs(), receipt_of_seq);
      break;
    case v1::WorkerMessage::kGoodbye:
      HandleGoodbyeLocked(worker, message.goodbye());
      break;
    default:
      break;  // a newer worker's message kind: the lease renewal is all it means to us
  }
  if (!stored) {
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
  // The worker's row, its listed ranks and what their absence means: one commit.
  RankStatusCommit commit;
  bool new_run = false;  // another daemon run than the one before: the old run's ranks are gone
  absl::StatusOr<WorkerEntry*> hello_from =
      workers_.Hello(session, hello, NowMs(), commit.write, &new_run);
  if (!hello_from.ok()) return hello_from.status();
  WorkerEntry& worker = **hello_from;
  LogInfo(absl::StrFormat("%s (node %s) said hello with %d live ranks%s", worker.info.id(),
                          worker.info.node(), hello.ranks_size(),
                          new_run ? " (a new run of its daemon)" : ""));

  // Reconcile: reported ranks of current attempts are kept, others are cancelled ...
  ListedRanks alive;
  for (const v1::RankStatus& status : hello.ranks()) {
    alive.insert({status.job_id(), status.attempt(), status.rank()});
    // A rank listed as ended ended while the worker had no session: it is listed so that it is
    // not taken for missing below, but its end is applied when its queued RankStatus arrives,
    // behind the step metrics and log lines it reported before it. Ending the attempt here would
    // finish the job first, and those would then be dropped as reports of an ended attempt.
    if (RankEnded(status.state())) continue;
    ApplyRankStatusLocked(worker, status, /*from_list=*/true, commit);
  }
  // ... and a rank of an active attempt placed here but not listed is gone: its attempt fails,
  // unless the daemon run never got its Assignment, which then goes again.
  ReconcileUnlistedRanksLocked(
      worker, alive, &hello,
      absl::StrCat("was not running on node ", worker.info.node(), " when its worker reconnected",
                   new_run ? " (a new run of its worker daemon: the ranks of the run before it "
                             "are gone)"
                           : ""),
      commit.write);
  // Slots of ended attempts whose ranks are not alive any more are free again.
  (void)FreeSlotsOfEndedAttemptsLocked(worker, alive, /*ended=*/nullptr);
  commit.slot_freed = true;
  // A Hello is not a queued message: a failed commit is logged and retried with the next one.
  (void)CommitRankStatusesLocked(commit);
  return absl::OkStatus();
}

bool Coordinator::HandleMetricsLocked(WorkerEntry& worker, v1::StepMetrics metrics,
                                      const WorkerReceipt* receipt) {
  ActiveJob* job = jobs_.FindActiveAttempt(metrics.job_id(), metrics.attempt());
  if (job == nullptr) return true;  // a late report of an attempt that ended
  bool placed_here = false;
  for (const RankRecord& r : job->attempt->ranks) {
    placed_here |= r.rank == metrics.rank() && r.worker_id == worker.info.id();
  }
  if (!placed_here) return true;
  metrics.set_node(worker.info.node());  // the reporting worker's, whatever the message said
  if (metrics.time_ms() == 0) metrics.set_time_ms(NowMs());
  // Heard of only once stored: a step that is not comes again (the worker resends it), and
  // watchers and the hang watchdog would count it twice.
  if (absl::Status s = store_->PutStepMetrics(metrics, receipt); !s.ok()) {
    if (auto line = message_store_log_.Failed(s.ToString(), absl::Now())) LogError(*line);
    return false;
  }
  if (auto line = message_store_log_.Succeeded(absl::Now())) LogInfo(*line);
  job->step_times.Add(metrics.step_seconds());
  v1::Job& j = job->record.job;
  if (!j.has_latest() || j.latest().attempt() != metrics.attempt() ||
      metrics.rank() <= j.latest().rank()) {
    *j.mutable_latest() = metrics;
  }
  if (!hub_.Watched(j.id())) return true;
  v1::JobUpdate update;
  *update.mutable_job() = j;
  *update.mutable_metrics() = std::move(metrics);
  hub_.Publish(j.id(), std::move(update));
  return true;
}

bool Coordinator::HandleLogsLocked(WorkerEntry& worker, const v1::LogBatch& batch,
                                   const WorkerReceipt* receipt) {
  // A worker may only report the output of ranks placed on it: a line naming another worker's
  // rank, or a job or attempt that does not exist, is dropped (one warning per batch). The
  // placement of an attempt that ended is read from the store (a cancelled rank's last lines
  // arrive after its attempt ended), at most kMaxStoreLookups times a batch: this runs under the
  // coordinator's lock.
  constexpr int kMaxStoreLookups = 8;
  int lookups = 0;
  bool store_failed = false;
  std::map<std::pair<std::string, int32_t>, std::set<int32_t>> ranks_here;  // (job, attempt)
  auto placed_here = [&](const v1::LogLine& line) -> bool {
    const std::pair<std::string, int32_t> key{line.job_id(), line.attempt()};
    auto it = ranks_here.find(key);
    if (it == ranks_here.end()) {
      std::set<int32_t> ranks;
      // By node as well as by id: a worker forgotten while cut off (--lost-worker-expiry) comes
      // back under a new id and resends its ranks' lines, often the ones that say why they ended.
      auto collect = [&](const AttemptRecord& attempt) {
        for (const RankRecord& r : attempt.ranks) {
          if (r.worker_id == worker.info.id() || r.node == worker.info.node()) {
            ranks.insert(r.rank);
          }
        }
      };
      if (ActiveJob* job = jobs_.FindActiveAttempt(key.first, key.second); job != nullptr) {
        collect(*job->attempt);
      } else if (!key.first.empty() && key.second > 0 && lookups < kMaxStoreLookups) {
        ++lookups;
        absl::StatusOr<AttemptRecord> ended = store_->GetAttempt(key.first, key.second);
        if (ended.ok()) {
          collect(*ended);
        } else if (!absl::IsNotFound(ended.status())) {
          store_failed = true;
        }
      }
      it = ranks_here.emplace(key, std::move(ranks)).first;
    }
    return it->second.count(line.rank()) != 0;
  };
  std::vector<v1::LogLine> lines;
  int dropped = 0;
  for (const v1::LogLine& in : batch.lines()) {
    // The cap counts every line looked at, kept or dropped.
    if (lines.size() + static_cast<size_t>(dropped) >= options_.max_log_lines_per_batch) break;
    if (!placed_here(in)) {
      ++dropped;
      continue;
    }
    v1::LogLine& line = lines.emplace_back(in);
    if (line.text().size() > options_.max_log_line_bytes) {
      line.set_text(TruncateUtf8(line.text(), options_.max_log_line_bytes));
    }
    if (line.time_ms() == 0) line.set_time_ms(NowMs());
  }
  if (store_failed) {
    LogError("reading an attempt's placement failed; the log batch is not acknowledged");
    return false;  // the worker sends it again
  }
  if (dropped > 0) {
    LogWarning(absl::StrFormat(
        "%s sent %d log line(s) of ranks that are not placed on it (or of unknown jobs); dropped",
        worker.info.id(), dropped));
  }
  absl::StatusOr<int64_t> first_seq = store_->AppendLogs(lines, receipt);
  if (!first_seq.ok()) {
    if (auto line = message_store_log_.Failed(first_seq.status().ToString(), absl::Now())) {
      LogError(*line);
    }
    return false;  // the worker sends them again; followers see them then
  }
  if (auto line = message_store_log_.Succeeded(absl::Now())) LogInfo(*line);
  for (size_t i = 0; i < lines.size(); ++i) lines[i].set_seq(*first_seq + static_cast<int64_t>(i));
  for (const v1::LogLine& line : lines) {
    if (jobs_.Find(line.job_id()) == nullptr) continue;
    hub_.PublishLog(line);
  }
  return true;
}

void Coordinator::ExpireLeasesLocked(int64_t now_ms) {
  StoreWrite write;
  for (WorkerEntry* expired : workers_.ExpireLeases(now_ms)) {
    WorkerEntry& worker = *expired;
    const std::string& id = worker.info.id();
    bool had_work = !worker.occupied.empty();
    for (const auto& [job_id, job] : jobs_.jobs()) {
      if (!job.attempt.has_value()) continue;
      for (const RankRecord& rank : job.attempt->ranks) had_work |= rank.worker_id == id;
    }
    bool was_ready = worker.info.state() == v1::WORKER_STATE_READY;
    if (!had_work && !was_ready) continue;  // gone quietly, nothing to account for
    if (metrics_ != nullptr) metrics_->CountLeaseExpiry();
    std::string reason = absl::StrFormat("worker %s (node %s) lost: no message for %d ms",
                                         id, worker.info.node(), now_ms - worker.last_message_ms);
    workers_.MarkLost(worker, absl::StrFormat("lease expired (no message for %d ms)",
                                              now_ms - worker.last_message_ms),
                      write);
    jobs_.FailAttemptsOnWorker(worker, reason, write);
    worker.occupied.clear();
  }
  if (write.empty()) return;  // the ticker stores what earlier commits could not
  write.durable = true;
  (void)jobs_.Commit(write);
  jobs_.RetireFinished();
}

}  // namespace dropless::coordinator
