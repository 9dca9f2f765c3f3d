// The report kept as rows arrive (server/report/live_report.h) against the batch path (WriteReports from
// the database): the same files, to the byte, whatever the order and the grouping in which the
// rows arrive (several threads at once, duplicates of rows already in), and when it is rebuilt
// from the database halfway through (tallyd's restart).
#include "server/report/live_report.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "server/report/report_writer.h"
#include "tests/server/store_fixture.h"

namespace tally {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class LiveReportTest : public StoreFixture {
 protected:
  static constexpr int64_t kRows = 3000;
  static constexpr int64_t kFailed = 31;  // Rows i % 97 == 5 below.
  LiveReportTest() : StoreFixture("live_report_test") {}
  void SetUp() override {
    StoreFixture::SetUp();
    if (HasFatalFailure()) return;
    v1::JobSpec& spec = *record_.job.mutable_spec();
    spec.set_manifest(dir_ + "/m.csv");
    for (const char* m : {"dice", "iou", "precision", "hd95", "nsd"}) spec.add_metrics(m);
    spec.set_num_classes(3);
    spec.set_empty_score("nan");
    spec.set_nsd_tolerance(1);
    spec.set_ignore_index(255);
    record_.job.set_job_id("j1");
    record_.job.set_images_total(kRows);
    // Every row accounted for, as when the report is written: the interval is over all rows.
    record_.job.set_images_failed(kFailed);
    record_.job.set_images_evaluated(kRows - kFailed);
    record_.job.set_num_classes(3);
    record_.job.set_created_unix(1000);
    record_.job.set_finished_unix(1010);
    record_.shard_size = 64;
    const std::vector<ManifestRow> rows = MakeRows(kRows, [](int64_t i, ManifestRow* r) {
      r->id = "case_" + std::to_string(i);
      r->prediction = "p/" + std::to_string(i) + ".png";
      r->prediction_path = "/d/" + r->prediction;
    });
    ASSERT_TRUE(store_->BeginSubmission("j1").ok());
    ASSERT_TRUE(store_->InsertManifestRows("j1", rows).ok());
    ASSERT_TRUE(store_->CreateJob(record_).ok());
    std::mt19937_64 rng(7);
    for (int64_t i = 0; i < kRows; ++i) {
      v1::ImageResult r;
      r.set_index(i);
      if (i % 97 == 5) {
        r.set_error("cannot read 'p/" + std::to_string(i) + ".png': no such file");
        results_.push_back(r);
        continue;
      }
      r.set_height(16);
      r.set_width(16);
      r.set_mask_max_label(2);
      for (int c = 0; c < 3; ++c) {
        v1::ClassResult* cr = r.add_classes();
        const int64_t tp = c == 2 && i % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 100);
        const int64_t fp = static_cast<int64_t>(rng() % 50), fn = c == 2 && i % 5 == 0 ? 0 : static_cast<int64_t>(rng() % 50);
        cr->set_tp(tp);
        cr->set_fp(fp);
        cr->set_fn(fn);
        cr->set_tn(256 - tp - fp - fn);
        const double u = static_cast<double>(rng() % 100000) / 333.0;
        cr->set_hd95(i % 11 == 0 ? std::numeric_limits<double>::infinity() : u);
        cr->set_hd(u + 1);
        cr->set_assd(u / 2);
        cr->set_nsd(static_cast<double>(rng() % 1000) / 999.0);
      }
      results_.push_back(r);
    }
  }
  // Commits `rows` (indices into results_) in random groups from `threads` threads, each commit's
  // new rows into `live` (if any), as the coordinator does; every tenth group is sent twice.
  void Commit(std::vector<int64_t> rows, LiveReport* live, int threads, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<std::vector<v1::ImageResult>> groups;
    for (size_t i = 0; i < rows.size();) {
      const size_t n = std::min<size_t>(rows.size() - i, 1 + rng() % 200);
      groups.emplace_back();
      for (size_t k = i; k < i + n; ++k) groups.back().push_back(results_[rows[k]]);
      if (groups.size() % 10 == 0) groups.push_back(groups.back());
      i += n;
    }
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        for (size_t g = t; g < groups.size(); g += threads) {
          std::vector<bool> new_rows;
          std::vector<RowNames> names;
          ASSERT_TRUE(store_->CommitResults("j1", "w", groups[g], 1005, &new_rows, {}, 0, live ? &names : nullptr).ok());
          if (live != nullptr) live->Add(groups[g], new_rows, names, static_cast<int64_t>(g));
        }
      });
    }
    for (auto& th : pool) th.join();
  }
  void ExpectSameFiles(const std::string& a, const std::string& b) {
    for (const char* f : kReportFiles) {
      const std::string x = Slurp(a + "/" + f), y = Slurp(b + "/" + f);
      EXPECT_FALSE(x.empty()) << f;
      EXPECT_TRUE(x == y) << f << " differs between " << a << " and " << b;
    }
  }
  JobRecord record_;
  std::vector<v1::ImageResult> results_;
};

