#include "coordinator/scheduler/gang_scheduler.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/byte_text.h"

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

// The bound of the node's slot indices (a view's `slots` counts only the slots it kept).
int32_t SlotIndexEnd(const NodeCapacity& node) {
  return node.slot_index_end >= 0 ? node.slot_index_end : node.slots;
}

// The nodes with only the slots that `keep` accepts, counted in `slots` and listed in
// `free_slots`; nodes left without a slot are dropped. `keep` sees the worker's slot indices.
template <typename Keep>
std::vector<NodeCapacity> SlotsWhere(const std::vector<NodeCapacity>& nodes, Keep keep) {
  std::vector<NodeCapacity> out;
  for (const NodeCapacity& node : nodes) {
    NodeCapacity view = node;
    view.slots = 0;
    view.slot_index_end = SlotIndexEnd(node);
    for (int32_t slot = 0; slot < view.slot_index_end; ++slot) {
      view.slots += keep(node, slot) ? 1 : 0;
    }
    view.free_slots.clear();
    for (int32_t slot : node.free_slots) {
      if (keep(node, slot)) view.free_slots.push_back(slot);
    }
    if (view.slots > 0) out.push_back(std::move(view));
  }
  return out;
}

// A slot's GPU memory in bytes; 0 when unknown.
int64_t SlotMemory(const NodeCapacity& node, int32_t slot) {
  return slot >= 0 && static_cast<size_t>(slot) < node.device_memory_bytes.size()
             ? node.device_memory_bytes[slot]
             : 0;
}

// The slots a job that needs GPUs with more than `above` bytes may use (every slot when 0).
std::vector<NodeCapacity> SlotsFor(const std::vector<NodeCapacity>& nodes, int64_t above) {
  if (above <= 0) return nodes;
  return SlotsWhere(nodes, [above](const NodeCapacity& node, int32_t slot) {
    return SlotMemory(node, slot) > above;
  });
}

// Slots of one kind on the nodes, busy or free: in all, and the most on one node; `away`: how
// many of them are on workers away for now (they may reconnect).
struct KindCapacity {
  int64_t total = 0;
  int64_t largest = 0;
  int64_t away = 0;
};

KindCapacity CapacityOf(const std::string& kind, const std::vector<NodeCapacity>& nodes) {
  KindCapacity c;
  for (const NodeCapacity& node : nodes) {
    if (node.slot_kind != kind) continue;
    c.total += node.slots;
    c.largest = std::max<int64_t>(c.largest, node.slots);
    if (node.away) c.away += node.slots;
  }
  return c;
}

// "READY cpu workers", and those away for now when they count.
std::string WorkersText(const std::string& kind, const KindCapacity& capacity) {
  return capacity.away > 0 ? absl::StrCat("READY ", kind, " workers and those reconnecting (",
                                          capacity.away, " slots LOST for less than their lease)")
                           : absl::StrCat("READY ", kind, " workers");
}

// What the jobs that did not fit hold back from the jobs after them, per backend: every slot (a
// job that may use any did not fit), or the GPUs that each job waiting for larger GPUs could run
// on (slots with more memory than it needs, on nodes that could hold its gang): the other GPUs
// stay open to the jobs behind them.
struct Holdback {
  const QueuedJob* all_by = nullptr;     // the job that holds back every slot
  std::vector<const QueuedJob*> larger;  // jobs that wait for larger GPUs

  bool Reserved(const NodeCapacity& node, int32_t slot) const {
    for (const QueuedJob* job : larger) {
      const int64_t above = job->needs_device_memory_above;
      if (SlotMemory(node, slot) <= above) continue;
      if (!GangNeedsOneNode(job->backend)) return true;
      int64_t qualifying = 0;
      for (int32_t s = 0; s < SlotIndexEnd(node); ++s) {
        qualifying += SlotMemory(node, s) > above ? 1 : 0;
      }
      if (qualifying >= job->world_size) return true;
    }
    return false;
  }

  std::string HeldFor() const {
    std::vector<std::string> ids;
    for (const QueuedJob* job : larger) ids.push_back(job->job_id);
    return absl::StrCat(" (the larger GPUs that ", absl::StrJoin(ids, ", "),
                        larger.size() == 1 ? " waits" : " wait", " for are held for ",
                        larger.size() == 1 ? "it" : "them", ")");
  }
};

}  // namespace

bool GangFitsCapacity(int32_t world_size, const std::string& kind, int64_t above,
                      const std::vector<NodeCapacity>& nodes) {
  const KindCapacity c = CapacityOf(kind, SlotsFor(nodes, above));
  return world_size <= c.total && (!GangNeedsOneNode(kind) || world_size <= c.largest);
}

