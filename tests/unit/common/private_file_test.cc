// ReadPrivateFile (common/private_file.h): the one reader of secret files, as ssh with a private
// key: refuses a file its group or others may read or write, or one that belongs to neither the
// reader nor root; checks the file it reads (a link's target), and reads it from that descriptor.
#include "common/private_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A file of `text` and mode `mode` under the test's temporary folder; "" when it could not be made.
std::string WriteFile(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = ::testing::TempDir() + "/" + name;
  unlink(path.c_str());  // a 0400 one of an earlier run could not be written again
  std::ofstream(path, std::ios::binary) << text;
  return chmod(path.c_str(), mode) == 0 ? path : "";
}

TEST(ReadPrivateFileTest, ReadsAFileOnlyItsOwnerMayUse) {
  for (mode_t mode : {0600, 0400, 0700}) {
    const std::string path = WriteFile("private.secret", "s3cret\nline two\n", mode);
    ASSERT_FALSE(path.empty());
    absl::StatusOr<std::string> text = ReadPrivateFile(path);
    ASSERT_TRUE(text.ok()) << mode << ": " << text.status();
    EXPECT_EQ(*text, "s3cret\nline two\n");
  }
}

TEST(ReadPrivateFileTest, RefusesAFileItsGroupOrOthersMayReadOrWrite) {
  for (const auto& [mode, who] : {std::pair<mode_t, const char*>{0644, "group read, others read"},
                                  {0640, "group read"},
                                  {0620, "group write"},
                                  {0604, "others read"},
                                  {0602, "others write"},
                                  {0444, "group read, others read"}}) {
    const std::string path = WriteFile("open.secret", "s3cret\n", mode);
    ASSERT_FALSE(path.empty());
    absl::StatusOr<std::string> text = ReadPrivateFile(path);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_EQ(std::string(text.status().message()),
              absl::StrFormat("mode %04o gives others than its owner access (%s); a file of "
                              "bearer tokens must be readable by its owner only: chmod 600 %s",
                              mode, who, path));
    EXPECT_THAT(std::string(text.status().message()), ::testing::Not(HasSubstr("s3cret")));
  }
}

// A link is followed, as open() follows it: what is checked is the file read, the target.
TEST(ReadPrivateFileTest, ChecksALinksTarget) {
  const std::string link = ::testing::TempDir() + "/link.secret";
  for (const auto& [mode, ok] : {std::pair<mode_t, bool>{0400, true}, {0644, false}}) {
    const std::string target = WriteFile("target.secret", "s3cret", mode);
    ASSERT_FALSE(target.empty());
    unlink(link.c_str());
    ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
    absl::StatusOr<std::string> text = ReadPrivateFile(link);
    EXPECT_EQ(text.ok(), ok) << mode << ": " << text.status();
    if (ok) {
      EXPECT_EQ(*text, "s3cret");
    } else {
      EXPECT_THAT(std::string(text.status().message()), StartsWith("mode 0644 gives"));
    }
  }
}

TEST(ReadPrivateFileTest, AFileThatCannotBeOpenedIsNotFoundWithTheReason) {
  absl::StatusOr<std::string> text = ReadPrivateFile("/nonexistent/secret");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(text.status().message()), "cannot open (No such file or directory)");
}

// Another user's file, mode 0600 or not, is refused: whoever owns it could have written it (or
// may read it). Only root can give a file away, so the test needs root (as the CI runs).
TEST(ReadPrivateFileTest, RefusesAFileOfAnotherUser) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "only root can make a file owned by another user (chown); the CI runs as root";
  }
  const std::string path = WriteFile("others.secret", "s3cret", 0600);
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(chown(path.c_str(), 65534, 65534), 0);
  absl::StatusOr<std::string> text = ReadPrivateFile(path);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(std::string(text.status().message()),
            absl::StrCat("owned by uid 65534, neither this process's user (uid 0) nor root; a "
                         "file of bearer tokens must belong to the user who reads it: chown 0 ",
                         path));
  // Root's own file is read, as is (for any user) a file of root's.
  ASSERT_EQ(chown(path.c_str(), 0, 0), 0);
  EXPECT_TRUE(ReadPrivateFile(path).ok());
}

}  // namespace
}  // namespace dropless
