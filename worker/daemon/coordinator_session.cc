#include "worker/daemon/coordinator_session.h"

#include <algorithm>
#include <atomic>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/api_metadata.h"
#include "common/log.h"
#include "google/protobuf/util/time_util.h"

namespace dropless {
namespace {

namespace v1 = dropless::v1;

// Longest wait of the writer before it re-checks for heartbeats and the end of the session.
constexpr absl::Duration kWriterTick = absl::Milliseconds(100);
// A session that lasted this long was healthy: the next reconnect starts from the minimum backoff.
constexpr absl::Duration kHealthySession = absl::Seconds(10);

std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  // gRPC's own reconnect backoff grows to minutes; the session has its own backoff, so keep the
  // channel's short and a restarted coordinator is found within seconds.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Heartbeats are writes into the TCP buffer: across a silent partition they would "succeed" until
  // TCP gave up (minutes). HTTP/2 keepalive pings expect an answer, so a dead path breaks the
  // session within ~15 s and the reconnect loop takes over. The coordinator permits pings every 5 s.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  return grpc::CreateCustomChannel(
      address, credentials != nullptr ? credentials : grpc::InsecureChannelCredentials(), args);
}

absl::Duration Jittered(absl::Duration d) {
  static thread_local std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> factor(0.8, 1.2);
  return d * factor(rng);
}

}  // namespace

CoordinatorSession::CoordinatorSession(SessionOptions options, RankManager* ranks,
                                       OutboundQueue* outbound, WorkerMetrics* metrics)
    : options_(std::move(options)),
      ranks_(ranks),
      outbound_(outbound),
      metrics_(metrics),
      boot_id_(options_.boot_id.empty() ? NewBootId() : options_.boot_id),
      channel_(MakeChannel(options_.coordinator, options_.credentials)),
      stub_(v1::WorkerService::NewStub(channel_)) {}

std::string CoordinatorSession::worker_id() const {
  absl::MutexLock lock(&mu_);
  return worker_id_;
}

bool CoordinatorSession::connected() const {
  absl::MutexLock lock(&mu_);
  return connected_;
}

void CoordinatorSession::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  if (open_context_ != nullptr) open_context_->TryCancel();
}

bool CoordinatorSession::SleepUnlessShutdown(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&shutdown_), d);
  return !shutdown_;
}

std::string CoordinatorSession::NewBootId() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x%08x%08x", rd(), rd(), rd(), rd());
}

bool CoordinatorSession::Flushed() const { return outbound_->size() == 0 || !connected(); }

bool CoordinatorSession::SayGoodbye(const std::string& reason, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (!connected_) return false;
  goodbye_ = reason;
  auto written_or_gone = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !goodbye_.has_value() || !connected_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&written_or_gone), timeout);
  return !goodbye_.has_value();
}

std::vector<v1::RankStatus> CoordinatorSession::EndedRanksStillQueued(
    const google::protobuf::RepeatedPtrField<v1::RankStatus>& listed) const {
  std::vector<v1::RankStatus> ended;
  for (v1::RankStatus& pending : outbound_->PendingRankStatuses()) {
    const v1::RankState state = pending.state();
    if (state != v1::RANK_STATE_SUCCEEDED && state != v1::RANK_STATE_FAILED &&
        state != v1::RANK_STATE_KILLED) {
      continue;
    }
    bool is_listed = false;
    for (const v1::RankStatus& r : listed) {
      is_listed |= r.job_id() == pending.job_id() && r.attempt() == pending.attempt() &&
                   r.rank() == pending.rank();
    }
    if (!is_listed) ended.push_back(std::move(pending));
  }
  return ended;
}

