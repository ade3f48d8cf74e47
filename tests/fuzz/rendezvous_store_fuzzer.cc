// libFuzzer target: the coordinator's rendezvous store (coordinator/rendezvous). The input is a
// program of operations (open, close, put, get, wait, authorize) over a few attempts and keys,
// run against the store and against a plain map model; any disagreement, crash or sanitizer
// report is a finding. Limits are small so the byte and key bounds are reached.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "coordinator/rendezvous/rendezvous_store.h"

namespace {

using dropless::coordinator::RendezvousStore;

class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  std::string Bytes(size_t max) {
    size_t n = Byte() % (max + 1);
    std::string out;
    while (n-- > 0 && !done()) out.push_back(static_cast<char>(Byte()));
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  RendezvousStore::Limits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 32;
  limits.max_keys_per_attempt = 6;
  limits.max_bytes_per_attempt = 96;
  RendezvousStore store(limits);
  // The model: open attempts, their secrets and keys.
  struct Space {
    std::string secret;
    std::map<std::string, std::string> keys;
    size_t bytes = 0;
  };
  std::map<std::pair<std::string, int>, Space> model;
  Program program(data, size);
  while (!program.done()) {
    const uint8_t op = program.Byte() % 6;
    const std::string job = program.Byte() % 2 == 0 ? "job-a" : "job-b";
    const int attempt = 1 + program.Byte() % 2;
    const auto scope = std::make_pair(job, attempt);
    auto it = model.find(scope);
    switch (op) {
      case 0: {  // open
        std::string secret = program.Bytes(4);
        store.Open(job, attempt, secret);
        model[scope].secret = secret;
        break;
      }
      case 1:  // close
        store.Close(job, attempt);
        model.erase(scope);
        break;
      case 2: {  // put
        std::string key = program.Bytes(10), value = program.Bytes(40);
        absl::Status s = store.Put(job, attempt, key, value);
        const bool valid = !key.empty() && key.size() <= limits.max_key_bytes &&
                           value.size() <= limits.max_value_bytes;
        if (!valid) {
          Check(absl::IsInvalidArgument(s));
          break;
        }
        if (it == model.end()) {
          Check(absl::IsFailedPrecondition(s));
          break;
        }
        Space& space = it->second;
        auto old = space.keys.find(key);
        const size_t after = space.bytes + key.size() + value.size() -
                             (old == space.keys.end() ? 0 : key.size() + old->second.size());
        const size_t count = space.keys.size() + (old == space.keys.end() ? 1 : 0);
        if (count > limits.max_keys_per_attempt || after > limits.max_bytes_per_attempt) {
          Check(absl::IsResourceExhausted(s));
          break;
        }
        Check(s.ok());
        space.keys[key] = value;
        space.bytes = after;
        break;
      }
      case 3: {  // get
        std::string key = program.Bytes(10);
        absl::StatusOr<std::string> got = store.Get(job, attempt, key);
        if (it == model.end()) {
          Check(!got.ok());
        } else if (auto k = it->second.keys.find(key); k != it->second.keys.end()) {
          Check(got.ok() && *got == k->second);
        } else {
          Check(!got.ok());
        }
        break;
      }
      case 4: {  // wait, without blocking
        std::string key = program.Bytes(10);
        absl::Status s = store.Wait(job, attempt, {key}, absl::ZeroDuration());
        if (it == model.end()) {
          Check(!s.ok());
        } else if (it->second.keys.count(key) != 0) {
          Check(s.ok());
        } else {
          Check(!s.ok());
        }
        break;
      }
      case 5: {  // authorize
        std::string secret = program.Bytes(4);
        absl::Status s = store.Authorize(job, attempt, secret);
        if (it == model.end()) {
          Check(absl::IsFailedPrecondition(s));
        } else {
          Check(s.ok() == (secret == it->second.secret));
          Check(s.ok() || absl::IsPermissionDenied(s));
        }
        break;
      }
    }
  }
  return 0;
}
