// Exit codes of the dropless CLI. They are part of its interface (scripts branch on them), listed
// in `dropless --help` and cli/README.md; never renumber one.
#ifndef DROPLESS_CLI_EXIT_CODES_H_
#define DROPLESS_CLI_EXIT_CODES_H_

namespace dropless::cli {

enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,         // the server refused or failed the operation (message shown), bad spec
  kExitUsage = 2,         // bad command line
  kExitNotFound = 3,      // no such job or worker
  kExitUnreachable = 4,   // the coordinator cannot be reached (or did not answer in --timeout)
  kExitJobFailed = 5,     // watch, submit --wait: the job ended FAILED
  kExitJobCancelled = 6,  // watch, submit --wait: the job ended CANCELLED
};

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_EXIT_CODES_H_
