// The worker daemon against the real coordinator: registration, /metrics, reconnects, flags.
#include <signal.h>

#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/worker/worker_cluster.h"

namespace dropless::testing {
namespace {

namespace v1 = dropless::v1;

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

// The coordinator marks a worker's heartbeat at RegisterWorker, a moment before the worker opens
// its session and counts the reconnect: the metrics are polled until the line shows up.
std::string MetricsOnceTheyShow(int port, const std::string& needle) {
  std::string metrics;
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  do {
    metrics = HttpGet(port, "/metrics");
    if (Has(metrics, needle)) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return metrics;
}

TEST(WorkerDaemonTest, RegistersReadyAndServesMetrics) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartWorker("node-a").ok()) << cluster.Diagnostics();
  std::optional<v1::Worker> w = cluster.WaitForWorker(
      "node-a", [](const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; },
      absl::Seconds(30));
  ASSERT_TRUE(w.has_value()) << cluster.Diagnostics();
  EXPECT_FALSE(w->id().empty());
  EXPECT_EQ(w->slot_kind(), "cpu");
  EXPECT_EQ(w->slots(), 1);
  EXPECT_EQ(w->slots_busy(), 0);
  EXPECT_EQ(w->metrics_port(), cluster.metrics_port("node-a"));
  ASSERT_EQ(w->devices_size(), 1);
  EXPECT_EQ(w->devices(0), "cpu");

  const std::string metrics = HttpGet(cluster.metrics_port("node-a"), "/metrics");
  EXPECT_TRUE(Has(metrics, "dropless_worker_up{node=\"node-a\"} 1")) << metrics;
  EXPECT_TRUE(Has(metrics, "dropless_worker_slots{node=\"node-a\",state=\"free\"} 1")) << metrics;
  EXPECT_TRUE(Has(metrics, "dropless_worker_ranks_running{node=\"node-a\"} 0")) << metrics;

  // Heartbeats keep it READY well past the lease timeout (5 s).
  absl::SleepFor(absl::Seconds(6));
  w = cluster.WaitForWorker("node-a", [](const v1::Worker&) { return true; }, absl::Seconds(5));
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->state(), v1::WORKER_STATE_READY) << cluster.Diagnostics();

  // SIGTERM: a clean exit.
  ASSERT_TRUE(cluster.worker("node-a")->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = cluster.worker("node-a")->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << cluster.Diagnostics();
}

TEST(WorkerDaemonTest, ReconnectsToARestartedCoordinatorWithTheSameId) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartWorker("node-r").ok()) << cluster.Diagnostics();
  auto ready = [](const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; };
  std::optional<v1::Worker> before = cluster.WaitForWorker("node-r", ready, absl::Seconds(30));
  ASSERT_TRUE(before.has_value()) << cluster.Diagnostics();

  cluster.KillCoordinator();
  absl::SleepFor(absl::Seconds(1));
  ASSERT_TRUE(cluster.worker("node-r")->Running()) << "the worker must survive its coordinator";
  ASSERT_TRUE(cluster.StartCoordinator().ok()) << cluster.Diagnostics();

  // A fresh heartbeat proves the new session (the old process' data is in the same db).
  const int64_t restart_ms = absl::ToUnixMillis(absl::Now());
  std::optional<v1::Worker> after = cluster.WaitForWorker(
      "node-r",
      [&](const v1::Worker& w) { return ready(w) && w.last_heartbeat_ms() > restart_ms; },
      absl::Seconds(30));
  ASSERT_TRUE(after.has_value()) << cluster.Diagnostics();
  EXPECT_EQ(after->id(), before->id());

  const std::string reconnected = "dropless_worker_session_reconnects_total{node=\"node-r\"} 1";
  const std::string metrics = MetricsOnceTheyShow(cluster.metrics_port("node-r"), reconnected);
  EXPECT_TRUE(Has(metrics, reconnected))
      << metrics;
}

