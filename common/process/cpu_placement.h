// Which CPU cores each local worker gets. A worker's decode threads should run on the cores of the
// NUMA node its GPU hangs off (the "CPU Affinity" column of `nvidia-smi topo -m`): its pinned
// staging buffers and the host-to-device copies then stay on that node's memory and PCIe root.
// PlaceWorkers decides from a given topology (tested on any machine); GpuLocalCpus and
// CoreOfCpus read it from /proc/driver/nvidia and /sys.
#ifndef TALLY_COMMON_PROCESS_CPU_PLACEMENT_H_
#define TALLY_COMMON_PROCESS_CPU_PLACEMENT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tally {

// "0-3,8,10-11" (the kernel's cpulist format) -> {0,1,2,3,8,10,11}; empty if malformed.
std::vector<int> ParseCpuList(absl::string_view text);

// The CPUs each of `workers` workers is pinned to.
//  allowed:  the CPUs this process may use.
//  near:     near[i] = the CPUs local to worker i's (first) GPU, ascending; empty (or `near` shorter than
//            `workers`) = unknown, e.g. CPU workers.
//  core_of:  cpu -> its physical core's key (hyperthread siblings share one); missing = its own.
// Every worker's GPU known and the GPUs' local sets disjoint or equal (NUMA nodes): each node's
// allowed CPUs are split among the workers of its GPUs; CPUs of nodes without a selected GPU stay
// unused (a remote core's decode costs the node link). Otherwise all allowed CPUs are split among
// all workers. Splits are contiguous runs of whole cores (siblings together), as even as the
// counts allow; with fewer CPUs than workers, workers share them round-robin.
std::vector<std::vector<int>> PlaceWorkers(int workers, const std::vector<int>& allowed,
                                           const std::vector<std::vector<int>>& near,
                                           const std::map<int, int>& core_of);

// The CPUs local to the GPU that `cuda_visible_device` names (a CUDA_VISIBLE_DEVICES entry: an
// index in PCI bus order, as nvidia-smi numbers them, or a "GPU-<uuid>"): the GPU's PCI bus id from
// <root>/proc/driver/nvidia/gpus/*/information, then <root>/sys/bus/pci/devices/<bus>/local_cpulist.
// Empty when any of it is missing (no driver, a container without /sys, a MIG id).
std::vector<int> GpuLocalCpus(const std::string& cuda_visible_device, const std::string& root = "");

// cpu -> the lowest CPU of its thread_siblings_list (<root>/sys/devices/system/cpu/cpuN/topology).
std::map<int, int> CoreOfCpus(const std::vector<int>& cpus, const std::string& root = "");

}  // namespace tally

#endif  // TALLY_COMMON_PROCESS_CPU_PLACEMENT_H_
