#include "worker/pipeline/pipeline.h"

#include <stdlib.h>

#include <condition_variable>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#include "common/formats/decode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/interfaces/model_runner.h"
#include "common/formats/png.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

std::string Fixture(const std::string& name) { return std::string(TALLY_SOURCE_DIR) + "/tests/fixtures/" + name; }

// 4x4 image whose red channel is 200 (class 1 for red_vs_rest.pt) where x < 2 and 50 elsewhere;
// its mask has class 1 where y < 2, class 0 elsewhere, and one ignored pixel at (3, 3).
// Class 1 by hand: TP = (x<2, y<2) = 4, FP = (x<2, y>=2) = 4, FN = (x>=2, y<2) = 4,
// TN = (x>=2, y>=2) minus the ignored pixel = 3. Class 0 mirrors it: TP 3, FP 4, FN 4, TN 4.
class PipelineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/pipeline_test_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    std::vector<uint8_t> rgb(4 * 4 * 3), mask(16);
    for (int y = 0; y < 4; ++y) {
      for (int x = 0; x < 4; ++x) {
        rgb[(y * 4 + x) * 3] = x < 2 ? 200 : 50;
        rgb[(y * 4 + x) * 3 + 1] = 90;
        rgb[(y * 4 + x) * 3 + 2] = 30;
        mask[y * 4 + x] = y < 2 ? 1 : 0;
      }
    }
    mask[15] = 255;
    ASSERT_TRUE(WritePng(dir_ + "/a.png", 4, 4, 3, 8, rgb.data()).ok());
    ASSERT_TRUE(WritePng(dir_ + "/a_mask.png", 4, 4, 1, 8, mask.data()).ok());
    mask[5] = 7;
    ASSERT_TRUE(WritePng(dir_ + "/bad_mask.png", 4, 4, 1, 8, mask.data()).ok());
    std::vector<uint8_t> small(9, 0);
    ASSERT_TRUE(WritePng(dir_ + "/small_mask.png", 3, 3, 1, 8, small.data()).ok());
    // The fixtures' mark: green 255 at pixel (0, 0); the red channel (what the models read) as a.png.
    rgb[1] = 255;
    ASSERT_TRUE(WritePng(dir_ + "/marked.png", 4, 4, 3, 8, rgb.data()).ok());
    std::vector<uint8_t> wide(4 * 16 * 3, 30), wide_mask(4 * 16, 0);
    ASSERT_TRUE(WritePng(dir_ + "/wide.png", 4, 16, 3, 8, wide.data()).ok());
    ASSERT_TRUE(WritePng(dir_ + "/wide_mask.png", 4, 16, 1, 8, wide_mask.data()).ok());
  }

  v1::ManifestRow Row(int64_t index, const std::string& image, const std::string& mask) {
    v1::ManifestRow r;
    r.set_index(index);
    r.set_image_path(dir_ + "/" + image);
    r.set_mask_path(dir_ + "/" + mask);
    return r;
  }

  struct Outcome {
    std::map<int64_t, v1::ImageResult> results;
    std::string fatal;
    bool definitive = false;
  };

  Outcome Evaluate(const std::string& model, std::vector<v1::ManifestRow> rows, int batch_size,
                   std::vector<Metric> metrics = {Metric::kDice, Metric::kIou}, bool nonfinite_warn = false) {
    ModelRunnerOptions ro;
    ro.model_path = Fixture(model);
    ro.cpu_threads = 1;
    auto runner = ModelRunner::Create(ro);
    EXPECT_TRUE(runner.ok()) << runner.status();
    PipelineOptions po;
    po.decode_threads = 2;
    po.batch_size = batch_size;
    po.warmup_batches = 0;
    po.metrics = metrics;
    po.nonfinite_warn = nonfinite_warn;
    Outcome out;
    std::mutex mu;
    {
      Pipeline p(
          runner->get(), po,
          [&](const LeaseKey&, v1::ImageResult r) {
            std::lock_guard<std::mutex> lock(mu);
            out.results[r.index()] = r;
          },
          [&](const std::string& m, bool definitive) {
            std::lock_guard<std::mutex> lock(mu);
            out.fatal = m;
            out.definitive = definitive;
          });
      p.Submit(LeaseKey{"job", 0, 1}, std::move(rows));
      p.WaitIdle(absl::InfiniteDuration());
    }
    return out;
  }

  std::string dir_;
};

