// The prediction store's entries (common/store/prediction_store.h): what goes in comes out, and an
// entry that is not the row's own, whole and intact is refused (DATA_LOSS) before it is scored.
#include "common/store/prediction_store.h"

#include <dirent.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/file_util.h"
#include "common/security/sha256.h"
#include "common/job/job_config.h"
#include "common/store/store_keys.h"
#include "proto/tally.pb.h"
#include "gtest/gtest.h"

namespace tally {
namespace {

StoreKey Key(const std::string& input = "00112233445566778899aabbccddeeff") {
  return {std::string(64, 'a'), std::string(64, 'b'), input};
}

StoredPrediction Labels(int h, int w, int k, uint32_t seed) {
  StoredPrediction p;
  p.height = h;
  p.width = w;
  p.classes = k;
  p.nonfinite = 7;
  p.labels.resize(static_cast<size_t>(h) * w);
  for (size_t i = 0; i < p.labels.size(); ++i) {
    seed = seed * 1103515245u + 12345u;
    p.labels[i] = static_cast<uint16_t>((seed >> 16) % static_cast<uint32_t>(k));
  }
  return p;
}

std::string TempDir() {
  char tmpl[] = "/tmp/tally-store-XXXXXX";
  return mkdtemp(tmpl);
}

TEST(PredictionStoreTest, EntriesRoundTripInTheFewestBitsThatHoldTheClasses) {
  for (const auto& [k, bits] : std::vector<std::pair<int, int>>{
           {2, 1}, {3, 2}, {4, 2}, {5, 4}, {16, 4}, {17, 8}, {256, 8}, {257, 16}, {4096, 16}}) {
    const StoredPrediction p = Labels(13, 17, k, 5);  // 221 labels: the last byte of a packed map is partial.
    const std::string bytes = EncodeStoreEntry(Key(), p);
    EXPECT_EQ(bytes.compare(0, 8, "TALLYPS3"), 0);
    EXPECT_EQ(static_cast<uint8_t>(bytes[12]), bits) << k;
    absl::StatusOr<StoredPrediction> got = DecodeStoreEntry(bytes, Key(), 13, 17);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->labels, p.labels);
    EXPECT_EQ(got->classes, k);
    EXPECT_EQ(got->nonfinite, 7);
  }
}

// Eight two-class labels a byte, the first in the lowest bit: 1,0,0,0,0,0,0,1 | 1,1 -> 0x81 0x03.
// (The bytes come out of DEFLATE: a stored block, whose payload is the packed bytes as they are,
// is what libdeflate writes for 2 incompressible bytes.)
TEST(PredictionStoreTest, TwoClassLabelsPackEightAByteLowestBitFirst) {
  StoredPrediction p;
  p.height = 1;
  p.width = 10;
  p.classes = 2;
  p.labels = {1, 0, 0, 0, 0, 0, 0, 1, 1, 1};
  const std::string bytes = EncodeStoreEntry(Key(), p);
  const std::string payload = bytes.substr(104);
  // A stored DEFLATE block: header byte 0x01 (final, stored), LEN 2, NLEN ~2, then the raw bytes.
  ASSERT_EQ(payload.size(), 7u);
  EXPECT_EQ(static_cast<uint8_t>(payload[5]), 0x81);
  EXPECT_EQ(static_cast<uint8_t>(payload[6]), 0x03);
}

TEST(PredictionStoreTest, AnEntryThatIsNotTheRowsOwnWholeAndIntactIsRefused) {
  const StoredPrediction p = Labels(9, 11, 3, 1);
  const std::string bytes = EncodeStoreEntry(Key(), p);
  auto refused = [](const absl::StatusOr<StoredPrediction>& r) { return absl::IsDataLoss(r.status()); };
  EXPECT_TRUE(refused(DecodeStoreEntry(bytes, Key("ffffffffffffffffffffffffffffffff"), 9, 11)));  // Another row's.
  EXPECT_TRUE(refused(DecodeStoreEntry(bytes, Key(), 11, 9)));                                   // Another size.
  EXPECT_TRUE(refused(DecodeStoreEntry(bytes.substr(0, bytes.size() - 1), Key(), 9, 11)));      // Truncated.
  EXPECT_TRUE(refused(DecodeStoreEntry(bytes.substr(0, 50), Key(), 9, 11)));
  EXPECT_TRUE(refused(DecodeStoreEntry(bytes + "x", Key(), 9, 11)));                            // Grown.
  for (size_t at : {size_t{0}, size_t{16}, size_t{28}, size_t{40}, size_t{50}, size_t{96}, size_t{100},
                    bytes.size() - 1}) {          // A byte changed.
    std::string bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x21);
    EXPECT_TRUE(refused(DecodeStoreEntry(bad, Key(), 9, 11))) << at;
  }
  // A header claiming more classes than the labels' width holds.
  std::string wide = bytes;
  wide[24] = static_cast<char>(0x2C);
  wide[25] = static_cast<char>(0x01);  // 300 classes in one byte a label.
  EXPECT_TRUE(refused(DecodeStoreEntry(wide, Key(), 9, 11)));
}

