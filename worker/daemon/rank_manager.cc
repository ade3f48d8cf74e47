#include "worker/daemon/rank_manager.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/step_phase.h"
#include "common/utf8.h"
#include "worker/daemon/step_metrics_proto.h"
#include "worker/rank/step_report.h"
#include "worker/rank/checkpoint_roots.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

constexpr size_t kMaxQuotedOutput = 400;

int64_t NowMs() { return absl::ToUnixMillis(absl::Now()); }

absl::Status WriteFileAtomically(const std::string& path, const std::string& content) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

// Slots are CUDA ordinals as the daemon sees them; when the daemon itself runs restricted by
// CUDA_VISIBLE_DEVICES, ordinal i is the i-th entry of that list, not device i of the node.
std::string CudaDeviceOfSlot(int slot) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible != nullptr && visible[0] != '\0') {
    std::vector<std::string> devices = absl::StrSplit(visible, ',');
    if (slot >= 0 && slot < static_cast<int>(devices.size())) return devices[slot];
  }
  return absl::StrCat(slot);
}

// The bytes of the regular files under `dir` (what a failed walk reaches).
int64_t DirectoryBytes(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  int64_t bytes = 0;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) {
      const uintmax_t size = it->file_size(size_ec);
      if (!size_ec) bytes += static_cast<int64_t>(size);
    }
  }
  return bytes;
}

}  // namespace

std::string SafePathComponent(const std::string& id) {
  std::string out = id;
  for (char& c : out) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-') c = '_';
  }
  if (out.empty() || out == "." || out == "..") out = absl::StrCat("_", out);
  return out;
}

RankManager::RankManager(RankManagerOptions options, OutboundQueue* outbound,
                         WorkerMetrics* metrics)
    : options_(std::move(options)), outbound_(outbound), metrics_(metrics) {
  RankSupervisor::Callbacks callbacks;
  callbacks.on_output = [this](RankSupervisor::ChildId id, absl::string_view line) {
    OnOutput(id, line);
  };
  callbacks.on_report = [this](RankSupervisor::ChildId id, absl::string_view line) {
    OnReport(id, line);
  };
  callbacks.on_exit = [this](RankSupervisor::ChildId id, const ChildExit& exit) {
    OnExit(id, exit);
  };
  supervisor_ = std::make_unique<RankSupervisor>(std::move(callbacks));
  absl::MutexLock lock(&mu_);
  UpdateGauges();
}

RankManager::~RankManager() {
  supervisor_.reset();  // kills and reaps while ranks_ is still alive for its callbacks
}

void RankManager::PushStatus(const RankEntry& entry, v1::RankState state, int exit_code,
                             const std::string& message) {
  v1::WorkerMessage msg;
  v1::RankStatus* status = msg.mutable_rank_status();
  status->set_job_id(entry.job_id);
  status->set_attempt(entry.attempt);
  status->set_rank(entry.rank);
  status->set_state(state);
  status->set_exit_code(exit_code);
  status->set_message(message);
  outbound_->Push(std::move(msg));
}

RankIdentity RankManager::IdentityOf(const RankEntry& entry) const {
  RankIdentity identity{entry.job_id, entry.rank, "", ""};
  if (options_.slot_kind == "cuda") {
    identity.gpu = CudaDeviceOfSlot(entry.slot);
    if (entry.slot >= 0 && entry.slot < static_cast<int>(options_.slot_uuids.size())) {
      identity.uuid = options_.slot_uuids[entry.slot];
    }
  }
  return identity;
}

void RankManager::UpdateGauges() {
  std::set<int> busy;
  for (const auto& [id, entry] : ranks_) busy.insert(entry.slot);
  const int busy_count = static_cast<int>(busy.size());
  metrics_->SetSlots(busy_count, std::max(0, options_.slots - busy_count));
  metrics_->SetRanksRunning(static_cast<int>(ranks_.size()));
}