absl::Status CoordinatorSession::Register() {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  // Wait for the channel to (re)connect rather than fail fast while it is in reconnect backoff:
  // failing fast stacked the channel's backoff on top of ours, and a restarted coordinator was
  // found only seconds after it was up, eating into the lease of the ranks still running here.
  context.set_wait_for_ready(true);
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::CancelledError("shutting down");
    open_context_ = &context;
  }
  v1::RegisterWorkerRequest request = options_.registration;
  request.set_boot_id(boot_id_);
  v1::RegisterWorkerResponse response;
  grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    open_context_ = nullptr;
  }
  if (!status.ok()) {
    const absl::StatusCode code = status.error_code() == grpc::StatusCode::INVALID_ARGUMENT
                                      ? absl::StatusCode::kInvalidArgument
                                  : status.error_code() == grpc::StatusCode::ALREADY_EXISTS
                                      ? absl::StatusCode::kAlreadyExists
                                      : absl::StatusCode::kUnavailable;
    return absl::Status(code, absl::StrCat("RegisterWorker with ", options_.coordinator,
                                           " failed: ", status.error_message(), " (code ",
                                           static_cast<int>(status.error_code()), ")"));
  }
  if (response.worker_id().empty()) {
    return absl::InternalError("RegisterWorker answered without a worker_id");
  }
  absl::MutexLock lock(&mu_);
  if (!worker_id_.empty() && worker_id_ != response.worker_id()) {
    LogInfo(absl::StrCat("coordinator gave a new worker id ", response.worker_id(),
                           " (was ", worker_id_, ")"));
  }
  worker_id_ = response.worker_id();
  const int64_t heartbeat_ms =
      response.has_heartbeat_interval()
          ? google::protobuf::util::TimeUtil::DurationToMilliseconds(response.heartbeat_interval())
          : response.heartbeat_interval_ms();  // a coordinator that predates the Duration
  heartbeat_interval_ = heartbeat_ms > 0 ? absl::Milliseconds(heartbeat_ms) : absl::Seconds(1);
  acknowledged_ = response.acknowledges();
  LogInfo(absl::StrCat("registered with ", options_.coordinator, " as worker ", worker_id_,
                         " (node ", options_.registration.node(), ", ",
                         options_.registration.devices_size(), " ",
                         options_.registration.slot_kind(), " slots, heartbeat every ",
                         absl::FormatDuration(heartbeat_interval_), ")"));
  return absl::OkStatus();
}

absl::Status CoordinatorSession::Run() {
  absl::Duration backoff = options_.min_backoff;
  bool last_failed = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return absl::OkStatus();
    }
    absl::Status status = Register();
    const bool registered = status.ok();
    absl::Time session_start = absl::Now();
    bool dropped_refused = false;
    if (registered) {
      status = RunSession(&dropped_refused);
      if (absl::Now() - session_start >= kHealthySession) backoff = options_.min_backoff;
    }
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_) return absl::OkStatus();
    }
    // The coordinator is up and refused one message (the queue logged it): the rest go at once.
    if (dropped_refused) {
      last_failed = false;
      continue;
    }
    if (absl::IsInvalidArgument(status) && !registered) {
      LogError(absl::StrCat("the coordinator refuses this worker: ", status.message()));
      return status;
    }
    // Repeated identical failures (coordinator down) are logged once, not every retry.
    // While the coordinator stays down, only the first failed attempt is logged.
    if (!last_failed) {
      const std::string line =
          absl::StrCat("no session with the coordinator: ", status.message(), "; retrying");
      if (absl::IsAlreadyExists(status)) {
        LogError(line);
      } else {
        LogWarning(line);
      }
    }
    last_failed = !registered || absl::IsAlreadyExists(status);
    if (!SleepUnlessShutdown(Jittered(backoff))) return absl::OkStatus();
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

