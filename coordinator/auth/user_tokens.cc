#include "coordinator/auth/user_tokens.h"

#include <yaml-cpp/yaml.h>

#include "absl/strings/str_cat.h"
#include "common/private_file.h"
#include "common/status_context.h"

namespace dropless::coordinator {
namespace {

constexpr size_t kMaxTokensFileBytes = 1 << 20;
constexpr size_t kMinTokenBytes = 16;

absl::StatusOr<std::string> Field(const YAML::Node& entry, const char* key, size_t index,
                                  bool required) {
  const YAML::Node value = entry[key];
  if (!value) {
    if (!required) return std::string();
    return absl::InvalidArgumentError(absl::StrCat("tokens[", index, "]: ", key, " is missing"));
  }
  try {
    return value.as<std::string>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat("tokens[", index, "].", key, ": not a string"));
  }
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer: return "viewer";
    case Role::kSubmitter: return "submitter";
    case Role::kAdmin: return "admin";
  }
  return "viewer";
}

absl::StatusOr<Role> ParseRole(absl::string_view text) {
  for (Role role : {Role::kViewer, Role::kSubmitter, Role::kAdmin}) {
    if (text == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("role \"", text, "\" is none of viewer, submitter, admin"));
}

absl::StatusOr<UserTokens> UserTokens::ParseYaml(const std::string& yaml) {
  if (yaml.size() > kMaxTokensFileBytes) {
    return absl::InvalidArgumentError("larger than 1 MiB");
  }
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not YAML: ", e.what()));
  }
  if (!root.IsMap() || !root["tokens"] || !root["tokens"].IsSequence()) {
    return absl::InvalidArgumentError("must be a mapping with a list `tokens`");
  }
  UserTokens tokens;
  size_t index = 0;
  for (const YAML::Node& entry : root["tokens"]) {
    if (!entry.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat("tokens[", index, "]: must be a mapping"));
    }
    absl::StatusOr<std::string> token = Field(entry, "token", index, true);
    if (!token.ok()) return token.status();
    absl::StatusOr<std::string> user = Field(entry, "user", index, true);
    if (!user.ok()) return user.status();
    absl::StatusOr<std::string> role_text = Field(entry, "role", index, true);
    if (!role_text.ok()) return role_text.status();
    absl::StatusOr<std::string> expires_text = Field(entry, "expires", index, false);
    if (!expires_text.ok()) return expires_text.status();
    if (token->size() < kMinTokenBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens[", index, "] (user ", *user, "): a token must have at least ", kMinTokenBytes,
          " characters"));
    }
    if (user->empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tokens[", index, "]: user is empty"));
    }
    TokenGrant grant;
    grant.user = *user;
    absl::StatusOr<Role> role = ParseRole(*role_text);
    if (!role.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens[", index, "] (user ", *user, "): ", role.status().message()));
    }
    grant.role = *role;
    if (!expires_text->empty()) {
      std::string error;
      if (!absl::ParseTime(absl::RFC3339_full, *expires_text, &grant.expires, &error)) {
        return absl::InvalidArgumentError(absl::StrCat("tokens[", index, "] (user ", *user,
                                                       "): expires: not RFC 3339: ", error));
      }
    }
    if (!tokens.grants_.emplace(*token, grant).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tokens[", index, "] (user ", *user, "): the same token twice"));
    }
    ++index;
  }
  return tokens;
}

absl::StatusOr<UserTokens> UserTokens::LoadFile(const std::string& path) {
  // Mode and owner checked on the descriptor the text is read from (common/private_file.h).
  absl::StatusOr<std::string> text = ReadPrivateFile(path);
  if (!text.ok()) return WithContext(absl::StrCat("tokens file ", path), text.status());
  absl::StatusOr<UserTokens> tokens = ParseYaml(*text);
  if (!tokens.ok()) {
    return WithContext(absl::StrCat("tokens file ", path), tokens.status());
  }
  return tokens;
}

absl::Status CheckTokenUnexpired(absl::string_view user, absl::Time expires, absl::Time now) {
  if (now < expires) return absl::OkStatus();
  return absl::UnauthenticatedError(
      absl::StrCat("expired bearer token of user ", user, " (expired ",
                   absl::FormatTime(absl::RFC3339_sec, expires, absl::UTCTimeZone()), ")"));
}

const TokenGrant* UserTokens::Find(absl::string_view token) const {
  auto it = grants_.find(token);
  return it == grants_.end() ? nullptr : &it->second;
}

}  // namespace dropless::coordinator
