// dropless logs ID [--rank R] [--tail N] [--since DURATION] [-f] [--raw]: the output of a job's
// rank processes, as forwarded by the workers. Without --rank every line carries "[rank R]";
// --tail and --since pick the last N stored lines / those at most DURATION old (the coordinator
// filters); -f follows until the job ends, across coordinator restarts (it resumes after the last
// line it printed, for up to 60 s of outage); -o json prints one object per line:
// {"job_id","attempt","rank","time","text"}. --timeout bounds the wait for the coordinator's first
// answer only (also with -f, also after a reconnect): the backlog then takes as long as its reader
// (a pager) needs, and -f follows for as long as the job runs.
// The text is the ranks' (user code's): on a terminal its control characters but newline and tab
// print as '?' (output/terminal_text.h), unless --raw; to a pipe or a file it is kept as it is.
#include <unistd.h>

#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"
#include "cli/reconnect.h"
#include "common/api_metadata.h"

namespace dropless::cli {

int RunLogs(const Invocation& inv) {
  std::vector<std::string> pos = inv.args.positional();
  if (pos.size() == 2 && (pos[0] == "job" || pos[0] == "jobs")) pos.erase(pos.begin());
  if (pos.size() != 1) {
    return UsageError(
        "usage: dropless logs ID [--rank R] [--tail N] [--since DURATION] [-f] [--raw]");
  }
  v1::GetLogsRequest request;
  request.set_job_id(pos[0]);
  request.set_follow(inv.args.Has("follow"));
  const bool one_rank = inv.args.Has("rank");
  if (one_rank) {
    int32_t rank = 0;
    if (!absl::SimpleAtoi(inv.args.Get("rank"), &rank) || rank < 0) {
      return UsageError(absl::StrCat("--rank: not a rank number: '", inv.args.Get("rank"), "'"));
    }
    request.set_rank(rank);
  }
  if (inv.args.Has("tail")) {
    int32_t tail = 0;
    if (!absl::SimpleAtoi(inv.args.Get("tail"), &tail) || tail < 0) {
      return UsageError(absl::StrCat("--tail: not a line count: '", inv.args.Get("tail"), "'"));
    }
    request.set_tail_lines(tail);
  }
  if (inv.args.Has("since")) {
    absl::StatusOr<absl::Duration> since = ParseDurationFlag("--since", inv.args.Get("since"));
    if (!since.ok()) return UsageError(std::string(since.status().message()));
    const int64_t nanos = absl::ToInt64Nanoseconds(*since);
    request.mutable_since()->set_seconds(nanos / 1000000000);
    request.mutable_since()->set_nanos(static_cast<int32_t>(nanos % 1000000000));
  }
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  const bool terminal_safe =
      inv.options.output == OutputFormat::kText && !inv.args.Has("raw") && IsTty(STDOUT_FILENO);
  int64_t last_seq = 0;
  bool received = false;   // a line arrived: a new stream resumes after the last one
  bool connected = false;  // a stream was open: losing it is a loss of the coordinator
  Reconnection reconnection("logs");
  while (true) {
    request.set_after_seq(last_seq);
    if (received) {
      // Resuming after the last line printed: every stored line after it, whatever --tail said.
      request.set_tail_lines(0);
      request.clear_since();
    }
    // No deadline on the stream: a deadline would also cut a long backlog, or one that a paused
    // pager (`dropless logs ID | less`) stops reading, short of its end; and a followed job's
    // lines for as long as it runs. --timeout bounds the first answer only, of every stream
    // opened (a reconnect's too).
    std::unique_ptr<grpc::ClientContext> context = client.StreamContext();
    std::unique_ptr<grpc::ClientReader<v1::LogLine>> reader;
    grpc::Status status = client.AwaitFirstAnswer(*context, [&] {
      reader = client.jobs().GetLogs(context.get(), request);  // returns once the request is sent
      // The coordinator marks a stream it accepted before any line (a quiet job prints none).
      reader->WaitForInitialMetadata();
    });
    if (status.ok()) {
      if (context->GetServerInitialMetadata().count(kLogStreamOpenMetadata) != 0) {
        connected = true;
        reconnection.Connected();
      }
      v1::LogLine line;
      while (reader->Read(&line)) {
        received = true;
        reconnection.Connected();
        if (line.seq() > 0) last_seq = line.seq();
        if (inv.options.output != OutputFormat::kText) {
          Value v = Value::Object();
          v.Set("job_id", Value::String(line.job_id()))
              .Set("attempt", Value::Int(line.attempt()))
              .Set("rank", Value::Int(line.rank()))
              .Set("time", TimeValue(line.time_ms()))
              .Set("text", Value::String(line.text()));
          PrintStructured(v, inv.options.output);
          continue;
        }
        std::cout << LogLineText(line, /*with_rank=*/!one_rank, terminal_safe);
        std::cout.flush();
      }
      status = reader->Finish();
      if (status.ok()) return kExitOk;
    } else {
      reader->Finish().IgnoreError();  // --timeout passed before the first answer: cancelled
    }
    // Following, and the coordinator went away (restart, network) or, back, does not answer: the
    // job lives on, and its lines are stored; resume after the last one printed.
    const bool retry = request.follow() && (connected || received) &&
                       Reconnection::LostCoordinator(status);
    if (!retry || !reconnection.Retry(status)) return client.Fail(status);
  }
}

}  // namespace dropless::cli
