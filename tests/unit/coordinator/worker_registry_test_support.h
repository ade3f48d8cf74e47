// Helpers of the WorkerRegistry unit tests (worker_registry_test.cc,
// worker_registry_churn_test.cc): registrations, hellos and sessions as the tests make them.
#ifndef DROPLESS_TESTS_UNIT_COORDINATOR_WORKER_REGISTRY_TEST_SUPPORT_H_
#define DROPLESS_TESTS_UNIT_COORDINATOR_WORKER_REGISTRY_TEST_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "coordinator/controller/worker_registry.h"
#include "coordinator/controller/worker_session.h"
#include "dropless/v1/worker_service.pb.h"

namespace dropless::coordinator::registry_testing {

inline constexpr int64_t kLeaseMs = 1000;

inline v1::RegisterWorkerRequest Request(const std::string& node, int slots) {
  v1::RegisterWorkerRequest request;
  request.set_node(node);
  request.set_slot_kind("cpu");
  for (int i = 0; i < slots; ++i) request.add_devices("cpu");
  return request;
}

inline v1::Hello HelloAs(const std::string& worker_id, const std::string& boot_id = "boot-1") {
  v1::Hello hello;
  hello.set_worker_id(worker_id);
  hello.set_boot_id(boot_id);
  return hello;
}

inline std::shared_ptr<WorkerSession> Session(const std::string& certified_node = "") {
  return std::make_shared<WorkerSession>("peer", certified_node, nullptr);
}

}  // namespace dropless::coordinator::registry_testing

#endif  // DROPLESS_TESTS_UNIT_COORDINATOR_WORKER_REGISTRY_TEST_SUPPORT_H_
