#include "coordinator/controller/worker_registry.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "common/log.h"
#include "coordinator/controller/job_events.h"

namespace dropless::coordinator {
namespace {

constexpr size_t kMaxNameBytes = 253;
constexpr size_t kMaxDevices = 4096;  // worker_config.h kMaxWorkerSlots: the worker checks it too
constexpr int64_t kStrayCancelIntervalMs = 5000;
constexpr int64_t kStrayCancelMemoryMs = 60'000;

absl::Status CheckName(const std::string& value, absl::string_view field, bool required) {
  if (value.empty()) {
    return required ? absl::InvalidArgumentError(absl::StrCat(field, ": must not be empty"))
                    : absl::OkStatus();
  }
  if (value.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": longer than ", kMaxNameBytes, " bytes"));
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

void WorkerRegistry::Restore(const ActiveState& state, int64_t now_ms, StoreWrite& write) {
  next_worker_number_ = std::max(next_worker_number_, state.last_worker_number + 1);
  for (const WorkerRecord& stored : state.workers) {
    int64_t number = 0;
    absl::string_view id = stored.info.id();
    if (absl::ConsumePrefix(&id, "worker-") && absl::SimpleAtoi(id, &number)) {
      next_worker_number_ = std::max(next_worker_number_, number + 1);
    }
    WorkerEntry& entry = workers_[stored.info.id()];
    entry.info = stored.info;
    // Away since: a LOST worker's absence goes on across the restart; a READY one was fine when
    // the last coordinator stopped, and one without a stored time predates schema 5: both are
    // away from now (not from whenever the coordinator went down).
    const bool was_lost = stored.info.state() == v1::WORKER_STATE_LOST;
    entry.lost_since_ms =
        was_lost && stored.lost_since_ms > 0 ? std::min(stored.lost_since_ms, now_ms) : now_ms;
    // Connected when the last coordinator stopped: it may be back in a moment, so it is away for
    // the scheduler (a gang keeps its hold) for one lease. A worker LOST before is not.
    entry.away_since_ms = was_lost ? 0 : now_ms;
    if (!was_lost || entry.lost_since_ms != stored.lost_since_ms) {
      entry.info.set_state(v1::WORKER_STATE_LOST);
      write.workers.push_back(Row(entry));
    }
    entry.last_message_ms = now_ms;
    worker_by_node_[stored.info.node()] = stored.info.id();
  }
  for (const WorkerReceipt& receipt : state.receipts) {
    auto found = workers_.find(receipt.worker_id);
    if (found == workers_.end()) continue;
    found->second.boot_id = receipt.boot_id;
    found->second.last_seq = receipt.seq;
  }
}

absl::Status WorkerRegistry::CheckRegistration(const v1::RegisterWorkerRequest& request) {
  if (absl::Status s = CheckName(request.node(), "node", true); !s.ok()) return s;
  if (absl::Status s = CheckName(request.address(), "address", false); !s.ok()) return s;
  // Stored with the worker and written into its events: the same bounds as a name.
  if (absl::Status s = CheckName(request.version(), "version", false); !s.ok()) return s;
  if (absl::Status s = CheckName(request.boot_id(), "boot_id", false); !s.ok()) return s;
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
    if (device.size() > 256)
      return absl::InvalidArgumentError("devices: entry longer than 256 bytes");
  }
  if (!request.device_memory_bytes().empty()) {
    if (request.slot_kind() != "cuda" ||
        request.device_memory_bytes_size() != request.devices_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("device_memory_bytes: one entry per slot of a cuda worker (got ",
                       request.device_memory_bytes_size(), " for ", request.devices_size(), " ",
                       request.slot_kind(), " slots)"));
    }
    for (int64_t bytes : request.device_memory_bytes()) {
      if (bytes < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("device_memory_bytes: must be >= 0 (got ", bytes, ")"));
      }
    }
  }
  if (request.metrics_port() < 0 || request.metrics_port() > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_port: must be 0..65535 (got ", request.metrics_port(), ")"));
  }
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckNodeIsFree(const WorkerEntry& worker,
                                             const std::string& boot_id) const {
  // The run that said hello last to this coordinator process (worker.boot_id) holds the node
  // until its lease runs out, also while it reconnects, so a second daemon given the same --node
  // never takes a live one's node; a run that said Goodbye gives it up when its session ends.
  // After a restart, the run the store names has not said hello here: it holds the node as above
  // (for the lease that runs from the restart) while a rank process holds a slot of it, since it
  // may be alive with its ranks running and a duplicate daemon's retry may come first; a node
  // with no work goes at once to the first run that says hello (a new run replaces a daemon that
  // died with its journal). Workers that predate boot ids ("") never hold it.
  const bool same_run = boot_id == worker.boot_id || worker.boot_id.empty();
  const bool gone = worker.lease_expired || (!worker.hello_here && worker.occupied.empty()) ||
                    (worker.session == nullptr && !worker.leaving.empty());
  if (same_run || gone) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "node \"", worker.info.node(), "\" is held by another running worker daemon (",
      worker.info.id(), ", address ", worker.info.address(),
      "); give each daemon its own --node, or stop the other one (the node is free again once it "
      "stops or its lease of ",
      lease_timeout_ms_, " ms runs out)"));
}