TEST(WorkerDaemonTest, ASilentCoordinatorBreaksTheSessionThroughKeepalive) {
  // A frozen coordinator is a silent partition: its kernel still takes the worker's heartbeats
  // into the socket buffer, nobody answers. Only HTTP/2 keepalive notices; without it the old
  // session would simply resume after SIGCONT and the worker would never reconnect.
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartWorker("node-k").ok()) << cluster.Diagnostics();
  auto ready = [](const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; };
  std::optional<v1::Worker> before = cluster.WaitForWorker("node-k", ready, absl::Seconds(30));
  ASSERT_TRUE(before.has_value()) << cluster.Diagnostics();

  ASSERT_TRUE(cluster.coordinator()->Signal(SIGSTOP).ok());
  // Keepalive: a ping every 10 s, 5 s to answer, so a break within 15 s of the stall; 30 s
  // leaves a loaded CI machine's timers room (20 s failed there once: no reconnect yet).
  absl::SleepFor(absl::Seconds(30));
  ASSERT_TRUE(cluster.coordinator()->Signal(SIGCONT).ok());
  ASSERT_TRUE(cluster.worker("node-k")->Running());

  const int64_t resumed_ms = absl::ToUnixMillis(absl::Now());
  std::optional<v1::Worker> after = cluster.WaitForWorker(
      "node-k", [&](const v1::Worker& w) { return ready(w) && w.last_heartbeat_ms() > resumed_ms; },
      absl::Seconds(30));
  ASSERT_TRUE(after.has_value()) << cluster.Diagnostics();
  EXPECT_EQ(after->id(), before->id());
  const std::string reconnected = "dropless_worker_session_reconnects_total{node=\"node-k\"} 1";
  const std::string metrics = MetricsOnceTheyShow(cluster.metrics_port("node-k"), reconnected);
  EXPECT_TRUE(Has(metrics, reconnected))
      << metrics << cluster.Diagnostics();
}

TEST(WorkerDaemonTest, BadFlagsAreRejectedNamingTheField) {
  // -1 is a value like any other (it once meant "not given"); 5000 slots the coordinator refuses.
  for (const char* slots : {"--cpu-slots=0", "--cpu-slots=-1", "--cpu-slots=5000"}) {
    CommandResult r =
        RunCommand({BinaryPath("dropless-worker"), slots, "--metrics-port=0"}, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 2) << slots << r.out << r.err;
    EXPECT_TRUE(Has(r.err, "cpu_slots")) << slots << r.err;
  }
  CommandResult r = RunCommand({BinaryPath("dropless-worker"), "--insecure",
                                "--coordinator=localhost:70000", "--metrics-port=0"},
                               absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "coordinator: ")) << r.err;

  r = RunCommand({BinaryPath("dropless-worker"), "--gpus=many"}, absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "gpus")) << r.err;

  r = RunCommand({BinaryPath("dropless-worker"), "--config=/nonexistent/worker.yaml"},
                 absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "/nonexistent/worker.yaml")) << r.err;
}

// Two daemons configured with one node name: the second is refused while the first holds the
// node (it keeps retrying, logging why), the first keeps its session, and the second takes the
// node over once the first stops.
TEST(WorkerDaemonTest, ASecondDaemonOfTheSameNodeWaitsForTheFirst) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  ASSERT_TRUE(cluster.StartWorker("node-d").ok()) << cluster.Diagnostics();
  auto ready = [](const v1::Worker& w) { return w.state() == v1::WORKER_STATE_READY; };
  ASSERT_TRUE(cluster.WaitForWorker("node-d", ready, absl::Seconds(30)).has_value())
      << cluster.Diagnostics();
  absl::StatusOr<std::unique_ptr<Process>> second = Process::Start({
      BinaryPath("dropless-worker"),
      "--insecure",
      absl::StrCat("--coordinator=", cluster.coordinator_address()),
      "--node=node-d",
      "--cpu-slots=1",
      "--metrics-port=0",
      absl::StrCat("--work-dir=", cluster.dir(), "/second"),
  });
  ASSERT_TRUE(second.ok()) << second.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!Has((*second)->Output(), "held by another running worker daemon") &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(Has((*second)->Output(), "node \"node-d\" is held by another running worker daemon"))
      << (*second)->Output();
  absl::SleepFor(absl::Seconds(2));
  EXPECT_TRUE((*second)->Running());
  // The first never lost its session: no reconnect counted on it.
  const std::string metrics = HttpGet(cluster.metrics_port("node-d"), "/metrics");
  EXPECT_TRUE(Has(metrics, "dropless_worker_session_reconnects_total{node=\"node-d\"} 0"))
      << metrics;
  EXPECT_TRUE(cluster.WaitForWorker("node-d", ready, absl::Seconds(5)).has_value());

  ASSERT_TRUE(cluster.worker("node-d")->Signal(SIGTERM).ok());
  ASSERT_TRUE(cluster.worker("node-d")->Wait(absl::Seconds(15)).ok());
  const absl::Time takeover = absl::Now() + absl::Seconds(30);
  while (!Has((*second)->Output(), "session open") && absl::Now() < takeover) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_TRUE(Has((*second)->Output(), "session open")) << (*second)->Output();
  EXPECT_TRUE(cluster.WaitForWorker("node-d", ready, absl::Seconds(30)).has_value())
      << cluster.Diagnostics();
  ASSERT_TRUE((*second)->Signal(SIGTERM).ok());
  absl::StatusOr<int> code = (*second)->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0) << (*second)->Output();
}

