#include "worker/daemon/worker_daemon.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <filesystem>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/version.h"
#include "worker/daemon/coordinator_session.h"
#include "worker/daemon/daemon_stop.h"
#include "worker/daemon/gpu_discovery.h"
#include "worker/daemon/outbound_journal.h"
#include "worker/daemon/outbound_queue.h"
#include "worker/daemon/rank_binary.h"
#include "worker/daemon/rank_manager.h"
#include "worker/daemon/worker_metrics.h"

namespace dropless {

int RunWorkerDaemon(const WorkerConfig& config, const HostFacts& host) {
  // Block the stop signals before any thread exists so every thread inherits the mask and the
  // main thread alone receives them through sigwait. Rank processes get a clean mask at exec.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  if (int rc = pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr); rc != 0) {
    LogError(absl::StrCat("pthread_sigmask: ", strerror(rc)));
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);  // a rank closing its pipes must not kill the daemon

  std::string warning;
  absl::StatusOr<SlotPlan> plan =
      PlanSlots(config, host.cpu_count, [] { return DiscoverCudaDevices(); }, &warning);
  if (!warning.empty()) LogWarning(warning);
  if (!plan.ok()) {
    LogError(plan.status().message());
    return 2;
  }

  if (absl::StatusOr<std::string> rank_binary = FindRankBinary(); !rank_binary.ok()) {
    LogWarning(absl::StrCat("every rank will fail: ", rank_binary.status().message()));
  }
  // The ranks start in other directories: hand them absolute paths.
  ChannelSecurity security = config.security;
  for (std::string* path : {&security.tls.ca, &security.tls.cert, &security.tls.key}) {
    if (!path->empty()) *path = std::filesystem::absolute(*path).string();
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(security);
  if (!credentials.ok()) {
    LogError(credentials.status().message());
    return 2;
  }
  if (security.insecure) {
    LogWarning("INSECURE: --insecure given: plaintext to the coordinator, no client certificate; "
               "for development only (docs/security.md)");
  }
  std::error_code ec;
  std::filesystem::create_directories(config.work_dir, ec);
  if (ec) {
    LogError(absl::StrCat("work_dir: cannot create ", config.work_dir, ": ", ec.message()));
    return 2;
  }

  absl::StatusOr<std::unique_ptr<WorkerMetrics>> metrics =
      WorkerMetrics::Create(config.node, config.metrics_address, config.metrics_port);
  if (!metrics.ok()) {
    LogError(metrics.status().message());
    return 2;
  }

  OutboundQueue outbound;
  outbound.SetDropObserver(
      [m = metrics->get()](int64_t count) { m->RecordOutboundDropped(count); });
  // What the previous run of this daemon had not delivered, and its message numbering.
  std::string boot_id = CoordinatorSession::NewBootId();
  {
    OutboundJournal::Recovered recovered;
    absl::StatusOr<std::unique_ptr<OutboundJournal>> journal =
        OutboundJournal::Open(absl::StrCat(config.work_dir, "/outbound.journal"), boot_id,
                              OutboundJournal::HostBootId(), &recovered);
    if (journal.ok()) {
      boot_id = recovered.boot_id;
      if (recovered.discarded_after_host_boot > 0) {
        LogWarning(absl::StrCat(
            "outbound journal: written before this host last booted; a new "
            "boot (the previous run's ranks are gone with the host), its ",
            recovered.discarded_after_host_boot, " unacknowledged message(s) not sent"));
      }
      if (!recovered.pending.empty()) {
        LogInfo(absl::StrCat("outbound journal: ", recovered.pending.size(),
                             " message(s) of the previous run not acknowledged yet; sending them",
                             recovered.corrupt_at >= 0 ? " in a new boot (the journal was corrupt)"
                                                       : absl::StrCat(" (acknowledged through ",
                                                                      recovered.acknowledged, ")"),
                             (*journal)->enabled() ? "" : " from memory (the journal is off)"));
      }
      outbound.Restore(*std::move(journal), std::move(recovered));
    } else if (absl::IsFailedPrecondition(journal.status())) {
      LogError(absl::StrCat("work_dir: ", journal.status().message()));
      return 2;
    } else {
      LogWarning(absl::StrCat(journal.status().message(),
                             "; undelivered messages will not survive a restart"));
    }
  }
  RankManagerOptions rank_options;
  // /proc/self/exe in the child still names this binary (fork precedes exec), even if the file on
  // disk was replaced since the daemon started.
  rank_options.rank_binary = "/proc/self/exe";
  rank_options.coordinator = config.coordinator;
  rank_options.node = config.node;
  rank_options.advertise_address = config.advertise_address;
  rank_options.work_dir = config.work_dir;
  rank_options.slot_kind = plan->slot_kind;
  rank_options.slots = static_cast<int>(plan->devices.size());
  rank_options.slot_uuids = plan->uuids;
  rank_options.kill_grace = absl::Milliseconds(config.kill_grace_ms);
  rank_options.rank_log_max_bytes = config.rank_log_max_bytes;
  rank_options.retained_job_bytes = config.retained_job_bytes;
  rank_options.checkpoint_roots = config.checkpoint_roots;
  rank_options.channel_env = ChannelSecurityEnvironment(security);
  auto ranks = std::make_unique<RankManager>(rank_options, &outbound, metrics->get());

  SessionOptions session_options;
  session_options.coordinator = config.coordinator;
  session_options.credentials = *credentials;
  session_options.boot_id = boot_id;
  dropless::v1::RegisterWorkerRequest& reg = session_options.registration;
  reg.set_node(config.node);
  reg.set_address(config.advertise_address);
  reg.set_metrics_port(config.metrics_port);
  reg.set_slot_kind(plan->slot_kind);
  for (const std::string& d : plan->devices) reg.add_devices(d);
  for (int64_t bytes : plan->memory_bytes) reg.add_device_memory_bytes(bytes);
  reg.set_version(DroplessVersion());
  CoordinatorSession session(session_options, ranks.get(), &outbound, metrics->get());

  LogInfo(absl::StrCat("node ", config.node, ": ", plan->devices.size(), " ", plan->slot_kind,
                         " slot(s) [", absl::StrJoin(plan->devices, ", "), "], coordinator ",
                         config.coordinator,
                         security.insecure ? " (PLAINTEXT)" : " (mutual TLS)",
                         ", advertised as ", config.advertise_address,
                         config.metrics_port != 0
                             ? absl::StrCat(", /metrics on ", config.metrics_address, ":",
                                            config.metrics_port)
                             : std::string(", /metrics disabled"),
                         ", work dir ", config.work_dir));
  // A registration the coordinator refuses as invalid ends the daemon (exit 1): retrying cannot
  // help, and an orchestrator shows the crash where an endless retry would look healthy.
  absl::Status session_end;
  std::thread session_thread([&session, &session_end] {
    session_end = session.Run();
    if (!session_end.ok()) kill(getpid(), SIGTERM);
  });

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  LogInfo(absl::StrCat("got ", strsignal(sig),
                       ": stopping ranks (a second SIGTERM or SIGINT stops them at once)"));
  const std::string why = absl::StrCat("the worker daemon got ", strsignal(sig));
  DaemonStop stop(ranks.get(), why, absl::Milliseconds(config.kill_grace_ms));
  std::thread second_signal([&stop, &stop_signals] { stop.WatchForSecondSignal(stop_signals); });
  DaemonStop::SessionHooks hooks;
  hooks.say_goodbye = [&session, &why](absl::Duration timeout) {
    (void)session.SayGoodbye(why, timeout);
  };
  hooks.flushed = [&session] { return session.Flushed(); };
  stop.Run(hooks);
  session.Shutdown();
  session_thread.join();
  stop.Finish();
  second_signal.join();
  ranks.reset();  // nothing left to wait for: Run waited for every rank or gave up on it
  if (!session_end.ok()) {
    LogError(absl::StrCat("stopped: ", session_end.message()));
    return 1;
  }
  LogInfo(stop.escalated() ? "stopped at once on a second signal" : "stopped");
  return 0;
}

}  // namespace dropless
