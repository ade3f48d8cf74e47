#include "worker/daemon/worker_config.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

HostFacts Host() {
  HostFacts h;
  h.hostname = "gpu-node-7";
  h.cpu_count = 12;
  h.temp_dir = "/var/tmp";
  return h;
}

// Flags of a development worker: plaintext, so no certificate files are needed.
WorkerSettings PlaintextFlags() {
  WorkerSettings flags;
  flags.insecure = true;
  return flags;
}

void ExpectInvalid(const absl::Status& status, const std::string& field) {
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find(field), std::string::npos)
      << "'" << status.message() << "' does not name " << field;
}

TEST(WorkerConfigTest, DefaultsFollowTheHost) {
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig({}, PlaintextFlags(), Host());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->coordinator, "localhost:7070");
  EXPECT_EQ(c->node, "gpu-node-7");
  EXPECT_EQ(c->advertise_address, "127.0.0.1");  // coordinator on loopback
  EXPECT_EQ(c->metrics_port, 9100);
  EXPECT_EQ(c->metrics_address, "0.0.0.0");
  EXPECT_EQ(c->gpus, "auto");
  EXPECT_FALSE(c->cpu_slots_given);
  EXPECT_EQ(c->work_dir, "/var/tmp/dropless-worker-gpu-node-7");
  EXPECT_EQ(c->kill_grace_ms, 5000);
}

TEST(WorkerConfigTest, AdvertisesHostnameForARemoteCoordinator) {
  WorkerSettings flags = PlaintextFlags();
  flags.coordinator = "coordinator.cluster:7070";
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig({}, flags, Host());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->advertise_address, "gpu-node-7");
}

TEST(WorkerConfigTest, LoopbackDetection) {
  EXPECT_TRUE(IsLoopbackAddress("localhost:7070"));
  EXPECT_TRUE(IsLoopbackAddress("127.0.0.1:1"));
  EXPECT_TRUE(IsLoopbackAddress("127.3.2.1:1"));
  EXPECT_TRUE(IsLoopbackAddress("[::1]:7070"));
  EXPECT_TRUE(IsLoopbackAddress("LOCALHOST:7070"));
  EXPECT_FALSE(IsLoopbackAddress("10.0.0.1:7070"));
  EXPECT_FALSE(IsLoopbackAddress("[fe80::1]:7070"));
  EXPECT_FALSE(IsLoopbackAddress("coord:7070"));
}

TEST(WorkerConfigTest, YamlIsReadAndFlagsWin) {
  absl::StatusOr<WorkerSettings> file = ParseWorkerSettingsYaml(R"(
coordinator: coord.example:7000
node: from-file
advertise_address: 10.1.2.3
metrics_port: 9200
metrics_address: 127.0.0.1
cpu_slots: 3
gpus: none
work_dir: /srv/dropless
kill_grace_ms: 250
)");
  ASSERT_TRUE(file.ok()) << file.status();
  WorkerSettings flags = PlaintextFlags();
  flags.node = "from-flag";
  flags.metrics_port = 0;
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig(*file, flags, Host());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->coordinator, "coord.example:7000");
  EXPECT_EQ(c->node, "from-flag");
  EXPECT_EQ(c->advertise_address, "10.1.2.3");
  EXPECT_EQ(c->metrics_port, 0);
  EXPECT_EQ(c->metrics_address, "127.0.0.1");
  EXPECT_EQ(c->cpu_slots, 3);
  EXPECT_TRUE(c->cpu_slots_given);
  EXPECT_EQ(c->gpus, "none");
  EXPECT_EQ(c->work_dir, "/srv/dropless");
  EXPECT_EQ(c->kill_grace_ms, 250);
}

TEST(WorkerConfigTest, ShippedExampleConfigParses) {
  std::ifstream in(std::string(DROPLESS_SOURCE_DIR) + "/configs/worker.yaml");
  ASSERT_TRUE(in) << "configs/worker.yaml missing";
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<WorkerSettings> s = ParseWorkerSettingsYaml(text);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(ResolveWorkerConfig(*s, {}, Host()).ok());
}

