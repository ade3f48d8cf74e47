// LockedCollectable: what a /metrics endpoint collects when a process updates several series as
// one fact (a step report, jobs moving between states): the registry, collected under the mutex
// those updates hold, so that no scrape sees half of one. Register it with the Exposer instead of
// the registry; Serialize gives the same text in memory.
#ifndef DROPLESS_COMMON_LOCKED_COLLECTABLE_H_
#define DROPLESS_COMMON_LOCKED_COLLECTABLE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace dropless {

class LockedCollectable : public prometheus::Collectable {
 public:
  // mu must outlive this object; the registry is shared.
  LockedCollectable(std::shared_ptr<prometheus::Registry> registry, absl::Mutex* mu)
      : registry_(std::move(registry)), mu_(mu) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(mu_);
    return registry_->Collect();
  }

  // Prometheus text exposition of one collection.
  std::string Serialize() const { return prometheus::TextSerializer().Serialize(Collect()); }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  absl::Mutex* mu_;
};

}  // namespace dropless

#endif  // DROPLESS_COMMON_LOCKED_COLLECTABLE_H_