absl::Status CoordinatorSession::RunSession(bool* dropped_refused) {
  grpc::ClientContext context;
  std::string worker_id;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return absl::CancelledError("shutting down");
    open_context_ = &context;
    worker_id = worker_id_;
  }
  auto stream = stub_->Session(&context);

  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker_id);
  hello.mutable_hello()->set_boot_id(boot_id_);
  // RankManager::HandleAssignment starts a rank at most once per run (alive or queued status).
  hello.mutable_hello()->set_takes_resent_assignments(true);
  // Whatever the last session wrote but the coordinator did not acknowledge goes again.
  outbound_->Rewind();
  for (v1::RankStatus& r : ranks_->LiveRanks()) *hello.mutable_hello()->add_ranks() = std::move(r);
  // Ranks that ended while no session was up (their exit status still queued, unacknowledged):
  // listed with it, or the coordinator would see them missing and fail their attempt.
  for (v1::RankStatus& ended : EndedRanksStillQueued(hello.hello().ranks())) {
    *hello.mutable_hello()->add_ranks() = std::move(ended);
  }
  bool opened = false;
  std::atomic<bool> write_failed{false};
  if (stream->Write(hello)) {
    opened = true;
    bool reconnect;
    {
      absl::MutexLock lock(&mu_);
      connected_ = true;
      reconnect = ++sessions_ > 1;
    }
    if (reconnect) metrics_->RecordSessionReconnect();
    LogInfo(absl::StrCat("session open (", hello.hello().ranks_size(), " live rank(s) reported)"));

    std::atomic<bool> stop{false};
    std::atomic<bool> writer_done{false};
    std::atomic<bool> reader_done{false};
    std::thread writer([&] {
      if (!WriteLoop(stream.get(), &stop)) {
        write_failed = true;
        // A failed write ends the session. A write fails once the coordinator ended the stream,
        // and the reader then sees the end too: cancelling only if it does not (a dead path)
        // lets it read the acknowledgements and the status that precede the end (the status
        // says whether a message was refused; cancelled, it would read CANCELLED).
        for (int i = 0; i < 100 && !reader_done; ++i) absl::SleepFor(absl::Milliseconds(10));
        if (!reader_done) context.TryCancel();
      }
      writer_done = true;
    });
    v1::CoordinatorMessage message;
    while (stream->Read(&message)) {
      if (message.has_ack()) {
        outbound_->Acknowledge(message.ack().seq());
      } else if (message.has_assignment()) {
        ranks_->HandleAssignment(message.assignment());
      } else if (message.has_cancellation()) {
        ranks_->HandleCancellation(message.cancellation());
      }
    }
    reader_done = true;
    // The stream ended: the writer sees `stop` within a tick (a write to an ended stream fails
    // at once). Cancelling only if it does not, so that Finish reads the coordinator's status
    // (e.g. why it refused the Hello) rather than CANCELLED.
    stop = true;
    for (int i = 0; i < 100 && !writer_done; ++i) absl::SleepFor(absl::Milliseconds(10));
    if (!writer_done) context.TryCancel();
    writer.join();
  } else {
    context.TryCancel();
  }
  grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    connected_ = false;
    open_context_ = nullptr;
  }
  // gRPC's status codes are absl's. The coordinator names the message it refuses in the
  // trailing metadata (a refusal without it, such as the Hello's, drops nothing).
  const absl::Status end(static_cast<absl::StatusCode>(status.error_code()),
                         status.error_message());
  std::optional<uint64_t> refused_seq;
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kRefusedSeqMetadata); it != trailers.end()) {
    uint64_t seq = 0;
    if (absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &seq)) {
      refused_seq = seq;
    }
  }
  if (opened && outbound_->SessionEnded(end, refused_seq).has_value()) {
    metrics_->RecordOutboundRefused();
    *dropped_refused = true;
  }
  const char* why = !opened        ? "could not send Hello"
                    : write_failed ? "a write to the coordinator failed"
                                   : "the coordinator closed the stream or the connection dropped";
  // A Hello refused because another daemon run holds the node keeps its code (Run logs it once).
  const absl::StatusCode code = status.error_code() == grpc::StatusCode::ALREADY_EXISTS
                                    ? absl::StatusCode::kAlreadyExists
                                    : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat("Session: ", why, " (", status.error_message(), ")"));
}

bool CoordinatorSession::WriteLoop(
    grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorMessage>* stream,
    std::atomic<bool>* stop) {
  absl::Duration interval;
  bool acknowledged;
  {
    absl::MutexLock lock(&mu_);
    interval = heartbeat_interval_;
    acknowledged = acknowledged_;
  }
  absl::Time next_heartbeat = absl::Now() + interval;
  while (!stop->load()) {
    std::optional<std::string> goodbye;
    {
      absl::MutexLock lock(&mu_);
      goodbye = goodbye_;
    }
    if (goodbye.has_value()) {
      v1::WorkerMessage bye;
      bye.mutable_goodbye()->set_reason(*goodbye);
      if (!stream->Write(bye)) return false;
      absl::MutexLock lock(&mu_);
      goodbye_.reset();
      continue;
    }
    const absl::Time now = absl::Now();
    if (now >= next_heartbeat) {
      v1::WorkerMessage beat;
      v1::Heartbeat* heartbeat = beat.mutable_heartbeat();
      heartbeat->set_time_ms(absl::ToUnixMillis(now));
      // Live ranks first, then the queue: a rank's end is queued before it leaves the live list,
      // so one ending in between is in one of the two.
      for (v1::RankStatus& r : ranks_->LiveRanks()) *heartbeat->add_ranks() = std::move(r);
      for (v1::RankStatus& ended : EndedRanksStillQueued(heartbeat->ranks())) {
        *heartbeat->add_ended_ranks() = std::move(ended);
      }
      heartbeat->set_lists_ended_ranks(true);
      if (!stream->Write(beat)) return false;
      next_heartbeat = now + interval;
      continue;
    }
    std::optional<OutboundQueue::Entry> entry =
        outbound_->Peek(std::min(kWriterTick, next_heartbeat - now));
    if (!entry.has_value()) continue;
    entry->message.set_seq(entry->sequence);
    if (!stream->Write(entry->message)) return false;
    // An acknowledging coordinator removes it from the queue once stored; an older one never
    // will, so it goes now (at most once, as before acknowledgements).
    if (acknowledged) {
      outbound_->MarkSent(entry->sequence);
    } else {
      outbound_->Pop(entry->sequence);
    }
  }
  return true;
}

}  // namespace dropless
