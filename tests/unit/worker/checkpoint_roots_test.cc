// CheckCheckpointDirInRoots and ParseCheckpointRoots (worker/rank/checkpoint_roots.h): a job's
// checkpoint.dir must be inside the daemon's --checkpoint-roots as written and as the filesystem
// resolves it; and the daemon's config reads and checks the roots.
#include "worker/rank/checkpoint_roots.h"

#include <unistd.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/daemon/worker_config.h"

namespace dropless {
namespace {

class CheckpointRootsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmp = ::testing::TempDir();
    while (tmp.size() > 1 && tmp.back() == '/') tmp.pop_back();
    base_ = absl::StrCat(tmp, "/checkpoint-roots-", getpid(), "-", std::random_device{}());
    root_ = base_ + "/root";
    std::filesystem::create_directories(root_ + "/existing");
    std::filesystem::create_directories(base_ + "/outside");
    std::filesystem::create_directory_symlink(base_ + "/outside", root_ + "/escape");
    std::filesystem::create_directory_symlink(root_ + "/existing", base_ + "/into-root");
  }
  void TearDown() override { std::filesystem::remove_all(base_); }
  std::string base_, root_;
};

TEST_F(CheckpointRootsTest, InsideTheRootsAsWrittenAndAsResolved) {
  const std::vector<std::string> roots = {"/nonexistent-root-a", root_};
  for (const std::string& ok : {root_, root_ + "/", root_ + "/existing", root_ + "/new/deeper/dir",
                                root_ + "/existing/new"}) {
    EXPECT_TRUE(CheckCheckpointDirInRoots(ok, roots).ok()) << ok;
  }
  for (const std::string& bad :
       {base_ + "/outside/x", root_ + "-sibling/x", root_ + "/../outside", root_ + "/./x",
        root_ + "//x", root_ + "/escape/x", root_ + "/escape", base_ + "/into-root/x",
        std::string("relative/dir"), std::string("/")}) {
    const absl::Status st = CheckCheckpointDirInRoots(bad, roots);
    ASSERT_FALSE(st.ok()) << bad;
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(st.message(), absl::StrCat("checkpoint.dir: ", bad,
                                                             " is not inside this worker's "
                                                             "checkpoint roots (/nonexistent-root-a,",
                                                             root_)))
        << st;
  }
  EXPECT_TRUE(CheckCheckpointDirInRoots(base_ + "/outside/x", {}).ok()) << "no roots: anywhere";
}

TEST_F(CheckpointRootsTest, RootsAreAbsoluteDirectoriesOtherThanSlash) {
  absl::StatusOr<std::vector<std::string>> roots = ParseCheckpointRoots("/a/,/b//c", "f");
  ASSERT_FALSE(roots.ok()) << "an empty component";
  roots = ParseCheckpointRoots("/a/,/b/c", "f");
  ASSERT_TRUE(roots.ok()) << roots.status();
  EXPECT_EQ(*roots, (std::vector<std::string>{"/a", "/b/c"}));
  EXPECT_EQ(JoinCheckpointRoots(*roots), "/a,/b/c");
  EXPECT_TRUE(ParseCheckpointRoots("", "f")->empty());
  for (const char* bad : {"/", "relative", "/a,,/b", "/a/../b", "/a/./b", "/a,"}) {
    absl::StatusOr<std::vector<std::string>> r = ParseCheckpointRoots(bad, "checkpoint_roots");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_TRUE(absl::StartsWith(r.status().message(), "checkpoint_roots: ")) << r.status();
  }
}

TEST_F(CheckpointRootsTest, TheDaemonsConfigReadsThemFromFileAndFlag) {
  const HostFacts host{"h", 4, "/tmp"};
  WorkerSettings none;
  none.insecure = true;
  absl::StatusOr<WorkerConfig> c = ResolveWorkerConfig(none, none, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->checkpoint_roots.empty());
  absl::StatusOr<WorkerSettings> file =
      ParseWorkerSettingsYaml("checkpoint_roots: /var/lib/dropless/checkpoints\n");
  ASSERT_TRUE(file.ok()) << file.status();
  file->insecure = true;
  c = ResolveWorkerConfig(*file, none, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_roots, std::vector<std::string>{"/var/lib/dropless/checkpoints"});
  WorkerSettings flags = none;
  flags.checkpoint_roots = "/scratch/ckpt";
  c = ResolveWorkerConfig(*file, flags, host);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->checkpoint_roots, std::vector<std::string>{"/scratch/ckpt"});
  flags.checkpoint_roots = "scratch";
  c = ResolveWorkerConfig(none, flags, host);
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(absl::StartsWith(c.status().message(), "checkpoint_roots: ")) << c.status();
}

}  // namespace
}  // namespace dropless
