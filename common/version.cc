#include "common/version.h"

namespace dropless {

const char* DroplessVersion() { return DROPLESS_VERSION; }

}  // namespace dropless