TEST(WorkerConfigTest, TlsFilesAreRequiredUnlessInsecure) {
  ExpectInvalid(ResolveWorkerConfig({}, {}, Host()).status(), "tls_ca");
  absl::StatusOr<WorkerSettings> file = ParseWorkerSettingsYaml(
      "tls_ca: /c/ca.pem\ntls_cert: /c/n.pem\ntls_key: /c/n.key\n");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig(*file, {}, Host());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->security.insecure);
  EXPECT_EQ(c->security.tls.cert, "/c/n.pem");
  WorkerSettings only_key;
  only_key.tls_ca = "/c/ca.pem";
  only_key.tls_key = "/c/n.key";
  ExpectInvalid(ResolveWorkerConfig({}, only_key, Host()).status(), "tls_cert");
  EXPECT_TRUE(ParseWorkerSettingsYaml("insecure: true\n")->insecure.value_or(false));
  ExpectInvalid(ParseWorkerSettingsYaml("insecure: maybe\n").status(), "insecure");
}

TEST(WorkerConfigTest, EmptyYamlIsAllDefaults) {
  absl::StatusOr<WorkerSettings> s = ParseWorkerSettingsYaml("# nothing\n");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->coordinator.has_value());
  EXPECT_FALSE(s->metrics_port.has_value());
}

TEST(WorkerConfigTest, BadYamlNamesTheKey) {
  ExpectInvalid(ParseWorkerSettingsYaml("metrics_prot: 1\n").status(), "metrics_prot");
  ExpectInvalid(ParseWorkerSettingsYaml("metrics_port: abc\n").status(), "metrics_port");
  ExpectInvalid(ParseWorkerSettingsYaml("cpu_slots: [1, 2]\n").status(), "cpu_slots");
  ExpectInvalid(ParseWorkerSettingsYaml("node: {a: 1}\n").status(), "node");
  ExpectInvalid(ParseWorkerSettingsYaml("- a\n- b\n").status(), "mapping");
  ExpectInvalid(ParseWorkerSettingsYaml("a: [\n").status(), "YAML");
}

TEST(WorkerConfigTest, MissingFileIsAnError) {
  absl::StatusOr<WorkerSettings> s = LoadWorkerSettingsFile("/nonexistent/worker.yaml");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("/nonexistent/worker.yaml"), std::string::npos);
}

TEST(WorkerConfigTest, InvalidValuesNameTheField) {
  auto resolve = [](WorkerSettings flags) {
    flags.insecure = true;
    return ResolveWorkerConfig({}, flags, Host()).status();
  };
  WorkerSettings s;
  s.metrics_port = 70000;
  ExpectInvalid(resolve(s), "metrics_port");
  s = {};
  s.cpu_slots = 0;
  ExpectInvalid(resolve(s), "cpu_slots");
  s = {};
  s.cpu_slots = -1;  // not a sentinel for "not given"
  ExpectInvalid(resolve(s), "cpu_slots");
  s = {};
  s.cpu_slots = kMaxWorkerSlots + 1;  // the coordinator would refuse the registration
  ExpectInvalid(resolve(s), "cpu_slots");
  s = {};
  s.cpu_slots = kMaxWorkerSlots;
  EXPECT_TRUE(resolve(s).ok());
  s = {};
  s.gpus = "some";
  ExpectInvalid(resolve(s), "gpus");
  s = {};
  s.gpus = "0";
  ExpectInvalid(resolve(s), "gpus");
  s = {};
  s.gpus = "2";
  s.cpu_slots = 2;
  ExpectInvalid(resolve(s), "cpu_slots");
  s = {};
  s.coordinator = "no-port";
  ExpectInvalid(resolve(s), "coordinator");
  s = {};
  s.coordinator = "localhost:70000";  // would wrap to port 4464
  ExpectInvalid(resolve(s), "coordinator");
  s = {};
  s.node = "bad/name";
  ExpectInvalid(resolve(s), "node");
  s = {};
  s.kill_grace_ms = -1;
  ExpectInvalid(resolve(s), "kill_grace_ms");
}