void RankManager::HandleAssignment(const v1::Assignment& assignment) {
  RankEntry base;
  base.job_id = assignment.job_id();
  base.attempt = assignment.attempt();
  // First, before anything can refuse it: a rank of this attempt that is alive here, or has a
  // status still queued, was started (or refused) here before, and an Assignment that comes again
  // (a coordinator resends one it placed but never heard of) must neither start it twice nor
  // report it a second time (a FAILED after its real end). Statuses leave the queue only once the
  // coordinator stored them (with fsync), so a rank started before is alive, queued, or known to
  // the coordinator, which then never sends its Assignment again (Hello.takes_resent_assignments).
  std::set<int> here;
  for (const v1::RankStatus& status : outbound_->PendingRankStatuses()) {
    if (status.job_id() == base.job_id && status.attempt() == base.attempt) {
      here.insert(status.rank());
    }
  }
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : ranks_) {
      if (entry.job_id == base.job_id && entry.attempt == base.attempt) here.insert(entry.rank);
    }
  }
  std::vector<v1::RankAssignment> fresh;
  for (const v1::RankAssignment& ra : assignment.ranks()) {
    if (here.count(ra.rank()) != 0) {
      LogInfo(absl::StrCat("job ", base.job_id, " attempt ", base.attempt, " rank ", ra.rank(),
                           " was started (or refused) here before; assignment ignored"));
      continue;
    }
    fresh.push_back(ra);
  }
  if (fresh.empty()) return;

  auto reject_all = [&](const std::string& why) {
    LogWarning(absl::StrCat("assignment of job ", assignment.job_id(), " attempt ",
                           assignment.attempt(), " rejected: ", why));
    for (const v1::RankAssignment& ra : fresh) {
      RankEntry e = base;
      e.rank = ra.rank();
      e.slot = ra.slot();
      metrics_->RecordRankExit(IdentityOf(e), RankExitResult::kFailed);
      PushStatus(e, v1::RANK_STATE_FAILED, 127, why);
    }
  };
  if (assignment.job_id().empty()) return reject_all("assignment: job_id is empty");
  std::string stopping;
  {
    absl::MutexLock lock(&mu_);
    stopping = stop_reason_;
  }
  // One that arrived while the daemon stops (sent before the coordinator had its Goodbye). A stop
  // that begins after this check is caught in StartRank.
  if (!stopping.empty()) return reject_all(absl::StrCat("not started: ", stopping));
  if (assignment.attempt() < 1) {
    return reject_all(absl::StrCat("assignment: attempt must be >= 1 (got ", assignment.attempt(), ")"));
  }
  if (assignment.world_size() < 1) {
    return reject_all(
        absl::StrCat("assignment: world_size must be >= 1 (got ", assignment.world_size(), ")"));
  }
  const std::string attempt_dir =
      absl::StrCat(options_.work_dir, "/jobs/", SafePathComponent(assignment.job_id()), "/attempt-",
                   assignment.attempt());
  std::error_code ec;
  std::filesystem::create_directories(attempt_dir, ec);
  if (ec) return reject_all(absl::StrCat("cannot create ", attempt_dir, ": ", ec.message()));
  PruneJobDirs(SafePathComponent(assignment.job_id()));
  const std::string spec_path = attempt_dir + "/spec.yaml";
  absl::Status written = WriteFileAtomically(spec_path, assignment.spec_yaml());
  if (!written.ok()) return reject_all(std::string(written.message()));

  for (const v1::RankAssignment& ra : fresh) {
    RankEntry e = base;
    e.rank = ra.rank();
    if (ra.rank() < 0 || ra.rank() >= assignment.world_size()) {
      PushStatus(e, v1::RANK_STATE_FAILED, 127,
                 absl::StrCat("assignment: rank ", ra.rank(), " outside 0..",
                              assignment.world_size() - 1));
      continue;
    }
    if (ra.slot() < 0 || ra.slot() >= options_.slots) {
      PushStatus(e, v1::RANK_STATE_FAILED, 127,
                 absl::StrCat("assignment: slot ", ra.slot(), " outside 0..", options_.slots - 1,
                              " of node ", options_.node));
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, entry] : ranks_) {
        if (entry.slot == ra.slot()) {
          LogWarning(absl::StrCat("slot ", ra.slot(), " is still held by job ", entry.job_id,
                                 " rank ", entry.rank, "; starting job ", e.job_id, " rank ",
                                 e.rank, " beside it"));
        }
      }
    }
    StartRank(assignment, ra.rank(), ra.slot(), spec_path, attempt_dir);
  }
}

