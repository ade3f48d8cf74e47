// GlooStoreBridge: lets Gloo's rendezvous (which speaks gloo::rendezvous::Store and reports
// failures by throwing) run on a dropless KeyValueStore (which returns absl::Status).
#ifndef DROPLESS_WORKER_TRANSPORT_GLOO_STORE_BRIDGE_H_
#define DROPLESS_WORKER_TRANSPORT_GLOO_STORE_BRIDGE_H_

#include <chrono>
#include <exception>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gloo/common/error.h"
#include "gloo/rendezvous/store.h"
#include "worker/transport/kv_store.h"

namespace dropless {

// Thrown through Gloo when the KeyValueStore fails, so the original status (e.g. DeadlineExceeded
// naming the missing keys) reaches the caller unchanged.
class KvStoreError : public gloo::IoException {
 public:
  explicit KvStoreError(absl::Status status)
      : gloo::IoException(std::string(status.ToString())), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

class GlooStoreBridge : public gloo::rendezvous::Store {
 public:
  // `store` must outlive the bridge. `timeout` bounds get() and the wait() without a timeout.
  GlooStoreBridge(KeyValueStore* store, absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  // Gloo expects get() to block until the key exists: Wait, then Get.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  KeyValueStore* store_;
  absl::Duration timeout_;
};

// The status for an exception that escaped Gloo: DeadlineExceeded for timeouts, the store's own
// status for store failures, Unavailable for I/O and other Gloo errors. `what` names the operation.
absl::Status StatusFromGlooException(const std::exception& e, absl::string_view what);

}  // namespace dropless

#endif  // DROPLESS_WORKER_TRANSPORT_GLOO_STORE_BRIDGE_H_
