// The dropless commands. Each takes the parsed command line (global options resolved) and returns
// the process exit code (cli/exit_codes.h); each prints its result to stdout and errors to stderr.
#ifndef DROPLESS_CLI_COMMANDS_COMMANDS_H_
#define DROPLESS_CLI_COMMANDS_COMMANDS_H_

#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/client.h"
#include "cli/output/value.h"

namespace dropless::cli {

struct Invocation {
  GlobalOptions options;
  ParsedArgs args;  // positional() excludes the command word itself
};

struct Command {
  std::string name;
  std::string synopsis;  // "submit -f FILE [--name NAME] [--priority N]"
  std::string summary;
  std::vector<FlagSpec> flags;  // besides the global ones
  int (*run)(const Invocation&);
  std::string details;  // more for `dropless COMMAND --help`, after the summary
};

// Every command, in the order `dropless --help` lists them.
const std::vector<Command>& AllCommands();

int RunSubmit(const Invocation& inv);
int RunGet(const Invocation& inv);
int RunDescribe(const Invocation& inv);
int RunWatch(const Invocation& inv);
int RunLogs(const Invocation& inv);
int RunMetrics(const Invocation& inv);
int RunCancel(const Invocation& inv);
int RunTop(const Invocation& inv);
int RunVersion(const Invocation& inv);
int RunCompletion(const Invocation& inv);

// Follows job `id` to its end as `watch` shows it; returns 0 SUCCEEDED, 5 FAILED, 6 CANCELLED
// (or the exit code of a failed call). Used by watch and submit --wait.
int FollowJobToEnd(const GlobalOptions& options, Client& client, const std::string& id);
// Parses a --state value: comma-separated job states, any case (running, PENDING, ...).
// InvalidArgument naming the flag and the unknown state.
absl::StatusOr<std::vector<v1::JobState>> ParseJobStates(const std::string& text);

// Prints "error: <message>" and a pointer to --help on stderr; returns kExitUsage.
int UsageError(const std::string& message);
// Prints one object as a JSON line or a YAML document on stdout.
void PrintStructured(const Value& value, OutputFormat format);

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_COMMANDS_COMMANDS_H_
