// The dropless release every binary reports (`dropless version`, the worker's registration, the
// coordinator's GetVersion): the CMake project version.
#ifndef DROPLESS_COMMON_VERSION_H_
#define DROPLESS_COMMON_VERSION_H_

namespace dropless {

const char* DroplessVersion();

}  // namespace dropless

#endif  // DROPLESS_COMMON_VERSION_H_
