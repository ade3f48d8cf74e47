// UserTokens: who a bearer token belongs to and what it may do, read from the coordinator's tokens
// file (YAML; scripts/dev-certs writes one):
//
//   tokens:
//     - {token: 3f9c..., user: alice, role: submitter}
//     - {token: 77ab..., user: ops, role: admin, expires: "2027-01-01T00:00:00Z"}
//
// Roles, each including the ones before it: viewer (read jobs, workers, logs, metrics),
// submitter (submit jobs; see and cancel its own), admin (every job).
#ifndef DROPLESS_COORDINATOR_AUTH_USER_TOKENS_H_
#define DROPLESS_COORDINATOR_AUTH_USER_TOKENS_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dropless::coordinator {

enum class Role { kViewer = 0, kSubmitter = 1, kAdmin = 2 };

absl::string_view RoleName(Role role);
// InvalidArgument naming the text when it is no role.
absl::StatusOr<Role> ParseRole(absl::string_view text);

struct TokenGrant {
  std::string user;
  Role role = Role::kViewer;
  absl::Time expires = absl::InfiniteFuture();
};

// OK while `now` is before `expires`; Unauthenticated naming the user and when their token
// expired (never the token itself) from then on. The one check of a token's expiry: at a call's
// start (CallAuthorizer) and at each wake-up of a stream that outlives it (JobServiceImpl).
absl::Status CheckTokenUnexpired(absl::string_view user, absl::Time expires, absl::Time now);

class UserTokens {
 public:
  // Errors name the file and the entry (never the token itself). A file its group or others may
  // read or write, or owned by neither the coordinator's user nor root, is refused
  // (FailedPrecondition naming the mode and `chmod 600`, or the owner and `chown`), links
  // followed, as ssh refuses such a private key (ReadPrivateFile, common/private_file.h).
  static absl::StatusOr<UserTokens> LoadFile(const std::string& path);
  static absl::StatusOr<UserTokens> ParseYaml(const std::string& yaml);

  // The grant of `token`, or null when the file has no such token.
  const TokenGrant* Find(absl::string_view token) const;
  size_t size() const { return grants_.size(); }

 private:
  std::map<std::string, TokenGrant, std::less<>> grants_;
};

}  // namespace dropless::coordinator

#endif  // DROPLESS_COORDINATOR_AUTH_USER_TOKENS_H_