TEST_F(LiveReportTest, RowsInAnyOrderFromSeveralThreadsGiveTheBatchReport) {
  ASSERT_TRUE(LiveReport::Eligible(record_.job));
  auto live = LiveReport::Create(record_, dir_ + "/spool/j1");
  ASSERT_TRUE(live.ok()) << live.status();
  std::vector<int64_t> all(kRows);
  for (int64_t i = 0; i < kRows; ++i) all[i] = i;
  Commit(all, live->get(), 4, 1);
  EXPECT_EQ((*live)->rows(), kRows);
  ReportOutcome kept, batch;
  ASSERT_TRUE((*live)->Write(store_.get(), record_, dir_ + "/live", &kept).ok());
  ASSERT_TRUE(WriteReports(store_.get(), record_, dir_ + "/batch", &batch).ok());
  ExpectSameFiles(dir_ + "/live", dir_ + "/batch");
  EXPECT_EQ(kept.summary, batch.summary);
  // per_image.csv holds every evaluated row once, in index order (3 classes a row).
  const std::string csv = Slurp(dir_ + "/live/per_image.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 1 + 3 * (kRows - (kRows + 91) / 97));
  EXPECT_EQ(csv.find("\n0,case_0,"), csv.find('\n'));
  EXPECT_LT(csv.find("\n998,case_998,"), csv.find("\n2999,case_2999,"));
  EXPECT_EQ(csv.find("\n5,case_5,"), std::string::npos);  // Failed: in report.json's failures.
}

TEST_F(LiveReportTest, RebuiltFromTheDatabaseHalfwayGivesTheBatchReport) {
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < kRows; ++i) (i % 3 == 0 ? second : first).push_back(i);
  Commit(first, nullptr, 2, 2);  // Committed before the restart: the kept report died with tallyd.
  // The restart: a fresh one fed from the database (what Coordinator::Resume does), then the rest live.
  auto live = LiveReport::Create(record_, dir_ + "/spool/j1");
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(store_->ForEachResult("j1", [&](const v1::ImageResult& r, const RowNames& names) {
    (*live)->AddOne(r, names);
    return absl::OkStatus();
  }).ok());
  Commit(second, live->get(), 3, 3);
  EXPECT_EQ((*live)->rows(), kRows);
  ASSERT_TRUE((*live)->Write(store_.get(), record_, dir_ + "/live", nullptr).ok());
  ASSERT_TRUE(WriteReports(store_.get(), record_, dir_ + "/batch", nullptr).ok());
  ExpectSameFiles(dir_ + "/live", dir_ + "/batch");
}

// A job that ended with rows missing (cancelled): per_image.csv skips them, as the batch path's does.
// (The record still says every row is accounted for, so that both intervals are over all rows:
// tallyd writes such a job's report from the database, whose interval says what the rows are.)
TEST_F(LiveReportTest, RowsThatNeverCameAreLeftOutAsInTheBatchReport) {
  auto live = LiveReport::Create(record_, dir_ + "/spool/j1");
  ASSERT_TRUE(live.ok()) << live.status();
  std::vector<int64_t> some;
  for (int64_t i = 0; i < kRows; ++i) {
    if (i < 1000 || i >= 2000 || i % 10 == 3) some.push_back(i);
  }
  Commit(some, live->get(), 2, 4);
  ASSERT_TRUE((*live)->Write(store_.get(), record_, dir_ + "/live", nullptr).ok());
  ASSERT_TRUE(WriteReports(store_.get(), record_, dir_ + "/batch", nullptr).ok());
  ExpectSameFiles(dir_ + "/live", dir_ + "/batch");
  struct stat st;
  EXPECT_NE(stat((dir_ + "/spool/j1.csv").c_str(), &st), 0);  // Moved into the report.
}

TEST_F(LiveReportTest, JobsWhoseReportNeedsIndexOrderKeepTheBatchPath) {
  v1::Job job = record_.job;
  EXPECT_TRUE(LiveReport::Eligible(job));
  job.set_num_classes(0);  // Not known yet.
  EXPECT_FALSE(LiveReport::Eligible(job));
  job = record_.job;
  job.mutable_spec()->set_num_classes(0);  // A prediction job whose class count grows with the rows.
  EXPECT_FALSE(LiveReport::Eligible(job));
  job = record_.job;
  job.mutable_spec()->add_metrics("lesion_dice");  // lesions.csv.
  EXPECT_FALSE(LiveReport::Eligible(job));
  job = record_.job;
  job.mutable_spec()->set_until_ci(0.02);  // Sampled: the interval is decided at the end.
  EXPECT_FALSE(LiveReport::Eligible(job));
}

}  // namespace
}  // namespace tally
