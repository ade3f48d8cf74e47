// dropless version [--client]: the CLI's release and, unless --client, the coordinator's (its
// GetVersion). -o json|yaml: {"client": {"version"}, "server": {"version", "api_version",
// "address"}}. An unreachable coordinator prints the client's line, then fails with exit code 4.
#include <unistd.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/terminal_text.h"
#include "common/version.h"

namespace dropless::cli {

int RunVersion(const Invocation& inv) {
  if (!inv.args.positional().empty()) {
    return UsageError(
        absl::StrCat("version: unexpected argument '", inv.args.positional()[0], "'"));
  }
  Value client_view = Value::Object().Set("version", Value::String(DroplessVersion()));
  const bool text = inv.options.output == OutputFormat::kText;
  if (inv.args.Has("client")) {
    if (text) {
      std::cout << "Client Version: " << DroplessVersion() << "\n";
    } else {
      PrintStructured(Value::Object().Set("client", std::move(client_view)), inv.options.output);
    }
    return kExitOk;
  }
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  v1::GetVersionResponse server;
  grpc::Status status =
      client.jobs().GetVersion(client.UnaryContext().get(), v1::GetVersionRequest(), &server);
  if (text) {
    std::cout << "Client Version: " << DroplessVersion() << "\n";
    std::cout.flush();
  }
  if (!status.ok()) return client.Fail(status);
  if (text) {
    std::cout << "Server Version: " << ForDisplay(server.version(), STDOUT_FILENO) << " (API "
              << ForDisplay(server.api_version(), STDOUT_FILENO) << ", coordinator "
              << client.address() << ")\n";
    return kExitOk;
  }
  Value server_view = Value::Object()
                          .Set("version", Value::String(server.version()))
                          .Set("api_version", Value::String(server.api_version()))
                          .Set("address", Value::String(client.address()));
  PrintStructured(Value::Object()
                      .Set("client", std::move(client_view))
                      .Set("server", std::move(server_view)),
                  inv.options.output);
  return kExitOk;
}

}  // namespace dropless::cli
