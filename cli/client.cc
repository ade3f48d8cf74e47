#include "cli/client.h"

#include <unistd.h>

#include <iostream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cli/exit_codes.h"
#include "cli/output/terminal_text.h"
#include "common/host_port.h"

namespace dropless::cli {

absl::StatusOr<Client> Client::Connect(const GlobalOptions& options) {
  const Setting& address = options.coordinator;
  const std::string from = address.given() ? address.from : "--coordinator";
  if (address.value.empty()) return absl::InvalidArgumentError(from + " must not be empty");
  if (absl::Status s = ParseHostPort(from, address.value, 1).status(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ReadChannelCredentials(options);
  if (!credentials.ok()) return credentials.status();
  return Client(options, *credentials);
}

Client::Client(const GlobalOptions& options,
               const std::shared_ptr<grpc::ChannelCredentials>& credentials)
    : options_(options) {
  grpc::ChannelArguments args;
  // Fail fast and retry quickly: a CLI call should not sit in gRPC's reconnect backoff.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A stream (watch, logs -f, submit --wait) only reads: if the coordinator's host vanishes
  // without closing the connection, nothing would ever tell the CLI. Keepalive pings expect an
  // answer, so a dead coordinator ends the stream within ~15 s and the reconnect logic takes
  // over. The coordinator accepts pings every 5 s.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(64 << 20);
  channel_ = grpc::CreateCustomChannel(address(), credentials, args);
  stub_ = v1::JobService::NewStub(channel_);
}

std::unique_ptr<grpc::ClientContext> Client::UnaryContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  return context;
}

std::unique_ptr<grpc::ClientContext> Client::StreamContext() const {
  return std::make_unique<grpc::ClientContext>();
}

grpc::Status Client::AwaitFirstAnswer(grpc::ClientContext& context,
                                      const std::function<void()>& open_and_wait) const {
  absl::Mutex mu;
  bool answered = false;
  bool expired = false;
  // The watchdog: cancels the call unless the answer comes first. TryCancel is safe from any
  // thread, also before the call starts (it then starts cancelled), and ends the wait.
  std::thread watchdog([&] {
    absl::MutexLock lock(&mu);
    if (!mu.AwaitWithTimeout(absl::Condition(&answered), options_.timeout)) {
      expired = true;
      context.TryCancel();
    }
  });
  open_and_wait();
  {
    absl::MutexLock lock(&mu);
    answered = true;
  }
  watchdog.join();
  if (!expired) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer within --timeout");
}

std::string Client::TlsHint(const std::string& message) const {
  if (absl::StrContains(message, "certificate verify failed")) {
    return " (the coordinator's certificate is not signed by the CA of --tls-ca / "
           "$DROPLESS_TLS_CA, or does not name this address)";
  }
  if (options_.insecure && absl::StrContains(message, "Socket closed")) {
    return " (--insecure speaks plaintext: does the coordinator use TLS?)";
  }
  return "";
}

int Client::Fail(const grpc::Status& status) const {
  // The message is the coordinator's, and may quote what users wrote (a job name, a label): on a
  // terminal, without its control characters.
  const std::string message = ForDisplay(status.error_message(), STDERR_FILENO);
  switch (status.error_code()) {
    case grpc::StatusCode::NOT_FOUND:
      std::cerr << "error: " << message << "\n";
      return kExitNotFound;
    case grpc::StatusCode::UNAVAILABLE:
      std::cerr << "error: cannot reach the coordinator at " << address() << ": " << message
                << TlsHint(message) << "\n";
      return kExitUnreachable;
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      // Not connected: nothing (or something that does not speak gRPC) answered at the address.
      if (channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_READY) {
        std::cerr << "error: cannot reach the coordinator at " << address() << " within --timeout "
                  << absl::FormatDuration(options_.timeout) << "\n";
        return kExitUnreachable;
      }
      std::cerr << "error: the coordinator at " << address() << " did not answer within --timeout "
                << absl::FormatDuration(options_.timeout) << "\n";
      return kExitError;
    default:
      std::cerr << "error: " << (message.empty() ? absl::StrCat("request failed (code ",
                                                                 status.error_code(), ")")
                                                 : message)
                << "\n";
      return kExitError;
  }
}

}  // namespace dropless::cli