bool GangNeedsOneNode(const std::string& slot_kind) { return slot_kind == "cuda"; }

std::optional<std::vector<RankSlot>> PackGang(int32_t world_size, const std::string& slot_kind,
                                              const std::vector<NodeCapacity>& nodes) {
  if (world_size <= 0) return std::nullopt;
  std::vector<Candidate> candidates;
  for (const NodeCapacity& node : nodes) {
    if (node.slot_kind == slot_kind && !node.away && !node.free_slots.empty()) {
      candidates.push_back({&node});
    }
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
  std::map<std::string, Holdback> held;  // by backend
  for (const QueuedJob& job : queue) {
    // The slots this job may use: every slot of its kind, or those with GPUs larger than one it
    // did not fit.
    const int64_t above = job.needs_device_memory_above;
    std::vector<NodeCapacity> larger;  // only when the job needs larger GPUs: no copy otherwise
    if (above > 0) larger = SlotsFor(nodes, above);
    const std::vector<NodeCapacity>& usable = above > 0 ? larger : nodes;
    const std::string slots_text =
        above > 0 ? absl::StrCat(job.backend, " slots with more than ", GibText(above),
                                 " of GPU memory (an attempt ran out of memory on one that size)")
                  : absl::StrCat(job.backend, " slots");
    const KindCapacity capacity = CapacityOf(job.backend, usable);
    const bool one_node = GangNeedsOneNode(job.backend);
    if (one_node && capacity.total >= job.world_size && job.world_size > capacity.largest) {
      plan.waiting.push_back(
          {job.job_id,
           absl::StrCat("needs ", job.world_size, " ", slots_text,
                        " on one node (the cuda engine's EP group is one NVLink domain) but the "
                        "largest ",
                        capacity.away > 0
                            ? absl::StrCat("of the ", WorkersText(job.backend, capacity))
                            : absl::StrCat("READY ", job.backend, " worker"),
                        " has ", capacity.largest, "; waiting for a larger worker")});
      continue;
    }
    if (job.world_size > capacity.total) {
      plan.waiting.push_back(
          {job.job_id, absl::StrCat("needs ", job.world_size, " ", slots_text, " but the ",
                                    WorkersText(job.backend, capacity), " have ", capacity.total,
                                    " in total; waiting for more workers")});
      continue;
    }
    Holdback& hold = held[job.backend];
    if (hold.all_by != nullptr) {
      plan.waiting.push_back(
          {job.job_id,
           absl::StrCat("queued behind ", hold.all_by->job_id, " (priority ", hold.all_by->priority,
                        ", needs ", hold.all_by->world_size, " ", job.backend, " slots)")});
      continue;
    }
    // Jobs ahead that wait for larger GPUs keep the ones they could run on; this one may take
    // the others.
    std::vector<NodeCapacity> unreserved;
    if (!hold.larger.empty()) {
      unreserved = SlotsWhere(usable, [&hold](const NodeCapacity& node, int32_t slot) {
        return !hold.Reserved(node, slot);
      });
    }
    const std::vector<NodeCapacity>& open = hold.larger.empty() ? usable : unreserved;
    std::optional<std::vector<RankSlot>> ranks = PackGang(job.world_size, job.backend, open);
    if (!ranks.has_value()) {
      int64_t free = 0, most_on_one = 0;
      for (const NodeCapacity& node : open) {
        if (node.slot_kind != job.backend || node.away) continue;
        free += static_cast<int64_t>(node.free_slots.size());
        most_on_one = std::max<int64_t>(most_on_one, static_cast<int64_t>(node.free_slots.size()));
      }
      std::string reason =
          one_node
              ? absl::StrCat("needs ", job.world_size, " ", slots_text, " on one node; at most ",
                             most_on_one, " free on one now")
              : absl::StrCat("needs ", job.world_size, " ", slots_text, "; ", free, " free now");
      if (capacity.away > 0) {
        absl::StrAppend(&reason, "; ", capacity.away,
                        " slots on workers reconnecting (LOST for less than their lease)");
      }
      if (!hold.larger.empty()) absl::StrAppend(&reason, hold.HeldFor());
      plan.waiting.push_back({job.job_id, std::move(reason)});
      // It holds back what it may use from the jobs behind it.
      if (above > 0) {
        hold.larger.push_back(&job);
      } else {
        hold.all_by = &job;
      }
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
