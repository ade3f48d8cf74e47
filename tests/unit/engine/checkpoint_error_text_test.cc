// Checkpoint errors quote what they repeat from a file: the files are anyone's who can write the
// checkpoint.dir, and the errors reach logs that another user may print to a terminal, where raw
// control characters would rewrite the screen or set the clipboard (OSC 52).
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/job_error.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/moe_checkpoint_test_util.h"
#include "worker/engine/checkpoint/checkpoint_claim.h"
#include "worker/engine/checkpoint/json.h"
#include "worker/engine/checkpoint/moe_checkpoint.h"
#include "worker/engine/checkpoint/safetensors.h"

namespace dropless::engine {
namespace {

using checkpoint_testing::CraftDataFile;
using checkpoint_testing::EditManifest;
using checkpoint_testing::RankState;
using checkpoint_testing::TinyJob;
using checkpoint_testing::WriteText;

// ESC ] 52 ; c ; <base64> BEL: "set the clipboard" in xterm and most terminals.
constexpr char kOsc52[] = "\x1b]52;c;cm0gLXJmIH4=\x07";

// A byte below 0x20, DEL, or a C1 control character (U+0080-U+009F in UTF-8: C2 80..C2 9F).
bool HasControlBytes(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return true;
    if (c == 0xc2 && i + 1 < text.size()) {
      const unsigned char next = static_cast<unsigned char>(text[i + 1]);
      if (next >= 0x80 && next <= 0x9f) return true;
    }
  }
  return false;
}

class CheckpointErrorTextTest : public checkpoint_testing::CheckpointDirTest {
 protected:
  // Rank 0's checkpoint of step 5 in a fresh directory, tampered with, read back: its error.
  absl::Status WriteThenRead(const std::function<void()>& tamper) {
    std::filesystem::remove_all(dir_);
    RankState state(TinyJob(1, 1), 0, 1);
    EXPECT_TRUE(state.Write(dir_, 5).ok());
    tamper();
    return state.Read(dir_).status();
  }
};

TEST_F(CheckpointErrorTextTest, QuoteForMessageEscapesEveryControlCharacter) {
  const std::string quoted =
      json::QuoteForMessage(std::string("a\x1b[2J\x07 b\x7f c\xc2\x9b"
                                        "31m d\xff e\xc3\xa9\n"));
  EXPECT_FALSE(HasControlBytes(quoted)) << quoted;
  EXPECT_EQ(quoted, "\"a\\u001b[2J\\u0007 b? c?31m d\xef\xbf\xbd e\xc3\xa9\\n\"");
}

TEST_F(CheckpointErrorTextTest, AMetadataValueIsQuoted) {
  const absl::Status s = WriteThenRead([&] {
    CraftDataFile(dir_, 5, [](std::vector<SafetensorsTensorRef>*, SafetensorsMetadata* metadata) {
      (*metadata)["step"] = std::string("5") + kOsc52;
    });
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("metadata step is \"5\\u001b]52;c;cm0gLXJmIH4=\\u0007\", expected "
                             "\"5\""),
            absl::string_view::npos)
      << s;
}

TEST_F(CheckpointErrorTextTest, AMetadataValueWithC1AndDelIsQuoted) {
  const absl::Status s = WriteThenRead([&] {
    CraftDataFile(dir_, 5, [](std::vector<SafetensorsTensorRef>*, SafetensorsMetadata* metadata) {
      (*metadata)["seed"] =
          "99\xc2\x9b"
          "2J\x7f";  // U+009B: CSI
    });
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("metadata seed is \"99?2J?\""), absl::string_view::npos) << s;
}

TEST_F(CheckpointErrorTextTest, ATensorNameIsQuoted) {
  const absl::Status s = WriteThenRead([&] {
    CraftDataFile(dir_, 5, [](std::vector<SafetensorsTensorRef>* tensors, SafetensorsMetadata*) {
      for (SafetensorsTensorRef& t : *tensors) {
        if (t.name == "layers.1.router.weight") t.name += kOsc52;
      }
    });
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find(
                "unexpected tensor \"layers.1.router.weight\\u001b]52;c;cm0gLXJmIH4=\\u0007\""),
            absl::string_view::npos)
      << s;
}

TEST_F(CheckpointErrorTextTest, ManifestFieldsAreQuoted) {
  // The format version, a string where an integer belongs.
  absl::Status s = WriteThenRead(
      [&] { EditManifest(dir_, 0, "\"version\": 1", "\"version\": \"\\u001b[31m1\\u0007\""); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("field \"version\" is the string \"\\u001b[31m1\\u0007\""),
            absl::string_view::npos)
      << s;
  // The router, another one's name.
  s = WriteThenRead([&] {
    EditManifest(dir_, 0, "\"router\": \"softmax\"", "\"router\": \"\\u001b[2Jsigmoid\\u0007\"");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("model.router is \"\\u001b[2Jsigmoid\\u0007\" there"),
            absl::string_view::npos)
      << s;
  // The data file's name, which paths in later messages would carry.
  s = WriteThenRead([&] {
    EditManifest(dir_, 0, "\"name\": \"rank-0-step-5",
                 "\"name\": \"rank-0-step-5\\u001b]0;x\\u0007");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  // A duplicate key, repeated by the JSON parser.
  s = WriteThenRead([&] {
    EditManifest(dir_, 0, "\"format\"",
                 "\"\\u001b]0;x\\u0007\": 1, \"\\u001b]0;x\\u0007\": 2, \"format\"");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("duplicate key \"\\u001b]0;x\\u0007\""), absl::string_view::npos) << s;
}

TEST_F(CheckpointErrorTextTest, OwnerRecordNamesAreQuoted) {
  std::filesystem::create_directories(dir_);
  // Another job's record, its job id a control sequence; then another user's.
  WriteText(CheckpointClaimPath(dir_, 0),
            std::string("dropless-checkpoint-owner job=x") + kOsc52 + " attempt=1\n");
  absl::Status s = CheckCheckpointClaim(dir_, {"job-a", 1, 0});
  EXPECT_TRUE(IsJobError(s)) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("job \"x\\u001b]52;c;cm0gLXJmIH4=\\u0007\" (attempt 1)"),
            absl::string_view::npos)
      << s;
  WriteText(CheckpointClaimPath(dir_, 0),
            "dropless-checkpoint-owner job=b attempt=1\nuser=eve\\x1b]52;c;eA==\\x07\\xc2\\x9b\n");
  s = ClaimCheckpoints(dir_, {"job-a", 1, 0, "alice"});
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_FALSE(HasControlBytes(s.message())) << s;
  EXPECT_NE(s.message().find("of user \"eve\\u001b]52;c;eA==\\u0007?\""), absl::string_view::npos)
      << s;
}

}  // namespace
}  // namespace dropless::engine
