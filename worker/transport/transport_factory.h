// Factories for the rank groups of one job attempt. Contract between the rank process
// (worker/rank) and the transport implementations (worker/transport).
#ifndef DROPLESS_WORKER_TRANSPORT_TRANSPORT_FACTORY_H_
#define DROPLESS_WORKER_TRANSPORT_TRANSPORT_FACTORY_H_

#include <memory>

#include <grpcpp/security/credentials.h>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/transport/communicator.h"
#include "worker/transport/kv_store.h"

namespace dropless {

struct GroupLayout {
  int rank = 0;
  int world_size = 1;
  int ep = 1;  // world_size == ep * dp
  int dp = 1;
};

// In-process groups for ep*dp ranks that run as threads of one process (tests, single-node CPU runs).
// Element i of the result belongs to rank i; each rank's groups are used from that rank's thread.
std::vector<RankGroups> CreateLocalGroups(int ep, int dp);
// As above; a collective that waits longer than `timeout` for the other ranks of its group fails with
// DeadlineExceeded on every rank of that group, and the group fails every later call (a lost rank
// thread must not hang the others forever). The two-argument form waits up to 10 minutes.
std::vector<RankGroups> CreateLocalGroups(int ep, int dp, absl::Duration timeout);

struct GlooOptions {
  GroupLayout layout;
  std::string host = "127.0.0.1";  // address this rank listens on (the worker's advertised host)
  // Finding the peers (rendezvous) and connecting the groups.
  absl::Duration connect_timeout = absl::Seconds(120);
  // One collective waiting for its slowest peer. A peer that dies closes its connections and
  // fails the collective at once; one that is alive but stuck is the coordinator's hang
  // watchdog's to find (its limits follow the job's own step times). This is only the backstop:
  // a peer legitimately minutes behind (skewed routing on CPU, a slow checkpoint write) must not
  // fail the attempt.
  absl::Duration collective_timeout = absl::Minutes(30);
};

// Gloo (TCP) groups; peers find each other through `store` (keys prefixed per group).
absl::StatusOr<RankGroups> CreateGlooGroups(const GlooOptions& options, KeyValueStore* store);

// In-memory store shared by the threads of one process (tests).
std::unique_ptr<KeyValueStore> NewMemoryKvStore();

// Client of the coordinator's RendezvousService, scoped to one job attempt.
std::unique_ptr<KeyValueStore> NewRendezvousKvStore(const std::string& coordinator_address,
                                                    const std::string& job_id, int attempt);

// How the RendezvousService client rides out a coordinator restart: calls that fail with
// UNAVAILABLE (or hit their own deadline) are retried with exponential backoff. Put and Get give up
// with Unavailable after `retry_budget`; Wait retries within its own timeout.
struct RendezvousClientOptions {
  absl::Duration rpc_timeout = absl::Seconds(10);  // deadline of one Put/Get call
  absl::Duration retry_budget = absl::Minutes(2);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  // The attempt's rendezvous secret (Assignment.rendezvous_secret; a rank finds it in
  // $DROPLESS_RENDEZVOUS_SECRET). Calls without the right one are refused (PermissionDenied).
  std::string secret;
  // How to reach the coordinator (mutual TLS with the node's certificate); null: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
};
std::unique_ptr<KeyValueStore> NewRendezvousKvStore(const std::string& coordinator_address,
                                                    const std::string& job_id, int attempt,
                                                    const RendezvousClientOptions& options);

}  // namespace dropless

#endif  // DROPLESS_WORKER_TRANSPORT_TRANSPORT_FACTORY_H_
