#include "client/gpus.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/json_writer.h"

namespace tally {
namespace {

// NVML's C API as far as used here (nvml.h's layouts; NVML_SUCCESS is 0).
using Device = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlMemoryV2 {  // nvmlMemory_v2_t: `used` without the driver's reserved memory, as nvidia-smi shows it.
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
constexpr unsigned int kMemoryV2 = sizeof(NvmlMemoryV2) | (2u << 24);  // NVML_STRUCT_VERSION(Memory, 2)
constexpr int kP2pNvlink = 2;  // NVML_P2P_CAPS_INDEX_NVLINK; status 0 = NVML_P2P_STATUS_OK.
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlProcess {  // nvmlProcessInfo_v2_t, as the _v3 call fills it.
  unsigned int pid;
  unsigned long long used;
  unsigned int gpu_instance, compute_instance;
};
struct NvmlPci {  // nvmlPciInfo_t.
  char bus_id_legacy[16];
  unsigned int domain, bus, device, device_id, subsystem_id;
  char bus_id[32];
};
constexpr int kMaxLinks = 18;  // NVML_NVLINK_MAX_LINKS

class Nvml {
 public:
  static std::unique_ptr<Nvml> Load() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return nullptr;
    auto n = std::unique_ptr<Nvml>(new Nvml(lib));
    auto init = n->Fn<int (*)()>("nvmlInit_v2");
    if (init == nullptr || init() != 0) return nullptr;
    n->initialised_ = true;
    return n;
  }
  ~Nvml() {
    if (initialised_) {
      if (auto shutdown = Fn<int (*)()>("nvmlShutdown")) shutdown();
    }
    dlclose(lib_);
  }
  template <typename F>
  F Fn(const char* name) const {
    return reinterpret_cast<F>(dlsym(lib_, name));
  }

 private:
  explicit Nvml(void* lib) : lib_(lib) {}
  void* lib_;
  bool initialised_ = false;
};

std::string TopologyName(int level) {
  switch (level) {
    case 0: return "SELF";
    case 10: return "PIX";   // One PCIe switch.
    case 20: return "PXB";   // Several PCIe switches.
    case 30: return "PHB";   // A PCIe host bridge.
    case 40: return "NODE";  // Host bridges within one NUMA node.
    case 50: return "SYS";   // Across NUMA nodes (SMP interconnect).
    default: return "";
  }
}

std::string Lower(std::string s) { return absl::AsciiStrToLower(s); }

// One GPU's name, ids, memory, utilisation and compute processes.
GpuReport ReadNvmlDevice(Nvml& nvml, Device d, int index) {
  auto name = nvml.Fn<int (*)(Device, char*, unsigned)>("nvmlDeviceGetName");
  auto uuid = nvml.Fn<int (*)(Device, char*, unsigned)>("nvmlDeviceGetUUID");
  auto pci = nvml.Fn<int (*)(Device, NvmlPci*)>("nvmlDeviceGetPciInfo_v3");
  auto memory = nvml.Fn<int (*)(Device, NvmlMemory*)>("nvmlDeviceGetMemoryInfo");
  auto memory_v2 = nvml.Fn<int (*)(Device, NvmlMemoryV2*)>("nvmlDeviceGetMemoryInfo_v2");
  auto util = nvml.Fn<int (*)(Device, NvmlUtilization*)>("nvmlDeviceGetUtilizationRates");
  auto procs = nvml.Fn<int (*)(Device, unsigned*, NvmlProcess*)>("nvmlDeviceGetComputeRunningProcesses_v3");
  GpuReport g;
  g.index = index;
  char text[256] = {};
  if (name && name(d, text, sizeof(text)) == 0) g.name = text;
  if (uuid && uuid(d, text, sizeof(text)) == 0) g.uuid = text;
  NvmlPci p{};
  if (pci && pci(d, &p) == 0) g.bus_id = Lower(p.bus_id);
  NvmlMemoryV2 m2{};
  m2.version = kMemoryV2;
  NvmlMemory m{};
  if (memory_v2 && memory_v2(d, &m2) == 0) {
    g.memory_total = static_cast<int64_t>(m2.total);
    g.memory_free = static_cast<int64_t>(m2.free);
    g.memory_used = static_cast<int64_t>(m2.used);
  } else if (memory && memory(d, &m) == 0) {
    g.memory_total = static_cast<int64_t>(m.total);
    g.memory_free = static_cast<int64_t>(m.free);
    g.memory_used = static_cast<int64_t>(m.used);
  }
  NvmlUtilization u{};
  if (util && util(d, &u) == 0) g.utilization = static_cast<int>(u.gpu);
  NvmlProcess list[128];
  unsigned n = 128;
  if (procs && procs(d, &n, list) == 0) {
    for (unsigned k = 0; k < n; ++k) {
      // NVML_VALUE_NOT_AVAILABLE (all ones) where the driver does not say.
      const bool known = list[k].used != ~0ull;
      g.processes.push_back({static_cast<int64_t>(list[k].pid), known ? static_cast<int64_t>(list[k].used) : -1});
    }
  }
  return g;
}

// The link between each pair of `devices` (r->gpus in the same order), as nvidia-smi topo -m names it.
void ReadNvmlLinks(Nvml& nvml, const std::vector<Device>& devices, GpuInventoryReport* r) {
  auto p2p = nvml.Fn<int (*)(Device, Device, int, int*)>("nvmlDeviceGetP2PStatus");
  auto ancestor = nvml.Fn<int (*)(Device, Device, int*)>("nvmlDeviceGetTopologyCommonAncestor");
  auto link_state = nvml.Fn<int (*)(Device, unsigned, int*)>("nvmlDeviceGetNvLinkState");
  auto link_remote = nvml.Fn<int (*)(Device, unsigned, NvmlPci*)>("nvmlDeviceGetNvLinkRemotePciInfo_v2");
  const size_t n = devices.size();
  r->links.assign(n, std::vector<std::string>(n));
  for (size_t i = 0; i < n; ++i) {
    std::map<size_t, int> nvlinks;  // Peer -> active links whose far end is that GPU.
    int active_links = 0;
    for (unsigned l = 0; link_state && l < kMaxLinks; ++l) {
      int active = 0;
      if (link_state(devices[i], l, &active) != 0 || !active) continue;
      ++active_links;
      NvmlPci remote{};
      if (!link_remote || link_remote(devices[i], l, &remote) != 0) continue;
      for (size_t j = 0; j < n; ++j) {
        if (j != i && Lower(remote.bus_id) == r->gpus[j].bus_id) ++nvlinks[j];
      }
    }
    for (size_t j = 0; j < n; ++j) {
      int status = -1;
      if (i == j) {
        r->links[i][j] = "X";
      } else if (nvlinks.count(j)) {
        r->links[i][j] = absl::StrCat("NV", nvlinks[j]);
      } else if (active_links > 0 && p2p && p2p(devices[i], devices[j], kP2pNvlink, &status) == 0 && status == 0) {
        // NVLink peers whose far-end PCI address differs from what this (virtual) machine shows, or
        // behind an NVSwitch: every active link serves the pair, as nvidia-smi topo counts them.
        r->links[i][j] = absl::StrCat("NV", active_links);
      } else if (int level = 0; ancestor && ancestor(devices[i], devices[j], &level) == 0) {
        r->links[i][j] = TopologyName(level);
      }
    }
  }
}

bool FromNvml(GpuInventoryReport* r) {
  std::unique_ptr<Nvml> nvml = Nvml::Load();
  if (!nvml) return false;
  r->source = "nvml";
  char text[256] = {};
  if (auto f = nvml->Fn<int (*)(char*, unsigned)>("nvmlSystemGetDriverVersion"); f && f(text, sizeof(text)) == 0) {
    r->driver_version = text;
  }
  int cuda = 0;
  if (auto f = nvml->Fn<int (*)(int*)>("nvmlSystemGetCudaDriverVersion_v2"); f && f(&cuda) == 0 && cuda > 0) {
    r->cuda_version = absl::StrCat(cuda / 1000, ".", cuda % 1000 / 10);
  }
  unsigned count = 0;
  auto get_count = nvml->Fn<int (*)(unsigned*)>("nvmlDeviceGetCount_v2");
  auto by_index = nvml->Fn<int (*)(unsigned, Device*)>("nvmlDeviceGetHandleByIndex_v2");
  if (get_count == nullptr || by_index == nullptr || get_count(&count) != 0) return true;
  std::vector<Device> devices;
  for (unsigned i = 0; i < count; ++i) {
    Device d = nullptr;
    if (by_index(i, &d) != 0) continue;
    devices.push_back(d);
    r->gpus.push_back(ReadNvmlDevice(*nvml, d, static_cast<int>(i)));
  }
  ReadNvmlLinks(*nvml, devices, r);
  return true;
}

// Output of a command from PATH (fixed arguments, no shell input from outside); empty on failure.
std::string Run(const std::string& command) {
  FILE* p = popen((command + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return "";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  return pclose(p) == 0 ? out : "";
}

int64_t MiB(absl::string_view v) {
  double d = 0;
  return absl::SimpleAtod(absl::StripAsciiWhitespace(v), &d) ? static_cast<int64_t>(d * 1048576.0) : 0;
}

bool FromNvidiaSmi(GpuInventoryReport* r) {
  const std::string gpus = Run(
      "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.free,memory.used,utilization.gpu,"
      "driver_version --format=csv,noheader,nounits");
  if (gpus.empty()) return false;
  r->source = "nvidia-smi";
  std::map<std::string, size_t> by_uuid;
  for (absl::string_view line : absl::StrSplit(gpus, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() < 9) continue;
    for (std::string& s : f) s = std::string(absl::StripAsciiWhitespace(s));
    GpuReport g;
    (void)absl::SimpleAtoi(f[0], &g.index);
    g.name = f[1];
    g.uuid = f[2];
    g.bus_id = Lower(f[3]);
    g.memory_total = MiB(f[4]);
    g.memory_free = MiB(f[5]);
    g.memory_used = MiB(f[6]);
    if (!absl::SimpleAtoi(f[7], &g.utilization)) g.utilization = -1;
    r->driver_version = f[8];
    by_uuid[g.uuid] = r->gpus.size();
    r->gpus.push_back(std::move(g));
  }
  const std::string apps = Run("nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits");
  for (absl::string_view line : absl::StrSplit(apps, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> f = absl::StrSplit(line, ',');
    if (f.size() < 3) continue;
    auto it = by_uuid.find(std::string(absl::StripAsciiWhitespace(f[0])));
    int64_t pid = 0;
    if (it == by_uuid.end() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(f[1]), &pid)) continue;
    r->gpus[it->second].processes.push_back({pid, MiB(f[2])});
  }
  const std::string summary = Run("nvidia-smi");
  if (size_t at = summary.find("CUDA Version:"); at != std::string::npos) {
    std::vector<std::string> words = absl::StrSplit(summary.substr(at + 13, 16), ' ', absl::SkipWhitespace());
    if (!words.empty()) r->cuda_version = words[0];
  }
  // `nvidia-smi topo -m`: a row per GPU, "GPUi  X  NV18  PIX ...", the first columns the GPUs.
  const size_t n = r->gpus.size();
  r->links.assign(n, std::vector<std::string>(n));
  for (absl::string_view line : absl::StrSplit(Run("nvidia-smi topo -m"), '\n', absl::SkipWhitespace())) {
    std::vector<std::string> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipWhitespace());
    int row = -1;
    if (f.size() < n + 1 || f[0].rfind("GPU", 0) != 0 || !absl::SimpleAtoi(f[0].substr(3), &row)) continue;
    if (row < 0 || static_cast<size_t>(row) >= n) continue;
    for (size_t j = 0; j < n; ++j) r->links[row][j] = f[j + 1];
  }
  return true;
}

std::string GiB(int64_t bytes) { return absl::StrFormat("%.1f", static_cast<double>(bytes) / 1073741824.0); }

}  // namespace

void JudgeGpus(GpuInventoryReport* report) {
  for (GpuReport& g : report->gpus) {
    if (g.processes.empty() && g.memory_used < kBusyBytes) {
      g.verdict = "ready";
      continue;
    }
    std::vector<std::string> pids;
    for (const GpuProcess& p : g.processes) pids.push_back(absl::StrCat(p.pid));
    g.verdict = absl::StrCat("busy: ", GiB(g.memory_used), " GiB used",
                             pids.empty() ? " (by processes not visible here)"
                                          : absl::StrCat(" by pid ", absl::StrJoin(pids, ", pid ")));
  }
}

GpuInventoryReport InspectGpus() {
  GpuInventoryReport r;
  const char* nvml = std::getenv("TALLY_NVML");
  const bool try_nvml = nvml == nullptr || std::string(nvml) != "off";
  if (!(try_nvml && FromNvml(&r)) && !FromNvidiaSmi(&r)) {
    r.error = "no NVIDIA driver found: neither libnvidia-ml.so.1 (NVML) could be loaded nor nvidia-smi run";
  }
  JudgeGpus(&r);
  return r;
}

std::string GpusText(const GpuInventoryReport& r) {
  if (!r.error.empty()) return r.error + "\n";
  std::string out = absl::StrCat("driver ", r.driver_version.empty() ? "?" : r.driver_version, ", CUDA ",
                                 r.cuda_version.empty() ? "?" : r.cuda_version, " (via ", r.source, "); ",
                                 r.gpus.size(), " GPU(s)\n");
  if (r.gpus.empty()) return out;
  size_t width = 4;
  for (const GpuReport& g : r.gpus) width = std::max(width, g.name.size());
  absl::StrAppend(&out, absl::StrFormat("%-4s %-*s %-18s %5s  %s\n", "GPU", static_cast<int>(width), "name",
                                        "memory used/total", "util", "verdict"));
  for (const GpuReport& g : r.gpus) {
    absl::StrAppend(&out, absl::StrFormat("%-4d %-*s %-18s %5s  %s\n", g.index, static_cast<int>(width), g.name,
                                          absl::StrCat(GiB(g.memory_used), "/", GiB(g.memory_total), " GiB"),
                                          g.utilization >= 0 ? absl::StrCat(g.utilization, "%") : "?", g.verdict));
  }
  if (r.gpus.size() > 1) {
    out += "links (NV#: NVLinks; PIX/PXB: PCIe switches; PHB: host bridge; NODE/SYS: across bridges/sockets):\n     ";
    for (const GpuReport& g : r.gpus) absl::StrAppend(&out, absl::StrFormat(" %-5s", absl::StrCat("GPU", g.index)));
    out += "\n";
    for (size_t i = 0; i < r.gpus.size(); ++i) {
      absl::StrAppend(&out, absl::StrFormat("%-5s", absl::StrCat("GPU", r.gpus[i].index)));
      for (size_t j = 0; j < r.gpus.size(); ++j) {
        const std::string& l = i < r.links.size() && j < r.links[i].size() ? r.links[i][j] : "";
        absl::StrAppend(&out, absl::StrFormat(" %-5s", l.empty() ? "?" : l));
      }
      out += "\n";
    }
  }
  return out;
}

std::string GpusJson(const GpuInventoryReport& r) {
  JsonWriter w(true, false);
  w.BeginObject();
  w.Field("source", r.source).Field("driver_version", r.driver_version).Field("cuda_version", r.cuda_version);
  if (!r.error.empty()) w.Field("error", r.error);
  int ready = 0;
  w.Key("gpus").BeginArray();
  for (const GpuReport& g : r.gpus) {
    ready += g.verdict == "ready";
    w.BeginObject().Field("index", g.index).Field("name", g.name).Field("uuid", g.uuid).Field("bus_id", g.bus_id);
    w.Field("memory_total_bytes", g.memory_total).Field("memory_free_bytes", g.memory_free);
    w.Field("memory_used_bytes", g.memory_used);
    if (g.utilization >= 0) {
      w.Field("utilization_percent", g.utilization);
    } else {
      w.Key("utilization_percent").Null();
    }
    w.Key("processes").BeginArray();
    for (const GpuProcess& p : g.processes) {
      w.BeginObject().Field("pid", p.pid);
      if (p.used_bytes >= 0) {
        w.Field("used_bytes", p.used_bytes);
      } else {
        w.Key("used_bytes").Null();
      }
      w.EndObject();
    }
    w.EndArray();
    w.Field("ready", g.verdict == "ready").Field("verdict", g.verdict).EndObject();
  }
  w.EndArray();
  w.Key("links").BeginArray();
  for (const auto& row : r.links) {
    w.BeginArray();
    for (const std::string& l : row) w.String(l);
    w.EndArray();
  }
  w.EndArray();
  w.Field("ready", ready);
  w.EndObject();
  return w.str();
}

}  // namespace tally
