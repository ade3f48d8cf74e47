// JobService over the Coordinator: the user-facing API the CLI speaks. Jobs record the submitting
// user as their owner; a submitter sees and cancels only their own.
#ifndef DROPLESS_COORDINATOR_SERVICE_JOB_SERVICE_H_
#define DROPLESS_COORDINATOR_SERVICE_JOB_SERVICE_H_

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
  JobServiceImpl(Coordinator* coordinator, const UserTokens* tokens, StreamLimiter* streams)
      : coordinator_(coordinator), tokens_(tokens), streams_(streams) {}

  grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                         v1::Job* response) override;
  grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                         v1::Job* response) override;
  // The job as of the call, then one update per event, state change and step metrics record,
  // ending OK after the update that shows the job finished.
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
  // may call which method at all is decided before the handler, by CallAuthorizer).
  absl::Status CheckAccess(const grpc::ServerContext& context, const std::string& job_id);

  Coordinator* const coordinator_;
  const UserTokens* const tokens_;
  StreamLimiter* const streams_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_SERVICE_JOB_SERVICE_H_