absl::StatusOr<const v1::Worker*> WorkerRegistry::Register(const v1::RegisterWorkerRequest& request,
                                                           int64_t now_ms, StoreWrite& write,
                                                           bool* fresh) {
  auto known = worker_by_node_.find(request.node());
  *fresh = known == worker_by_node_.end();
  // A worker that predates boot ids registers without one: only its Hello is checked.
  if (!*fresh && !request.boot_id().empty()) {
    if (absl::Status s = CheckNodeIsFree(workers_.at(known->second), request.boot_id()); !s.ok()) {
      return s;
    }
  }
  std::string id = *fresh ? absl::StrFormat("worker-%04d", next_worker_number_++) : known->second;
  WorkerEntry& worker = workers_[id];
  v1::Worker& info = worker.info;
  if (*fresh) {
    info.set_id(id);
    info.set_node(request.node());
    info.set_state(v1::WORKER_STATE_LOST);  // READY once its session says Hello
    info.set_registered_time_ms(now_ms);
    worker_by_node_[request.node()] = id;
  }
  // A registration is a sign of life: a LOST worker's absence counts from its latest.
  if (info.state() != v1::WORKER_STATE_READY) worker.lost_since_ms = now_ms;
  info.set_address(request.address());
  info.set_metrics_port(request.metrics_port());
  info.set_slot_kind(request.slot_kind());
  *info.mutable_devices() = request.devices();
  *info.mutable_device_memory_bytes() = request.device_memory_bytes();
  info.set_slots(request.devices_size());
  worker.last_message_ms = now_ms;
  worker.registered_boot_id = request.boot_id();
  write.workers.push_back(Row(worker));
  AddEvent(write, "", 0, *fresh ? "WorkerRegistered" : "WorkerReregistered",
           absl::StrFormat("%s: node %s, %d %s slots, version %s", id, request.node(),
                           request.devices_size(), request.slot_kind(),
                           request.version().empty() ? "unknown" : request.version()));
  return &info;
}

WorkerEntry* WorkerRegistry::Find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

void WorkerRegistry::OpenSession(const std::shared_ptr<WorkerSession>& session, int64_t now_ms) {
  sessions_[session] = SessionEntry{"", now_ms};
}

const std::string* WorkerRegistry::SessionWorker(
    const std::shared_ptr<WorkerSession>& session) const {
  auto it = sessions_.find(session);
  return it == sessions_.end() ? nullptr : &it->second.worker_id;
}

