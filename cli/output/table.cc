#include "cli/output/table.h"

#include <algorithm>

namespace dropless::cli {

Table::Table(std::vector<std::string> headers) { rows_.push_back(std::move(headers)); }

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(std::max(cells.size(), rows_[0].size()));
  rows_.push_back(std::move(cells));
}

std::string Table::Render() const {
  std::vector<size_t> width(rows_[0].size(), 0);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < width.size(); ++i) {
      line += row[i];
      if (i + 1 < width.size()) line += std::string(width[i] - row[i].size() + 3, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace dropless::cli