// A registration the coordinator refuses as invalid (here a node name longer than it accepts)
// cannot succeed on a retry: the daemon says why and exits 1 instead of retrying forever.
TEST(WorkerDaemonTest, ARegistrationRefusedAsInvalidStopsTheDaemon) {
  WorkerCluster cluster;
  ASSERT_TRUE(cluster.StartCoordinator().ok());
  absl::StatusOr<std::unique_ptr<Process>> worker = Process::Start({
      BinaryPath("dropless-worker"),
      "--insecure",
      absl::StrCat("--coordinator=", cluster.coordinator_address()),
      absl::StrCat("--node=", std::string(300, 'n')),
      "--cpu-slots=1",
      "--metrics-port=0",
      absl::StrCat("--work-dir=", cluster.dir(), "/long"),
  });
  ASSERT_TRUE(worker.ok()) << worker.status();
  absl::StatusOr<int> code = (*worker)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status() << (*worker)->Output();
  EXPECT_EQ(*code, 1) << (*worker)->Output();
  EXPECT_TRUE(Has((*worker)->Output(), "the coordinator refuses this worker"))
      << (*worker)->Output();
  EXPECT_TRUE(Has((*worker)->Output(), "node: longer than")) << (*worker)->Output();
}

TEST(WorkerDaemonTest, RankSubcommandReachesTheRankImage) {
  // Missing flags are reported by the rank process (exit 2 naming the flag), proving that
  // `dropless-worker rank` found and exec'd dropless-worker-rank.
  CommandResult r = RunCommand({BinaryPath("dropless-worker"), "rank", "--coordinator",
                                "127.0.0.1:1", "--job", "j", "--attempt", "1", "--rank", "2",
                                "--world-size", "2"},
                               absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "--rank")) << r.err;
}

// A cuda job's rank loads libdropless_engine_cuda.so only then; a worker without it (a CPU-only
// build, or the library not installed next to the executables) fails the rank with one clear line.
TEST(WorkerDaemonTest, RankOfACudaJobFailsClearlyWithoutTheCudaEngine) {
  std::string spec = TinyCpuSpec();
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"backend: cpu", "backend: cuda"},
                                 {"ep: 2", "ep: 1"}}) {
    ASSERT_NE(spec.find(from), std::string::npos) << from;
    spec.replace(spec.find(from), from.size(), to);
  }
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/spec.yaml";
  {
    std::ofstream(path) << spec;
  }
  CommandResult r = RunCommand({"env", "DROPLESS_CUDA_ENGINE_LIBRARY=" + dir + "/missing.so",
                                BinaryPath("dropless-worker"), "rank", "--coordinator",
                                "127.0.0.1:1", "--job", "j", "--attempt", "1", "--rank", "0",
                                "--world-size", "1", "--slot", "0", "--spec", path, "--host",
                                "127.0.0.1", "--node", "n"},
                               absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_TRUE(Has(r.err, "the cuda engine module could not be loaded")) << r.err;
  EXPECT_TRUE(Has(r.err, "missing.so")) << r.err;
}

// The daemon links no CUDA, BLAS, NCCL or Gloo library (docs/architecture.md): their static TLS
// would crash its /metrics threads, and a node without the CUDA driver must still run it. The
// rank image links them instead.
TEST(WorkerDaemonTest, DaemonLinksNoCudaBlasOrCollectiveLibrary) {
  CommandResult r = RunCommand({"ldd", BinaryPath("dropless-worker")}, absl::Seconds(30));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ASSERT_TRUE(Has(r.out, "libc.so")) << r.out;  // ldd really listed the libraries
  for (const char* forbidden : {"libcuda.", "libcudart", "libcublas", "libnccl", "libopenblas",
                                "libblas", "libgloo"}) {
    EXPECT_FALSE(Has(r.out, forbidden)) << "dropless-worker links " << forbidden << ":\n" << r.out;
  }
  CommandResult rank = RunCommand({"ldd", BinaryPath("dropless-worker-rank")}, absl::Seconds(30));
  ASSERT_EQ(rank.exit_code, 0) << rank.out << rank.err;
  EXPECT_TRUE(Has(rank.out, "openblas") || Has(rank.out, "libblas")) << rank.out;
}

}  // namespace
}  // namespace dropless::testing
