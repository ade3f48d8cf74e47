#include "coordinator/server/coordinator_config.h"

#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dropless::coordinator {
namespace {

using ::testing::HasSubstr;

TEST(CoordinatorConfigTest, KeysOverlayTheDefaults) {
  absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml(
      "listen: 127.0.0.1:9000\nmetrics_port: 0\nlease_timeout_ms: 3000\ninsecure: true\n",
      CoordinatorConfig{});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->listen, "127.0.0.1:9000");
  EXPECT_EQ(config->metrics_port, 0);
  EXPECT_EQ(config->lease_timeout_ms, 3000);
  EXPECT_EQ(config->db, "dropless.db");  // untouched default
  EXPECT_EQ(config->heartbeat_interval_ms, 1000);
  EXPECT_TRUE(ValidateConfig(*config).ok());
}

TEST(CoordinatorConfigTest, EmptyDocumentKeepsTheBase) {
  CoordinatorConfig base;
  base.db = "x.db";
  absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml("", base);
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->db, "x.db");
}

TEST(CoordinatorConfigTest, UnknownKeyAndWrongTypeAreNamed) {
  absl::StatusOr<CoordinatorConfig> unknown = ApplyConfigYaml("lsiten: x\n", {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("\"lsiten\""));
  absl::StatusOr<CoordinatorConfig> wrong = ApplyConfigYaml("metrics_port: many\n", {});
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr("metrics_port"));
  EXPECT_FALSE(ApplyConfigYaml("[1, 2]\n", {}).ok());
  EXPECT_FALSE(ApplyConfigYaml("listen: [\n", {}).ok());
}

TEST(CoordinatorConfigTest, ValidationNamesTheField) {
  CoordinatorConfig config;
  config.lease_timeout_ms = 500;
  absl::Status lease = ValidateConfig(config);
  EXPECT_THAT(lease.message(), HasSubstr("lease_timeout_ms"));
  config = CoordinatorConfig{};
  config.metrics_port = 70000;
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("metrics_port"));
  // A port past 65535 would wrap (70000 is 4464) and the coordinator would listen elsewhere.
  config = CoordinatorConfig{};
  config.listen = "0.0.0.0:70000";
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("listen: "));
  config = CoordinatorConfig{};
  config.worker_listen = "0.0.0.0:99999";
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("worker_listen: "));
  config = CoordinatorConfig{};
  config.listen = "7070";
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("listen: "));
  absl::StatusOr<CoordinatorConfig> threads =
      ApplyConfigYaml("max_server_threads: 8\ninsecure: true\n", CoordinatorConfig{});
  ASSERT_TRUE(threads.ok()) << threads.status();
  EXPECT_EQ(threads->max_server_threads, 8);
  EXPECT_THAT(ValidateConfig(*threads).message(), HasSubstr("max_server_threads"));
}

TEST(CoordinatorConfigTest, TlsAndTokensAreRequiredUnlessInsecure) {
  CoordinatorConfig config;
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("tls_cert: required with TLS"));
  config.tls_cert = "c.pem";
  config.tls_key = "c.key";
  config.worker_ca = "ca.pem";
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("tokens_file"));
  config.tokens_file = "tokens.yaml";
  EXPECT_TRUE(ValidateConfig(config).ok());
  config.submit_rate_per_second = -1;
  EXPECT_THAT(ValidateConfig(config).message(), HasSubstr("submit_rate_per_second"));
  CoordinatorConfig plaintext;
  plaintext.insecure = true;
  EXPECT_TRUE(ValidateConfig(plaintext).ok());
}

