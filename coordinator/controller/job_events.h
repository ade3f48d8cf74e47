// Events as the controller records them: appended to a StoreWrite, stored with the change they
// describe, then published to the job's watchers.
#ifndef DROPLESS_COORDINATOR_CONTROLLER_JOB_EVENTS_H_
#define DROPLESS_COORDINATOR_CONTROLLER_JOB_EVENTS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "coordinator/store/job_store.h"
#include "coordinator/util/clock.h"

namespace dropless::coordinator {

// An event stamped now; an empty job_id makes it a cluster event (workers, start-up).
inline void AddEvent(StoreWrite& write, const std::string& job_id, int32_t attempt,
                     std::string type, std::string message) {
  v1::Event& event = write.events.emplace_back();
  event.set_time_ms(NowMs());
  event.set_job_id(job_id);
  event.set_attempt(attempt);
  event.set_type(std::move(type));
  event.set_message(std::move(message));
}

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_CONTROLLER_JOB_EVENTS_H_
