// CRC-32C (Castagnoli), the checksum of checkpoint files: SSE4.2 instructions on x86-64 when the
// CPU has them, slicing-by-8 tables elsewhere; both give the same value.
#ifndef DROPLESS_WORKER_ENGINE_CHECKPOINT_CRC32C_H_
#define DROPLESS_WORKER_ENGINE_CHECKPOINT_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace dropless::engine {

// The CRC-32C of (the data `crc` is the CRC-32C of) followed by `data`: Crc32cExtend(0, d, n) is
// the CRC-32C of d, and extending piece by piece gives the CRC-32C of the concatenation.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }

namespace crc32c_internal {
// The table implementation alone (tests compare it with the dispatching one).
uint32_t ExtendPortable(uint32_t crc, const void* data, size_t size);
}  // namespace crc32c_internal

}  // namespace dropless::engine

#endif  // DROPLESS_WORKER_ENGINE_CHECKPOINT_CRC32C_H_
