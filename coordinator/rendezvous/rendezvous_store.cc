#include "coordinator/rendezvous/rendezvous_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dropless::coordinator {
namespace {

// The first few missing keys and their count: a status message travels in a gRPC trailer, which
// must stay small however many keys a caller waits on.
std::string DescribeMissing(const std::vector<std::string>& missing) {
  constexpr size_t kShownKeys = 8;
  constexpr size_t kShownKeyBytes = 128;
  std::vector<std::string> shown;
  for (size_t i = 0; i < missing.size() && i < kShownKeys; ++i) {
    shown.push_back(missing[i].size() > kShownKeyBytes
                        ? absl::StrCat(missing[i].substr(0, kShownKeyBytes), "...")
                        : missing[i]);
  }
  std::string text = absl::StrCat("missing keys: ", absl::StrJoin(shown, ", "));
  if (missing.size() > shown.size()) {
    absl::StrAppend(&text, " and ", missing.size() - shown.size(), " more (", missing.size(),
                    " missing)");
  }
  return text;
}

}  // namespace

std::string RendezvousStore::Name(const Scope& scope) {
  return absl::StrCat("job \"", scope.first, "\" attempt ", scope.second);
}

void RendezvousStore::Open(const std::string& job_id, int32_t attempt, const std::string& secret) {
  absl::MutexLock lock(&mu_);
  spaces_[Scope(job_id, attempt)].secret = secret;
}

absl::Status RendezvousStore::Authorize(const std::string& job_id, int32_t attempt,
                                        const std::string& secret) const {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  auto it = spaces_.find(Scope(job_id, attempt));
  if (it == spaces_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(Scope(job_id, attempt)), " is not active"));
  }
  const std::string& expected = it->second.secret;
  // Compared in constant time: the time taken says nothing about how much of a guess matched.
  unsigned char diff = expected.size() == secret.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    diff |= static_cast<unsigned char>(expected[i] ^ (i < secret.size() ? secret[i] : 0));
  }
  if (diff != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("scope.secret: not the rendezvous secret of ", Name(Scope(job_id, attempt)),
                     " (only that attempt's ranks may use its keys)"));
  }
  return absl::OkStatus();
}

void RendezvousStore::Close(const std::string& job_id, int32_t attempt) {
  absl::MutexLock lock(&mu_);
  spaces_.erase(Scope(job_id, attempt));
  changed_.SignalAll();
}

void RendezvousStore::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  spaces_.clear();
  changed_.SignalAll();
}

size_t RendezvousStore::OpenAttempts() const {
  absl::MutexLock lock(&mu_);
  return spaces_.size();
}

absl::Status RendezvousStore::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("key: must not be empty");
  if (key.size() > limits_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key: ", key.size(), " bytes exceeds the limit of ",
                                                   limits_.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::CheckPutLocked(const Scope& scope, const std::string& key,
                                             size_t value_bytes, size_t* bytes) const {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  if (value_bytes > limits_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value: ", value_bytes,
                                                   " bytes exceeds the limit of ",
                                                   limits_.max_value_bytes));
  }
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  auto space = spaces_.find(scope);
  if (space == spaces_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(Name(scope), " is not active"));
  }
  const Keyspace& keys = space->second;
  auto existing = keys.values.find(key);
  if (existing == keys.values.end() && keys.values.size() >= limits_.max_keys_per_attempt) {
    return absl::ResourceExhaustedError(absl::StrCat(Name(scope), " already holds ",
                                                     keys.values.size(), " keys (the limit)"));
  }
  const size_t replaced =
      existing == keys.values.end() ? 0 : existing->first.size() + existing->second.size();
  *bytes = keys.bytes - replaced + key.size() + value_bytes;
  if (*bytes > limits_.max_bytes_per_attempt) {
    return absl::ResourceExhaustedError(
        absl::StrCat(Name(scope), " would hold ", *bytes, " bytes of keys and values, over the "
                     "limit of ", limits_.max_bytes_per_attempt));
  }
  return absl::OkStatus();
}

absl::Status RendezvousStore::CheckPut(const std::string& job_id, int32_t attempt,
                                       const std::string& key, size_t value_bytes) const {
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  return CheckPutLocked(Scope(job_id, attempt), key, value_bytes, &bytes);
}

absl::Status RendezvousStore::Put(const std::string& job_id, int32_t attempt,
                                  const std::string& key, std::string value) {
  absl::MutexLock lock(&mu_);
  const Scope scope(job_id, attempt);
  size_t bytes = 0;
  if (absl::Status s = CheckPutLocked(scope, key, value.size(), &bytes); !s.ok()) return s;
  Keyspace& keys = spaces_[scope];
  keys.bytes = bytes;
  keys.values[key] = std::move(value);
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousStore::Get(const std::string& job_id, int32_t attempt,
                                                 const std::string& key) {
  if (absl::Status s = CheckKey(key); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
  Scope scope(job_id, attempt);
  auto space = spaces_.find(scope);
  if (space == spaces_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(Name(scope), " is not active"));
  }
  auto it = space->second.values.find(key);
  if (it == space->second.values.end()) {
    return absl::NotFoundError(absl::StrCat("key \"", key, "\" not set in ", Name(scope)));
  }
  return it->second;
}

absl::Status RendezvousStore::Wait(const std::string& job_id, int32_t attempt,
                                   const std::vector<std::string>& keys, absl::Duration timeout,
                                   const std::function<bool()>& cancelled) {
  for (const std::string& key : keys) {
    if (absl::Status s = CheckKey(key); !s.ok()) return s;
  }
  if (timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeout_ms: must not be negative");
  }
  const absl::Time deadline = absl::Now() + std::min(timeout, limits_.max_wait);
  const Scope scope(job_id, attempt);
  std::vector<std::string> missing;
  absl::MutexLock lock(&mu_);
  while (true) {
    if (shut_down_) return absl::UnavailableError("coordinator is shutting down");
    auto space = spaces_.find(scope);
    if (space == spaces_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(Name(scope), " is not active"));
    }
    missing.clear();
    for (const std::string& key : keys) {
      if (space->second.values.count(key) == 0) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();
    if (cancelled && cancelled()) return absl::CancelledError("rendezvous wait cancelled");
    absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous wait in ", Name(scope), " timed out after ",
          absl::FormatDuration(std::min(timeout, limits_.max_wait)), "; ",
          DescribeMissing(missing)));
    }
    // Woken by any change to the store; re-polls a few times a second for cancellation.
    changed_.WaitWithDeadline(&mu_, std::min(deadline, now + absl::Milliseconds(200)));
  }
}

}  // namespace dropless::coordinator
