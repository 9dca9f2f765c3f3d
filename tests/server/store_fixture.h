// What the JobStore-backed tests share (job_store_test, live_report_test): a fresh database in a
// temporary folder of its own, removed after the test, and made-up manifest rows.
#ifndef TALLY_TESTS_SERVER_STORE_FIXTURE_H_
#define TALLY_TESTS_SERVER_STORE_FIXTURE_H_

#include <stdlib.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/store/job_store.h"

namespace tally {

// `store_` is a JobStore at `dir_`/state.db; `dir_` is `::testing::TempDir()`/`prefix`_XXXXXX.
class StoreFixture : public ::testing::Test {
 protected:
  explicit StoreFixture(std::string prefix) : prefix_(std::move(prefix)) {}
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/" + prefix_ + "_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto store = JobStore::Open(dir_ + "/state.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::string cmd = "rm -rf '" + dir_ + "'";
    (void)system(cmd.c_str());
  }

  const std::string prefix_;
  std::string dir_;
  std::unique_ptr<JobStore> store_;
};

// Rows 0..n-1 of a made-up manifest: index i, line i + 2 (the header is line 1), mask "m/<i>.png"
// at "/d/m/<i>.png"; `fill` sets the rest (id, image or prediction, errors, columns).
inline std::vector<ManifestRow> MakeRows(int64_t n, const std::function<void(int64_t, ManifestRow*)>& fill) {
  std::vector<ManifestRow> rows;
  rows.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    ManifestRow r;
    r.index = i;
    r.line = i + 2;
    r.mask = "m/" + std::to_string(i) + ".png";
    r.mask_path = "/d/" + r.mask;
    fill(i, &r);
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace tally

#endif  // TALLY_TESTS_SERVER_STORE_FIXTURE_H_
