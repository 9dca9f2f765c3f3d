// tally-load-worker: a fake worker for loading tallyd. It speaks the real WorkerControl
// API (RegisterWorker, AcquireShard as a long poll, one ReportResults per shard, Heartbeat listing
// its lease) but opens no image and runs no model: every row's result is made up from its index
// alone (LoadRowCounts below; bench/load_bench.py computes the same numbers independently to check
// the report). 64 x 64 rows, --classes classes, surface distances made up too when the job selects
// any. --rate caps the rows per second it reports (0: as fast as tallyd takes them).
//
//   tally-load-worker --coordinator HOST:PORT [--rate 2200] [--classes 3] [--name load0]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "base/flag_util.h"
#include "proto/tally.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "127.0.0.1:50051", "tallyd's address");
ABSL_FLAG(double, rate, 0, "rows per second to report at most (0: no limit)");
ABSL_FLAG(int, classes, 3, "classes of every made-up result");
ABSL_FLAG(std::string, name, "load", "worker name");
ABSL_FLAG(int, idle_exit_seconds, 0, "exit after this long without a shard (0: never)");

namespace {

using tally::v1::WorkerControl;
namespace v1 = tally::v1;

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr int kSide = 64;

// Row `index`, class `c`: tp in [0, 1000), fp and fn in [0, 300), the rest true negatives; hd95 in
// [0, 10) in steps of 0.01 (hd = hd95 + 1, assd = hd95 / 2, nsd = tp / 1000).
void FillClass(int64_t index, int c, bool surface, v1::ClassResult* out) {
  const uint64_t h = SplitMix64(static_cast<uint64_t>(index) * 16 + static_cast<uint64_t>(c));
  const int64_t tp = static_cast<int64_t>(h % 1000), fp = static_cast<int64_t>((h >> 10) % 300);
  const int64_t fn = static_cast<int64_t>((h >> 20) % 300);
  out->set_tp(tp);
  out->set_fp(fp);
  out->set_fn(fn);
  out->set_tn(kSide * kSide - tp - fp - fn);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double hd95 = static_cast<double>((h >> 30) % 1000) / 100.0;
  out->set_hd95(surface ? hd95 : nan);
  out->set_hd(surface ? hd95 + 1 : nan);
  out->set_assd(surface ? hd95 / 2 : nan);
  out->set_nsd(surface ? static_cast<double>(tp) / 1000.0 : nan);
}

bool WantsSurface(const v1::JobSpec& spec) {
  for (const std::string& m : spec.metrics()) {
    if (m == "all" || m == "hd" || m == "hd95" || m == "assd" || m == "nsd") return true;
  }
  return spec.metrics_size() == 0;  // The default set has hd95.
}

struct Held {
  std::mutex mu;
  v1::HeldLease lease;
  bool holding = false;
};

}  // namespace

constexpr char kUsage[] =
    "tally-load-worker: a fake worker over the real WorkerControl API for loading tallyd (bench/load_bench.py).\n"
    "\n"
    "  tally-load-worker --coordinator HOST:PORT [--rate 2200] [--classes 3] [--name load0]";

