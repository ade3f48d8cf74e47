// ProgressBar: the live status line of `dropless watch` on a terminal, redrawn in place
// ("\r" + erase line), with event lines scrolling above it.
#ifndef DROPLESS_CLI_PROGRESS_PROGRESS_BAR_H_
#define DROPLESS_CLI_PROGRESS_PROGRESS_BAR_H_

#include <cstdint>
#include <cstdio>
#include <string>

namespace dropless::cli {

struct Progress {
  std::string state;  // PENDING, RUNNING, ...
  int64_t step = 0;   // last finished step; 0 before the first
  int64_t steps = 0;
  bool has_metrics = false;
  double loss = 0;
  double step_seconds = 0;
  double tflops = 0;
  double mfu = 0;  // 0..1
};

// The bar and its figures in at most `width` columns, e.g.
// "RUNNING [#########.....................] 12/40  30%  500.0 ms/step  3.21 TFLOP/s  MFU   1.2%
//  loss 1.234      ETA 14s"  (one line). On a narrow terminal TFLOP/s goes first, then step time,
// MFU, loss; ETA stays longest.
// "RUNNING [######......] 12/40 30% | 0.012s/step | 0.52 TFLOP/s | MFU 0.1% | loss 1.234 | ETA 3s"
// Figures are dropped from the right when the terminal is narrow.
std::string RenderProgress(const Progress& p, int width);

// Remaining time at the last step's pace; negative when unknown.
double EtaSeconds(const Progress& p);

class ProgressBar {
 public:
  ProgressBar(std::FILE* out, int width) : out_(out), width_(width) {}
  ~ProgressBar() { Finish(); }

  void Draw(const Progress& p);
  // A line above the bar (an event), then the bar again.
  void PrintLine(const std::string& line);
  // Ends the bar's line so that later output starts on a fresh one.
  void Finish();

 private:
  std::FILE* out_;
  int width_;
  bool drawn_ = false;
  Progress last_;
};

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_PROGRESS_PROGRESS_BAR_H_
