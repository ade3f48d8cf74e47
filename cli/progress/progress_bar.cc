#include "cli/progress/progress_bar.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cli/output/views.h"

namespace dropless::cli {

double EtaSeconds(const Progress& p) {
  if (!p.has_metrics || p.steps <= 0 || p.step_seconds <= 0) return -1;
  return std::max<int64_t>(0, p.steps - p.step) * p.step_seconds;
}

std::string RenderProgress(const Progress& p, int width) {
  width = std::max(width, 20);
  const double fraction =
      p.steps > 0 ? std::clamp(static_cast<double>(p.step) / p.steps, 0.0, 1.0) : 0.0;
  std::string counts = absl::StrFormat("%d/%d %3d%%", p.step, p.steps,
                                       static_cast<int>(fraction * 100.0 + 1e-9));
  std::vector<std::string> figures;
  if (p.has_metrics) {
    figures.push_back(absl::StrCat(DurationText(p.step_seconds), "/step"));
    figures.push_back(absl::StrFormat("%.3g TFLOP/s", p.tflops));
    figures.push_back(absl::StrFormat("MFU %.1f%%", 100.0 * p.mfu));
    figures.push_back(absl::StrFormat("loss %.4g", p.loss));
    const double eta = EtaSeconds(p);
    if (eta >= 0) figures.push_back(absl::StrCat("ETA ", DurationText(eta)));
  }
  // Bar: between 10 and 30 cells, shrinking first; figures go when even 10 cells do not fit.
  const std::string head = p.state + " [";
  const std::string tail = "] " + counts;
  auto line_without_bar = [&](size_t n_figures) {
    std::string s = head + tail;
    for (size_t i = 0; i < n_figures; ++i) s += " | " + figures[i];
    return s;
  };
  size_t n = figures.size();
  while (n > 0 && static_cast<int>(line_without_bar(n).size()) + 10 > width) --n;
  const int room = width - static_cast<int>(line_without_bar(n).size());
  const int cells = std::clamp(room, 0, 30);
  const int filled = static_cast<int>(fraction * cells);
  std::string bar = std::string(filled, '#') + std::string(cells - filled, '.');
  std::string line = head + bar + tail;
  for (size_t i = 0; i < n; ++i) line += " | " + figures[i];
  if (static_cast<int>(line.size()) > width) line.resize(width);
  return line;
}

void ProgressBar::Draw(const Progress& p) {
  last_ = p;
  // Stay one column short of the edge: some terminals wrap when the last column is written.
  std::fprintf(out_, "\r\033[K%s", RenderProgress(p, width_ - 1).c_str());
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::PrintLine(const std::string& line) {
  std::fprintf(out_, "\r\033[K%s\n", line.c_str());
  if (drawn_) {
    Draw(last_);
  } else {
    std::fflush(out_);
  }
}

void ProgressBar::Finish() {
  if (!drawn_) return;
  std::fprintf(out_, "\n");
  std::fflush(out_);
  drawn_ = false;
}

}  // namespace dropless::cli