TEST_F(PipelineTest, ConfusionCountsMatchHandWorkedValues) {
  Outcome o = Evaluate("red_vs_rest.pt", {Row(0, "a.png", "a_mask.png")}, 2);
  ASSERT_EQ(o.fatal, "");
  ASSERT_EQ(o.results.size(), 1u);
  const v1::ImageResult& r = o.results[0];
  EXPECT_EQ(r.error(), "");
  ASSERT_EQ(r.classes_size(), 2);
  EXPECT_EQ(r.classes(1).tp(), 4);
  EXPECT_EQ(r.classes(1).fp(), 4);
  EXPECT_EQ(r.classes(1).fn(), 4);
  EXPECT_EQ(r.classes(1).tn(), 3);
  EXPECT_EQ(r.classes(0).tp(), 3);
  EXPECT_EQ(r.classes(0).fp(), 4);
  EXPECT_EQ(r.classes(0).fn(), 4);
  EXPECT_EQ(r.classes(0).tn(), 4);
}

TEST_F(PipelineTest, SingleLogitAndDictOutputsGiveTheSameCounts) {
  for (const char* model : {"single_logit.pt", "dict_output.pt"}) {
    Outcome o = Evaluate(model, {Row(0, "a.png", "a_mask.png")}, 1);
    ASSERT_EQ(o.fatal, "") << model;
    const v1::ImageResult& r = o.results[0];
    ASSERT_EQ(r.classes_size(), 2) << model;  // One logit -> background + foreground.
    EXPECT_EQ(r.classes(1).tp(), 4) << model;
    EXPECT_EQ(r.classes(1).fp(), 4) << model;
    EXPECT_EQ(r.classes(1).fn(), 4) << model;
    EXPECT_EQ(r.classes(1).tn(), 3) << model;
  }
}

TEST_F(PipelineTest, RowProblemsFailOnlyTheirRow) {
  std::vector<v1::ManifestRow> rows = {Row(0, "a.png", "a_mask.png"), Row(1, "a.png", "bad_mask.png"),
                                       Row(2, "missing.png", "a_mask.png"), Row(3, "a.png", "small_mask.png"),
                                       Row(4, "a.png", "a_mask.png")};
  rows.push_back(Row(5, "a.png", "a_mask.png"));
  rows.back().set_error("manifest line 7: 1 fields, but the header has 2");
  Outcome o = Evaluate("red_vs_rest.pt", rows, 4);
  ASSERT_EQ(o.fatal, "");
  ASSERT_EQ(o.results.size(), 6u);
  EXPECT_EQ(o.results[0].error(), "");
  EXPECT_THAT(o.results[1].error(), HasSubstr("mask value 7 at (y=1, x=1) >= number of classes 2"));
  EXPECT_THAT(o.results[2].error(), HasSubstr("missing.png"));
  EXPECT_THAT(o.results[3].error(), HasSubstr("4x4"));
  EXPECT_THAT(o.results[3].error(), HasSubstr("3x3"));
  EXPECT_EQ(o.results[4].error(), "");
  EXPECT_EQ(o.results[4].classes(1).tp(), 4);
  EXPECT_THAT(o.results[5].error(), HasSubstr("line 7"));
}

TEST_F(PipelineTest, BatchSizeDoesNotChangeResults) {
  std::vector<v1::ManifestRow> rows;
  for (int i = 0; i < 7; ++i) rows.push_back(Row(i, "a.png", "a_mask.png"));
  Outcome one = Evaluate("three_class.pt", rows, 1, {Metric::kDice, Metric::kHd95});
  Outcome three = Evaluate("three_class.pt", rows, 3, {Metric::kDice, Metric::kHd95});
  ASSERT_EQ(one.results.size(), 7u);
  ASSERT_EQ(three.results.size(), 7u);
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(one.results[i].SerializeAsString(), three.results[i].SerializeAsString()) << i;
  }
}

TEST_F(PipelineTest, WrongOutputRankFailsTheJobNamingModelAndShape) {
  Outcome o = Evaluate("bad_rank.pt", {Row(0, "a.png", "a_mask.png")}, 1);
  EXPECT_THAT(o.fatal, HasSubstr("bad_rank.pt"));
  EXPECT_THAT(o.fatal, HasSubstr("[1, 2]"));
  EXPECT_THAT(o.fatal, HasSubstr("[1, 3, 4, 4]"));
  o = Evaluate("bad_batch.pt", {Row(0, "a.png", "a_mask.png"), Row(1, "a.png", "a_mask.png")}, 2);
  EXPECT_THAT(o.fatal, HasSubstr("bad_batch.pt"));
  EXPECT_THAT(o.fatal, HasSubstr("N = 2"));
}

