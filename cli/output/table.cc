#include "cli/output/table.h"

#include <algorithm>

namespace dropless::cli {

Table::Table(std::vector<std::string> headers) { rows_.push_back(std::move(headers)); }

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(std::max(cells.size(), rows_[0].size()));
  rows_.push_back(std::move(cells));
}

std::vector<size_t> Table::Widths() const {
  std::vector<size_t> width(rows_[0].size(), 0);
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], row[i].size());
    }
  }
  return width;
}

std::string Table::Render() const { return RenderFrom(0, Widths()); }

std::string Table::RenderRowsLike(const Table& like) const {
  std::vector<size_t> width = Widths();
  const std::vector<size_t> theirs = like.Widths();
  for (size_t i = 0; i < width.size() && i < theirs.size(); ++i) {
    width[i] = std::max(width[i], theirs[i]);
  }
  return RenderFrom(1, width);
}

std::string Table::RenderFrom(size_t first_row, const std::vector<size_t>& width) const {
  std::string out;
  for (size_t r = first_row; r < rows_.size(); ++r) {
    const auto& row = rows_[r];
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
