// Client: the CLI's connection to the coordinator's JobService, and the one place that turns a
// failed RPC into a message on stderr and an exit code (cli/exit_codes.h).
#ifndef DROPLESS_CLI_CLIENT_H_
#define DROPLESS_CLI_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cli/args.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace dropless::cli {

class Client {
 public:
  // The client of options.coordinator. The connection settings are checked, and the CA and token
  // files read, here and not before (commands that make no call never need them): errors name the
  // flag or the environment variable a bad value came from.
  static absl::StatusOr<Client> Connect(const GlobalOptions& options);

  v1::JobService::Stub& jobs() { return *stub_; }
  // A context for one unary call, with the --timeout deadline.
  std::unique_ptr<grpc::ClientContext> UnaryContext() const;
  // A context for a stream: no deadline (a job's stream lives as long as the job, a backlog takes
  // as long as its reader needs). Its first answer is bounded by AwaitFirstAnswer.
  std::unique_ptr<grpc::ClientContext> StreamContext() const;
  // Runs `open_and_wait` for at most --timeout: it opens a stream on `context` (a StreamContext)
  // and waits for the coordinator's first answer, whatever that is for the stream (its initial
  // metadata for GetLogs, the first message for WatchJob), or for the stream's end. Past
  // --timeout the call is cancelled (the wait then returns) and the result is DEADLINE_EXCEEDED,
  // for Fail. Only this first wait is bounded: what follows takes as long as it takes. Opening is
  // inside the bound: it blocks until the request is sent, i.e. while the connection is made.
  // Unbounded, a socket that accepts and never answers holds a stream for gRPC's 20 s connect
  // timeout, and a coordinator whose handler is stuck (its connection alive) for ever.
  grpc::Status AwaitFirstAnswer(grpc::ClientContext& context,
                                const std::function<void()>& open_and_wait) const;

  // Prints "error: <the server's message>" (or why the coordinator is unreachable) to stderr and
  // returns the exit code for a failed call.
  int Fail(const grpc::Status& status) const;

  const std::string& address() const { return options_.coordinator.value; }

 private:
  Client(const GlobalOptions& options,
         const std::shared_ptr<grpc::ChannelCredentials>& credentials);

  // Why a TLS connection may have failed, for the UNAVAILABLE message; "" when nothing to add.
  std::string TlsHint(const std::string& message) const;

  GlobalOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_CLIENT_H_