// Volumes keep their depth, and single-score outputs their 16-bit scores after the labels; the
// payload's digest covers both.
TEST(PredictionStoreTest, VolumesAndScoresRoundTrip) {
  StoredPrediction p = Labels(6, 5, 3, 9);
  p.labels.resize(4 * 6 * 5);
  for (size_t i = 0; i < p.labels.size(); ++i) p.labels[i] = static_cast<uint16_t>(i % 3);
  p.depth = 4;
  const std::string bytes = EncodeStoreEntry(Key(), p);
  EXPECT_EQ(static_cast<uint8_t>(bytes[28]), 4);
  absl::StatusOr<StoredPrediction> got = DecodeStoreEntry(bytes, Key(), 6, 5, 4);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, p.labels);
  EXPECT_EQ(got->depth, 4);
  EXPECT_TRUE(absl::IsDataLoss(DecodeStoreEntry(bytes, Key(), 6, 5, 3).status()));  // Another depth.
  EXPECT_TRUE(absl::IsDataLoss(DecodeStoreEntry(bytes, Key(), 6, 5).status()));

  StoredPrediction s = Labels(7, 9, 2, 3);
  for (size_t i = 0; i < s.labels.size(); ++i) s.scores.push_back(static_cast<uint16_t>(i * 1021 % 65536));
  const std::string scored = EncodeStoreEntry(Key(), s);
  EXPECT_EQ(static_cast<uint8_t>(scored[96]), 16);
  got = DecodeStoreEntry(scored, Key(), 7, 9);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->scores, s.scores);
  EXPECT_EQ(got->labels, s.labels);
  std::string no_scores = scored;  // A header that drops the scores: the payload is then too long.
  no_scores[96] = 0;
  EXPECT_TRUE(absl::IsDataLoss(DecodeStoreEntry(no_scores, Key(), 7, 9).status()));
}

// The first layout (TALLYPS2: a 96-byte header, 2D, no scores) is still read: the same entry with
// the four bytes of depth and the eight after the key taken out.
TEST(PredictionStoreTest, EntriesOfTheFirstLayoutAreRead) {
  const StoredPrediction p = Labels(8, 3, 5, 2);
  std::string v3 = EncodeStoreEntry(Key(), p);
  std::string v2 = v3.substr(0, 96) + v3.substr(104);
  v2[7] = '2';
  v2[8] = 96;
  v2[28] = 0;
  absl::StatusOr<StoredPrediction> got = DecodeStoreEntry(v2, Key(), 8, 3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, p.labels);
  EXPECT_TRUE(got->scores.empty());
  v2[8] = 104;  // A header size that is not the layout's.
  EXPECT_TRUE(absl::IsDataLoss(DecodeStoreEntry(v2, Key(), 8, 3).status()));
}

