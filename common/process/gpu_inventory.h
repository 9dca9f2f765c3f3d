// Which GPUs this machine exposes, found without linking CUDA (the coordinator and the client
// never load CUDA): CUDA_VISIBLE_DEVICES when set, else /proc/driver/nvidia/gpus, else
// `nvidia-smi -L`.
#ifndef TALLY_COMMON_PROCESS_GPU_INVENTORY_H_
#define TALLY_COMMON_PROCESS_GPU_INVENTORY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tally {

// Each entry is a value for CUDA_VISIBLE_DEVICES that selects exactly that GPU.
std::vector<std::string> VisibleGpus();

// Parses a --gpus selection: "all" (every visible GPU; an error if there is none) or a comma
// list of indices into VisibleGpus().
absl::StatusOr<std::vector<std::string>> SelectGpus(const std::string& selection);
// Groups selected GPUs into workers of `per_worker` contiguous GPUs each ({"0","1","2","3"}, 2 ->
// {"0,1","2,3"}: CUDA_VISIBLE_DEVICES values). INVALID_ARGUMENT unless the count divides evenly.
absl::StatusOr<std::vector<std::string>> GroupGpus(const std::vector<std::string>& gpus, int per_worker);

}  // namespace tally

#endif  // TALLY_COMMON_PROCESS_GPU_INVENTORY_H_
