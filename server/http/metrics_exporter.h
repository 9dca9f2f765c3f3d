// tallyd's Prometheus endpoint: `--metrics-listen host:port` serves GET /metrics in the Prometheus
// text format (prometheus-cpp's exposer, a civetweb HTTP server). Every scrape reads the
// coordinator's figures (Coordinator::Metrics) at that moment: jobs by state, rows evaluated and
// failed, shards leased/expired/retried, workers registered and busy, the commit latency
// histogram, the database size, and each worker's rows, images/s and GPU memory from its latest
// heartbeat, so one scrape of tallyd sees the whole fleet; and each follow's last step evaluated,
// its lag behind the trainer (checkpoints and seconds) and its best step. Names and labels: docs/operations.md "Metrics endpoint".
#ifndef TALLY_SERVER_HTTP_METRICS_EXPORTER_H_
#define TALLY_SERVER_HTTP_METRICS_EXPORTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/coordinator/coordinator.h"
#include "server/follow/follow_manager.h"

namespace prometheus {
class Exposer;
struct MetricFamily;
}  // namespace prometheus

namespace tally {

// The families of one scrape, built from a snapshot (separate from the HTTP side for tests).
std::vector<prometheus::MetricFamily> BuildMetricFamilies(const CoordinatorMetrics& m,
                                                          const std::vector<FollowGauges>& follows = {});

class MetricsExporter {
 public:
  // Listens on `listen` (host:port; port 0 picks a free one). `core` (and `follows`, which may be
  // null) must outlive the exporter. UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen, Coordinator* core,
                                                                const FollowManager* follows = nullptr);
  ~MetricsExporter();

  int port() const { return port_; }

 private:
  class Collector;
  MetricsExporter() = default;

  std::shared_ptr<Collector> collector_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace tally

#endif  // TALLY_SERVER_HTTP_METRICS_EXPORTER_H_
