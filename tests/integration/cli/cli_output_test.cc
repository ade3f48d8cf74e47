// In-process checks of the CLI's building blocks that the binary tests cannot reach exhaustively:
// the JSON and YAML emitters against real parsers on random strings, the progress line's width,
// the argument parser, and the expert-load summary of top and describe. (Unit tests of cli/; they
// live here with the CLI's other tests.)
#include <initializer_list>
#include <optional>
#include <random>
#include <string>

#include "cli/args.h"
#include "cli/output/expert_load.h"
#include "cli/output/table.h"
#include "cli/output/value.h"
#include "cli/output/views.h"
#include "cli/progress/progress_bar.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace dropless::cli {
namespace {

using ::testing::HasSubstr;

// Random text drawn from the characters that break naive emitters.
std::string RandomAwkwardString(std::mt19937& rng) {
  static const std::vector<std::string> kPieces = {
      "a", "Z", "0", "9", " ", "  ", "\n", "\n\n", "\t", "\"", "'", "\\", ":", ": ", "#", " #",
      "-", "- ", "?", "*", "&", "!", "|", ">", "{", "}", "[", "]", ",", "%", "@", "`", "yes",
      "no", "null", "~", "true", "1e3", "0x1F", "012", ".inf", "é", "日本", "\x01", "\x7f", "\r"};
  std::uniform_int_distribution<size_t> len(0, 12), pick(0, kPieces.size() - 1);
  std::string s;
  for (size_t i = len(rng); i > 0; --i) s += kPieces[pick(rng)];
  return s;
}

TEST(EmitterTest, RandomStringsRoundTripThroughJsonAndYamlParsers) {
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 2000; ++i) {
    const std::string text = RandomAwkwardString(rng);
    Value v = Value::Object();
    v.Set("text", Value::String(text));
    v.Set("list", Value::Array().Push(Value::String(text)).Push(Value::Int(i)));
    v.Set("nested", Value::Object().Set("inner", Value::String(text)));

    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ToJson(v), &parsed).ok())
        << ToJson(v);
    EXPECT_EQ(parsed.fields().at("text").string_value(), text);

    const std::string yaml = ToYaml(v);
    YAML::Node doc;
    ASSERT_NO_THROW(doc = YAML::Load(yaml)) << yaml;
    EXPECT_EQ(doc["text"].as<std::string>(), text) << yaml;
    EXPECT_EQ(doc["list"][0].as<std::string>(), text) << yaml;
    EXPECT_EQ(doc["list"][1].as<int>(), i);
    EXPECT_EQ(doc["nested"]["inner"].as<std::string>(), text) << yaml;
  }
}

TEST(EmitterTest, NumbersNullsAndEmptyContainers) {
  Value v = Value::Object();
  v.Set("int", Value::Int(-42))
      .Set("double", Value::Double(0.1))
      .Set("nan", Value::Double(std::nan("")))
      .Set("null", Value())
      .Set("yes", Value::Bool(true))
      .Set("empty_list", Value::Array())
      .Set("empty_map", Value::Object())
      .Set("objects", Value::Array()
                          .Push(Value::Object().Set("a", Value::Int(1)).Set("b", Value::Int(2)))
                          .Push(Value::Object().Set("a", Value::Int(3))));
  EXPECT_EQ(ToJson(v),
            "{\"int\":-42,\"double\":0.1,\"nan\":null,\"null\":null,\"yes\":true,"
            "\"empty_list\":[],\"empty_map\":{},\"objects\":[{\"a\":1,\"b\":2},{\"a\":3}]}");
  YAML::Node doc = YAML::Load(ToYaml(v));
  EXPECT_EQ(doc["int"].as<int>(), -42);
  EXPECT_DOUBLE_EQ(doc["double"].as<double>(), 0.1);
  EXPECT_TRUE(doc["nan"].IsNull());
  EXPECT_TRUE(doc["yes"].as<bool>());
  EXPECT_EQ(doc["empty_list"].size(), 0u);
  EXPECT_EQ(doc["objects"][0]["b"].as<int>(), 2);
  EXPECT_EQ(doc["objects"][1]["a"].as<int>(), 3);
}

