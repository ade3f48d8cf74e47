// gRPC metadata the coordinator's API sends beside its messages, shared by the coordinator and the
// CLI (one spelling of each key).
#ifndef DROPLESS_COMMON_API_METADATA_H_
#define DROPLESS_COMMON_API_METADATA_H_

namespace dropless {

// Initial metadata of a GetLogs stream the coordinator accepted, sent before any line: a follower
// whose stream then ends UNAVAILABLE lost a coordinator it had reached, and reconnects.
inline constexpr char kLogStreamOpenMetadata[] = "dropless-log-stream-open";

// Trailing metadata of a worker Session the coordinator ended with INVALID_ARGUMENT at a queued
// message it refuses as malformed: that message's seq (decimal). The daemon drops exactly that
// message; a refusal without it (the Hello) drops nothing.
inline constexpr char kRefusedSeqMetadata[] = "dropless-refused-seq";

}  // namespace dropless

#endif  // DROPLESS_COMMON_API_METADATA_H_
