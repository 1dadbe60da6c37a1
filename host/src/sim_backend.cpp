// The sim backend: a GPU-less executor. Device memory is host RAM (lazily committed anonymous
// mappings) at device-like addresses; modules are parsed from their fatbinary/cubin/PTX so kernel
// parameter layouts are known; kernels run on the PTX executor (orion/ptx). A kernel the executor
// cannot run (no PTX a GPU would JIT, or PTX it does not implement) fails its launch, unless the
// daemon was started with --sim-unexecutable skip (API-level testing: results are not computed).
//
// This file makes the backend (MakeSimBackend); the class is in sim_backend.h and the files it names.
#include "sim_backend.h"

namespace orion::host {

using sim::SimBackend;

std::unique_ptr<Backend> MakeSimBackend(const SimOptions& options) { return std::make_unique<SimBackend>(options); }

std::vector<PhysicalGpu> SimPhysicalGpus(uint32_t count, uint64_t mem_mib) {
  std::vector<PhysicalGpu> gpus;
  for (uint32_t i = 0; i < count; ++i) {
    gpus.push_back({i, "Orion Simulated GPU", mem_mib << 20, "GPU-orion-sim-" + std::to_string(i)});
  }
  return gpus;
}

}  // namespace orion::host
