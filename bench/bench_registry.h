// dropless-bench sub-benchmarks register themselves here; bench/main.cc dispatches
// `dropless-bench <name> [flags]` to them. Each lives in its own bench/<name>_bench.{cc,cu}.
#ifndef DROPLESS_BENCH_BENCH_REGISTRY_H_
#define DROPLESS_BENCH_BENCH_REGISTRY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace dropless::bench {

// argv excludes the program and sub-benchmark names. Returns the process exit code.
using BenchMain = std::function<int(const std::vector<std::string>& args)>;

struct BenchEntry {
  std::string help;
  BenchMain main;
};

inline std::map<std::string, BenchEntry>& Registry() {
  static std::map<std::string, BenchEntry> registry;
  return registry;
}

struct Registrar {
  Registrar(const std::string& name, const std::string& help, BenchMain main) {
    Registry()[name] = BenchEntry{help, std::move(main)};
  }
};

}  // namespace dropless::bench

#define DROPLESS_REGISTER_BENCH(var, name, help, fn) \
  static ::dropless::bench::Registrar var##_registrar(name, help, fn)

#endif  // DROPLESS_BENCH_BENCH_REGISTRY_H_