void RankManager::PruneJobDirs(const std::string& keep) {
  namespace fs = std::filesystem;
  std::set<std::string> live{keep};
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : ranks_) live.insert(SafePathComponent(entry.job_id));
  }
  std::error_code ec;
  struct JobDir {
    fs::file_time_type time;
    fs::path path;
    int64_t bytes = 0;  // its files', for a job with no live rank
  };
  std::vector<JobDir> dirs;
  int64_t finished_bytes = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(options_.work_dir + "/jobs", ec)) {
    std::error_code time_ec;
    fs::file_time_type t = fs::last_write_time(e.path(), time_ec);
    if (time_ec) continue;
    JobDir dir{t, e.path()};
    if (options_.retained_job_bytes > 0 && live.count(dir.path.filename().string()) == 0) {
      dir.bytes = DirectoryBytes(dir.path);
      finished_bytes += dir.bytes;
    }
    dirs.push_back(std::move(dir));
  }
  size_t excess = dirs.size() > static_cast<size_t>(options_.retained_job_dirs)
                      ? dirs.size() - options_.retained_job_dirs
                      : 0;
  auto over_bytes = [&] {
    return options_.retained_job_bytes > 0 && finished_bytes > options_.retained_job_bytes;
  };
  if (excess == 0 && !over_bytes()) return;
  std::sort(dirs.begin(), dirs.end(),
            [](const JobDir& a, const JobDir& b) { return a.time < b.time; });  // oldest first
  for (const JobDir& dir : dirs) {
    if (excess == 0 && !over_bytes()) break;
    if (live.count(dir.path.filename().string()) > 0) continue;
    fs::remove_all(dir.path, ec);
    if (ec) {
      LogWarning(absl::StrCat("cannot remove ", dir.path.string(), ": ", ec.message()));
      continue;
    }
    if (excess > 0) --excess;
    finished_bytes -= dir.bytes;
  }
}

void RankManager::StartRank(const v1::Assignment& assignment, int rank, int slot,
                            const std::string& spec_path, const std::string& attempt_dir) {
  RankEntry entry;
  entry.job_id = assignment.job_id();
  entry.attempt = assignment.attempt();
  entry.rank = rank;
  entry.slot = slot;
  RankSupervisor::ChildId id;
  {
    absl::MutexLock lock(&mu_);
    // Checked where the rank is added, under the same lock: StopAll stops the ranks it
    // finds, so one added after it ran would never be stopped.
    if (!stop_reason_.empty()) {
      const std::string why = absl::StrCat("not started: ", stop_reason_);
      LogWarning(absl::StrCat("job ", entry.job_id, " attempt ", entry.attempt, " rank ", rank,
                              ": ", why));
      metrics_->RecordRankExit(IdentityOf(entry), RankExitResult::kFailed);
      PushStatus(entry, v1::RANK_STATE_FAILED, 127, why);
      return;
    }
    id = next_id_++;
    ranks_[id] = entry;
    UpdateGauges();
  }
  // STARTING goes out before the process can report anything, so the order is always kept.
  PushStatus(entry, v1::RANK_STATE_STARTING, 0, "");

  ChildSpec spec;
  spec.path = options_.rank_binary;
  spec.argv = {options_.rank_binary,
               "rank",
               "--coordinator", options_.coordinator,
               "--job", assignment.job_id(),
               "--attempt", absl::StrCat(assignment.attempt()),
               "--rank", absl::StrCat(rank),
               "--world-size", absl::StrCat(assignment.world_size()),
               "--slot", absl::StrCat(slot),
               "--spec", spec_path,
               "--host", options_.advertise_address,
               "--node", options_.node,
               "--report-fd", "3"};
  if (options_.slot_kind == "cuda") {
    spec.env = {absl::StrCat("CUDA_VISIBLE_DEVICES=", CudaDeviceOfSlot(slot))};
  } else {
    // One slot is one core: BLAS and OpenMP pools would oversubscribe the node.
    spec.env = {"OPENBLAS_NUM_THREADS=1", "OMP_NUM_THREADS=1"};
  }
  // Only this attempt's ranks may use its rendezvous keys; the environment keeps it off `ps`.
  spec.env.push_back(
      absl::StrCat("DROPLESS_RENDEZVOUS_SECRET=", assignment.rendezvous_secret()));
  // Whose checkpoints the rank may claim (checkpoint_claim.h).
  spec.env.push_back(absl::StrCat("DROPLESS_JOB_OWNER=", assignment.owner()));
  if (!options_.checkpoint_roots.empty()) {
    spec.env.push_back(absl::StrCat(kCheckpointRootsEnv, "=",
                                    JoinCheckpointRoots(options_.checkpoint_roots)));
  }
  spec.env.insert(spec.env.end(), options_.channel_env.begin(), options_.channel_env.end());
  spec.log_path = absl::StrCat(attempt_dir, "/rank-", rank, ".log");
  spec.log_max_bytes = options_.rank_log_max_bytes;
  spec.report_pipe = true;

  absl::StatusOr<pid_t> pid = supervisor_->Start(id, spec);
  if (!pid.ok()) {
    {
      // Queued before the rank leaves the live list (as OnExit does), so a Hello or heartbeat
      // built meanwhile lists it either live or as ended.
      absl::MutexLock lock(&mu_);
      PushStatus(entry, v1::RANK_STATE_FAILED, 127,
                 absl::StrCat("cannot start rank process: ", pid.status().message()));
      ranks_.erase(id);
      UpdateGauges();
    }
    LogError(absl::StrCat("job ", entry.job_id, " rank ", rank,
                          ": cannot start: ", pid.status().message()));
    metrics_->RecordRankExit(IdentityOf(entry), RankExitResult::kFailed);
    return;
  }
  bool cancelled = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranks_.find(id);
    if (it != ranks_.end()) {
      it->second.pid = *pid;
      cancelled = it->second.cancelled;
    }
  }
  if (cancelled) supervisor_->Stop(id, options_.kill_grace);
  LogInfo(absl::StrCat("job ", entry.job_id, " attempt ", entry.attempt, " rank ", rank,
                         " started on ", options_.slot_kind, " slot ", slot, " (pid ", *pid, ")"));
}

