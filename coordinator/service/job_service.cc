#include "coordinator/service/job_service.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/api_metadata.h"
#include "common/version.h"
#include "coordinator/auth/caller.h"
#include "coordinator/util/duration_field.h"
#include "coordinator/util/grpc_status.h"

namespace dropless::coordinator {
namespace {

// How often a blocked stream looks at its RPC's cancellation (and its caller's token).
constexpr absl::Duration kPollInterval = absl::Milliseconds(200);

// A stream outlives the checks at its call's start: it ends UNAUTHENTICATED once its caller's
// token has expired (else a stream opened with a token that then expires would go on for good).
grpc::Status StreamTokenStatus(const Caller& caller) {
  absl::Status s = CheckTokenUnexpired(caller.user, caller.token_expires, absl::Now());
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      absl::StrCat(s.message(), ": the stream ends; open it again with a valid "
                                                "token"));
}

// How long a stream waits for its next item: kPollInterval, or less when the caller's token
// expires sooner (so the stream ends at the expiry, not up to a poll later).
absl::Duration StreamWait(const Caller& caller) {
  return std::max(absl::ZeroDuration(),
                  std::min(kPollInterval, caller.token_expires - absl::Now()));
}

// The oldest time_ms of the stored lines a GetLogs request asks for (`since`; 0: any age).
absl::StatusOr<int64_t> OldestStoredLineMs(const v1::GetLogsRequest& request) {
  if (!request.has_since()) return 0;
  absl::StatusOr<int64_t> since_ms = NonNegativeDurationMs(request.since(), "since");
  if (!since_ms.ok()) return since_ms.status();
  return absl::ToUnixMillis(absl::Now()) - *since_ms;
}

}  // namespace

absl::Status JobServiceImpl::CheckAccess(const Caller& caller, const std::string& job_id) {
  if (caller.role != Role::kSubmitter) return absl::OkStatus();
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(job_id);
  if (!job.ok()) return job.status();
  return CheckJobAccess(caller, job_id, job->owner());
}

