// dropless: the command-line client of a dropless coordinator (kubectl style).
//
//   dropless submit -f FILE [--name NAME] [--priority N] [--dry-run | --wait]
//   dropless get jobs [ID] [--state S,...] [-w] | get job ID | get workers [ID]
//   dropless describe job ID
//   dropless watch ID                                       exits 0 / 5 / 6 by the job's end state
//   dropless logs ID [--rank R] [--tail N] [--since DURATION] [-f]
//   dropless metrics ID | top ID [-w] | cancel ID [--reason TEXT] | version | completion bash|zsh
//
// Global flags: --coordinator ADDR (else $DROPLESS_COORDINATOR, else localhost:7070),
// --timeout DURATION (10s), -o json|yaml. Exit codes are in cli/exit_codes.h and `--help`;
// the JSON/YAML schema is in cli/README.md.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"

namespace dropless::cli {
namespace {

constexpr char kExitCodeHelp[] =
    "Exit codes:\n"
    "  0  success (watch, submit --wait: the job SUCCEEDED)\n"
    "  1  the coordinator refused or failed the request (its message is shown), or the spec is "
    "invalid\n"
    "  2  usage error (bad command line)\n"
    "  3  no such job or worker\n"
    "  4  the coordinator cannot be reached\n"
    "  5  watch, submit --wait: the job FAILED\n"
    "  6  watch, submit --wait: the job was CANCELLED\n";

std::string MainHelp() {
  std::string out =
      "dropless: submit and follow dropless MoE training jobs on a dropless coordinator.\n\n"
      "Usage: dropless [global flags] COMMAND [args]\n\nCommands:\n";
  for (const Command& c : AllCommands()) {
    out += absl::StrCat("  ", c.synopsis, "\n      ", c.summary, "\n");
  }
  out += "\nGlobal flags:\n" + FlagHelp(GlobalFlagSpecs());
  out += absl::StrCat("\n", kExitCodeHelp,
                      "\nRun 'dropless COMMAND --help' for the flags of one command.\n");
  return out;
}

std::string CommandHelp(const Command& c) {
  std::string out = absl::StrCat("Usage: dropless ", c.synopsis, "\n\n", c.summary, "\n");
  if (!c.details.empty()) out += "\n" + c.details;
  if (!c.flags.empty()) out += "\nFlags:\n" + FlagHelp(c.flags);
  out += "\nGlobal flags:\n" + FlagHelp(GlobalFlagSpecs());
  out += absl::StrCat("\n", kExitCodeHelp);
  return out;
}

// The command word: the first argument that is not a global flag or a global flag's value.
int FindCommand(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.empty() || a[0] != '-' || a == "-") return static_cast<int>(i);
    if (a == "--") return i + 1 < args.size() ? static_cast<int>(i + 1) : -1;
    if (a.find('=') != std::string::npos) continue;
    for (const FlagSpec& spec : GlobalFlagSpecs()) {
      for (const std::string& name : spec.names) {
        if (name == a && spec.takes_value) ++i;  // skip its value
      }
    }
  }
  return -1;
}

int Main(const std::vector<std::string>& args) {
  const int at = FindCommand(args);
  if (at < 0) {
    absl::StatusOr<ParsedArgs> globals = ParsedArgs::Parse(args, GlobalFlagSpecs());
    if (!globals.ok()) return UsageError(std::string(globals.status().message()));
    if (globals->Has("help")) {
      std::cout << MainHelp();
      return kExitOk;
    }
    std::cerr << MainHelp();
    return kExitUsage;
  }
  std::string name = args[at];
  std::vector<std::string> rest(args.begin(), args.begin() + at);
  rest.insert(rest.end(), args.begin() + at + 1, args.end());
  if (name == "help") {
    if (rest.empty()) {
      std::cout << MainHelp();
      return kExitOk;
    }
    name = rest[0];
    rest = {"--help"};
  }
  const Command* command = nullptr;
  for (const Command& c : AllCommands()) {
    if (c.name == name) command = &c;
  }
  if (command == nullptr) return UsageError(absl::StrCat("unknown command '", name, "'"));

  std::vector<FlagSpec> specs = GlobalFlagSpecs();
  specs.insert(specs.end(), command->flags.begin(), command->flags.end());
  absl::StatusOr<ParsedArgs> parsed = ParsedArgs::Parse(rest, specs);
  if (!parsed.ok()) return UsageError(absl::StrCat(name, ": ", parsed.status().message()));
  // Help needs no other setting to be right; nor does any command before it makes a client
  // (Client::Connect reads the CA and token files).
  if (parsed->Has("help")) {
    std::cout << CommandHelp(*command);
    return kExitOk;
  }
  absl::StatusOr<GlobalOptions> options = ReadGlobalOptions(*parsed);
  if (!options.ok()) return UsageError(std::string(options.status().message()));
  return command->run(Invocation{*options, *std::move(parsed)});
}

}  // namespace
}  // namespace dropless::cli

int main(int argc, char** argv) {
  return dropless::cli::Main(std::vector<std::string>(argv + 1, argv + argc));
}