absl::StatusOr<WorkerEntry*> WorkerRegistry::Hello(const std::shared_ptr<WorkerSession>& session,
                                                   const v1::Hello& hello, int64_t now_ms,
                                                   StoreWrite& write, bool* new_run) {
  if (hello.worker_id().empty()) {
    return absl::InvalidArgumentError("hello.worker_id: must not be empty");
  }
  if (absl::Status s = CheckName(hello.boot_id(), "hello.boot_id", false); !s.ok()) return s;
  WorkerEntry* found = Find(hello.worker_id());
  if (found == nullptr) {
    return absl::NotFoundError(absl::StrCat("worker \"", hello.worker_id(),
                                            "\" is not registered; call RegisterWorker first"));
  }
  WorkerEntry& worker = *found;
  if (!session->certified_node().empty() && session->certified_node() != worker.info.node()) {
    return absl::PermissionDeniedError(
        absl::StrCat("hello: worker ", hello.worker_id(), " is node \"", worker.info.node(),
                     "\" but the client certificate is node \"", session->certified_node(),
                     "\": a worker may only report as itself"));
  }
  if (!worker.registered_boot_id.empty()) {
    // The node's address and slots are those of the last registration, which found the node
    // free for its run: only that run may say hello.
    if (hello.boot_id() != worker.registered_boot_id) {
      return absl::AlreadyExistsError(
          absl::StrCat("node \"", worker.info.node(),
                       "\" was registered since by another worker daemon run; "
                       "register again"));
    }
  } else if (absl::Status s = CheckNodeIsFree(worker, hello.boot_id()); !s.ok()) {
    return s;  // a registration without a boot id (an older worker, or a test's)
  }
  if (worker.session != nullptr && worker.session != session) worker.session->Close();
  const bool replaces_run =
      !worker.boot_id.empty() && !hello.boot_id().empty() && hello.boot_id() != worker.boot_id;
  if (new_run != nullptr) *new_run = replaces_run;
  if (hello.boot_id() != worker.boot_id) {  // a new numbering: seq starts from 1 again
    worker.boot_id = hello.boot_id();
    worker.last_seq = 0;
  }
  worker.hello_here = true;
  sessions_[session].worker_id = worker.info.id();
  worker.session = session;
  worker.last_message_ms = now_ms;
  worker.lease_expired = false;
  worker.disconnected_ms = 0;
  worker.away_since_ms = 0;
  worker.leaving.clear();
  if (worker.info.state() != v1::WORKER_STATE_READY) {
    worker.info.set_state(v1::WORKER_STATE_READY);
    worker.lost_since_ms = 0;
    write.workers.push_back(Row(worker));
    AddEvent(write, "", 0, "WorkerReady",
             absl::StrFormat("%s (node %s): session open, %d ranks alive%s", worker.info.id(),
                             worker.info.node(), hello.ranks_size(),
                             replaces_run ? " (a new run of its daemon)" : ""));
  }
  return &worker;
}

std::string WorkerRegistry::ForgetSession(const std::shared_ptr<WorkerSession>& session) {
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return std::string();
  std::string worker_id = std::move(it->second.worker_id);
  sessions_.erase(it);
  return worker_id;
}

WorkerEntry* WorkerRegistry::Disconnect(const std::string& worker_id,
                                        const std::shared_ptr<WorkerSession>& session,
                                        int64_t now_ms) {
  WorkerEntry* worker = Find(worker_id);
  if (worker == nullptr || worker->session != session) return nullptr;  // superseded
  worker->session = nullptr;
  worker->away_since_ms = now_ms;
  return worker;
}

void WorkerRegistry::CloseAllSessions() {
  for (auto& [session, entry] : sessions_) session->Close();
}

void WorkerRegistry::MarkLost(WorkerEntry& worker, const std::string& why, StoreWrite& write) {
  if (worker.info.state() == v1::WORKER_STATE_LOST) return;
  worker.info.set_state(v1::WORKER_STATE_LOST);
  worker.lost_since_ms = worker.last_message_ms;  // last heard from
  write.workers.push_back(Row(worker));
  AddEvent(write, "", 0, "WorkerLost",
           absl::StrFormat("%s (node %s): %s", worker.info.id(), worker.info.node(), why));
  LogWarning(absl::StrFormat("%s (node %s) lost: %s", worker.info.id(), worker.info.node(), why));
}