// Scores as kept: round(p * 65535), NaN as 0; a pixel counts at t where q / 65535 > t.
TEST(PredictionStoreTest, ScoresQuantiseToSixteenBitsAndCountAtThresholds) {
  EXPECT_EQ(QuantizeScore(0.0), 0);
  EXPECT_EQ(QuantizeScore(-3.0), 0);
  EXPECT_EQ(QuantizeScore(std::nan("")), 0);
  EXPECT_EQ(QuantizeScore(1.0), 65535);
  EXPECT_EQ(QuantizeScore(2.0), 65535);
  EXPECT_EQ(QuantizeScore(0.5), 32768);  // 32767.5 rounds away from zero.
  EXPECT_EQ(QuantizeScore(0.25), 16384);  // 16383.75.
  EXPECT_EQ(QuantizeScore(100.0 / 65535), 100);
  // Pixels: scores 0.1, 0.3, 0.6, 0.9 (quantised) against references 1, 0, 1, ignored(65535), then 0.
  const std::vector<uint16_t> q = {QuantizeScore(0.1), QuantizeScore(0.3), QuantizeScore(0.6), QuantizeScore(0.9),
                                   QuantizeScore(0.95)};
  const std::vector<uint16_t> ref = {1, 0, 1, 65535, 0};
  std::vector<int64_t> c(8);
  CountStoredThresholds(q.data(), ref.data(), q.size(), {0.2, 0.5}, c.data());
  // t = 0.2: fg 0.3, 0.6, 0.95 -> tp 1 (0.6), fp 2 (0.3, 0.95), fn 1 (0.1), tn 0.
  // t = 0.5: fg 0.6, 0.95 -> tp 1, fp 1, fn 1, tn 1 (0.3).
  EXPECT_EQ(c, (std::vector<int64_t>{1, 2, 1, 0, 1, 1, 1, 1}));
  // Exact to 1/65535: a score one step above t counts, t itself does not.
  const uint16_t at = 13107;  // 0.2 * 65535 exactly.
  const std::vector<uint16_t> edge = {at, at + 1};
  const std::vector<uint16_t> ones = {1, 1};
  CountStoredThresholds(edge.data(), ones.data(), 2, {0.2}, c.data());
  EXPECT_EQ(std::vector<int64_t>(c.begin(), c.begin() + 4), (std::vector<int64_t>{1, 0, 1, 0}));
}

TEST(PredictionStoreTest, ConcurrentWritersOfOneEntryLeaveOneGoodEntryAndNoTemporaryFile) {
  const std::string root = TempDir();
  const PredictionStore store(root);
  const StoredPrediction p = Labels(64, 48, 5, 9);
  std::vector<std::thread> writers;
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < 25; ++i) ASSERT_TRUE(store.Write(Key(), p).ok());
    });
  }
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        absl::StatusOr<StoredPrediction> got = store.Read(Key(), 64, 48);
        // Absent before the first rename, whole afterwards: never part of one.
        ASSERT_TRUE(got.ok() || absl::IsNotFound(got.status())) << got.status();
        if (got.ok()) {
          ASSERT_EQ(got->labels, p.labels);
        }
      }
    });
  }
  for (auto& w : writers) w.join();
  for (auto& r : readers) r.join();
  absl::StatusOr<StoredPrediction> got = store.Read(Key(), 64, 48);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->labels, p.labels);
  const std::string path = store.EntryPath(Key());
  EXPECT_EQ(path, root + "/v1/aaaaaaaaaaaaaaaa/bbbbbbbbbbbbbbbb/00/00112233445566778899aabbccddeeff.tps");
  DIR* dir = opendir(path.substr(0, path.rfind('/')).c_str());
  ASSERT_NE(dir, nullptr);
  int files = 0;
  while (dirent* e = readdir(dir)) files += e->d_name[0] != '.';
  closedir(dir);
  EXPECT_EQ(files, 1);
  EXPECT_TRUE(RemoveTree(root).ok());
}

TEST(PredictionStoreTest, AnOversizedFileIsRefusedBeforeItIsRead) {
  const std::string root = TempDir();
  const PredictionStore store(root);
  ASSERT_TRUE(store.Write(Key(), Labels(4, 4, 2, 3)).ok());
  {
    std::ofstream f(store.EntryPath(Key()), std::ios::app | std::ios::binary);
    f << std::string(1 << 20, 'z');
  }
  absl::StatusOr<StoredPrediction> got = store.Read(Key(), 4, 4);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_NE(got.status().message().find("more than a 4x4 entry holds"), std::string::npos) << got.status();
  EXPECT_TRUE(absl::IsNotFound(store.Read(Key("0123456789abcdef0123456789abcdef"), 4, 4).status()));
  EXPECT_TRUE(RemoveTree(root).ok());
}

