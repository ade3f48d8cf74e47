// KeyValueStore: the rendezvous store of one job attempt (NCCL unique id, Gloo's store keys).
// Implementations: the coordinator's RendezvousService client (rank processes) and an in-memory
// store (tests).
#ifndef DROPLESS_WORKER_TRANSPORT_KV_STORE_H_
#define DROPLESS_WORKER_TRANSPORT_KV_STORE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dropless {

class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Put(const std::string& key, const std::string& value) = 0;
  // NotFound when the key is absent.
  virtual absl::StatusOr<std::string> Get(const std::string& key) = 0;
  // Blocks until every key exists; DeadlineExceeded naming the missing keys after timeout.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
};

}  // namespace dropless

#endif  // DROPLESS_WORKER_TRANSPORT_KV_STORE_H_