absl::StatusOr<SlotPlan> Plan(WorkerSettings flags, absl::StatusOr<std::vector<std::string>> gpus,
                              bool* discovered, std::string* warning = nullptr) {
  flags.insecure = true;
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig({}, flags, Host());
  if (!c.ok()) return c.status();
  *discovered = false;
  return PlanSlots(
      *c, 12,
      [&]() -> absl::StatusOr<std::vector<CudaDevice>> {
        *discovered = true;
        if (!gpus.ok()) return gpus.status();
        std::vector<CudaDevice> devices;
        for (size_t i = 0; i < gpus->size(); ++i) {
          devices.push_back({(*gpus)[i], absl::StrCat("GPU-", i), (int64_t{80} + i) << 30});
        }
        return devices;
      },
      warning);
}

TEST(PlanSlotsTest, AutoUsesGpusWhenFound) {
  bool discovered;
  absl::StatusOr<SlotPlan> p =
      Plan({}, std::vector<std::string>{"NVIDIA H200", "NVIDIA H200"}, &discovered);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(discovered);
  EXPECT_EQ(p->slot_kind, "cuda");
  EXPECT_EQ(p->devices, (std::vector<std::string>{"NVIDIA H200", "NVIDIA H200"}));
  EXPECT_EQ(p->uuids, (std::vector<std::string>{"GPU-0", "GPU-1"}));
  EXPECT_EQ(p->memory_bytes, (std::vector<int64_t>{int64_t{80} << 30, int64_t{81} << 30}));
}

TEST(PlanSlotsTest, AutoFallsBackToOneCpuSlotPerCpu) {
  bool discovered;
  absl::StatusOr<SlotPlan> p = Plan({}, std::vector<std::string>{}, &discovered);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slot_kind, "cpu");
  EXPECT_EQ(p->devices, std::vector<std::string>(12, "cpu"));
  EXPECT_EQ(p->uuids, std::vector<std::string>(12, ""));
  EXPECT_TRUE(p->memory_bytes.empty());
}

TEST(PlanSlotsTest, AutoFallsBackToCpuOnDiscoveryErrorWithAWarning) {
  bool discovered;
  std::string warning;
  absl::StatusOr<SlotPlan> p = Plan(
      {}, absl::FailedPreconditionError("cuInit failed with CUresult 999"), &discovered, &warning);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->slot_kind, "cpu");
  EXPECT_NE(warning.find("999"), std::string::npos);
}

TEST(PlanSlotsTest, ExplicitCpuSlotsSkipDiscovery) {
  WorkerSettings s;
  s.cpu_slots = 2;
  bool discovered;
  absl::StatusOr<SlotPlan> p = Plan(s, std::vector<std::string>{"GPU"}, &discovered);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(discovered);
  EXPECT_EQ(p->slot_kind, "cpu");
  EXPECT_EQ(p->devices.size(), 2u);
  s = {};
  s.gpus = "none";
  p = Plan(s, std::vector<std::string>{"GPU"}, &discovered);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(discovered);
  EXPECT_EQ(p->devices.size(), 12u);
}

TEST(PlanSlotsTest, GpuCountTakesTheFirstAndFailsWhenShort) {
  WorkerSettings s;
  s.gpus = "2";
  bool discovered;
  absl::StatusOr<SlotPlan> p = Plan(s, std::vector<std::string>{"a", "b", "c"}, &discovered);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->devices, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(p->uuids, (std::vector<std::string>{"GPU-0", "GPU-1"}));
  EXPECT_EQ(p->memory_bytes.size(), 2u);
  p = Plan(s, std::vector<std::string>{"a"}, &discovered);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(p.status().message().find("1 found"), std::string::npos) << p.status();
  p = Plan(s, absl::FailedPreconditionError("broken"), &discovered);
  EXPECT_FALSE(p.ok());
}

}  // namespace
}  // namespace dropless