void RankManager::HandleCancellation(const v1::Cancellation& cancellation) {
  std::vector<RankSupervisor::ChildId> to_stop;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, entry] : ranks_) {
      if (entry.job_id != cancellation.job_id()) continue;
      if (cancellation.attempt() != 0 && entry.attempt != cancellation.attempt()) continue;
      entry.cancelled = true;
      to_stop.push_back(id);
    }
  }
  LogInfo(absl::StrCat("cancellation of job ", cancellation.job_id(), " attempt ",
                         cancellation.attempt(), ": stopping ", to_stop.size(), " rank(s)",
                         cancellation.reason().empty() ? "" : ": ", cancellation.reason()));
  for (RankSupervisor::ChildId id : to_stop) supervisor_->Stop(id, options_.kill_grace);
}

void RankManager::OnOutput(RankSupervisor::ChildId id, absl::string_view line) {
  v1::LogLine log;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranks_.find(id);
    if (it == ranks_.end()) return;
    RankEntry& entry = it->second;
    if (!line.empty()) entry.last_output = ToValidUtf8(TruncateUtf8(line, kMaxQuotedOutput));
    log.set_job_id(entry.job_id);
    log.set_attempt(entry.attempt);
    log.set_rank(entry.rank);
  }
  log.set_time_ms(NowMs());
  log.set_text(ToValidUtf8(line));  // rank output is any bytes; a proto3 string must be UTF-8
  outbound_->PushLogLine(std::move(log));
}

void RankManager::OnReport(RankSupervisor::ChildId id, absl::string_view line) {
  if (IsPhaseLine(line)) {
    OnPhaseLine(id, line);
    return;
  }
  const bool ready = line == kReadyLine;
  absl::StatusOr<StepStats> report;
  if (!ready) report = ParseStepReport(line);
  RankEntry entry;
  bool became_running = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranks_.find(id);
    if (it == ranks_.end()) return;
    if (!ready && !report.ok()) {
      if (!it->second.bad_report_logged) {
        it->second.bad_report_logged = true;
        LogWarning(absl::StrCat("job ", it->second.job_id, " rank ", it->second.rank,
                               ": ignoring bad report line: ", report.status().message()));
      }
      return;
    }
    if (it->second.state == v1::RANK_STATE_STARTING) {
      it->second.state = v1::RANK_STATE_RUNNING;
      became_running = true;
    }
    entry = it->second;
  }
  if (became_running) PushStatus(entry, v1::RANK_STATE_RUNNING, 0, "");
  if (ready) return;

  metrics_->RecordStep(IdentityOf(entry), *report);
  v1::WorkerMessage msg;
  v1::StepMetrics* m = msg.mutable_metrics();
  m->set_job_id(entry.job_id);
  m->set_attempt(entry.attempt);
  m->set_rank(entry.rank);
  StepStatsToProto(*report, m);
  m->set_time_ms(NowMs());
  m->set_node(options_.node);
  outbound_->Push(std::move(msg));
}