TEST(ViewsTest, JobJsonUsesBareStateNamesAndDocumentedFields) {
  v1::Job job;
  job.set_id("j-1");
  job.set_name("tiny");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_steps(40);
  job.mutable_latest()->set_step(12);
  job.mutable_latest()->set_loss(1.5);
  const std::string json = ToJson(JobView(job));
  EXPECT_THAT(json, HasSubstr("\"id\":\"j-1\""));
  EXPECT_THAT(json, HasSubstr("\"state\":\"RUNNING\""));
  EXPECT_THAT(json, HasSubstr("\"step\":12"));
  EXPECT_THAT(json, ::testing::Not(HasSubstr("JOB_STATE")));
  EXPECT_EQ(StepText(job), "12/40");

  v1::JobUpdate update;
  *update.mutable_job() = job;
  update.mutable_metrics()->set_step(13);
  update.mutable_metrics()->set_step_seconds(0.5);
  update.mutable_metrics()->set_tflops(2.0);
  update.mutable_metrics()->set_mfu(0.25);
  update.mutable_metrics()->set_loss(1.25);
  google::protobuf::Struct line;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ToJson(WatchUpdateView(update)), &line)
                  .ok());
  EXPECT_EQ(line.fields().at("state").string_value(), "RUNNING");
  EXPECT_EQ(line.fields().at("step").number_value(), 13);
  EXPECT_EQ(line.fields().at("steps").number_value(), 40);
  EXPECT_EQ(line.fields().at("loss").number_value(), 1.25);
  EXPECT_EQ(line.fields().at("step_seconds").number_value(), 0.5);
  EXPECT_EQ(line.fields().at("tflops").number_value(), 2.0);
  EXPECT_EQ(line.fields().at("mfu").number_value(), 0.25);
  EXPECT_EQ(line.fields().at("eta_seconds").number_value(), 27 * 0.5);
}

TEST(ProgressTest, LineFitsEveryWidthAndShowsTheFigures) {
  Progress p{"RUNNING", 12, 40, true, 1.2345, 0.5, 3.21, 0.0123};
  const std::string wide = RenderProgress(p, 160);
  EXPECT_THAT(wide, HasSubstr("12/40  30%"));
  EXPECT_THAT(wide, HasSubstr("500.0 ms/step"));
  EXPECT_THAT(wide, HasSubstr("3.21 TFLOP/s"));
  EXPECT_THAT(wide, HasSubstr("MFU   1.2%"));
  EXPECT_THAT(wide, HasSubstr("loss 1.234"));
  EXPECT_THAT(wide, HasSubstr("ETA 14s"));
  EXPECT_THAT(wide, HasSubstr("[#########.....................]"));
  for (int width = 20; width <= 200; ++width) {
    EXPECT_LE(RenderProgress(p, width).size(), static_cast<size_t>(width)) << width;
  }
  // Narrow: TFLOP/s goes before ETA and loss.
  const std::string narrow = RenderProgress(p, 80);
  EXPECT_THAT(narrow, HasSubstr("ETA 14s"));
  EXPECT_THAT(narrow, HasSubstr("loss 1.234"));
  EXPECT_THAT(narrow, ::testing::Not(HasSubstr("TFLOP/s")));
  // The bar keeps its width while the figures change.
  Progress later = p;
  later.loss = 0.01;
  later.step_seconds = 0.0123;
  EXPECT_EQ(RenderProgress(later, 120).find("] "), RenderProgress(p, 120).find("] "));
  Progress pending{"PENDING", 0, 40};
  EXPECT_THAT(RenderProgress(pending, 80), HasSubstr("PENDING   ["));
  EXPECT_LT(EtaSeconds(pending), 0);
}