// A settings folder is found only when its file names the model and hashes to the folder's name:
// a file edited by hand, or copied under another folder, is not a run's settings.
TEST(StoreKeysTest, SettingsFilesAreFoundOnlyWhereTheyVerify) {
  const std::string root = TempDir();
  const std::string model(64, 'c');
  const std::string job = "precision fp32\ninput 0x0\nmean \nstd \nlabel_map \ncompile off\n";
  const std::string run_a = "decode cpu cpu\ndevice cuda H200\nbatch 32\nlayout contiguous\njpeg host\n";
  const std::string run_b = "decode cpu cpu\ndevice cuda H200\nbatch 32\nlayout contiguous\njpeg nvjpeg\n";
  const std::string run_c = "decode cpu cpu\ndevice cpu \nbatch 0\nlayout contiguous\njpeg host\n";
  std::vector<std::string> digests;
  for (const std::string& run : {run_a, run_b, run_c}) {
    const std::string text = job + run;
    // The folder is named by the text's SHA-256 (common/security's, tested on its own vectors).
    const std::string digest = Sha256Hex(text);
    digests.push_back(digest);
    const std::string path = SettingsFilePath(root, model, digest);
    ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok());
    ASSERT_TRUE(WriteFileAtomically(path, SettingsFileText(model, text)).ok());
  }
  std::vector<StoredSettings> found = ListStoredSettings(root, model);
  ASSERT_EQ(found.size(), 3u);
  // Two JPEG decoders of one run are one run; the CPU's is another.
  std::set<std::string> runs;
  for (const StoredSettings& s : found) runs.insert(s.RunKey());
  EXPECT_EQ(runs.size(), 2u);
  EXPECT_EQ(found[0].Lines()[0], (std::pair<std::string, std::string>{"precision", "fp32"}));
  EXPECT_EQ(SettingsFlag("input"), "--input-size");
  EXPECT_EQ(SettingsFlag("batch"), "");
  // Edited: precision bf16 under fp32's folder. Another model's file: not this model's.
  ASSERT_TRUE(WriteFileAtomically(SettingsFilePath(root, model, digests[0]),
                                  SettingsFileText(model, "precision bf16\n" + job.substr(15) + run_a)).ok());
  ASSERT_TRUE(WriteFileAtomically(SettingsFilePath(root, model, digests[1]),
                                  SettingsFileText(std::string(64, 'd'), job + run_b)).ok());
  found = ListStoredSettings(root, model);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].settings, digests[2]);
  EXPECT_TRUE(ListStoredSettings(root, std::string(64, 'e')).empty());
  EXPECT_TRUE(RemoveTree(root).ok());
}

TEST(StoreKeysTest, SettingsFilesParseOnlyWhenWholeAndTheirFoldersOwn) {
  const std::string model(64, 'c');
  const std::string text = "precision fp32\ncompile off\n";
  const std::string folder = Sha256Hex(text).substr(0, 16);
  absl::StatusOr<StoredSettings> s = ParseSettingsFile(SettingsFileText(model, text), "", folder);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->model, model);  // Any model when none is asked for.
  EXPECT_EQ(s->text, text);
  EXPECT_TRUE(absl::IsDataLoss(ParseSettingsFile(SettingsFileText(model, text), std::string(64, 'd'), folder).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseSettingsFile(SettingsFileText(model, text), model, "0000000000000000").status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseSettingsFile(SettingsFileText("c0ffee", text), "", folder).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseSettingsFile("tally-store-settings-v1\nmodel " + model, "", folder).status()));
  EXPECT_TRUE(absl::IsDataLoss(ParseSettingsFile(SettingsFileText(model, text + std::string(70000, 'x')), "",
                                                 folder).status()));
}

// Volume jobs' settings lines, and numbers as values: clip:0,1000 and clip:0.0,1e3 are one setting.
TEST(StoreKeysTest, VolumeSettingsAreLinesOfTheirOwnAndNumbersAreValues) {
  auto text = [](const std::string& intensity, bool volume) {
    v1::JobSpec spec;
    spec.set_model("m.pt");
    spec.set_manifest("m.csv");
    spec.set_intensity(intensity);
    spec.set_volume_inputs(volume);
    absl::StatusOr<JobConfig> config = JobConfigFromSpec(spec);
    EXPECT_TRUE(config.ok()) << config.status();
    return config.ok() ? JobSettingsText(*config) : std::string();
  };
  const std::string a = text("clip:0,1000", true);
  EXPECT_EQ(a, text("clip:0.0,1e3", true));
  EXPECT_NE(a.find("\nvolume on\nintensity clip:0,1000\nsliding_window 0,0,0\noverlap 0.5\nsw_batch 4\n"
                   "keep_dtype off\n"),
            std::string::npos)
      << a;
  EXPECT_EQ(text("", false).find("volume"), std::string::npos);  // 2D jobs' digests are as they were.
  EXPECT_EQ(SettingsFlag("sw_batch"), "--sw-batch-size");
  EXPECT_EQ(SettingsFlag("volume"), "");
}

}  // namespace
}  // namespace tally
