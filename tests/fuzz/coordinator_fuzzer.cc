// libFuzzer target: the coordinator's request handlers and the worker session stream, in process:
// the Coordinator that the gRPC services adapt, on a SQLite file under $TMPDIR. Each input is a
// program of user calls (submit with a fuzzed name, priority and request id, get, list, cancel,
// events, step metrics, logs, watch) and worker-protocol calls (register, sessions, Hello, rank
// status, metrics, log lines, and WorkerMessages decoded from raw input bytes). A crash, a
// sanitizer report or a broken promise (an accepted submit whose job cannot be read back, a
// repeated request id that made a second job) is a finding. State carries over between inputs,
// as it does in a long-running coordinator.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/utf8.h"
#include "coordinator/controller/coordinator.h"
#include "coordinator/store/job_store.h"

namespace {

namespace v1 = dropless::v1;
using dropless::coordinator::Coordinator;
using dropless::coordinator::WorkerSession;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

class Program {
 public:
  Program(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool done() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  int32_t Int() { return static_cast<int8_t>(Byte()); }
  // Text as gRPC delivers it: proto3 strings are valid UTF-8 once parsed.
  std::string Bytes(size_t max) {
    size_t n = Byte() % (max + 1);
    std::string out;
    while (n-- > 0 && !done()) out.push_back(static_cast<char>(Byte()));
    return dropless::ToValidUtf8(out);
  }
  std::string RawBytes(size_t max) {
    size_t n = Byte() % (max + 1);
    std::string out;
    while (n-- > 0 && !done()) out.push_back(static_cast<char>(Byte()));
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

std::string Spec(int ranks, int attempts) {
  return absl::StrFormat(R"(name: fuzz
priority: 0
max_attempts: %d
model: {hidden: 64, ffn: 128, experts: %d, topk: 2, shared_experts: 0, layers: 1, router: softmax, renormalize: true, activation: swiglu}
parallel: {ep: %d, dp: 1}
precision: bf16
tokens_per_rank: 64
steps: 5
dispatcher: auto
data: {distribution: uniform, seed: 7}
resources: {backend: cpu}
)",
                         attempts, 4 * ranks, ranks);
}

struct State {
  std::unique_ptr<Coordinator> coordinator;
  std::vector<std::string> jobs;
  std::vector<std::string> workers;
  std::vector<std::shared_ptr<WorkerSession>> sessions;
  std::map<std::string, std::string> job_of_request;  // request id -> job id
};

State* state = nullptr;

// What goes back to clients must serialize: every string valid UTF-8.
void CheckJob(const absl::StatusOr<v1::Job>& job) {
  if (!job.ok()) return;
  Check(dropless::IsValidUtf8(job->name()) && dropless::IsValidUtf8(job->message()) &&
        dropless::IsValidUtf8(job->spec_yaml()));
}
void CheckEvents(const absl::StatusOr<std::vector<v1::Event>>& events) {
  if (!events.ok()) return;
  for (const v1::Event& e : *events) Check(dropless::IsValidUtf8(e.message()));
}

const std::string& Pick(const std::vector<std::string>& known, Program& p,
                        const std::string& fallback) {
  const uint8_t b = p.Byte();
  return known.empty() || b == 0 ? fallback : known[b % known.size()];
}

void Run(Program& p) {
  Coordinator& c = *state->coordinator;
  const std::string fuzz_id = p.Bytes(12);
  const std::string& job = Pick(state->jobs, p, fuzz_id);
  switch (p.Byte() % 14) {
    case 0: {
      v1::SubmitJobRequest request;
      request.set_spec_yaml(Spec(1 + p.Byte() % 2, 1 + p.Byte() % 2));
      if (p.Byte() % 4 == 0) request.set_name(p.Bytes(16));
      if (p.Byte() % 4 == 0) request.set_priority(p.Int());
      if (p.Byte() % 2 == 0) request.set_request_id(absl::StrCat("r", p.Byte() % 8));
      absl::StatusOr<v1::Job> submitted = c.SubmitJob(request);
      if (!submitted.ok()) return;
      Check(c.GetJob(submitted->id()).ok());
      if (!request.request_id().empty()) {
        auto [it, fresh] = state->job_of_request.emplace(request.request_id(), submitted->id());
        Check(fresh || it->second == submitted->id());
      }
      if (state->jobs.size() < 256) state->jobs.push_back(submitted->id());
      return;
    }
    case 1:
      CheckJob(c.GetJob(job));
      return;
    case 2: {
      v1::ListJobsRequest request;
      if (p.Byte() % 2 == 0) request.add_states(static_cast<v1::JobState>(p.Int()));
      // Bounded (a negative one is an error): the store grows over a fuzz run and a full listing
      // reads every job.
      request.set_limit(p.Byte() % 3 == 0 ? -1 : 1 + p.Byte() % 32);
      (void)c.ListJobs(request);
      return;
    }
    case 3:
      CheckJob(c.CancelJob(job, p.Bytes(255) + std::string(p.Byte() % 2 == 0 ? 0 : 1200, 'r')));
      return;
    case 4:
      CheckEvents(c.ListEvents(p.Byte() % 4 == 0 ? "" : job, p.Byte() % 3 == 0 ? -1 : 1 + p.Byte() % 32));
      return;
    case 5: {
      std::optional<int32_t> rank;
      if (p.Byte() % 2 == 0) rank = p.Int();
      (void)c.ListStepMetrics(job, rank, p.Int());
      return;
    }
    case 6: {
      std::optional<int32_t> rank;
      if (p.Byte() % 2 == 0) rank = p.Int();
      absl::StatusOr<dropless::coordinator::LogStream> logs =
          c.OpenLogs(job, rank, p.Byte() % 2 == 0, p.Int());
      if (logs.ok() && logs->live != nullptr) c.EndLogs(job, logs->live);
      return;
    }
    case 7: {
      absl::StatusOr<dropless::coordinator::JobWatch> watch = c.WatchJob(job);
      if (watch.ok() && watch->updates != nullptr) c.EndWatch(job, watch->updates);
      return;
    }
    case 8: {
      v1::RegisterWorkerRequest request;
      request.set_node(p.Byte() % 8 == 0 ? p.Bytes(12) : absl::StrCat("node-", p.Byte() % 4));
      request.set_slot_kind(p.Byte() % 4 == 0 ? p.Bytes(5) : "cpu");
      for (int i = p.Byte() % 5; i > 0; --i) request.add_devices("cpu");
      request.set_metrics_port(p.Int());
      absl::StatusOr<v1::RegisterWorkerResponse> registered = c.RegisterWorker(request);
      if (registered.ok() && state->workers.size() < 16) {
        state->workers.push_back(registered->worker_id());
      }
      return;
    }
    case 9: {
      if (state->sessions.size() >= 16) return;
      auto session = std::make_shared<WorkerSession>("fuzz", nullptr);
      c.AddSession(session);
      state->sessions.push_back(session);
      return;
    }
    case 10: {  // Hello, possibly listing ranks
      if (state->sessions.empty()) return;
      auto& session = state->sessions[p.Byte() % state->sessions.size()];
      v1::WorkerMessage message;
      v1::Hello* hello = message.mutable_hello();
      hello->set_worker_id(Pick(state->workers, p, fuzz_id));
      hello->set_boot_id(absl::StrCat("boot-", p.Byte() % 3));
      for (int i = p.Byte() % 3; i > 0; --i) {
        v1::RankStatus* r = hello->add_ranks();
        r->set_job_id(job);
        r->set_attempt(p.Int());
        r->set_rank(p.Int());
        r->set_state(static_cast<v1::RankState>(p.Byte() % 7));
      }
      if (!c.HandleWorkerMessage(session, message).ok()) c.RemoveSession(session);
      return;
    }
    case 11: {  // a well-formed queued message of the protocol
      if (state->sessions.empty()) return;
      auto& session = state->sessions[p.Byte() % state->sessions.size()];
      v1::WorkerMessage message;
      message.set_seq(p.Byte());
      const uint8_t kind = p.Byte() % 4;
      if (kind == 0) {
        v1::RankStatus* r = message.mutable_rank_status();
        r->set_job_id(job);
        r->set_attempt(p.Int());
        r->set_rank(p.Int());
        r->set_state(static_cast<v1::RankState>(p.Byte() % 7));
        r->set_exit_code(p.Int());
        r->set_message(p.Bytes(64) + std::string(p.Byte() % 2 == 0 ? 0 : 600, 'm') + "\xc3\xa9");
      } else if (kind == 1) {
        v1::StepMetrics* m = message.mutable_metrics();
        m->set_job_id(job);
        m->set_attempt(p.Int());
        m->set_rank(p.Int());
        m->set_step(p.Int());
        m->set_step_seconds(p.Int() / 10.0);
        m->set_loss(p.Int());
      } else if (kind == 2) {
        for (int i = p.Byte() % 4; i > 0; --i) {
          v1::LogLine* line = message.mutable_logs()->add_lines();
          line->set_job_id(job);
          line->set_rank(p.Int());
          line->set_text(p.Bytes(40) + std::string(p.Byte() % 2 == 0 ? 0 : 20000, 'x'));
        }
      } else {
        v1::Heartbeat* beat = message.mutable_heartbeat();
        beat->set_time_ms(int64_t{1} << 40);
        v1::RankStatus* r = beat->add_ranks();
        r->set_job_id(job);
        r->set_attempt(p.Int());
        r->set_rank(p.Int());
        r->set_state(static_cast<v1::RankState>(p.Byte() % 7));
        r->set_phase(p.Bytes(10));
        r->set_phase_since_ms(p.Byte());
        r->set_step(p.Int());
      }
      if (!c.HandleWorkerMessage(session, message).ok()) c.RemoveSession(session);
      return;
    }
    case 12: {  // any bytes the stream could carry
      if (state->sessions.empty()) return;
      auto& session = state->sessions[p.Byte() % state->sessions.size()];
      const std::string bytes = p.RawBytes(120);
      v1::WorkerMessage message;
      if (!message.ParseFromString(bytes)) return;  // gRPC would end the stream
      if (!c.HandleWorkerMessage(session, message).ok()) c.RemoveSession(session);
      return;
    }
    case 13:
      if (!state->sessions.empty()) {
        const size_t i = p.Byte() % state->sessions.size();
        c.RemoveSession(state->sessions[i]);
        state->sessions.erase(state->sessions.begin() + static_cast<std::ptrdiff_t>(i));
      }
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Memory-backed when there is one: every accepted submit is an fsync'ed transaction.
  const char* tmp = std::getenv("TMPDIR");
  std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (tmp != nullptr ? tmp : "/tmp");
  std::string dir = absl::StrCat(base, "/coordinator-fuzz-XXXXXX");
  Check(mkdtemp(dir.data()) != nullptr);
  absl::StatusOr<std::unique_ptr<dropless::coordinator::JobStore>> store =
      dropless::coordinator::JobStore::Open(dir + "/fuzz.db");
  Check(store.ok());
  dropless::coordinator::CoordinatorOptions options;
  options.heartbeat_interval_ms = 100;
  options.lease_timeout_ms = 1000;
  absl::StatusOr<std::unique_ptr<Coordinator>> coordinator =
      Coordinator::Create(*std::move(store), options, nullptr);
  Check(coordinator.ok());
  state = new State;
  state->coordinator = *std::move(coordinator);
  static std::string db_dir = dir;
  std::atexit([] { std::filesystem::remove_all(db_dir); });
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Program program(data, size);
  while (!program.done()) Run(program);
  return 0;
}