// The model raises on one image of a batch: the batch is split down to single images, so only that
// row fails, with the model's message, and its neighbours get their hand-worked counts.
TEST_F(PipelineTest, ImageOnWhichTheModelRaisesFailsAlone) {
  std::vector<v1::ManifestRow> rows;
  for (int i = 0; i < 6; ++i) rows.push_back(Row(i, i == 3 ? "marked.png" : "a.png", "a_mask.png"));
  Outcome o = Evaluate("raises_on_mark.pt", rows, 4);
  ASSERT_EQ(o.fatal, "");
  ASSERT_EQ(o.results.size(), 6u);
  for (int i = 0; i < 6; ++i) {
    if (i == 3) {
      EXPECT_THAT(o.results[i].error(), HasSubstr("cannot handle this input"));
      EXPECT_THAT(o.results[i].error(), HasSubstr("raises_on_mark.pt"));
      EXPECT_THAT(o.results[i].error(), HasSubstr("[1, 3, 4, 4]"));  // It failed alone.
      continue;
    }
    ASSERT_EQ(o.results[i].error(), "") << i;
    EXPECT_EQ(o.results[i].classes(1).tp(), 4) << i;
    EXPECT_EQ(o.results[i].classes(1).tn(), 3) << i;
  }
}

// ... but a model that raises on every image of its first two batches is broken: the job fails.
TEST_F(PipelineTest, ModelRaisingOnEveryImageFailsTheJobDefinitively) {
  std::vector<v1::ManifestRow> rows;
  for (int i = 0; i < 4; ++i) rows.push_back(Row(i, "marked.png", "a_mask.png"));
  Outcome o = Evaluate("raises_on_mark.pt", rows, 2);
  EXPECT_THAT(o.fatal, HasSubstr("cannot handle this input"));
  EXPECT_TRUE(o.definitive);
}

TEST_F(PipelineTest, NonFiniteOutputFailsTheRowUnlessWarned) {
  std::vector<v1::ManifestRow> rows = {Row(0, "a.png", "a_mask.png"), Row(1, "marked.png", "a_mask.png")};
  Outcome o = Evaluate("nan_on_mark.pt", rows, 2);
  ASSERT_EQ(o.fatal, "");
  EXPECT_EQ(o.results[0].error(), "");
  EXPECT_EQ(o.results[0].nonfinite(), 0);
  // 4 x 4 pixels x 2 logits, all NaN.
  EXPECT_THAT(o.results[1].error(), HasSubstr("model output has 32 non-finite values"));
  o = Evaluate("nan_on_mark.pt", rows, 2, {Metric::kDice, Metric::kIou}, /*nonfinite_warn=*/true);
  EXPECT_EQ(o.results[1].error(), "");
  EXPECT_EQ(o.results[1].nonfinite(), 32);
  EXPECT_EQ(o.results[1].classes_size(), 2);
}

// A model whose class count depends on the input fails the rows that disagree with the first
// batch, instead of sending results the coordinator would have to reject.
TEST_F(PipelineTest, ClassCountChangingWithTheInputFailsThoseRows) {
  std::vector<v1::ManifestRow> rows = {Row(0, "a.png", "a_mask.png"), Row(1, "wide.png", "wide_mask.png"),
                                       Row(2, "a.png", "a_mask.png")};
  Outcome o = Evaluate("classes_by_width.pt", rows, 1);
  ASSERT_EQ(o.fatal, "");
  EXPECT_EQ(o.results[0].error(), "");
  EXPECT_THAT(o.results[1].error(), HasSubstr("returned 3 classes for this input (4x16) but 2 for earlier ones"));
  EXPECT_EQ(o.results[2].error(), "");
  EXPECT_EQ(o.results[2].classes_size(), 2);
}

TEST(ModelRunnerTest, MissingOrInvalidModelIsAClearError) {
  ModelRunnerOptions ro;
  ro.model_path = Fixture("no_such_model.pt");
  auto r = ModelRunner::Create(ro);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("no_such_model.pt"));
  ro.model_path = Fixture("not_torchscript.pt");
  r = ModelRunner::Create(ro);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("not_torchscript.pt"));
  EXPECT_THAT(r.status().message(), HasSubstr("TorchScript"));
}

