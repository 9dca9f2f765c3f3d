// The grouping of failure reasons in the reports: file names and numbers are left out.
#include "server/report/report_data.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(FailureKindTest, FileNamesAndNumbersAreLeftOut) {
  EXPECT_EQ(FailureKind("mask value 2 at (y=10, x=3) >= number of classes 2"),
            "mask value # at (y=#, x=#) >= number of classes #");
  EXPECT_EQ(FailureKind("image: cannot open '/d/a1.png': No such file"), "image: cannot open '\xE2\x80\xA6': No such file");
  EXPECT_EQ(FailureKind("image 'x' is 3x4 (height x width) but mask 'y' is 5x6"),
            "image '\xE2\x80\xA6' is #x# (height x width) but mask '\xE2\x80\xA6' is #x#");
}

// Found by trying it: "an earlier sample's key ('k') ..." was cut at the apostrophe of "sample's".
TEST(FailureKindTest, ApostrophesInsideWordsAreTextAndQuotedNamesMayHoldThem) {
  EXPECT_EQ(FailureKind("shard 'a.tar', sample 'k': an earlier sample's key (in 'b.tar') is the same"),
            "shard '\xE2\x80\xA6', sample '\xE2\x80\xA6': an earlier sample's key (in '\xE2\x80\xA6') is the same");
  EXPECT_EQ(FailureKind("image: cannot open '/d/o'brien 2.png': No such file"),
            "image: cannot open '\xE2\x80\xA6': No such file");
  EXPECT_EQ(FailureKind("it can't be read"), "it can't be read");
}

}  // namespace
}  // namespace tally