TEST(ArgsTest, FlagFormsAndPositionals) {
  std::vector<FlagSpec> specs = GlobalFlagSpecs();
  specs.push_back({{"-f", "--follow"}, false, "", ""});
  specs.push_back({{"--rank"}, true, "R", ""});
  auto parsed = ParsedArgs::Parse({"logs", "-o", "json", "abc", "--rank=3", "-f", "--", "-x"}, specs);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->positional(), ::testing::ElementsAre("logs", "abc", "-x"));
  EXPECT_EQ(parsed->Get("output"), "json");
  EXPECT_EQ(parsed->Get("rank"), "3");
  EXPECT_TRUE(parsed->Has("follow"));
  EXPECT_FALSE(ParsedArgs::Parse({"--nope"}, specs).ok());
  EXPECT_FALSE(ParsedArgs::Parse({"--rank"}, specs).ok());
  EXPECT_FALSE(ParsedArgs::Parse({"-f=1"}, specs).ok());
}

TEST(TableTest, ColumnsAlign) {
  Table t({"ID", "NAME"});
  t.AddRow({"a-long-id", "x"});
  t.AddRow({"b", "y"});
  EXPECT_EQ(t.Render(), "ID          NAME\na-long-id   x\nb           y\n");
}

v1::StepMetrics WithExpertTokens(std::initializer_list<int64_t> tokens) {
  v1::StepMetrics m;
  m.set_step(7);
  for (int64_t t : tokens) m.add_expert_tokens(t);
  return m;
}

TEST(ExpertLoadTest, SummaryIsMinMedianMaxAndIdleExperts) {
  EXPECT_FALSE(SummarizeExpertLoad(v1::StepMetrics()).has_value());
  EXPECT_EQ(ExpertLoadCell(v1::StepMetrics()), "-");
  const v1::StepMetrics m = WithExpertTokens({40, 0, 10, 30, 20, 100});
  const std::optional<ExpertLoadSummary> s = SummarizeExpertLoad(m);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->experts, 6);
  EXPECT_EQ(s->min, 0);
  EXPECT_EQ(s->median, 20);  // the lower middle of 0 10 20 30 40 100
  EXPECT_EQ(s->max, 100);
  EXPECT_DOUBLE_EQ(s->mean, 200.0 / 6);
  EXPECT_EQ(s->idle, 1);
  EXPECT_EQ(ExpertLoadCell(m), "0/20/100");
  EXPECT_EQ(ExpertLoadSummaryLine(*s),
            "6 experts, tokens per expert min 0, median 20, max 100 (max/mean 3.00, 1 idle)");
}

TEST(ExpertLoadTest, HistogramCountsEveryExpertOnceByLoadOverTheMean) {
  // Mean 100: loads 0, 0.3, 0.95, 1.0, 1.05, 1.2, 2.5 of the mean.
  const v1::StepMetrics m = WithExpertTokens({0, 30, 95, 100, 105, 120, 250});
  const std::optional<ExpertLoadSummary> s = SummarizeExpertLoad(m);
  ASSERT_TRUE(s.has_value());
  const std::string h = ExpertLoadHistogram(m, *s);
  EXPECT_THAT(h, HasSubstr("  LOAD/MEAN   EXPERTS\n"));
  EXPECT_THAT(h, HasSubstr("  0 (idle)    1     ##########\n"));
  EXPECT_THAT(h, HasSubstr("  (0, 0.5)    1     ##########\n"));
  EXPECT_THAT(h, HasSubstr("  [0.5, 0.9)  0\n"));
  EXPECT_THAT(h, HasSubstr("  [0.9, 1.1)  3     ##############################\n"));
  EXPECT_THAT(h, HasSubstr("  [1.1, 1.5)  1     ##########\n"));
  EXPECT_THAT(h, HasSubstr("  >= 2        1     ##########\n"));
  EXPECT_EQ(
      ExpertLoadHistogram(WithExpertTokens({0, 0}), *SummarizeExpertLoad(WithExpertTokens({0, 0}))),
      "");
}

}  // namespace
}  // namespace dropless::cli
