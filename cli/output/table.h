// Table: the human output of `get` (kubectl style: upper-case headers, columns padded by 3 spaces).
#ifndef DROPLESS_CLI_OUTPUT_TABLE_H_
#define DROPLESS_CLI_OUTPUT_TABLE_H_

#include <string>
#include <vector>

namespace dropless::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> headers);
  // Rows shorter than the headers are padded with empty cells.
  void AddRow(std::vector<std::string> cells);
  std::string Render() const;
  // The rows without the header line, each column at least as wide as in `like` (so rows of a
  // later batch line up under an earlier table's header: `get -w`).
  std::string RenderRowsLike(const Table& like) const;

 private:
  std::vector<size_t> Widths() const;
  std::string RenderFrom(size_t first_row, const std::vector<size_t>& width) const;

  std::vector<std::vector<std::string>> rows_;  // rows_[0]: headers
};

}  // namespace dropless::cli

#endif  // DROPLESS_CLI_OUTPUT_TABLE_H_
