// NewMemoryKvStore: a map behind a mutex; Wait sleeps on the mutex until the keys appear.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

class MemoryKvStore : public KeyValueStore {
 public:
  absl::Status Put(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key not found: ", key));
    return it->second;
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto all_present = [this, &keys]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return MissingLocked(keys).empty();
    };
    if (mu_.AwaitWithTimeout(absl::Condition(&all_present), timeout)) return absl::OkStatus();
    return absl::DeadlineExceededError(
        absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                     " waiting for keys: ", absl::StrJoin(MissingLocked(keys), ", ")));
  }

 private:
  std::vector<std::string> MissingLocked(const std::vector<std::string>& keys) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (values_.count(key) == 0) missing.push_back(key);
    }
    return missing;
  }

  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<KeyValueStore> NewMemoryKvStore() { return std::make_unique<MemoryKvStore>(); }

}  // namespace dropless