std::vector<WorkerEntry*> WorkerRegistry::ExpireLeases(int64_t now_ms) {
  std::vector<WorkerLease> leases;
  for (const auto& [id, worker] : workers_) {
    if (!worker.lease_expired) leases.push_back({id, worker.last_message_ms});
  }
  std::vector<WorkerEntry*> expired;
  for (const std::string& id : ExpiredLeases(leases, now_ms, lease_timeout_ms_)) {
    WorkerEntry& worker = workers_.at(id);
    worker.lease_expired = true;
    if (worker.session != nullptr) {
      worker.session->Close();
      worker.session = nullptr;
    }
    expired.push_back(&worker);
  }
  for (auto& [session, entry] : sessions_) {
    if (entry.worker_id.empty() && now_ms - entry.opened_ms > lease_timeout_ms_) session->Close();
  }
  for (auto it = stray_turns_.begin(); it != stray_turns_.end();) {
    it = now_ms - it->second > kStrayCancelMemoryMs ? stray_turns_.erase(it) : std::next(it);
  }
  return expired;
}

std::vector<WorkerEntry*> WorkerRegistry::ForgettableWorkers(int64_t now_ms, int64_t expiry_ms) {
  std::vector<WorkerEntry*> out;
  // Two leases without a message (after a restart counted from the restart): a live daemon, or a
  // new run of it (a host rebooted while the coordinator was down, which CheckNodeIsFree refuses
  // for the first lease at most, while the stored run holds work), retries its registration every
  // few seconds and is back before anything is forgotten.
  const int64_t quiet_ms = 2 * lease_timeout_ms_;
  for (auto& [id, worker] : workers_) {
    if (worker.info.state() == v1::WORKER_STATE_READY || worker.session != nullptr ||
        worker.lost_since_ms <= 0 || now_ms - worker.lost_since_ms <= expiry_ms ||
        now_ms - worker.last_message_ms <= quiet_ms || !worker.occupied.empty()) {
      continue;
    }
    out.push_back(&worker);
  }
  return out;
}

void WorkerRegistry::Forget(const std::string& worker_id, int64_t now_ms, int64_t expiry_ms,
                            StoreWrite& write) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  const WorkerEntry& worker = it->second;
  const absl::Duration away =
      absl::Trunc(absl::Milliseconds(now_ms - worker.lost_since_ms), absl::Seconds(1));
  const std::string since = absl::FormatTime(
      "%Y-%m-%dT%H:%M:%SZ", absl::FromUnixMillis(worker.lost_since_ms), absl::UTCTimeZone());
  AddEvent(write, "", 0, "WorkerForgotten",
           absl::StrFormat("%s (node %s): away for %s (since %s), longer than "
                           "--lost-worker-expiry %s; forgotten (it registers as a new worker if "
                           "it comes back)",
                           worker_id, worker.info.node(), absl::FormatDuration(away), since,
                           absl::FormatDuration(absl::Milliseconds(expiry_ms))));
  LogInfo(
      absl::StrFormat("%s (node %s) forgotten: away for %s (since %s), longer than "
                      "--lost-worker-expiry %s",
                      worker_id, worker.info.node(), absl::FormatDuration(away), since,
                      absl::FormatDuration(absl::Milliseconds(expiry_ms))));
  write.forgotten_workers.push_back(worker_id);
  write.last_worker_number = std::max(write.last_worker_number, next_worker_number_ - 1);
  // A session superseded or closed at lease expiry stays mapped to it until its stream ends:
  // closed and unmapped now, its messages are refused ("session is closed").
  for (auto session = sessions_.begin(); session != sessions_.end();) {
    if (session->second.worker_id != worker_id) {
      ++session;
      continue;
    }
    session->first->Close();
    session = sessions_.erase(session);
  }
  const std::string prefix = absl::StrCat(worker_id, "|");
  for (auto turn = stray_turns_.begin(); turn != stray_turns_.end();) {
    turn = absl::StartsWith(turn->first, prefix) ? stray_turns_.erase(turn) : std::next(turn);
  }
  auto by_node = worker_by_node_.find(worker.info.node());
  if (by_node != worker_by_node_.end() && by_node->second == worker_id) {
    worker_by_node_.erase(by_node);
  }
  workers_.erase(it);
}

