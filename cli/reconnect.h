// Reconnection: how `watch` and `logs -f` ride out a coordinator that went away mid-job (restart,
// network): retry once a second for up to 60 s from the loss, with one notice on stderr per loss.
// Each re-opened stream waits at most --timeout for its first answer (Client::AwaitFirstAnswer),
// as the first one did: a coordinator that is back but silent (accepts, never answers) is still
// lost, and tried again. The window is checked between tries, so the last try may end up to
// --timeout after it.
#ifndef DROPLESS_CLI_RECONNECT_H_
#define DROPLESS_CLI_RECONNECT_H_

#include <functional>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/time/time.h"

namespace dropless::cli {

class Reconnection {
 public:
  static constexpr absl::Duration kWindow = absl::Seconds(60);

  // command: the name the notice starts with ("watch", "logs").
  explicit Reconnection(std::string command) : command_(std::move(command)) {}

  // Whether a followed stream that ended with `status` lost the coordinator (worth a retry):
  // UNAVAILABLE (it went away), or DEADLINE_EXCEEDED (a stream has no deadline: no first answer
  // within --timeout, Client::AwaitFirstAnswer).
  static bool LostCoordinator(const grpc::Status& status);

  // A message arrived: the next loss opens a new window.
  void Connected() { lost_since_ = absl::InfiniteFuture(); }

  // The stream ended with `status` (the caller has decided a retry makes sense). False once the
  // window since the loss is over. Else, on the first failure of a window, runs on_first_loss and
  // prints "<command>: lost the coordinator (<message>); reconnecting"; then waits 1 s; true.
  bool Retry(const grpc::Status& status, const std::function<void()>& on_first_loss = nullptr);

 private:
  std::string command_;
  absl::Time lost_since_ = absl::InfiniteFuture();
};

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_RECONNECT_H_