// A CUDA worker reads a model into host memory and moves it with Module::to() (its CPU part overlaps
// CUDA's initialisation), unless some tensor would stay behind: then it reads the file again onto
// the GPU. The analysis runs here on the CPU; the fixtures say by construction what it must find.
TEST(ModelRunnerTest, KnowsWhichModelsModuleToMovesWhole) {
  std::string stays;
  for (const char* whole : {"conv3.pt", "red_vs_rest.pt", "slow.pt", "dict_output.pt", "hangs_on_mark.pt"}) {
    auto moves = TorchScriptMovesWithTo(Fixture(whole), &stays);
    ASSERT_TRUE(moves.ok()) << moves.status();
    EXPECT_TRUE(*moves) << whole << ": " << stays;
  }
  auto traced = TorchScriptMovesWithTo(Fixture("traced_constant.pt"), &stays);
  ASSERT_TRUE(traced.ok()) << traced.status();
  EXPECT_FALSE(*traced);
  EXPECT_THAT(stays, HasSubstr("a tensor constant in __torch__.TracedConstant.forward"));
  auto attribute = TorchScriptMovesWithTo(Fixture("tensor_attribute.pt"), &stays);
  ASSERT_TRUE(attribute.ok()) << attribute.status();
  EXPECT_FALSE(*attribute);
  EXPECT_THAT(stays, HasSubstr("attribute 'offset' of __torch__.TensorAttribute"));
  EXPECT_EQ(TorchScriptMovesWithTo(Fixture("not_torchscript.pt"), &stays).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --channels-last auto's kept trials are keyed by the network, not the file: conv3_retrained.pt is
// conv3's network with other weights, saved by another script (so its TorchScript type names carry
// other mangling numbers); it must share conv3's key, and networks that differ must not.
TEST(ModelRunnerTest, LayoutTrialsAreKeptPerNetworkNotPerCheckpoint) {
  auto key = [](const char* name) {
    absl::StatusOr<std::string> k = TorchScriptArchitecture(Fixture(name));
    EXPECT_TRUE(k.ok()) << name << ": " << k.status();
    return k.ok() ? *k : std::string(name);
  };
  std::ifstream a(Fixture("conv3.pt"), std::ios::binary), b(Fixture("conv3_retrained.pt"), std::ios::binary);
  const std::string bytes_a((std::istreambuf_iterator<char>(a)), {}), bytes_b((std::istreambuf_iterator<char>(b)), {});
  ASSERT_NE(bytes_a, bytes_b);
  const std::string conv3 = key("conv3.pt");
  EXPECT_EQ(conv3.size(), 64u);
  EXPECT_EQ(conv3, key("conv3_retrained.pt"));
  std::set<std::string> distinct;
  for (const char* other : {"conv3.pt", "red_vs_rest.pt", "slow.pt", "half_res.pt", "dict_output.pt", "three_class.pt",
                            "traced_constant.pt", "tensor_attribute.pt"}) {
    distinct.insert(key(other));
  }
  EXPECT_EQ(distinct.size(), 8u);
  EXPECT_EQ(TorchScriptArchitecture(Fixture("not_torchscript.pt")).status().code(), absl::StatusCode::kInvalidArgument);
}

// Both models compute red_vs_rest's logits with their 0.5 held where Module::to() cannot reach it;
// on the CPU they evaluate exactly as red_vs_rest does.
TEST_F(PipelineTest, ModelsHoldingTensorsOutsideParametersEvaluateAsTheirTwin) {
  std::vector<v1::ManifestRow> rows = {Row(0, "a.png", "a_mask.png"), Row(1, "wide.png", "wide_mask.png")};
  Outcome twin = Evaluate("red_vs_rest.pt", rows, 1);
  ASSERT_EQ(twin.fatal, "");
  for (const char* model : {"traced_constant.pt", "tensor_attribute.pt"}) {
    Outcome o = Evaluate(model, rows, 1);
    ASSERT_EQ(o.fatal, "") << model;
    ASSERT_EQ(o.results.size(), twin.results.size()) << model;
    for (const auto& [index, result] : twin.results) {
      EXPECT_EQ(o.results[index].SerializeAsString(), result.SerializeAsString()) << model << " row " << index;
    }
  }
}

}  // namespace
}  // namespace tally
