#include "coordinator/scheduler/gang_scheduler.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dropless::coordinator {
namespace {

struct Candidate {
  const NodeCapacity* node;
  int32_t free() const { return static_cast<int32_t>(node->free_slots.size()); }
};

// Larger free first; ties broken by worker id so plans are deterministic.
bool MoreFree(const Candidate& a, const Candidate& b) {
  if (a.free() != b.free()) return a.free() > b.free();
  return a.node->worker_id < b.node->worker_id;
}

// Fewer free first (best fit); ties by worker id.
bool LessFree(const Candidate& a, const Candidate& b) {
  if (a.free() != b.free()) return a.free() < b.free();
  return a.node->worker_id < b.node->worker_id;
}

void AssignRanks(const std::vector<std::pair<const NodeCapacity*, int32_t>>& take,
                 std::vector<RankSlot>* out) {
  int32_t rank = 0;
  for (const auto& [node, count] : take) {
    for (int32_t i = 0; i < count; ++i) {
      out->push_back(RankSlot{rank++, node->worker_id, node->node, node->free_slots[i]});
    }
  }
}

// The nodes as a job that needs GPUs with more than `above` bytes sees them: only the slots that
// qualify, counted in `slots` and listed in `free_slots`.
std::vector<NodeCapacity> SlotsWithMoreMemory(const std::vector<NodeCapacity>& nodes,
                                              int64_t above) {
  std::vector<NodeCapacity> out;
  for (const NodeCapacity& node : nodes) {
    auto qualifies = [&](int32_t slot) {
      return slot >= 0 && static_cast<size_t>(slot) < node.device_memory_bytes.size() &&
             node.device_memory_bytes[slot] > above;
    };
    NodeCapacity view = node;
    view.slots = 0;
    for (int32_t slot = 0; slot < node.slots; ++slot) view.slots += qualifies(slot) ? 1 : 0;
    view.free_slots.clear();
    for (int32_t slot : node.free_slots) {
      if (qualifies(slot)) view.free_slots.push_back(slot);
    }
    if (view.slots > 0) out.push_back(std::move(view));
  }
  return out;
}

std::string GiB(int64_t bytes) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30));
}

}  // namespace

bool GangNeedsOneNode(const std::string& slot_kind) { return slot_kind == "cuda"; }

std::optional<std::vector<RankSlot>> PackGang(int32_t world_size, const std::string& slot_kind,
                                              const std::vector<NodeCapacity>& nodes) {
  if (world_size <= 0) return std::nullopt;
  std::vector<Candidate> candidates;
  for (const NodeCapacity& node : nodes) {
    if (node.slot_kind == slot_kind && !node.free_slots.empty()) candidates.push_back({&node});
  }
  std::vector<std::pair<const NodeCapacity*, int32_t>> take;
  std::vector<RankSlot> ranks;

  // One node if any holds the whole gang: the tightest fit.
  std::sort(candidates.begin(), candidates.end(), LessFree);
  for (const Candidate& c : candidates) {
    if (c.free() >= world_size) {
      take.emplace_back(c.node, world_size);
      AssignRanks(take, &ranks);
      return ranks;
    }
  }
  if (GangNeedsOneNode(slot_kind)) return std::nullopt;

  // Fewest nodes: the largest ones until the remainder fits in one more node, which is then the
  // smallest node that holds it.
  std::sort(candidates.begin(), candidates.end(), MoreFree);
  int32_t remaining = world_size;
  size_t next = 0;
  while (next < candidates.size()) {
    // Does some node among the rest hold the remainder? The rest are sorted by free, descending,
    // so the first one is the only one to check.
    if (candidates[next].free() >= remaining) break;
    take.emplace_back(candidates[next].node, candidates[next].free());
    remaining -= candidates[next].free();
    ++next;
  }
  if (next == candidates.size()) return std::nullopt;
  const Candidate* last = &candidates[next];
  for (size_t i = next; i < candidates.size(); ++i) {
    if (candidates[i].free() >= remaining && LessFree(candidates[i], *last)) last = &candidates[i];
  }
  take.emplace_back(last->node, remaining);
  AssignRanks(take, &ranks);
  return ranks;
}

