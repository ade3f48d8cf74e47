// Client: the CLI's connection to the coordinator's JobService, and the one place that turns a
// failed RPC into a message on stderr and an exit code (cli/exit_codes.h).
#ifndef DROPLESS_CLI_CLIENT_H_
#define DROPLESS_CLI_CLIENT_H_

#include <memory>
#include <string>

#include "cli/args.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace dropless::cli {

class Client {
 public:
  explicit Client(const GlobalOptions& options);

  v1::JobService::Stub& jobs() { return *stub_; }
  // A context for one unary call, with the --timeout deadline.
  std::unique_ptr<grpc::ClientContext> UnaryContext() const;
  // A context for a stream that lives as long as the job: no deadline; an unreachable
  // coordinator still fails the first read at once.
  std::unique_ptr<grpc::ClientContext> StreamContext() const;

  // Prints "error: <the server's message>" (or why the coordinator is unreachable) to stderr and
  // returns the exit code for a failed call.
  int Fail(const grpc::Status& status) const;

  const std::string& address() const { return options_.coordinator; }

 private:
  // Why a TLS connection may have failed, for the UNAVAILABLE message; "" when nothing to add.
  std::string TlsHint(const std::string& message) const;

  GlobalOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_CLIENT_H_
