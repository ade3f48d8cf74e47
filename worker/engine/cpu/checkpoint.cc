#include "worker/engine/cpu/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dropless::cpu {
namespace {

constexpr char kMagic[8] = {'D', 'L', 'C', 'K', 'P', 'T', '\0', '\0'};
constexpr int kIdentityFields = 10;

absl::Status ErrnoStatus(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat("checkpoint: ", what, " ", path, ": ", std::strerror(errno)));
}

uint64_t Fnv1a(uint64_t hash, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    hash ^= p[i];
    hash *= 0x100000001b3ULL;
  }
  return hash;
}
constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ULL;

template <typename V>
void Append(std::string* out, V value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));
}

std::vector<int64_t> IdentityFields(const CheckpointIdentity& id) {
  return {id.rank, id.world_size, id.ep, id.dp, id.hidden, id.ffn, id.experts, id.topk,
          id.shared_experts, id.layers};
}

absl::Status MakeDirs(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoStatus("mkdir", prefix);
  }
  return absl::OkStatus();
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = write(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("write", path);
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, void* data, size_t bytes, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = read(fd, p, bytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("read", path);
    }
    if (n == 0) return absl::DataLossError(absl::StrCat("checkpoint: ", path, " is truncated"));
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

class FileCloser {
 public:
  explicit FileCloser(int fd) : fd_(fd) {}
  ~FileCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

}  // namespace

bool CheckpointIdentity::operator==(const CheckpointIdentity& other) const {
  return IdentityFields(*this) == IdentityFields(other) && seed == other.seed;
}

std::string RankCheckpointPath(const std::string& dir, int64_t rank) {
  return absl::StrCat(dir, "/rank-", rank, ".ckpt");
}

absl::Status WriteRankCheckpoint(const std::string& dir, const CheckpointIdentity& identity,
                                 int64_t step, absl::Span<const absl::Span<const float>> tensors) {
  if (absl::Status status = MakeDirs(dir); !status.ok()) return status;
  std::string header(kMagic, sizeof(kMagic));
  Append(&header, kCheckpointVersion);
  Append(&header, static_cast<uint32_t>(tensors.size()));
  Append(&header, step);
  for (int64_t field : IdentityFields(identity)) Append(&header, field);
  Append(&header, identity.seed);
  for (const auto& tensor : tensors) Append(&header, static_cast<int64_t>(tensor.size()));

  const std::string path = RankCheckpointPath(dir, identity.rank);
  const std::string temp = path + ".tmp";
  const int fd = open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus("open", temp);
  FileCloser closer(fd);
  if (absl::Status s = WriteAll(fd, header.data(), header.size(), temp); !s.ok()) return s;
  uint64_t checksum = kFnvOffset;
  for (const auto& tensor : tensors) {
    const size_t bytes = tensor.size() * sizeof(float);
    checksum = Fnv1a(checksum, tensor.data(), bytes);
    if (absl::Status s = WriteAll(fd, tensor.data(), bytes, temp); !s.ok()) return s;
  }
  if (absl::Status s = WriteAll(fd, &checksum, sizeof(checksum), temp); !s.ok()) return s;
  if (fsync(fd) != 0) return ErrnoStatus("fsync", temp);
  if (close(closer.Release()) != 0) return ErrnoStatus("close", temp);
  if (rename(temp.c_str(), path.c_str()) != 0) return ErrnoStatus("rename", temp);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return ErrnoStatus("open", dir);
  const int sync_result = fsync(dir_fd);
  close(dir_fd);
  if (sync_result != 0) return ErrnoStatus("fsync", dir);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ReadRankCheckpoint(const std::string& dir,
                                           const CheckpointIdentity& identity,
                                           absl::Span<const absl::Span<float>> tensors) {
  const std::string path = RankCheckpointPath(dir, identity.rank);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("checkpoint: no ", path));
    return ErrnoStatus("open", path);
  }
  FileCloser closer(fd);
  char magic[sizeof(kMagic)];
  uint32_t version = 0, count = 0;
  int64_t step = 0;
  if (absl::Status s = ReadAll(fd, magic, sizeof(magic), path); !s.ok()) return s;
  if (std::memcmp(magic, kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", path, " is not a dropless checkpoint"));
  }
  if (absl::Status s = ReadAll(fd, &version, sizeof(version), path); !s.ok()) return s;
  if (version != kCheckpointVersion) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint: %s has version %d, this engine reads version %d", path, version,
        kCheckpointVersion));
  }
  if (absl::Status s = ReadAll(fd, &count, sizeof(count), path); !s.ok()) return s;
  if (absl::Status s = ReadAll(fd, &step, sizeof(step), path); !s.ok()) return s;
  std::vector<int64_t> fields(kIdentityFields);
  CheckpointIdentity stored;
  if (absl::Status s = ReadAll(fd, fields.data(), fields.size() * sizeof(int64_t), path); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadAll(fd, &stored.seed, sizeof(stored.seed), path); !s.ok()) return s;
  if (fields != IdentityFields(identity) || stored.seed != identity.seed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint: ", path, " belongs to another job shape (rank, world, ep, dp, hidden, ffn, "
        "experts, topk, shared_experts, layers or seed differ)"));
  }
  if (count != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint: %s holds %d tensors, expected %d", path, count, tensors.size()));
  }
  std::vector<int64_t> sizes(count);
  if (absl::Status s = ReadAll(fd, sizes.data(), sizes.size() * sizeof(int64_t), path); !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < count; ++i) {
    if (sizes[i] != static_cast<int64_t>(tensors[i].size())) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "checkpoint: %s tensor %d has %d values, expected %d", path, i, sizes[i],
          tensors[i].size()));
    }
  }
  uint64_t checksum = kFnvOffset;
  for (const auto& tensor : tensors) {
    const size_t bytes = tensor.size() * sizeof(float);
    if (absl::Status s = ReadAll(fd, tensor.data(), bytes, path); !s.ok()) return s;
    checksum = Fnv1a(checksum, tensor.data(), bytes);
  }
  uint64_t stored_checksum = 0;
  if (absl::Status s = ReadAll(fd, &stored_checksum, sizeof(stored_checksum), path); !s.ok()) {
    return s;
  }
  if (stored_checksum != checksum) {
    return absl::DataLossError(absl::StrCat("checkpoint: ", path, " fails its checksum"));
  }
  if (step < 0) return absl::DataLossError(absl::StrCat("checkpoint: ", path, " has a negative step"));
  return step;
}

}  // namespace dropless::cpu