void WorkerRegistry::Send(const std::string& worker_id, v1::CoordinatorMessage message) {
  WorkerEntry* worker = Find(worker_id);
  if (worker != nullptr && worker->session != nullptr) worker->session->Send(std::move(message));
}

bool WorkerRegistry::TakeStrayTurn(const std::string& key, int64_t now_ms) {
  auto [it, first] = stray_turns_.emplace(key, now_ms);
  if (first) return true;
  if (now_ms - it->second < kStrayCancelIntervalMs) return false;
  it->second = now_ms;
  return true;
}

bool WorkerRegistry::TakeStrayCancelTurn(const std::string& worker_id, const std::string& job_id,
                                         int32_t attempt, int64_t now_ms) {
  return TakeStrayTurn(StrayKey(worker_id, job_id, attempt), now_ms);
}

bool WorkerRegistry::TakeStraySlotLookupTurn(const std::string& worker_id,
                                             const std::string& job_id, int32_t attempt,
                                             int32_t rank, int64_t now_ms) {
  return TakeStrayTurn(absl::StrCat(StrayKey(worker_id, job_id, attempt), "|rank ", rank), now_ms);
}

namespace {

// The worker's slots as the scheduler sees them, none free yet.
NodeCapacity AllSlotsOf(const std::string& id, const WorkerEntry& worker) {
  return NodeCapacity{
      id,
      worker.info.node(),
      worker.info.slot_kind(),
      worker.info.slots(),
      {},
      -1,
      {worker.info.device_memory_bytes().begin(), worker.info.device_memory_bytes().end()}};
}

}  // namespace

std::vector<NodeCapacity> WorkerRegistry::Capacity(int64_t now_ms) const {
  std::vector<NodeCapacity> nodes;
  for (const auto& [id, worker] : workers_) {
    // A worker whose daemon said Goodbye is stopping its ranks: nothing new goes there, and it
    // holds nothing for the jobs that wait.
    if (!worker.leaving.empty()) continue;
    const bool ready = worker.info.state() == v1::WORKER_STATE_READY && worker.session != nullptr;
    if (!ready) {
      // Away for less than a lease since its session ended (a blip, or a restart of the
      // coordinator): it may be back in a moment, so a gang waiting for its slots keeps them from
      // smaller jobs meanwhile. Counted from the session's end, not its last message: a daemon
      // that registers again and again but never says hello renews its lease, never this.
      const bool away_for_now = worker.session == nullptr && !worker.lease_expired &&
                                worker.away_since_ms > 0 &&
                                now_ms - worker.away_since_ms <= lease_timeout_ms_;
      if (away_for_now) {
        NodeCapacity away = AllSlotsOf(id, worker);
        away.away = true;
        nodes.push_back(std::move(away));
      }
      continue;
    }
    NodeCapacity node = AllSlotsOf(id, worker);
    for (int32_t slot = 0; slot < worker.info.slots(); ++slot) {
      if (worker.occupied.count(slot) == 0) node.free_slots.push_back(slot);
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

std::vector<NodeCapacity> WorkerRegistry::KnownCapacity() const {
  std::vector<NodeCapacity> nodes;
  for (const auto& [id, worker] : workers_) nodes.push_back(AllSlotsOf(id, worker));
  return nodes;
}

std::vector<v1::Worker> WorkerRegistry::List() const {
  std::vector<v1::Worker> out;
  for (const auto& [id, worker] : workers_) {
    v1::Worker info = worker.info;
    info.set_slots_busy(static_cast<int32_t>(worker.occupied.size()));
    info.set_last_heartbeat_ms(worker.last_message_ms);
    out.push_back(std::move(info));
  }
  return out;
}

WorkerRegistry::Counts WorkerRegistry::Count() const {
  Counts counts;
  for (const auto& [id, worker] : workers_) {
    if (worker.info.state() == v1::WORKER_STATE_READY) {
      ++counts.ready;
      const int64_t busy = static_cast<int64_t>(worker.occupied.size());
      counts.busy_slots += busy;
      counts.free_slots += std::max<int64_t>(0, worker.info.slots() - busy);
    } else {
      ++counts.lost;
    }
  }
  return counts;
}

}  // namespace dropless::coordinator
