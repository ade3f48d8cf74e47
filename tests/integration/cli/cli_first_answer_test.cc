// --timeout bounds the wait for a stream's first answer, and only that, in every command that opens
// a stream: `logs`, `logs -f`, `watch` and `submit --wait`, also when one of them reconnects. The
// real `dropless` binary against a loopback socket that accepts and never answers, against a
// scripted JobService whose streams hang (a coordinator connected but stuck), and against the
// real coordinator, whose answered streams must outlive --timeout.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/api_metadata.h"
#include "dropless/v1/job_service.grpc.pb.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/cli/cli_fixture.h"

namespace dropless::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kJobId[] = "job-000001";

// A loopback port whose kernel completes the TCP handshakes while nobody ever speaks: a hung host
// behind a live socket, or an address that is not a coordinator's.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        listen(fd_, 16) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      return;
    }
    address_ = absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
  }
  ~SilentListener() {
    if (fd_ >= 0) close(fd_);
  }
  SilentListener(const SilentListener&) = delete;
  SilentListener& operator=(const SilentListener&) = delete;

  const std::string& address() const { return address_; }  // "" when it could not listen

 private:
  int fd_ = -1;
  std::string address_;
};

// What the scripted JobService does with one WatchJob or GetLogs call.
enum class Reply {
  kHang,             // accepts the call and never answers, until the client cancels it
  kLose,             // UNAVAILABLE at once, as a coordinator going down answers
  kAnswerThenLose,   // the first answer (a RUNNING job; the open mark and one line), then UNAVAILABLE
  kAnswerThenEnd,    // the first answer (a SUCCEEDED job; the open mark and one line), then OK
};

// What a ScriptedJobService has seen so far.
struct ScriptedCalls {
  int watch = 0;
  int logs = 0;
  int cancelled_hangs = 0;            // kHang calls that the client cancelled
  std::vector<int64_t> logs_after_seq;  // each GetLogs call's after_seq, in order
};

// A JobService that answers SubmitJob at once and each stream call as its script says, call by
// call (the last reply repeats).
class ScriptedJobService final : public v1::JobService::Service {
 public:
  explicit ScriptedJobService(std::vector<Reply> script) : script_(std::move(script)) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*,
                         v1::Job* job) override {
    job->set_id(kJobId);
    job->set_state(v1::JOB_STATE_PENDING);
    return grpc::Status::OK;
  }

  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest*,
                        grpc::ServerWriter<v1::JobUpdate>* writer) override {
    int call = 0;
    {
      absl::MutexLock lock(&mu_);
      call = ++calls_.watch;
    }
    const Reply reply = ReplyTo(call);
    if (reply == Reply::kHang) return Hang(context);
    if (reply == Reply::kLose) return Lost();
    v1::JobUpdate update;
    update.mutable_job()->set_id(kJobId);
    update.mutable_job()->set_steps(10);
    update.mutable_job()->set_state(reply == Reply::kAnswerThenEnd ? v1::JOB_STATE_SUCCEEDED
                                                                    : v1::JOB_STATE_RUNNING);
    writer->Write(update);
    return reply == Reply::kAnswerThenEnd ? grpc::Status::OK : Lost();
  }

  grpc::Status GetLogs(grpc::ServerContext* context, const v1::GetLogsRequest* request,
                       grpc::ServerWriter<v1::LogLine>* writer) override {
    int call = 0;
    {
      absl::MutexLock lock(&mu_);
      call = ++calls_.logs;
      calls_.logs_after_seq.push_back(request->after_seq());
    }
    const Reply reply = ReplyTo(call);
    if (reply == Reply::kHang) return Hang(context);
    if (reply == Reply::kLose) return Lost();
    context->AddInitialMetadata(kLogStreamOpenMetadata, "1");
    writer->SendInitialMetadata();
    v1::LogLine line;
    line.set_job_id(kJobId);
    line.set_attempt(1);
    line.set_text(absl::StrCat("line of call ", call));
    line.set_seq(call);
    writer->Write(line);
    return reply == Reply::kAnswerThenEnd ? grpc::Status::OK : Lost();
  }

  ScriptedCalls calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

  // The calls once `done` says so (a cancellation reaches the server a moment after the client
  // exits), or as they are after 10 s.
  ScriptedCalls AwaitCalls(const std::function<bool(const ScriptedCalls&)>& done) const {
    absl::MutexLock lock(&mu_);
    auto ready = [&] { return done(calls_); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(10));
    return calls_;
  }

 private:
  Reply ReplyTo(int call) const {
    return script_[std::min(static_cast<size_t>(call), script_.size()) - 1];
  }
  grpc::Status Hang(grpc::ServerContext* context) {
    while (!context->IsCancelled()) absl::SleepFor(absl::Milliseconds(10));
    absl::MutexLock lock(&mu_);
    ++calls_.cancelled_hangs;
    return grpc::Status::CANCELLED;
  }
  static grpc::Status Lost() {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "scripted: coordinator going away");
  }

  const std::vector<Reply> script_;
  mutable absl::Mutex mu_;
  ScriptedCalls calls_ ABSL_GUARDED_BY(mu_);
};

