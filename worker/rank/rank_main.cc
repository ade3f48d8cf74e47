// dropless-worker-rank: the rank process image. The daemon starts ranks as
// `dropless-worker rank ...` (docs/architecture.md); that subcommand execs this binary, installed
// next to dropless-worker, with the same arguments and file descriptors.
//
// It is a separate image because the engine links OpenBLAS, whose 60 KiB of static TLS is carved
// out of every thread stack of a process that loads it at startup; civetweb's 100 KiB worker
// threads (the daemon's /metrics) then overflow. The daemon image links no engine, transport or
// BLAS library.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "worker/rank/rank_options.h"
#include "worker/rank/rank_process.h"

ABSL_FLAG(std::string, coordinator, "", "coordinator gRPC address host:port (rendezvous)");
ABSL_FLAG(std::string, job, "", "job id");
ABSL_FLAG(int, attempt, 0, "attempt number (>= 1)");
ABSL_FLAG(int, rank, -1, "rank in the job attempt");
ABSL_FLAG(int, world_size, 0, "ranks in the job attempt");
ABSL_FLAG(int, slot, -1, "GPU index or CPU slot on this node");
ABSL_FLAG(std::string, spec, "", "job spec YAML file");
ABSL_FLAG(std::string, host, "", "address this rank listens on for its peers");
ABSL_FLAG(std::string, node, "", "node name");
ABSL_FLAG(int, report_fd, -1, "fd of the report pipe to the daemon (-1: none)");

namespace {

// absl flags are C identifiers; accept the documented dashed spellings (--world-size) too.
std::string NormalizeFlag(const std::string& arg) {
  if (arg.size() < 3 || arg[0] != '-' || arg[1] != '-') return arg;
  size_t end = arg.find('=');
  if (end == std::string::npos) end = arg.size();
  std::string out = arg;
  for (size_t i = 2; i < end; ++i) {
    if (out[i] == '-') out[i] = '_';
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) args.push_back(i == 0 ? argv[0] : NormalizeFlag(argv[i]));
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  absl::SetProgramUsageMessage(
      "dropless rank process (started by dropless-worker).\n"
      "  dropless-worker rank --coordinator ADDR --job ID --attempt N --rank R --world-size W\n"
      "                       --slot S --spec FILE --host ADDR --node NAME --report-fd 3");
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());
  if (positional.size() > 1) {
    std::fprintf(stderr, "error: unexpected argument '%s'\n", positional[1]);
    return 2;
  }
  dropless::RankOptions o;
  o.coordinator = absl::GetFlag(FLAGS_coordinator);
  o.job_id = absl::GetFlag(FLAGS_job);
  o.attempt = absl::GetFlag(FLAGS_attempt);
  o.rank = absl::GetFlag(FLAGS_rank);
  o.world_size = absl::GetFlag(FLAGS_world_size);
  o.slot = absl::GetFlag(FLAGS_slot);
  o.spec_path = absl::GetFlag(FLAGS_spec);
  o.host = absl::GetFlag(FLAGS_host);
  o.node = absl::GetFlag(FLAGS_node);
  o.report_fd = absl::GetFlag(FLAGS_report_fd);
  return dropless::RunRankProcess(o);
}
