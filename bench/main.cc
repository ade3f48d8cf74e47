// dropless-bench: prints a table per sub-benchmark and writes the BENCH.md JSON (--json PATH).
#include <cstdio>
#include <string>
#include <vector>

#include "bench/bench_registry.h"

int main(int argc, char** argv) {
  auto& registry = dropless::bench::Registry();
  if (argc < 2 || registry.count(argv[1]) == 0) {
    std::fprintf(stderr, "usage: dropless-bench <benchmark> [flags]\nbenchmarks:\n");
    for (const auto& [name, entry] : registry) {
      std::fprintf(stderr, "  %-10s %s\n", name.c_str(), entry.help.c_str());
    }
    return argc < 2 ? 2 : 1;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  return registry[argv[1]].main(args);
}