TEST(CoordinatorConfigTest, JobRetentionIsZeroOrAtLeastAnHour) {
  EXPECT_EQ(CoordinatorConfig{}.job_retention, absl::Hours(720));
  absl::StatusOr<CoordinatorConfig> config =
      ApplyConfigYaml("job_retention: 48h\ninsecure: true\n", CoordinatorConfig{});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job_retention, absl::Hours(48));
  EXPECT_TRUE(ValidateConfig(*config).ok());
  config = ApplyConfigYaml("job_retention: 0\ninsecure: true\n", CoordinatorConfig{});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->job_retention, absl::ZeroDuration());  // kept for good
  EXPECT_TRUE(ValidateConfig(*config).ok());
  absl::StatusOr<CoordinatorConfig> vague = ApplyConfigYaml("job_retention: a month\n", {});
  ASSERT_FALSE(vague.ok());
  EXPECT_THAT(vague.status().message(), HasSubstr("job_retention: not a duration"));
  config = ApplyConfigYaml("job_retention: 1h\ninsecure: true\n", CoordinatorConfig{});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(ValidateConfig(*config).ok());
  // Shorter could delete a cancelled job whose ranks are still stopping (kMinJobRetention).
  for (const char* refused : {"-1h", "1s", "59m59s"}) {
    config = ApplyConfigYaml(absl::StrCat("job_retention: ", refused, "\ninsecure: true\n"),
                             CoordinatorConfig{});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_THAT(ValidateConfig(*config).message(),
                HasSubstr(absl::StrCat("job_retention (--job-retention): 0 (finished jobs kept for "
                                       "good) or at least 1h (got ",
                                       refused, ")")));
  }
}

TEST(CoordinatorConfigTest, LostWorkerExpiryIsZeroOrAtLeastAMinute) {
  EXPECT_EQ(CoordinatorConfig{}.lost_worker_expiry, absl::Hours(24));
  for (const auto& [text, expiry] :
       {std::pair{"1m", absl::Minutes(1)}, std::pair{"720h", absl::Hours(720)},
        std::pair{"0", absl::ZeroDuration()}}) {  // 0: kept for good
    absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml(
        absl::StrCat("lost_worker_expiry: ", text, "\ninsecure: true\n"), CoordinatorConfig{});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->lost_worker_expiry, expiry);
    EXPECT_TRUE(ValidateConfig(*config).ok()) << text;
  }
  EXPECT_THAT(ApplyConfigYaml("lost_worker_expiry: a day\n", {}).status().message(),
              HasSubstr("lost_worker_expiry: not a duration"));
  // Shorter, a blip or a restart of the coordinator could make a live worker a new one.
  for (const char* refused : {"-1h", "1s", "59s"}) {
    absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml(
        absl::StrCat("lost_worker_expiry: ", refused, "\ninsecure: true\n"), CoordinatorConfig{});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_THAT(ValidateConfig(*config).message(),
                HasSubstr(absl::StrCat("lost_worker_expiry (--lost-worker-expiry): 0 (lost "
                                       "workers kept for good) or at least 1m (got ",
                                       refused, ")")));
  }
}

TEST(CoordinatorConfigTest, MaxUserPriorityIsWithinTheSpecsRange) {
  EXPECT_EQ(CoordinatorConfig{}.max_user_priority, 100);
  for (int priority : {0, 250, 1000}) {  // 1000: the spec's maximum, no limit
    absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml(
        absl::StrCat("max_user_priority: ", priority, "\ninsecure: true\n"), CoordinatorConfig{});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->max_user_priority, priority);
    EXPECT_TRUE(ValidateConfig(*config).ok()) << priority;
  }
  for (int priority : {-1, 1001}) {
    absl::StatusOr<CoordinatorConfig> config = ApplyConfigYaml(
        absl::StrCat("max_user_priority: ", priority, "\ninsecure: true\n"), CoordinatorConfig{});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_THAT(ValidateConfig(*config).message(),
                HasSubstr(absl::StrCat("max_user_priority (--max-user-priority): must be 0..1000, "
                                       "the spec's priority range (1000: no limit; got ",
                                       priority, ")")));
  }
  EXPECT_THAT(ApplyConfigYaml("max_user_priority: high\n", {}).status().message(),
              HasSubstr("max_user_priority: wrong type"));
}

TEST(CoordinatorConfigTest, ShippedExampleIsValid) {
  absl::StatusOr<CoordinatorConfig> config =
      ApplyConfigFile(DROPLESS_SOURCE_DIR "/configs/coordinator.yaml", CoordinatorConfig{});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(ValidateConfig(*config).ok());
  EXPECT_EQ(config->listen, "0.0.0.0:7070");
  EXPECT_EQ(config->max_user_priority, 100);
}

TEST(CoordinatorConfigTest, MissingFileIsNamed) {
  absl::StatusOr<CoordinatorConfig> config = ApplyConfigFile("/nonexistent/c.yaml", {});
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("/nonexistent/c.yaml"));
}

}  // namespace
}  // namespace dropless::coordinator
