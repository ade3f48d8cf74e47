#include <iostream>

#include "cli/commands/commands.h"
#include "cli/exit_codes.h"

namespace dropless::cli {

const std::vector<Command>& AllCommands() {
  static const std::vector<Command>* commands = new std::vector<Command>{
      {"submit", "submit -f FILE [--name NAME] [--priority N] [--request-id ID] [--dry-run | --wait]",
       "validate a job spec (YAML) locally, submit it, print the job id",
       {{{"-f", "--filename"}, true, "FILE", "job spec YAML; - reads stdin"},
        {{"--name"}, true, "NAME", "override the spec's name"},
        {{"--priority"}, true, "N",
         "override the spec's priority (higher runs first); above the coordinator's "
         "--max-user-priority only role admin may submit (PERMISSION_DENIED otherwise)"},
        {{"--request-id"}, true, "ID",
         "idempotency key: a submit repeated with the same ID returns the first one's job "
         "(default: a fresh random id, kept across this command's retries)"},
        {{"--dry-run"}, false, "", "let the coordinator validate it; create nothing"},
        {{"--wait"}, false, "", "then follow it like watch; exit code from its end state"}},
       RunSubmit},
      {"get",
       "get jobs [ID] [--state S,...] [-l K=V,...] [--owner NAME] [-w] | get job ID | "
       "get workers [ID]",
       "list jobs or workers, or show one (table; -o json|yaml)",
       {{{"--state"}, true, "S,...", "only jobs in these states (pending, running, ...)"},
        {{"-l", "--selector"}, true, "K=V,...", "only jobs with these labels"},
        {{"--owner"}, true, "NAME", "only jobs this user submitted"},
        {{"--chunk-size"}, true, "N", "jobs per request while listing (default 500)"},
        {{"-w", "--watch"}, false, "", "then print each job that changes, until interrupted"}},
       RunGet},
      {"describe", "describe job ID",
       "spec summary, progress, placement and events of a job", {}, RunDescribe},
      {"watch", "watch ID",
       "follow a job to its end: progress bar on a terminal, lines otherwise, -o json per update",
       {}, RunWatch},
      {"logs", "logs ID [--rank R] [--tail N] [--since DURATION] [-f] [--raw]",
       "print the output of a job's ranks",
       {{{"--rank"}, true, "R", "only this rank"},
        {{"--tail"}, true, "N", "only the last N stored lines"},
        {{"--since"}, true, "DURATION", "only stored lines at most this old, e.g. 10m"},
        {{"-f", "--follow"}, false, "", "keep printing until the job ends"},
        {{"--raw"}, false, "",
         "print the ranks' bytes as they are, escape sequences included, also on a terminal"}},
       RunLogs,
       "The text is what the ranks wrote (user code). On a terminal its control characters but\n"
       "newline and tab (escape sequences, carriage returns) print as '?'; piped or redirected,\n"
       "with --raw, or with -o json|yaml (which escape them), it is kept as written.\n"
       "--timeout bounds the wait for the coordinator's first answer only: a long backlog, a\n"
       "pager that stops reading, or -f following a long job takes as long as it needs.\n"},
      {"metrics", "metrics ID [--rank R] [--limit N]",
       "a job's stored step metrics, oldest first (loss, step time, TFLOP/s, MFU)",
       {{{"--rank"}, true, "R", "only this rank"},
        {{"--limit"}, true, "N", "only the most recent N"}},
       RunMetrics},
      {"top", "top ID [-w]",
       "latest step of each rank: step time, TFLOP/s, MFU, memory, expert load imbalance",
       {{{"-w", "--watch"}, false, "", "redraw every 2 seconds until the job ends"}}, RunTop},
      {"cancel", "cancel ID [--reason TEXT]", "cancel a job",
       {{{"--reason"}, true, "TEXT", "recorded in the job's events"}}, RunCancel},
      {"version", "version [--client]", "versions of the CLI and of the coordinator",
       {{{"--client"}, false, "", "only the CLI's; no call"}}, RunVersion},
      {"completion", "completion bash|zsh", "print a shell completion script",
       {}, RunCompletion},
  };
  return *commands;
}

int UsageError(const std::string& message) {
  std::cerr << "error: " << message << "\nRun 'dropless --help' for usage.\n";
  return kExitUsage;
}

void PrintStructured(const Value& value, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    std::cout << "---\n" << ToYaml(value);
  } else {
    std::cout << ToJson(value) << "\n";
  }
  std::cout.flush();
}

}  // namespace dropless::cli
