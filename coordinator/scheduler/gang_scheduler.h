// Gang scheduling of job attempts onto worker slots, and worker lease expiry. Pure decisions:
// no clocks, no I/O, no locks, so every rule is checked by table-driven tests.
//
// Rules (docs/architecture.md, "Job lifecycle"):
// - A job needs world_size = ep*dp slots of its backend's kind (cpu or cuda) on READY workers,
//   all or nothing.
// - Packing: a single node with enough free slots if there is one (the one with the fewest free
//   slots that still fits, so large holes stay for large gangs); otherwise the fewest nodes,
//   largest free first, the last node being the smallest one that holds the remainder. Ranks are
//   consecutive per node, so an EP group (consecutive ranks) shares a node where it can.
// - A cuda gang goes on one node only (GangNeedsOneNode): the cuda engine's EP group is one NVLink
//   domain. One larger than every READY cuda worker waits for a larger one without blocking.
// - Order: higher priority first, FIFO (submission order) among equals.
// - A job that does not fit now blocks every later job of the same backend (they have lower or
//   equal priority), so a large gang is never starved by smaller jobs behind it. Backends are
//   separate pools and do not block each other.
// - A job larger than every READY slot of its kind together cannot fit until workers join; it
//   waits with a reason but does not block the queue (it would otherwise block it forever).
// - A worker away for now (its session ended less than a lease ago, it may reconnect:
//   NodeCapacity::away, as WorkerRegistry::Capacity decides) counts as READY with every slot busy:
//   a gang that needs it waits and holds back the jobs behind it, so they do not backfill the
//   slots it waits for while the worker reconnects. Nothing is placed on it.
// - A cuda job that ran out of memory on a GPU of some size (QueuedJob.needs_device_memory_above)
//   goes only on slots whose GPU has more; the rules above then count only those slots. Slots of
//   unknown memory (a worker that predates reporting it) do not qualify. Such a job that does not
//   fit now holds back only the GPUs it could use: the jobs behind it may take the smaller ones.
#ifndef DROPLESS_COORDINATOR_SCHEDULER_GANG_SCHEDULER_H_
#define DROPLESS_COORDINATOR_SCHEDULER_GANG_SCHEDULER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dropless::coordinator {

// A READY worker as the scheduler sees it, or one away for now (`away`).
struct NodeCapacity {
  std::string worker_id;
  std::string node;
  std::string slot_kind;            // cpu | cuda
  int32_t slots = 0;                // all slots of the worker (of a view: the slots it kept)
  std::vector<int32_t> free_slots;  // slot indices held by no live rank, ascending
  // Slot indices run below this: the worker's slot count (-1: `slots`). A view that keeps some
  // slots (the larger GPUs) counts fewer `slots` but keeps the worker's indices.
  int32_t slot_index_end = -1;
  // By slot index (cuda): the GPU's total memory in bytes; 0 or missing: unknown.
  std::vector<int64_t> device_memory_bytes;
  // Away for now (its session ended less than a lease ago; it may reconnect): its slots count
  // toward what a gang waits for, none is free (free_slots is empty).
  bool away = false;
};

// A PENDING job waiting for placement.
struct QueuedJob {
  std::string job_id;
  int32_t priority = 0;
  int64_t seq = 0;      // submission order
  std::string backend;  // cpu | cuda
  int32_t world_size = 0;
  // Bytes: only slots whose GPU has more memory than this qualify (0: any slot).
  int64_t needs_device_memory_above = 0;
};

struct RankSlot {
  int32_t rank = 0;
  std::string worker_id;
  std::string node;
  int32_t slot = 0;
  bool operator==(const RankSlot& o) const {
    return rank == o.rank && worker_id == o.worker_id && node == o.node && slot == o.slot;
  }
};

struct JobPlacement {
  std::string job_id;
  std::vector<RankSlot> ranks;  // rank order
};

struct WaitingJob {
  std::string job_id;
  std::string reason;  // why it was not placed, for the job's event log
};

struct SchedulePlan {
  std::vector<JobPlacement> placements;  // in decision order
  std::vector<WaitingJob> waiting;       // in queue order
};

// Whether a gang of this slot kind must fit on one node (cuda: one NVLink domain).
bool GangNeedsOneNode(const std::string& slot_kind);

// Places world_size ranks onto the nodes per the packing rule, or nullopt when they do not fit.
// Nodes of other kinds than slot_kind are ignored.
std::optional<std::vector<RankSlot>> PackGang(int32_t world_size, const std::string& slot_kind,
                                              const std::vector<NodeCapacity>& nodes);

// Whether world_size ranks of `kind` fit these nodes' slots whose GPUs have more than `above`
// bytes (any slot when 0), busy or free, by the rules above: what could ever be placed there.
bool GangFitsCapacity(int32_t world_size, const std::string& kind, int64_t above,
                      const std::vector<NodeCapacity>& nodes);

// Decides which queued jobs start now and where, and why the others wait.
SchedulePlan PlanSchedule(std::vector<QueuedJob> queue, std::vector<NodeCapacity> nodes);

// A worker's lease: the time of the last message it sent (Unix ms).
struct WorkerLease {
  std::string worker_id;
  int64_t last_message_ms = 0;
};

// Workers whose lease expired: no message for more than lease_timeout_ms.
std::vector<std::string> ExpiredLeases(const std::vector<WorkerLease>& leases, int64_t now_ms,
                                       int64_t lease_timeout_ms);

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SCHEDULER_GANG_SCHEDULER_H_