grpc::Status JobServiceImpl::SubmitJob(grpc::ServerContext* context,
                                       const v1::SubmitJobRequest* request, v1::Job* response) {
  const Caller caller = CallerOf(*context, tokens_);
  // The coordinator checks the job's final priority against the limit, after the request_id
  // lookup (a retry of an accepted submit gets its job).
  const std::optional<int32_t> max_priority =
      caller.role == Role::kAdmin ? std::nullopt : std::optional<int32_t>(max_user_priority_);
  absl::StatusOr<v1::Job> job = coordinator_->SubmitJob(*request, caller.user, max_priority);
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetJob(grpc::ServerContext* context,
                                    const v1::GetJobRequest* request, v1::Job* response) {
  absl::StatusOr<v1::Job> job = coordinator_->GetJob(request->id());
  if (!job.ok()) return ToGrpcStatus(job.status());
  if (absl::Status s = CheckJobAccess(CallerOf(*context, tokens_), job->id(), job->owner());
      !s.ok()) {
    return ToGrpcStatus(s);
  }
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListJobs(grpc::ServerContext* context,
                                      const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  // A submitter lists their own jobs; viewers and admins every job, or one owner's.
  absl::StatusOr<std::optional<std::string>> owner =
      ListedOwner(CallerOf(*context, tokens_), request->owner());
  if (!owner.ok()) return ToGrpcStatus(owner.status());
  absl::StatusOr<v1::ListJobsResponse> jobs =
      coordinator_->ListJobs(*request, owner->has_value() ? &**owner : nullptr);
  if (!jobs.ok()) return ToGrpcStatus(jobs.status());
  *response = std::move(*jobs);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::CancelJob(grpc::ServerContext* context,
                                       const v1::CancelJobRequest* request, v1::Job* response) {
  if (absl::Status s = CheckAccess(CallerOf(*context, tokens_), request->id()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<v1::Job> job = coordinator_->CancelJob(request->id(), request->reason());
  if (!job.ok()) return ToGrpcStatus(job.status());
  *response = std::move(*job);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::WatchJob(grpc::ServerContext* context,
                                      const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::JobUpdate>* writer) {
  const Caller caller = CallerOf(*context, tokens_);
  if (absl::Status s = CheckAccess(caller, request->id()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<StreamLimiter::Slot> slot = streams_->Acquire(caller.user);
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  absl::StatusOr<JobWatch> watch = coordinator_->WatchJob(request->id());
  if (!watch.ok()) return ToGrpcStatus(watch.status());
  v1::JobUpdate first;
  *first.mutable_job() = watch->snapshot;
  bool finished = IsTerminal(watch->snapshot.state());
  bool open = writer->Write(first);
  const auto& updates = watch->updates;
  grpc::Status token = grpc::Status::OK;
  while (open && !finished && updates != nullptr && !context->IsCancelled()) {
    if (!(token = StreamTokenStatus(caller)).ok()) break;
    if (updates->TakeOverflow()) {
      // This reader fell behind and updates were dropped: resynchronize with a snapshot.
      absl::StatusOr<v1::Job> now = coordinator_->GetJob(request->id());
      if (now.ok()) {
        v1::JobUpdate resync;
        *resync.mutable_job() = *now;
        finished = IsTerminal(now->state());
        open = writer->Write(resync);
        continue;
      }
    }
    v1::JobUpdate update;
    Mailbox<v1::JobUpdate>::Result result = updates->Pop(StreamWait(caller), &update);
    if (result == Mailbox<v1::JobUpdate>::Result::kTimeout) continue;
    if (result == Mailbox<v1::JobUpdate>::Result::kClosed) {
      if (coordinator_->ShuttingDown()) break;
      // Closed because the job ended; make sure the reader saw the end.
      absl::StatusOr<v1::Job> last = coordinator_->GetJob(request->id());
      if (last.ok()) {
        v1::JobUpdate end;
        *end.mutable_job() = *last;
        open = writer->Write(end);
        finished = IsTerminal(last->state());
      }
      break;
    }
    finished = IsTerminal(update.job().state());
    open = writer->Write(update);
  }
  if (updates != nullptr) coordinator_->EndWatch(request->id(), updates);
  if (!token.ok()) return token;
  if (!finished && coordinator_->ShuttingDown()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator is shutting down");
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListEvents(grpc::ServerContext* context,
                                        const v1::ListEventsRequest* request,
                                        v1::ListEventsResponse* response) {
  const Caller caller = CallerOf(*context, tokens_);
  if (request->job_id().empty() && caller.role == Role::kSubmitter) {
    // Cluster-wide events tell of every user's jobs and of the workers.
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("job_id: user ", caller.user,
                                     " (role submitter) may list the events of their own jobs "
                                     "only; the cluster's events (no job_id) need role viewer"));
  }
  if (absl::Status s = CheckAccess(caller, request->job_id()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<std::vector<v1::Event>> events =
      coordinator_->ListEvents(request->job_id(), request->limit());
  if (!events.ok()) return ToGrpcStatus(events.status());
  for (v1::Event& event : *events) *response->add_events() = std::move(event);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListStepMetrics(grpc::ServerContext* context,
                                             const v1::ListStepMetricsRequest* request,
                                             v1::ListStepMetricsResponse* response) {
  if (absl::Status s = CheckAccess(CallerOf(*context, tokens_), request->job_id()); !s.ok()) {
    return ToGrpcStatus(s);
  }
  std::optional<int32_t> rank;
  if (request->has_rank()) rank = request->rank();
  absl::StatusOr<std::vector<v1::StepMetrics>> metrics =
      coordinator_->ListStepMetrics(request->job_id(), rank, request->limit());
  if (!metrics.ok()) return ToGrpcStatus(metrics.status());
  for (v1::StepMetrics& m : *metrics) *response->add_metrics() = std::move(m);
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetLogs(grpc::ServerContext* context,
                                     const v1::GetLogsRequest* request,
                                     grpc::ServerWriter<v1::LogLine>* writer) {
  const Caller caller = CallerOf(*context, tokens_);
  if (absl::Status s = CheckAccess(caller, request->job_id()); !s.ok()) return ToGrpcStatus(s);
  std::optional<int32_t> rank;
  if (request->has_rank()) rank = request->rank();
  absl::StatusOr<int64_t> oldest_ms = OldestStoredLineMs(*request);
  if (!oldest_ms.ok()) return ToGrpcStatus(oldest_ms.status());
  // Every GetLogs holds a slot until it ends: one without follow also holds a server thread for
  // as long as its backlog takes to send.
  absl::StatusOr<StreamLimiter::Slot> slot = streams_->Acquire(caller.user);
  if (!slot.ok()) return ToGrpcStatus(slot.status());
  // The store finds the stored lines asked for (the last tail_lines of those since the oldest).
  absl::StatusOr<LogStream> stream =
      coordinator_->OpenLogs(request->job_id(), rank, request->follow(), request->after_seq(),
                             request->tail_lines(), *oldest_ms);
  if (!stream.ok()) return ToGrpcStatus(stream.status());
  // Tells the client the stream is open before any line: a follower of a quiet job that loses
  // the coordinator then knows it was connected, and reconnects (cli/commands/logs.cc).
  context->AddInitialMetadata(kLogStreamOpenMetadata, "1");
  writer->SendInitialMetadata();
  bool open = true;
  grpc::Status token = grpc::Status::OK;
  // A page at a time, each sent before the next is read: one page in memory, the lock free while
  // a slow reader takes it.
  while (open && !stream->backlog_done && !context->IsCancelled()) {
    if (!(token = StreamTokenStatus(caller)).ok()) break;
    absl::StatusOr<std::vector<v1::LogLine>> page = coordinator_->NextLogPage(&*stream);
    if (!page.ok()) {
      if (stream->live != nullptr) coordinator_->EndLogs(request->job_id(), stream->live);
      return ToGrpcStatus(page.status());
    }
    for (const v1::LogLine& line : *page) {
      if (!(open = writer->Write(line))) break;
    }
  }
  const auto& live = stream->live;
  bool ended = live == nullptr;
  while (open && token.ok() && live != nullptr && !context->IsCancelled()) {
    if (!(token = StreamTokenStatus(caller)).ok()) break;
    if (live->TakeOverflow()) {
      v1::LogLine note;
      note.set_job_id(request->job_id());
      note.set_text("[dropless: log lines dropped here; this reader was too slow]");
      open = writer->Write(note);
    }
    v1::LogLine line;
    Mailbox<v1::LogLine>::Result result = live->Pop(StreamWait(caller), &line);
    if (result == Mailbox<v1::LogLine>::Result::kTimeout) continue;
    if (result == Mailbox<v1::LogLine>::Result::kClosed) {
      ended = !coordinator_->ShuttingDown();
      break;
    }
    open = writer->Write(line);
  }
  if (live != nullptr) coordinator_->EndLogs(request->job_id(), live);
  if (!token.ok()) return token;
  if (!ended && open && coordinator_->ShuttingDown()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator is shutting down");
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* response) {
  for (v1::Worker& worker : coordinator_->ListWorkers()) {
    *response->add_workers() = std::move(worker);
  }
  return grpc::Status::OK;
}

grpc::Status JobServiceImpl::GetVersion(grpc::ServerContext*, const v1::GetVersionRequest*,
                                        v1::GetVersionResponse* response) {
  response->set_version(DroplessVersion());
  response->set_api_version(v1::GetVersionRequest::descriptor()->file()->package());
  return grpc::Status::OK;
}

}  // namespace dropless::coordinator
