// An AOTInductor package's metadata as the worker reads it (worker/torch/package_metadata.h): what
// `tally export` writes is read back, and a package whose metadata is missing or out of bounds is
// refused naming the file, before the worker hands its code a batch.
#include "worker/torch/package_metadata.h"

#include <string>
#include <unordered_map>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

using ::testing::HasSubstr;
using Meta = std::unordered_map<std::string, std::string>;

Meta Exported() {  // What python/tally/export.py writes for --input-size 512x640 --batch-size 32.
  return {{"tally.input", "3x512x640"},      {"tally.batch_max", "32"}, {"tally.batch_dynamic", "1"},
          {"tally.precision", "bf16"},       {"tally.torch", "2.11.0"}, {"AOTI_DEVICE_KEY", "cuda"}};
}

TEST(PackageMetadataTest, ReadsWhatTheExportWrote) {
  absl::StatusOr<PackageMetadata> m = ParsePackageMetadata("net.pt2", Exported());
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->height, 512);
  EXPECT_EQ(m->width, 640);
  EXPECT_EQ(m->batch_max, 32);
  EXPECT_TRUE(m->batch_dynamic);
  EXPECT_EQ(m->precision, "bf16");
  EXPECT_EQ(m->torch_version, "2.11.0");
  Meta fixed = Exported();
  fixed["tally.batch_dynamic"] = "0";
  fixed.erase("tally.torch");
  m = ParsePackageMetadata("net.pt2", fixed);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_FALSE(m->batch_dynamic);
  EXPECT_EQ(m->torch_version, "");
}

TEST(PackageMetadataTest, APackageNotMadeByTallyExportIsRefused) {
  for (const char* key : {"tally.input", "tally.batch_max", "tally.precision"}) {
    Meta meta = Exported();
    meta.erase(key);
    absl::StatusOr<PackageMetadata> m = ParsePackageMetadata("/models/net.pt2", meta);
    ASSERT_FALSE(m.ok()) << key;
    EXPECT_THAT(m.status().message(), HasSubstr("model '/models/net.pt2' was not made by tally export")) << key;
  }
}

TEST(PackageMetadataTest, ShapesAndBatchesOutOfBoundsAreRefused) {
  const std::pair<const char*, const char*> bad[] = {
      {"tally.input", "1x512x512"},   {"tally.input", "3x0x512"},        {"tally.input", "3x512x65537"},
      {"tally.input", "3x512"},       {"tally.input", "3x-5x512"},       {"tally.input", "3x512x512x1"},
      {"tally.input", "3xax512"},     {"tally.input", "3x99999999999999999999x2"},
      {"tally.batch_max", "0"},       {"tally.batch_max", "4097"},       {"tally.batch_max", "-1"},
      {"tally.batch_max", "3 2"},     {"tally.batch_max", "9223372036854775808"}};
  for (const auto& [key, value] : bad) {
    Meta meta = Exported();
    meta[key] = value;
    absl::StatusOr<PackageMetadata> m = ParsePackageMetadata("net.pt2", meta);
    ASSERT_FALSE(m.ok()) << key << "=" << value;
    EXPECT_THAT(m.status().message(), HasSubstr("model 'net.pt2'")) << key << "=" << value;
  }
  Meta edge = Exported();
  edge["tally.input"] = "3x65536x1";
  edge["tally.batch_max"] = "4096";
  absl::StatusOr<PackageMetadata> m = ParsePackageMetadata("net.pt2", edge);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->height, 65536);
  EXPECT_EQ(m->width, 1);
  EXPECT_EQ(m->batch_max, 4096);
}

}  // namespace
}  // namespace tally
