#include "worker/rank/rank_process.h"

#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/engine_config.h"
#include "common/grpc_security.h"
#include "common/job_error.h"
#include "common/job_spec.h"
#include "common/status_context.h"
#include "common/status_macros.h"
#include "common/step_phase.h"
#include "worker/engine/checkpoint/checkpoint_claim.h"
#include "worker/engine/engine.h"
#include "worker/engine/engine_registry.h"
#include "worker/rank/phase_reporter.h"
#include "worker/rank/report_pipe.h"
#include "worker/rank/step_report.h"
#include "worker/transport/transport_factory.h"
#include "worker/rank/checkpoint_roots.h"

namespace dropless {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--spec: cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class RankRun {
 public:
  explicit RankRun(const RankOptions& options) : options_(options) {}

  absl::Status Run();

 private:
  // Log lines carry the rank already (LogLine.rank), so no prefix here.
  void Say(const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }

  const RankOptions& options_;
};

absl::Status RankRun::Run() {
  absl::StatusOr<std::string> yaml = ReadFile(options_.spec_path);
  if (!yaml.ok()) return yaml.status();
  absl::StatusOr<JobSpec> spec = ParseJobSpec(*yaml);
  if (!spec.ok()) {
    return MarkJobError(absl::InvalidArgumentError(
        absl::StrCat("job spec ", options_.spec_path, ": ", spec.status().message())));
  }
  if (spec->world_size() != options_.world_size) {
    return MarkJobError(absl::InvalidArgumentError(absl::StrCat(
        "--world-size ", options_.world_size,
        " does not match the spec's parallel.ep * parallel.dp = ", spec->world_size())));
  }
  const std::string backend(ToString(spec->resources.backend));
  const std::string& checkpoint_dir = spec->checkpoint.dir;
  // The daemon's --checkpoint-roots: a spec cannot make the rank write outside them.
  if (const char* roots = std::getenv(kCheckpointRootsEnv); roots != nullptr && !checkpoint_dir.empty()) {
    absl::StatusOr<std::vector<std::string>> parsed = ParseCheckpointRoots(roots, kCheckpointRootsEnv);
    if (!parsed.ok()) return parsed.status();
    if (absl::Status st = CheckCheckpointDirInRoots(checkpoint_dir, *parsed); !st.ok()) {
      return MarkJobError(st);
    }
  }
  engine::CheckpointClaim claim{options_.job_id, options_.attempt, options_.rank};
  if (const char* owner = std::getenv("DROPLESS_JOB_OWNER"); owner != nullptr) claim.user = owner;
  if (absl::Status st = PrepareEngine(spec->resources.backend, EngineConfigFromSpec(*spec)); !st.ok()) {
    return WithContext(absl::StrCat("the ", backend, " engine"), st);
  }
  Say(absl::StrFormat("job %s attempt %d: joining %d rank(s) (ep=%d, dp=%d) on %s, slot %d",
                      options_.job_id, options_.attempt, options_.world_size, spec->parallel.ep,
                      spec->parallel.dp, options_.host, options_.slot));
  RendezvousClientOptions rendezvous;
  if (const char* secret = std::getenv("DROPLESS_RENDEZVOUS_SECRET"); secret != nullptr) {
    rendezvous.secret = secret;  // from the daemon: the environment, not the visible command line
  }
  // The daemon's way to the coordinator (its node certificate, or plaintext), also from there.
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(ChannelSecurityFromEnvironment());
  if (!credentials.ok()) return credentials.status();
  rendezvous.credentials = *credentials;
  std::unique_ptr<KeyValueStore> store =
      NewRendezvousKvStore(options_.coordinator, options_.job_id, options_.attempt, rendezvous);
  GlooOptions gloo;
  gloo.layout.rank = options_.rank;
  gloo.layout.world_size = options_.world_size;
  gloo.layout.ep = static_cast<int>(spec->parallel.ep);
  gloo.layout.dp = static_cast<int>(spec->parallel.dp);
  gloo.host = options_.host;
  absl::StatusOr<RankGroups> groups = CreateGlooGroups(gloo, store.get());
  if (!groups.ok()) {
    return WithContext("joining the rank groups", groups.status());
  }

  // This attempt writes the rank's checkpoints from now on (after the rendezvous, which only the
  // coordinator's current attempt passes): a rank of an earlier attempt still running (its
  // worker cut off from the coordinator) stops at its next save.
  if (!checkpoint_dir.empty()) {
    DROPLESS_RETURN_IF_ERROR(
        WithContext("checkpoint", engine::ClaimCheckpoints(checkpoint_dir, claim)));
  }
  groups->store = store.get();
  EngineContext context;
  context.config = EngineConfigFromSpec(*spec);
  context.rank = options_.rank;
  context.world_size = options_.world_size;
  context.groups = &*groups;
  absl::StatusOr<std::unique_ptr<Engine>> engine = CreateEngine(spec->resources.backend, context);
  if (!engine.ok()) {
    return WithContext(absl::StrCat("building the ", backend, " engine"), engine.status());
  }

  if (absl::Status st = WriteReportLine(options_.report_fd, kReadyLine); !st.ok()) return st;
  // Phase lines for the hang watchdog (phase_reporter.h), until Run returns.
  if (absl::Status st = PhaseReporter::Start(options_.report_fd, options_.rank, options_.attempt);
      !st.ok()) {
    return st;
  }
  struct StopPhases {
    ~StopPhases() { PhaseReporter::Stop(); }
  } stop_phases;
  const int64_t steps = spec->steps;
  const int64_t progress_every = std::max<int64_t>(1, steps / 10);
  const double peak = (*engine)->PeakFlops();
  Say(absl::StrFormat("ready: %s engine, %d steps of %d tokens", backend, steps,
                      spec->tokens_per_rank));

  const absl::Time start = absl::Now();
  // An engine restored from a checkpoint (a later attempt of the job) continues where it was.
  const int64_t first_step = (*engine)->StepsDone() + 1;
  if (first_step > steps + 1) {
    // Another run's checkpoint (a longer job in the same directory): nothing of this one to run.
    return MarkJobError(absl::FailedPreconditionError(absl::StrFormat(
        "checkpoint.dir %s holds step %d, beyond this job's steps (%d); choose another "
        "checkpoint.dir or raise steps",
        checkpoint_dir, first_step - 1, steps)));
  }
  if (first_step > 1) {
    Say(absl::StrFormat("resuming from the checkpoint of step %d", first_step - 1));
  }
  for (int64_t step = first_step; step <= steps; ++step) {
    PhaseReporter::SetStep(step);
    absl::StatusOr<StepStats> stats = (*engine)->Step();
    if (!stats.ok()) {
      return WithContext(absl::StrCat("step ", step), stats.status());
    }
    StepStats& r = *stats;
    r.step = step;
    r.steps = steps;
    r.peak_flops = peak;
    if (absl::Status st = WriteReportLine(options_.report_fd, FormatStepReport(r)); !st.ok()) {
      return st;
    }
    if (step == first_step || step % progress_every == 0 || step == steps) {
      Say(absl::StrFormat("step %d/%d loss=%.6g aux_loss=%.4g %.1f ms/step %.3g GFLOP/s %.0f tokens/s",
                          step, steps, r.loss, r.aux_loss, r.step_seconds * 1e3,
                          r.FlopsPerSecond() / 1e9, r.TokensPerSecond()));
    }
    if (spec->checkpoint.DueAfter(step, steps)) {
      EnterStepPhase(StepPhase::kCheckpoint);
      if (absl::Status st = engine::CheckCheckpointClaim(checkpoint_dir, claim); !st.ok()) {
        return WithContext(absl::StrCat("checkpoint at step ", step), st);
      }
      if (absl::Status st = (*engine)->SaveCheckpoint(checkpoint_dir); !st.ok()) {
        return WithContext(absl::StrCat("checkpoint at step ", step), st);
      }
    }
  }
  Say(absl::StrFormat("done: %d steps in %.2f s", steps - first_step + 1,
                      absl::ToDoubleSeconds(absl::Now() - start)));
  return absl::OkStatus();
}

}  // namespace

int RunRankProcess(const RankOptions& options) {
  // stdout is a pipe to the daemon: line buffering makes progress show up as it happens.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // A write to a peer or a pipe that closed is an error with a message (Gloo's "connection
  // reset", "is the worker daemon gone?"), not a death by SIGPIPE (the daemon resets every
  // signal to its default in the child).
  std::signal(SIGPIPE, SIG_IGN);
  // Gloo holds a socket per peer and group: as many descriptors as the hard limit allows.
  if (rlimit files; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);  // best effort: the lower limit may still do
  }
  if (absl::Status st = ValidateRankOptions(options); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  RankRun run(options);
  if (absl::Status st = run.Run(); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(st.message()).c_str());
    // A problem of the job itself (the coordinator ends the job rather than retrying it), or of
    // the job on this GPU (placed on larger ones next).
    return RankExitCodeFor(st);
  }
  return 0;
}

}  // namespace dropless
