// The coordinator core driven directly (coordinator_test, coordinator_restart_test): a fresh
// state folder of its own, a fake clock, no background thread, and helpers for a worker's calls.
#ifndef TALLY_TESTS_SERVER_COORDINATOR_FIXTURE_H_
#define TALLY_TESTS_SERVER_COORDINATOR_FIXTURE_H_

#include <stdlib.h>

#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "server/coordinator/coordinator.h"

namespace tally {

// Drives the coordinator core directly, with a fake clock and no background thread.
class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // TempDir() ends with '/': the paths Tally records are normalised, so the expected ones must be too.
    std::string base = ::testing::TempDir();
    if (!base.empty() && base.back() == '/') base.pop_back();
    std::string tmpl = base + "/coordinator_test_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    std::ofstream(dir_ + "/model.pt") << "not inspected by the coordinator";
    WriteManifest(10);
    Restart();
  }

  void WriteManifest(int rows) {
    std::ofstream m(dir_ + "/manifest.csv");
    m << "image,mask\n";
    for (int i = 0; i < rows; ++i) m << "img" << i << ".png,mask" << i << ".png\n";
  }

  // Restarts the coordinator on the same state; `tweak` may change the options.
  void Restart(const std::function<void(CoordinatorOptions*)>& tweak = nullptr) {
    core_.reset();
    CoordinatorOptions o;
    o.state_dir = dir_ + "/state";
    o.lease_seconds = 10;
    o.max_shard_attempts = 3;
    o.clock = [this] { return now_; };
    o.background_thread = false;
    if (tweak) tweak(&o);
    auto c = Coordinator::Create(o);
    ASSERT_TRUE(c.ok()) << c.status();
    core_ = std::move(*c);
  }

  v1::JobSpec Spec(int shard_size, int batch_size) {
    v1::JobSpec spec;
    spec.set_model(dir_ + "/model.pt");
    spec.set_manifest(dir_ + "/manifest.csv");
    spec.set_shard_size(shard_size);
    spec.set_batch_size(batch_size);
    return spec;
  }

  std::string Register(const std::string& name) {
    v1::RegisterWorkerRequest r;
    r.set_name(name);
    r.set_device("cpu");
    auto resp = core_->RegisterWorker(r);
    EXPECT_TRUE(resp.ok());
    return resp->worker_id();
  }

  // A heartbeat from `worker` listing the lease of `a` as held.
  static v1::HeartbeatRequest Beat(const std::string& worker, const v1::ShardAssignment& a) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(worker);
    v1::HeldLease* held = hb.add_leases();
    held->set_job_id(a.job_id());
    held->set_shard_id(a.shard_id());
    held->set_lease_id(a.lease_id());
    return hb;
  }

  v1::ShardAssignment Acquire(const std::string& worker) {
    v1::AcquireShardRequest r;
    r.set_worker_id(worker);
    auto resp = core_->AcquireShard(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp->assignment();
  }

  // A report from `worker` under the lease of `a`, for a job of 2 classes, with no results yet.
  static v1::ReportResultsRequest ReportOf(const std::string& worker, const v1::ShardAssignment& a) {
    v1::ReportResultsRequest r;
    r.set_worker_id(worker);
    r.set_job_id(a.job_id());
    r.set_shard_id(a.shard_id());
    r.set_lease_id(a.lease_id());
    r.set_num_classes(2);
    return r;
  }

  // Reports a result for every row of the assignment: per-image counts derived from the index so
  // that the report's totals can be checked.
  v1::ReportResultsResponse Complete(const std::string& worker, const v1::ShardAssignment& a, bool complete = true) {
    v1::ReportResultsRequest r = ReportOf(worker, a);
    r.set_shard_complete(complete);
    for (const auto& row : a.rows()) {
      v1::ImageResult* ir = r.add_results();
      ir->set_index(row.index());
      ir->set_height(2);
      ir->set_width(2);
      for (int c = 0; c < 2; ++c) {
        v1::ClassResult* cr = ir->add_classes();
        cr->set_tp(c == 1 ? 1 : 2);
        cr->set_fp(c == 1 ? row.index() % 2 : 0);
        cr->set_fn(0);
        cr->set_tn(4 - cr->tp() - cr->fp());
      }
    }
    auto resp = core_->ReportResults(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return *resp;
  }

  std::string ReadReport(const std::string& job_id, const std::string& file) {
    auto dir = core_->ReportDir(job_id);
    EXPECT_TRUE(dir.ok()) << dir.status();
    std::ifstream in(*dir + "/" + file);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  std::string dir_;
  double now_ = 1000;
  std::unique_ptr<Coordinator> core_;
};

}  // namespace tally

#endif  // TALLY_TESTS_SERVER_COORDINATOR_FIXTURE_H_
