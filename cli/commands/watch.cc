// dropless watch ID: follows a job until it ends. On a terminal: a progress bar redrawn in place,
// events scrolling above it. Otherwise: one plain line per event, state change and step (rank 0).
// -o json: one JSON object per update (every rank's steps); -o yaml: one document per update.
// Exit code: 0 SUCCEEDED, 5 FAILED, 6 CANCELLED (cli/exit_codes.h). --timeout bounds the wait
// for the coordinator's first answer (also after a reconnect), never the watch itself.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/client.h"
#include "cli/commands/commands.h"
#include "cli/exit_codes.h"
#include "cli/output/terminal_text.h"
#include "cli/output/views.h"
#include "cli/progress/progress_bar.h"
#include "cli/reconnect.h"

namespace dropless::cli {
namespace {

int TerminalWidth() {
  struct winsize ws {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

std::string EventLine(const v1::Event& e) {
  std::string line = absl::StrCat(TimeText(e.time_ms()), "  ", e.type());
  if (e.attempt() > 0) absl::StrAppend(&line, " (attempt ", e.attempt(), ")");
  if (!e.message().empty()) absl::StrAppend(&line, ": ", e.message());
  return line;
}

std::string StepLine(const v1::Job& job, const v1::StepMetrics& m) {
  Progress p{JobStateName(job.state()), m.step(), job.steps(), true, m.loss(), m.step_seconds(),
             m.tflops(), m.mfu()};
  const double eta = EtaSeconds(p);
  return absl::StrFormat("step %d/%d  loss %.6g  step_seconds %.6g  tflops %.4g  mfu %.4f%s",
                         m.step(), job.steps(), m.loss(), m.step_seconds(), m.tflops(), m.mfu(),
                         eta >= 0 ? absl::StrCat("  eta ", DurationText(eta)) : "");
}

// Shows updates in the chosen format; remembers the job's last state.
class UpdatePrinter {
 public:
  explicit UpdatePrinter(OutputFormat format)
      : format_(format), tty_(format == OutputFormat::kText && isatty(STDOUT_FILENO)) {
    if (tty_) bar_ = std::make_unique<ProgressBar>(stdout, TerminalWidth());
  }

  void Show(const v1::JobUpdate& update) {
    const v1::Job& job = update.job();
    const std::string state = JobStateName(job.state());
    if (format_ != OutputFormat::kText) {
      PrintStructured(WatchUpdateView(update), format_);
    } else {
      ShowText(update, state);
    }
    last_state_ = job.state();
    last_state_name_ = state;
  }

  v1::JobState last_state() const { return last_state_; }
  void Finish() {
    if (bar_) bar_->Finish();
  }

 private:
  void ShowText(const v1::JobUpdate& update, const std::string& state) {
    const v1::Job& job = update.job();
    std::vector<std::string> lines;
    if (update.has_event()) lines.push_back(EventLine(update.event()));
    if (state != last_state_name_) {
      std::string line = absl::StrCat("job ", job.id(), " ", state);
      if (!job.message().empty()) absl::StrAppend(&line, ": ", job.message());
      lines.push_back(line);
    }
    // Rank 0 speaks for the job; the other ranks' steps are in -o json.
    const bool step = update.has_metrics() && update.metrics().rank() == 0;
    if (step) {
      progress_ = Progress{state, update.metrics().step(), job.steps(), true,
                           update.metrics().loss(), update.metrics().step_seconds(),
                           update.metrics().tflops(), update.metrics().mfu()};
    } else if (progress_.steps == 0 && job.has_latest() && job.latest().step() > 0) {
      const v1::StepMetrics& m = job.latest();  // joining a job that is already running
      progress_ = Progress{state, m.step(), job.steps(), true, m.loss(), m.step_seconds(),
                           m.tflops(), m.mfu()};
    }
    progress_.state = state;
    progress_.steps = job.steps();
    if (bar_) {
      // On the terminal: event and job messages are users', shown without control characters.
      // The plain lines below go to a pipe or a file, as they are.
      for (const std::string& line : lines) bar_->PrintLine(TerminalSafe(line));
      bar_->Draw(progress_);
      return;
    }
    for (const std::string& line : lines) std::cout << line << "\n";
    if (step) std::cout << StepLine(job, update.metrics()) << "\n";
    std::cout.flush();
  }

  OutputFormat format_;
  bool tty_;
  std::unique_ptr<ProgressBar> bar_;
  Progress progress_;
  v1::JobState last_state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string last_state_name_;
};

int ExitCodeFor(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_SUCCEEDED: return kExitOk;
    case v1::JOB_STATE_CANCELLED: return kExitJobCancelled;
    default: return kExitJobFailed;
  }
}

}  // namespace

int RunWatch(const Invocation& inv) {
  std::vector<std::string> pos = inv.args.positional();
  if (pos.size() == 2 && (pos[0] == "job" || pos[0] == "jobs")) pos.erase(pos.begin());
  if (pos.size() != 1) return UsageError("usage: dropless watch ID");
  absl::StatusOr<Client> connection = Client::Connect(inv.options);
  if (!connection.ok()) return UsageError(std::string(connection.status().message()));
  Client& client = *connection;
  return FollowJobToEnd(inv.options, client, pos[0]);
}

int FollowJobToEnd(const GlobalOptions& options, Client& client, const std::string& id) {
  v1::WatchJobRequest request;
  request.set_id(id);
  UpdatePrinter printer(options.output);
  bool received = false;
  Reconnection reconnection("watch");
  while (true) {
    // No deadline on the stream (it lives as long as the job): --timeout bounds its first answer
    // only, the job as it is now, which the coordinator sends at once; so on every reconnect.
    std::unique_ptr<grpc::ClientContext> context = client.StreamContext();
    std::unique_ptr<grpc::ClientReader<v1::JobUpdate>> reader;
    v1::JobUpdate update;
    bool more = false;
    grpc::Status status = client.AwaitFirstAnswer(*context, [&] {
      reader = client.jobs().WatchJob(context.get(), request);
      more = reader->Read(&update);
    });
    for (; status.ok() && more; more = reader->Read(&update)) {
      received = true;
      reconnection.Connected();
      printer.Show(update);
      if (IsTerminal(update.job().state())) {
        const v1::JobState end_state = update.job().state();
        // The job is over: do not wait for the server to close the stream.
        context->TryCancel();
        while (reader->Read(&update)) {
        }
        reader->Finish().IgnoreError();
        printer.Finish();
        return ExitCodeFor(end_state);
      }
    }
    if (status.ok()) {
      status = reader->Finish();
    } else {
      reader->Finish().IgnoreError();  // --timeout passed before the first answer: cancelled
    }
    // The coordinator went away mid-job (restart, network) or, back, does not answer: the job
    // lives on; follow it again.
    const bool retry = received && (status.ok() || Reconnection::LostCoordinator(status));
    if (!retry) {
      printer.Finish();
      return client.Fail(status);
    }
    if (!reconnection.Retry(status, [&] { printer.Finish(); })) {
      if (status.ok()) {
        std::cerr << "error: the watch stream ended before the job finished (last state "
                  << JobStateName(printer.last_state()) << ")\n";
        return kExitError;
      }
      return client.Fail(status);
    }
  }
}

}  // namespace dropless::cli