void RankManager::OnPhaseLine(RankSupervisor::ChildId id, absl::string_view line) {
  absl::StatusOr<PhaseReport> phase = ParsePhaseLine(line);
  absl::MutexLock lock(&mu_);
  auto it = ranks_.find(id);
  if (it == ranks_.end()) return;
  if (!phase.ok()) {
    if (!it->second.bad_report_logged) {
      it->second.bad_report_logged = true;
      LogInfo(absl::StrCat("job ", it->second.job_id, " rank ", it->second.rank,
                             ": ignoring bad report line: ", phase.status().message()));
    }
    return;
  }
  it->second.phase = *phase;  // the heartbeats carry it to the coordinator's hang watchdog
}

void RankManager::OnExit(RankSupervisor::ChildId id, const ChildExit& exit) {
  RankEntry entry;
  RankExitResult result;
  {
    absl::MutexLock lock(&mu_);
    auto it = ranks_.find(id);
    if (it == ranks_.end()) return;
    entry = std::move(it->second);
    v1::RankState state;
    std::string message;
    if (exit.success()) {
      state = v1::RANK_STATE_SUCCEEDED;
      result = RankExitResult::kSucceeded;
    } else if ((entry.cancelled || exit.stop_requested) && exit.signal != 0) {
      // Killed by the stop's signal. An exit code is the rank's own end even when a stop was on
      // its way (ranks handle no SIGTERM): its failure (78 a job error, 79 a GPU too small) is
      // reported as such below, and the coordinator records it after the attempt's end too.
      state = v1::RANK_STATE_KILLED;
      result = RankExitResult::kKilled;
      message = stop_reason_.empty()
                    ? absl::StrCat("stopped on cancel (", exit.Describe(), ")")
                    : absl::StrCat("stopped: ", stop_reason_, " (", exit.Describe(), ")");
    } else {
      state = v1::RANK_STATE_FAILED;
      result = RankExitResult::kFailed;
      message = exit.Describe();
      if (!entry.last_output.empty()) absl::StrAppend(&message, ": ", entry.last_output);
    }
    // Its gauges go before its end is reported: whoever learns of the end (a test, a scraper after
    // the job finished) no longer sees them.
    metrics_->RecordRankExit(IdentityOf(entry), result);
    // Queued before the rank leaves ranks_, under the same lock: a Hello built meanwhile lists the
    // rank either as live or (from the queue) as ended, never as neither.
    PushStatus(entry, state, exit.shell_status(), message);
    ranks_.erase(it);
    UpdateGauges();
  }
  LogInfo(absl::StrCat("job ", entry.job_id, " attempt ", entry.attempt, " rank ", entry.rank,
                       " (pid ", entry.pid, ") ended: ", exit.Describe()));
}

std::vector<v1::RankStatus> RankManager::LiveRanks() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::RankStatus> live;
  for (const auto& [id, entry] : ranks_) {
    v1::RankStatus s;
    s.set_job_id(entry.job_id);
    s.set_attempt(entry.attempt);
    s.set_rank(entry.rank);
    s.set_state(entry.state);
    if (entry.phase.has_value()) {
      s.set_phase(std::string(StepPhaseName(entry.phase->phase)));
      s.set_phase_since_ms(entry.phase->since_ms);
      s.set_step(entry.phase->step);
    }
    live.push_back(std::move(s));
  }
  return live;
}

std::vector<pid_t> RankManager::LivePids() const {
  absl::MutexLock lock(&mu_);
  std::vector<pid_t> pids;
  for (const auto& [id, entry] : ranks_) {
    if (entry.pid > 0) pids.push_back(entry.pid);
  }
  return pids;
}

bool RankManager::StopAllAndWait(absl::Duration timeout, absl::string_view why) {
  StopAll(why);
  return WaitUntilStopped(timeout);
}

void RankManager::StopAll(absl::string_view why) {
  {
    absl::MutexLock lock(&mu_);
    stop_reason_ = std::string(why);
    for (auto& [id, entry] : ranks_) entry.cancelled = true;
  }
  supervisor_->StopAll(options_.kill_grace);
}

bool RankManager::WaitUntilStopped(absl::Duration timeout) {
  return supervisor_->WaitUntilIdle(timeout);
}

void RankManager::KillAll(absl::Duration reap_timeout) { supervisor_->KillAll(reap_timeout); }

}  // namespace dropless
