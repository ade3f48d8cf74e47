// JobService over the Coordinator: the user-facing API the CLI speaks. Jobs record the submitting
// user as their owner; a submitter sees and cancels only their own.
#ifndef DROPLESS_COORDINATOR_SERVICE_JOB_SERVICE_H_
#define DROPLESS_COORDINATOR_SERVICE_JOB_SERVICE_H_

#include <cstdint>

#include "coordinator/auth/caller.h"
#include "coordinator/auth/stream_limiter.h"
#include "coordinator/auth/user_tokens.h"
#include "coordinator/controller/coordinator.h"
#include "dropless/v1/job_service.grpc.pb.h"

namespace dropless::coordinator {

class JobServiceImpl final : public v1::JobService::Service {
 public:
  // tokens: those the listener's CallAuthorizer checks calls with (null on a plaintext listener,
  // where every caller is the anonymous admin).
  // streams: the bound on open WatchJob / GetLogs streams (outlives the service).
  // max_user_priority: the highest priority a caller below admin may give a job
  // (--max-user-priority).
  JobServiceImpl(Coordinator* coordinator, const UserTokens* tokens, StreamLimiter* streams,
                 int32_t max_user_priority)
      : coordinator_(coordinator),
        tokens_(tokens),
        streams_(streams),
        max_user_priority_(max_user_priority) {}

  // A job above max_user_priority (the spec's priority, or the request's override) only for an
  // admin: anyone else is refused PERMISSION_DENIED naming the priority and the limit, a dry run
  // included, before anything is stored; a retry of an accepted submit (its request_id) gets its
  // job whatever the limit now (Coordinator::SubmitJob checks it).
  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  // The job as of the call, then one update per event, state change and step metrics record,
  // ending OK after the update that shows the job finished. Like GetLogs, it ends UNAUTHENTICATED
  // once the caller's token expires (checked at each wake-up of the stream, every 200 ms at most).
  //
  // Every call about one job (GetJob, CancelJob, WatchJob, ListEvents, ListStepMetrics, GetLogs)
  // answers a caller who may not see that job NOT_FOUND, as for a job that does not exist.
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobUpdate>* writer) override;
  grpc::Status ListEvents(grpc::ServerContext* context, const v1::ListEventsRequest* request,
                          v1::ListEventsResponse* response) override;
  grpc::Status ListStepMetrics(grpc::ServerContext* context,
                               const v1::ListStepMetricsRequest* request,
                               v1::ListStepMetricsResponse* response) override;
  // Stored lines (the most recent per job are kept; of them the last tail_lines, at most `since`
  // old), then with follow the new ones until the job ends.
  grpc::Status GetLogs(grpc::ServerContext* context, const v1::GetLogsRequest* request,
                       grpc::ServerWriter<v1::LogLine>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status GetVersion(grpc::ServerContext* context, const v1::GetVersionRequest* request,
                          v1::GetVersionResponse* response) override;

 private:
  // The caller's right to one job: a submitter only to their own (coordinator/auth/caller.h; who
  // may call which method at all is decided before the handler, by CallAuthorizer). Each handler
  // finds its caller once (CallerOf) and passes it here and to what else it checks.
  absl::Status CheckAccess(const Caller& caller, const std::string& job_id);

  Coordinator* const coordinator_;
  const UserTokens* const tokens_;
  StreamLimiter* const streams_;
  const int32_t max_user_priority_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVICE_JOB_SERVICE_H_
