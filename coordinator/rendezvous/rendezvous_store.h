// RendezvousStore: the in-memory key-value store behind RendezvousService, one keyspace per job
// attempt. A keyspace exists only while its attempt is active: the coordinator opens it when it
// places the attempt and closes it when the attempt ends, which drops the keys and wakes every
// waiter. The coordinator also writes every accepted Put to its SQLite store first
// (Coordinator::RendezvousPut, after CheckPut) and puts the stored keys back after a restart, so
// ranks still rendezvousing then find what their peers put before it.
//
// Thread-safe.
#ifndef DROPLESS_COORDINATOR_RENDEZVOUS_RENDEZVOUS_STORE_H_
#define DROPLESS_COORDINATOR_RENDEZVOUS_RENDEZVOUS_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

class RendezvousStore {
 public:
  struct Limits {
    size_t max_key_bytes = 1024;
    size_t max_value_bytes = 1 << 20;   // an NCCL unique id is 128 bytes; Gloo keys are small
    size_t max_keys_per_attempt = 16384;
    // Keys and values of one attempt together: without it, max_keys_per_attempt full-size values
    // (16 GiB) would fit. Gloo's full-mesh addresses of a 1024-rank group take ~150 MiB.
    size_t max_bytes_per_attempt = size_t{256} << 20;
    absl::Duration max_wait = absl::Hours(1);
  };

  RendezvousStore() : RendezvousStore(Limits{}) {}
  explicit RendezvousStore(Limits limits) : limits_(limits) {}

  // `secret` is the attempt's credential (Assignment.rendezvous_secret); empty: none is asked
  // (an attempt placed by a coordinator that predates secrets).
  void Open(const std::string& job_id, int32_t attempt, const std::string& secret = "");
  // Drops the attempt's keys; waiters on it return FailedPrecondition.
  void Close(const std::string& job_id, int32_t attempt);
  // Wakes every waiter with Unavailable; later calls fail the same way.
  void Shutdown();

  // Whether a caller presenting `secret` may use the attempt's keys: FailedPrecondition when the
  // attempt is not active, PermissionDenied when the secret is not the attempt's.
  absl::Status Authorize(const std::string& job_id, int32_t attempt,
                         const std::string& secret) const;

  // Errors: InvalidArgument for an empty or oversize key or value, ResourceExhausted past the key
  // count or the attempt's bytes, FailedPrecondition when the attempt is not active. Overwrites
  // an existing key.
  absl::Status Put(const std::string& job_id, int32_t attempt, const std::string& key,
                   std::string value);
  // Whether Put would accept the key and value now (the same errors), without storing anything.
  absl::Status CheckPut(const std::string& job_id, int32_t attempt, const std::string& key,
                        size_t value_bytes) const;
  // NotFound when the key does not exist (yet).
  absl::StatusOr<std::string> Get(const std::string& job_id, int32_t attempt,
                                  const std::string& key);
  // Blocks until every key exists (OK), the timeout passes (DeadlineExceeded naming the first
  // missing keys and how many there are), the attempt ends (FailedPrecondition), or cancelled() turns true (Cancelled; polled a
  // few times a second, for the RPC's context).
  absl::Status Wait(const std::string& job_id, int32_t attempt,
                    const std::vector<std::string>& keys, absl::Duration timeout,
                    const std::function<bool()>& cancelled = nullptr);

  size_t OpenAttempts() const;

 private:
  using Scope = std::pair<std::string, int32_t>;
  struct Keyspace {
    std::map<std::string, std::string> values;
    size_t bytes = 0;  // sum of key and value sizes
    std::string secret;
  };

  absl::Status CheckKey(const std::string& key) const;
  // Put's checks; on success *bytes is the attempt's byte count after the put.
  absl::Status CheckPutLocked(const Scope& scope, const std::string& key, size_t value_bytes,
                              size_t* bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::string Name(const Scope& scope);

  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<Scope, Keyspace> spaces_ ABSL_GUARDED_BY(mu_);
  absl::CondVar changed_;  // signalled on every Put, Close and Shutdown
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_RENDEZVOUS_RENDEZVOUS_STORE_H_