SchedulePlan PlanSchedule(std::vector<QueuedJob> queue, std::vector<NodeCapacity> nodes) {
  std::stable_sort(queue.begin(), queue.end(), [](const QueuedJob& a, const QueuedJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.seq < b.seq;
  });
  SchedulePlan plan;
  std::map<std::string, const QueuedJob*> blocked_by;  // backend -> first job that did not fit
  for (const QueuedJob& job : queue) {
    // The slots this job may use: every slot of its kind, or those with GPUs larger than one it
    // did not fit.
    const int64_t above = job.needs_device_memory_above;
    std::vector<NodeCapacity> larger;
    if (above > 0) larger = SlotsWithMoreMemory(nodes, above);
    const std::vector<NodeCapacity>& usable = above > 0 ? larger : nodes;
    const std::string slots_text =
        above > 0 ? absl::StrCat(job.backend, " slots with more than ", GiB(above),
                                 " of GPU memory (an attempt ran out of memory on one that size)")
                  : absl::StrCat(job.backend, " slots");
    int64_t total = 0;    // busy or free
    int64_t largest = 0;  // the most slots of one worker
    for (const NodeCapacity& node : usable) {
      if (node.slot_kind != job.backend) continue;
      total += node.slots;
      largest = std::max<int64_t>(largest, node.slots);
    }
    const bool one_node = GangNeedsOneNode(job.backend);
    if (one_node && total >= job.world_size && job.world_size > largest) {
      plan.waiting.push_back(
          {job.job_id,
           absl::StrCat("needs ", job.world_size, " ", slots_text,
                        " on one node (the cuda engine's EP group is one NVLink domain) but the "
                        "largest READY ",
                        job.backend, " worker has ", largest, "; waiting for a larger worker")});
      continue;
    }
    if (job.world_size > total) {
      plan.waiting.push_back(
          {job.job_id,
           absl::StrCat("needs ", job.world_size, " ", slots_text, " but the READY ", job.backend,
                        " workers have ", total, " in total; waiting for more workers")});
      continue;
    }
    auto blocker = blocked_by.find(job.backend);
    if (blocker != blocked_by.end()) {
      plan.waiting.push_back(
          {job.job_id, absl::StrCat("queued behind ", blocker->second->job_id, " (priority ",
                                    blocker->second->priority, ", needs ",
                                    blocker->second->world_size, " ", job.backend, " slots)")});
      continue;
    }
    std::optional<std::vector<RankSlot>> ranks = PackGang(job.world_size, job.backend, usable);
    if (!ranks.has_value()) {
      int64_t free = 0, most_on_one = 0;
      for (const NodeCapacity& node : usable) {
        if (node.slot_kind != job.backend) continue;
        free += static_cast<int64_t>(node.free_slots.size());
        most_on_one = std::max<int64_t>(most_on_one, static_cast<int64_t>(node.free_slots.size()));
      }
      plan.waiting.push_back(
          {job.job_id,
           one_node
               ? absl::StrCat("needs ", job.world_size, " ", slots_text, " on one node; at most ",
                              most_on_one, " free on one now")
               : absl::StrCat("needs ", job.world_size, " ", slots_text, "; ", free, " free now")});
      blocked_by[job.backend] = &job;
      continue;
    }
    // Take the slots out of the pool for the jobs after this one.
    for (const RankSlot& r : *ranks) {
      for (NodeCapacity& node : nodes) {
        if (node.worker_id != r.worker_id) continue;
        node.free_slots.erase(std::remove(node.free_slots.begin(), node.free_slots.end(), r.slot),
                              node.free_slots.end());
      }
    }
    plan.placements.push_back({job.job_id, std::move(*ranks)});
  }
  return plan;
}

std::vector<std::string> ExpiredLeases(const std::vector<WorkerLease>& leases, int64_t now_ms,
                                       int64_t lease_timeout_ms) {
  std::vector<std::string> expired;
  for (const WorkerLease& lease : leases) {
    if (now_ms - lease.last_message_ms > lease_timeout_ms) expired.push_back(lease.worker_id);
  }
  return expired;
}

}  // namespace dropless::coordinator
