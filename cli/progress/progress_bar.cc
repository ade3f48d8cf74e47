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
  const std::string counts = absl::StrFormat("%d/%d %3d%%", p.step, p.steps,
                                             static_cast<int>(fraction * 100.0 + 1e-9));
  // Fixed-width figures, so that the bar does not jitter as the numbers change. `keep`: the
  // order in which they go when the terminal is narrow (highest goes last).
  struct Figure {
    std::string text;
    int keep;
  };
  std::vector<Figure> figures;
  if (p.has_metrics) {
    const std::string step_time =
        p.step_seconds < 10 ? absl::StrFormat("%6.1f ms/step", 1e3 * p.step_seconds)
                            : absl::StrFormat("%6s/step", DurationText(p.step_seconds));
    const double eta = EtaSeconds(p);
    figures.push_back({step_time, 2});
    figures.push_back({absl::StrFormat("%7.3g TFLOP/s", p.tflops), 1});
    figures.push_back({absl::StrFormat("MFU %5.1f%%", 100.0 * p.mfu), 3});
    figures.push_back({absl::StrFormat("loss %-9.4g", p.loss), 4});
    figures.push_back({absl::StrFormat("ETA %-7s", eta >= 0 ? DurationText(eta) : "-"), 5});
  }
  const std::string head = absl::StrFormat("%-9s [", p.state);  // SCHEDULED is the longest
  const std::string tail = "] " + counts;
  constexpr int kMinBar = 10, kMaxBar = 30;
  auto length = [&] {
    size_t n = head.size() + tail.size();
    for (const Figure& f : figures) n += 2 + f.text.size();
    return static_cast<int>(n);
  };
  while (!figures.empty() && length() + kMinBar > width) {
    auto lowest = std::min_element(figures.begin(), figures.end(),
                                   [](const Figure& a, const Figure& b) { return a.keep < b.keep; });
    figures.erase(lowest);
  }
  const int cells = std::clamp(width - length(), 0, kMaxBar);
  const int filled = static_cast<int>(fraction * cells);
  std::string line = head + std::string(filled, '#') + std::string(cells - filled, '.') + tail;
  for (const Figure& f : figures) line += "  " + f.text;
  while (!line.empty() && line.back() == ' ') line.pop_back();
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
