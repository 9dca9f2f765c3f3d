// `tally gpus`: is this box ready, and for what. Every NVIDIA GPU with its name, memory (total,
// free, used), utilisation, the processes using it, the driver and CUDA versions, the link between
// each pair of GPUs (NVLink, or how far apart on PCIe), and a verdict per GPU ("ready", or "busy:
// 21.3 GiB used by pid 4242"). Read through NVML, loaded with dlopen (so CPU builds and machines
// without a driver run it too), else by parsing `nvidia-smi`.
#ifndef TALLY_CLIENT_GPUS_H_
#define TALLY_CLIENT_GPUS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tally {

struct GpuProcess {
  int64_t pid = 0;
  int64_t used_bytes = 0;  // -1: not reported.
};

struct GpuReport {
  int index = 0;
  std::string name;
  std::string uuid;
  std::string bus_id;
  int64_t memory_total = 0;
  int64_t memory_free = 0;
  int64_t memory_used = 0;
  int utilization = -1;  // Percent; -1: not reported.
  std::vector<GpuProcess> processes;
  std::string verdict;   // "ready" or "busy: ..."
};

struct GpuInventoryReport {
  std::string source;  // "nvml", "nvidia-smi" or "" (none found).
  std::string driver_version;
  std::string cuda_version;
  std::vector<GpuReport> gpus;
  // links[i][j] for i != j: "NV4" (4 NVLinks), or the PCIe path as nvidia-smi topo names it (PIX,
  // PXB, PHB, NODE, SYS); "" where unknown.
  std::vector<std::vector<std::string>> links;
  std::string error;   // Why nothing was found.
};

// Used memory above this, or any process, makes a GPU busy (an idle GPU shows a few hundred MiB).
inline constexpr int64_t kBusyBytes = int64_t{1} << 30;

// NVML first; `nvidia-smi` (from PATH) when NVML cannot be loaded. TALLY_NVML=off skips NVML.
GpuInventoryReport InspectGpus();
// Sets each GPU's verdict from its processes and memory.
void JudgeGpus(GpuInventoryReport* report);

std::string GpusText(const GpuInventoryReport& report);
std::string GpusJson(const GpuInventoryReport& report);

}  // namespace tally

#endif  // TALLY_CLIENT_GPUS_H_