// The scripted service on a loopback port (plaintext, as --insecure speaks).
class ScriptedCoordinator {
 public:
  explicit ScriptedCoordinator(std::vector<Reply> script) : service_(std::move(script)) {
    grpc::ServerBuilder builder;
    // The coordinator's ping policy (coordinator/server/coordinator_server.cc): the CLI's
    // keepalive pings are answered, so a stuck stream stays open as it would there.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~ScriptedCoordinator() {
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  }

  bool ok() const { return server_ != nullptr && port_ > 0; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  ScriptedJobService& service() { return service_; }

 private:
  ScriptedJobService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

std::vector<std::string> CliAt(const std::string& address, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {BinaryPath("dropless"), "--insecure", "--coordinator", address,
                                   "--timeout", "1s"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// A command that opens a stream, as the user types it after the global flags.
struct StreamCommand {
  std::string name;
  std::vector<std::string> args;
};

void PrintTo(const StreamCommand& command, std::ostream* os) { *os << command.name; }

std::vector<StreamCommand> StreamCommands() {
  return {{"logs", {"logs", kJobId}},
          {"logs_follow", {"logs", kJobId, "-f"}},
          {"watch", {"watch", kJobId}},
          {"submit_wait", {"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"), "--wait"}}};
}

class FirstAnswerTest : public ::testing::TestWithParam<StreamCommand> {};

// Nothing speaks at the address: the command fails once --timeout has passed (it used to wait
// for gRPC's 20 s connect timeout, `logs` without -f excepted), naming the address and the flag.
TEST_P(FirstAnswerTest, ASocketThatNeverAnswersFailsWithinTheTimeout) {
  SilentListener silent;
  ASSERT_FALSE(silent.address().empty());
  const absl::Time start = absl::Now();
  CommandResult r = RunCommand(CliAt(silent.address(), GetParam().args), absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(900)) << r.err;
  EXPECT_LT(took, absl::Seconds(8)) << r.err;
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_EQ(r.err, "error: cannot reach the coordinator at " + silent.address() +
                       " within --timeout 1s\n");
}

// A coordinator that is connected (HTTP/2 up, keepalive pings answered) but whose stream never
// answers: without the bound `logs -f`, `watch` and `submit --wait` waited for ever.
TEST_P(FirstAnswerTest, AStreamThatNeverAnswersFailsWithinTheTimeout) {
  ScriptedCoordinator coordinator({Reply::kHang});
  ASSERT_TRUE(coordinator.ok());
  const absl::Time start = absl::Now();
  CommandResult r = RunCommand(CliAt(coordinator.address(), GetParam().args), absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  EXPECT_GE(took, absl::Milliseconds(900)) << r.err;
  EXPECT_LT(took, absl::Seconds(8)) << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err, "error: the coordinator at " + coordinator.address() +
                       " did not answer within --timeout 1s\n");
  if (GetParam().name == "submit_wait") EXPECT_EQ(r.out, std::string(kJobId) + "\n");
  // The CLI cancelled the call it gave up on (the server saw it), and did not open another.
  const ScriptedCalls calls =
      coordinator.service().AwaitCalls([](const ScriptedCalls& c) { return c.cancelled_hangs > 0; });
  EXPECT_EQ(calls.cancelled_hangs, 1);
  EXPECT_EQ(calls.watch + calls.logs, 1);
}

INSTANTIATE_TEST_SUITE_P(StreamCommands, FirstAnswerTest, ::testing::ValuesIn(StreamCommands()),
                         [](const ::testing::TestParamInfo<StreamCommand>& info) {
                           return info.param.name;
                         });

// A reconnecting `watch`: the coordinator answers, goes away, refuses once, then is back but does
// not answer (a stream opened and stuck): that try ends after --timeout and the next one follows
// the job to its end. Without the bound the stuck try held the watch for ever.
TEST(FirstAnswerReconnectTest, WatchRetriesAReopenedStreamThatDoesNotAnswer) {
  ScriptedCoordinator coordinator(
      {Reply::kAnswerThenLose, Reply::kLose, Reply::kHang, Reply::kAnswerThenEnd});
  ASSERT_TRUE(coordinator.ok());
  const absl::Time start = absl::Now();
  CommandResult r =
      RunCommand(CliAt(coordinator.address(), {"watch", kJobId, "-o", "json"}), absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("\"RUNNING\""));
  EXPECT_THAT(r.out, HasSubstr("\"SUCCEEDED\""));
  // One notice for the one loss, whatever the tries in between met.
  EXPECT_EQ(r.err, "watch: lost the coordinator (scripted: coordinator going away); reconnecting\n");
  const ScriptedCalls calls =
      coordinator.service().AwaitCalls([](const ScriptedCalls& c) { return c.cancelled_hangs > 0; });
  EXPECT_EQ(calls.watch, 4);
  EXPECT_EQ(calls.cancelled_hangs, 1);
}

// The same for `logs -f`, which also resumes after the last line it printed.
TEST(FirstAnswerReconnectTest, LogsFollowRetriesAReopenedStreamThatDoesNotAnswer) {
  ScriptedCoordinator coordinator(
      {Reply::kAnswerThenLose, Reply::kLose, Reply::kHang, Reply::kAnswerThenEnd});
  ASSERT_TRUE(coordinator.ok());
  const absl::Time start = absl::Now();
  CommandResult r = RunCommand(CliAt(coordinator.address(), {"logs", kJobId, "-f", "--rank", "0"}),
                               absl::Seconds(60));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << r.err;
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "line of call 1\nline of call 4\n");
  EXPECT_EQ(r.err, "logs: lost the coordinator (scripted: coordinator going away); reconnecting\n");
  const ScriptedCalls calls =
      coordinator.service().AwaitCalls([](const ScriptedCalls& c) { return c.cancelled_hangs > 0; });
  EXPECT_EQ(calls.logs, 4);
  EXPECT_EQ(calls.cancelled_hangs, 1);
  // Every try resumes after the one line printed.
  EXPECT_THAT(calls.logs_after_seq, ::testing::ElementsAre(0, 1, 1, 1));
}

// Once answered, a stream has no deadline: against the real coordinator, `watch`, `logs -f` and
// `submit --wait` of pending jobs (no worker) are still following them four --timeouts later, and
// end as the jobs do.
class FirstAnswerLiveTest : public CliTest {};

TEST_F(FirstAnswerLiveTest, AnsweredStreamsOutliveTheTimeout) {
  const std::string id = Submit("configs/jobs/tiny-cpu.yaml");
  ASSERT_FALSE(id.empty());
  auto watch = Process::Start(CliAt(address(), {"watch", id, "-o", "json"}));
  ASSERT_TRUE(watch.ok()) << watch.status();
  auto logs = Process::Start(CliAt(address(), {"logs", id, "-f"}));
  ASSERT_TRUE(logs.ok()) << logs.status();
  auto submit =
      Process::Start(CliAt(address(), {"submit", "-f", SourcePath("configs/jobs/tiny-cpu.yaml"),
                                       "--wait", "-o", "json"}));
  ASSERT_TRUE(submit.ok()) << submit.status();
  absl::SleepFor(absl::Seconds(4));
  EXPECT_TRUE((*watch)->Running()) << (*watch)->Output();
  EXPECT_TRUE((*logs)->Running()) << (*logs)->Output();
  EXPECT_TRUE((*submit)->Running()) << (*submit)->Output();
  EXPECT_THAT((*watch)->Output(), HasSubstr("\"PENDING\""));

  // submit -o json prints the job, then the watch updates: the first line is the job.
  const std::string submitted = (*submit)->Output();
  const std::string second_id =
      Str(ParseJson(submitted.substr(0, submitted.find('\n'))), "id");
  ASSERT_FALSE(second_id.empty()) << submitted;
  EXPECT_THAT(submitted, HasSubstr("\"PENDING\""));
  for (const std::string& job : {id, second_id}) {
    CommandResult cancelled = Cli({"cancel", job});
    EXPECT_EQ(cancelled.exit_code, 0) << cancelled.err;
  }
  absl::StatusOr<int> code = (*watch)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 6) << (*watch)->Output();
  code = (*logs)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0) << (*logs)->Output();
  code = (*submit)->Wait(absl::Seconds(30));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 6) << (*submit)->Output();
}

}  // namespace
}  // namespace dropless::testing