int main(int argc, char** argv) {
  if (!tally::ParseToolFlags(argc, argv, kUsage, "bench/load_worker.cc")) {
    return 0;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(256 << 20);
  args.SetMaxSendMessageSize(256 << 20);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_coordinator), grpc::InsecureChannelCredentials(), args);
  auto stub = WorkerControl::NewStub(channel);
  v1::RegisterWorkerRequest reg;
  reg.set_name(absl::GetFlag(FLAGS_name));
  reg.set_device("cpu");
  reg.set_device_name("load generator");
  reg.set_hostname("localhost");
  reg.set_pid(getpid());
  // Registers (again, after tallyd restarted: it answers an unknown worker with NOT_FOUND), retrying
  // for up to a minute while tallyd is away.
  std::mutex id_mu;
  std::string worker_id;
  double heartbeat_seconds = 1;
  auto register_worker = [&]() -> bool {
    for (int attempt = 0; attempt < 300; ++attempt) {
      v1::RegisterWorkerResponse registered;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::Status s = stub->RegisterWorker(&ctx, reg, &registered);
      if (s.ok()) {
        std::lock_guard<std::mutex> lock(id_mu);
        worker_id = registered.worker_id();
        heartbeat_seconds = std::max(0.2, registered.heartbeat_seconds());
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::fprintf(stderr, "cannot register with %s\n", absl::GetFlag(FLAGS_coordinator).c_str());
    return false;
  };
  if (!register_worker()) return 1;
  Held held;
  std::atomic<bool> stop{false};
  auto current_id = [&] {
    std::lock_guard<std::mutex> lock(id_mu);
    return worker_id;
  };
  std::thread beat([&] {
    while (!stop.load()) {
      v1::HeartbeatRequest req;
      req.set_worker_id(current_id());
      {
        std::lock_guard<std::mutex> lock(held.mu);
        if (held.holding) *req.add_leases() = held.lease;
      }
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      v1::HeartbeatResponse resp;
      stub->Heartbeat(&ctx, req, &resp).ok();
      std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(heartbeat_seconds * 1000 / 2)));
    }
  });
  const double rate = absl::GetFlag(FLAGS_rate);
  const int classes = absl::GetFlag(FLAGS_classes);
  const auto start = std::chrono::steady_clock::now();
  auto last_shard = start;
  int64_t rows_sent = 0;
  while (true) {
    v1::AcquireShardRequest acq;
    acq.set_worker_id(current_id());
    acq.set_max_wait_ms(1000);
    v1::AcquireShardResponse got;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    if (!stub->AcquireShard(&ctx, acq, &got).ok()) {  // tallyd away or restarted: register again.
      if (!register_worker()) break;
      continue;
    }
    if (!got.has_assignment()) {
      const int idle = absl::GetFlag(FLAGS_idle_exit_seconds);
      if (idle > 0 && std::chrono::steady_clock::now() - last_shard > std::chrono::seconds(idle)) break;
      continue;
    }
    last_shard = std::chrono::steady_clock::now();
    const v1::ShardAssignment& a = got.assignment();
    {
      std::lock_guard<std::mutex> lock(held.mu);
      held.lease.set_job_id(a.job_id());
      held.lease.set_shard_id(a.shard_id());
      held.lease.set_lease_id(a.lease_id());
      held.holding = true;
    }
    const bool surface = WantsSurface(a.spec());
    v1::ReportResultsRequest rep;
    rep.set_worker_id(current_id());
    rep.set_job_id(a.job_id());
    rep.set_shard_id(a.shard_id());
    rep.set_lease_id(a.lease_id());
    rep.set_shard_complete(true);
    rep.set_num_classes(classes);
    for (const v1::ManifestRow& row : a.rows()) {
      v1::ImageResult* r = rep.add_results();
      r->set_index(row.index());
      r->set_height(kSide);
      r->set_width(kSide);
      r->set_mask_max_label(classes - 1);
      for (int c = 0; c < classes; ++c) FillClass(row.index(), c, surface, r->add_classes());
    }
    rows_sent += a.rows_size();
    if (rate > 0) {  // Pace: the rows sent so far at `rate` rows/s.
      const auto due = start + std::chrono::duration<double>(static_cast<double>(rows_sent) / rate);
      std::this_thread::sleep_until(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(due));
    }
    v1::ReportResultsResponse resp;
    grpc::ClientContext rctx;
    rctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    grpc::Status s = stub->ReportResults(&rctx, rep, &resp);
    if (!s.ok()) {  // The shard goes back to tallyd's queue (its lease lapses); it is granted again.
      std::fprintf(stderr, "report shard %lld: %s\n", static_cast<long long>(a.shard_id()), s.error_message().c_str());
    }
    std::lock_guard<std::mutex> lock(held.mu);
    held.holding = false;
  }
  stop = true;
  beat.join();
  return 0;
}
