// Coordinator: a worker that goes away (its session ends, or its daemon says Goodbye before it
// stops its ranks) and what that means for the jobs placed on it: an event on each of their
// active attempts, and the cause named when a peer rank then fails because those ranks are gone
// (a rank on another node sees only "connection closed by peer"); ranks a worker's Hello or
// heartbeat no longer lists: gone, or, after a restart of the coordinator, never assigned.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/utf8.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/controller/job_events.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {
namespace {

// The ranks of `attempt` placed on `worker_id` that had not ended, as "rank 1" or "ranks 1, 3".
std::string RanksOn(const AttemptRecord& attempt, const std::string& worker_id) {
  std::vector<int32_t> ranks;
  for (const RankRecord& r : attempt.ranks) {
    if (r.worker_id == worker_id && !RankEnded(r.state)) ranks.push_back(r.rank);
  }
  if (ranks.empty()) return std::string();
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ", absl::StrJoin(ranks, ", "));
}

}  // namespace

void Coordinator::NoteWorkerGoneLocked(const WorkerEntry& worker, absl::string_view type,
                                       absl::string_view what, StoreWrite& write) {
  for (auto& [id, job] : jobs_.jobs()) {
    if (!job.attempt.has_value()) continue;
    const std::string ranks = RanksOn(*job.attempt, worker.info.id());
    if (ranks.empty()) continue;
    AddEvent(write, id, job.attempt->attempt, std::string(type),
             absl::StrFormat("%s (node %s), running %s of this attempt, %s", worker.info.id(),
                             worker.info.node(), ranks, what));
  }
}

std::string Coordinator::GonePeersLocked(const ActiveJob& job, const WorkerEntry& reporter) {
  std::vector<std::string> causes;
  const int64_t now_ms = NowMs();
  std::set<std::string> seen;
  for (const RankRecord& r : job.attempt->ranks) {
    if (r.worker_id == reporter.info.id() || !seen.insert(r.worker_id).second) continue;
    const WorkerEntry* peer = workers_.Find(r.worker_id);
    if (peer == nullptr) continue;
    const std::string ranks = RanksOn(*job.attempt, peer->info.id());
    if (ranks.empty()) continue;  // its ranks had ended before it went away
    if (!peer->leaving.empty()) {
      causes.push_back(absl::StrFormat("the worker of node %s (%s) was shutting down (%s)",
                                       peer->info.node(), ranks, peer->leaving));
    } else if (peer->disconnected_ms != 0) {
      causes.push_back(absl::StrFormat("the worker of node %s (%s) disconnected %d ms earlier",
                                       peer->info.node(), ranks, now_ms - peer->disconnected_ms));
    }
  }
  return absl::StrJoin(causes, " and ");
}

bool Coordinator::ReconcileUnlistedRanksLocked(WorkerEntry& worker, const ListedRanks& listed,
                                               const v1::Hello* hello, const std::string& what,
                                               StoreWrite& write) {
  // Only the daemon run a rank was assigned to knows whether it got the Assignment: one that
  // restarted with a new boot (its journal lost) may have started the rank and lost it.
  const bool takes_resent =
      hello != nullptr && hello->takes_resent_assignments() && !hello->boot_id().empty();
  bool failed = false;
  for (auto& [id, job] : jobs_.jobs()) {
    if (!job.attempt.has_value() || IsTerminal(job.record.job.state())) continue;
    std::vector<const RankRecord*> unlisted;
    for (const RankRecord& rank : job.attempt->ranks) {
      const bool reported =
          rank.state == v1::RANK_STATE_STARTING || rank.state == v1::RANK_STATE_RUNNING;
      if (rank.worker_id != worker.info.id() || RankEnded(rank.state) ||
          (hello == nullptr && !reported) ||
          listed.count({id, job.attempt->attempt, rank.rank}) != 0) {
        continue;
      }
      unlisted.push_back(&rank);
    }
    if (unlisted.empty()) continue;
    // Never reported (an acknowledged status is stored with fsync, so a restart keeps it) and
    // neither alive on the worker nor queued there: its daemon run never got the Assignment.
    const bool never_assigned =
        takes_resent && std::all_of(unlisted.begin(), unlisted.end(), [&](const RankRecord* r) {
          return r->state == v1::RANK_STATE_UNSPECIFIED && r->boot_id == hello->boot_id();
        });
    if (never_assigned) {
      jobs_.ResendAssignment(
          job, worker.info.id(),
          absl::StrFormat("the assignment of %s to node %s never reached its worker (lost to a "
                          "restart of the coordinator?); sent again",
                          RanksOn(*job.attempt, worker.info.id()), worker.info.node()),
          write);
      continue;
    }
    const RankRecord gone = *unlisted.front();
    worker.occupied.erase(gone.slot);
    jobs_.FailAttempt(job, absl::StrCat("rank ", gone.rank, " ", what), write);
    failed = true;
  }
  return failed;
}

void Coordinator::HandleGoodbyeLocked(WorkerEntry& worker, const v1::Goodbye& goodbye) {
  if (!worker.leaving.empty()) return;  // said already: one event per attempt
  // The reason goes into events, failure messages and the log: no control characters.
  std::string reason = SanitizedText(goodbye.reason(), 256);
  if (reason.empty()) reason = "no reason given";
  worker.leaving = reason;
  LogInfo(absl::StrFormat("%s (node %s) is shutting down: %s", worker.info.id(), worker.info.node(),
                          reason));
  StoreWrite write;
  NoteWorkerGoneLocked(worker, "WorkerLeaving",
                       absl::StrCat("is shutting down (", reason, "); its ranks are being stopped"),
                       write);
  if (write.empty()) return;
  (void)jobs_.Commit(write);
}

}  // namespace dropless::coordinator
