// NewRendezvousKvStore: KeyValueStore over the coordinator's RendezvousService, scoped to one job
// attempt. The coordinator may restart while ranks rendezvous, so UNAVAILABLE is retried with
// exponential backoff; every call carries its own deadline so that a hung coordinator cannot
// hang a rank. Calls fail fast while the channel is down (no wait_for_ready) so that the retry
// loop, not gRPC, decides how long to keep trying.
#include <algorithm>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "dropless/v1/rendezvous_service.grpc.pb.h"
#include "worker/transport/transport_factory.h"

namespace dropless {
namespace {

// Slack beyond a Wait's own timeout for the server to answer DEADLINE_EXCEEDED itself (that answer
// names the missing keys, a client-side deadline does not).
constexpr absl::Duration kWaitSlack = absl::Seconds(5);

absl::Status FromGrpc(const grpc::Status& status, absl::string_view what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

// Failures that a restarted or briefly unreachable coordinator produces.
bool IsTransient(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const RendezvousClientOptions& options) {
  grpc::ChannelArguments args;
  // gRPC's default reconnect backoff grows to two minutes; a restarted coordinator should be
  // found again within about max_backoff.
  const int max_backoff_ms = static_cast<int>(absl::ToInt64Milliseconds(options.max_backoff));
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.initial_backoff)));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS,
              static_cast<int>(absl::ToInt64Milliseconds(options.initial_backoff)));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_backoff_ms);
  return grpc::CreateCustomChannel(
      address,
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
      args);
}

class RendezvousKvStore : public KeyValueStore {
 public:
  RendezvousKvStore(const std::string& address, const std::string& job_id, int attempt,
                    const RendezvousClientOptions& options)
      : address_(address),
        options_(options),
        stub_(v1::RendezvousService::NewStub(MakeChannel(address, options))),
        rng_(std::random_device{}()) {
    scope_.set_job_id(job_id);
    scope_.set_attempt(attempt);
    scope_.set_secret(options.secret);
  }

  absl::Status Put(const std::string& key, const std::string& value) override {
    v1::PutRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(key);
    request.set_value(value);
    v1::PutResponse response;
    return CallWithRetries(absl::StrCat("rendezvous Put ", Describe(key)),
                           [&](grpc::ClientContext* context) {
                             return stub_->Put(context, request, &response);
                           });
  }

  absl::StatusOr<std::string> Get(const std::string& key) override {
    v1::GetRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(key);
    v1::GetResponse response;
    absl::Status status = CallWithRetries(absl::StrCat("rendezvous Get ", Describe(key)),
                                          [&](grpc::ClientContext* context) {
                                            return stub_->Get(context, request, &response);
                                          });
    if (!status.ok()) return status;
    if (!response.found()) {
      return absl::NotFoundError(absl::StrCat("rendezvous key not found: ", Describe(key)));
    }
    return std::move(*response.mutable_value());
  }

  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    const std::string what =
        absl::StrCat("rendezvous Wait for ", Describe(absl::StrJoin(keys, ", ")));
    absl::Duration backoff = options_.initial_backoff;
    grpc::Status last;
    while (true) {
      const absl::Duration remaining = std::max(deadline - absl::Now(), absl::ZeroDuration());
      v1::WaitRequest request;
      *request.mutable_scope() = scope_;
      for (const std::string& key : keys) request.add_keys(key);
      request.set_timeout_ms(absl::ToInt64Milliseconds(remaining));
      v1::WaitResponse response;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + remaining + kWaitSlack));
      last = stub_->Wait(&context, request, &response);
      if (last.ok()) return absl::OkStatus();
      // The server's own DEADLINE_EXCEEDED arrives before ours and is final.
      const bool server_timed_out = last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
                                    absl::Now() < deadline + kWaitSlack;
      if (server_timed_out || !IsTransient(last)) return FromGrpc(last, what);
      if (absl::Now() >= deadline) break;
      SleepBackoff(&backoff, deadline);
    }
    return absl::DeadlineExceededError(absl::StrFormat(
        "%s: timed out after %s; the coordinator at %s was unreachable (%s)", what,
        absl::FormatDuration(timeout), address_, last.error_message()));
  }

 private:
  template <typename Call>
  absl::Status CallWithRetries(const std::string& what, Call&& call) {
    const absl::Time give_up = absl::Now() + options_.retry_budget;
    absl::Duration backoff = options_.initial_backoff;
    while (true) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
      grpc::Status status = call(&context);
      if (status.ok() || !IsTransient(status)) return FromGrpc(status, what);
      if (absl::Now() >= give_up) {
        return absl::UnavailableError(absl::StrFormat(
            "%s: coordinator at %s unreachable for %s: %s", what, address_,
            absl::FormatDuration(options_.retry_budget), status.error_message()));
      }
      SleepBackoff(&backoff, give_up);
    }
  }

  // Sleeps a jittered `*backoff` (never past `limit`) and doubles it up to max_backoff.
  void SleepBackoff(absl::Duration* backoff, absl::Time limit) {
    double factor;
    {
      absl::MutexLock lock(&rng_mu_);
      factor = std::uniform_real_distribution<double>(0.5, 1.0)(rng_);
    }
    absl::Duration sleep = *backoff * factor;
    sleep = std::min(sleep, std::max(limit - absl::Now(), absl::ZeroDuration()));
    absl::SleepFor(sleep);
    *backoff = std::min(*backoff * 2, options_.max_backoff);
  }

  std::string Describe(absl::string_view keys) const {
    return absl::StrFormat("%s (job %s attempt %d)", keys, scope_.job_id(), scope_.attempt());
  }

  const std::string address_;
  const RendezvousClientOptions options_;
  std::unique_ptr<v1::RendezvousService::Stub> stub_;
  v1::Scope scope_;
  absl::Mutex rng_mu_;
  std::mt19937 rng_ ABSL_GUARDED_BY(rng_mu_);
};

}  // namespace

std::unique_ptr<KeyValueStore> NewRendezvousKvStore(const std::string& coordinator_address,
                                                    const std::string& job_id, int attempt,
                                                    const RendezvousClientOptions& options) {
  return std::make_unique<RendezvousKvStore>(coordinator_address, job_id, attempt, options);
}

std::unique_ptr<KeyValueStore> NewRendezvousKvStore(const std::string& coordinator_address,
                                                    const std::string& job_id, int attempt) {
  return NewRendezvousKvStore(coordinator_address, job_id, attempt, RendezvousClientOptions{});
}

}  // namespace dropless
