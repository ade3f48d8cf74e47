#include "worker/transport/gloo_store_bridge.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_context.h"

namespace dropless {

GlooStoreBridge::GlooStoreBridge(KeyValueStore* store, absl::Duration timeout)
    : store_(store), timeout_(timeout) {}

void GlooStoreBridge::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = store_->Put(key, std::string(data.begin(), data.end()));
  if (!status.ok()) throw KvStoreError(std::move(status));
}

std::vector<char> GlooStoreBridge::get(const std::string& key) {
  absl::Status waited = store_->Wait({key}, timeout_);
  if (!waited.ok()) throw KvStoreError(std::move(waited));
  absl::StatusOr<std::string> value = store_->Get(key);
  if (!value.ok()) throw KvStoreError(value.status());
  return std::vector<char>(value->begin(), value->end());
}

void GlooStoreBridge::wait(const std::vector<std::string>& keys) {
  absl::Status status = store_->Wait(keys, timeout_);
  if (!status.ok()) throw KvStoreError(std::move(status));
}

void GlooStoreBridge::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  absl::Status status = store_->Wait(keys, absl::FromChrono(timeout));
  if (!status.ok()) throw KvStoreError(std::move(status));
}

absl::Status StatusFromGlooException(const std::exception& e, absl::string_view what) {
  if (const auto* store_error = dynamic_cast<const KvStoreError*>(&e)) {
    const absl::Status& s = store_error->status();
    return WithContext(absl::StrCat(what, ": rendezvous store"), s);
  }
  const std::string message = absl::StrCat(what, ": ", e.what());
  // Gloo reports every timeout as an IoException whose text says so.
  const std::string lower = absl::AsciiStrToLower(e.what());
  if (absl::StrContains(lower, "timed out") || absl::StrContains(lower, "timeout")) {
    return absl::DeadlineExceededError(message);
  }
  if (dynamic_cast<const gloo::Exception*>(&e) != nullptr) return absl::UnavailableError(message);
  return absl::InternalError(message);
}

}  // namespace dropless
