// tally gpus: this machine's GPUs (client/gpus.h); exit 0 when at least one is ready, 1 otherwise.
#include <iostream>

#include "client/gpus.h"
#include "client/verbs/verbs.h"

namespace tally {

int GpusVerb(bool json) {
  const GpuInventoryReport gpus = InspectGpus();
  std::cout << (json ? GpusJson(gpus) + "\n" : GpusText(gpus));
  for (const GpuReport& g : gpus.gpus) {
    if (g.verdict == "ready") return 0;
  }
  return 1;
}

}  // namespace tally
