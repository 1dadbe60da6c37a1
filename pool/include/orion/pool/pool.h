// orion/pool/pool.h — the vGPU slot pool: physical GPUs split into vGPU slots (vgpu_count per GPU),
// and admission of a request for ORION_VGPU x ORION_GMEM when it fits. A bottom-layer library
// (it needs orion_common only): oriond admits standalone clients with it, orion-controller places
// with one pool per server.
//
// Placement follows Orion: the vGPUs of one request are packed onto one GPU while its memory and
// slots allow, then onto the next GPU (the fullest GPU that still fits is chosen first).
//
//   VgpuPool pool(gpus, /*vgpu_count=*/4);
//   auto p = pool.Admit(2, 4096);   // 2 vGPUs of 4096 MiB
//   ...; pool.Release(*p);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "orion/common/status.h"

namespace orion::pool {

// One vGPU of a session: which physical GPU, which slot on it, its memory quota, and the share of
// the physical GPU's compute guaranteed to it (percent, 1..100; 0: best effort, compute share).
struct Placement {
  uint32_t pgpu = 0;
  uint32_t vgpu = 0;
  uint64_t quota_bytes = 0;
  uint32_t ratio = 0;
};

// A physical GPU as oriond sees it at start-up (or as a server registered it at the controller).
struct PhysicalGpu {
  uint32_t index = 0;
  std::string name;
  uint64_t total_mem = 0;  // bytes
  std::string uuid;        // text, for logs
};

// How the vGPUs of one request are laid on GPUs: `kPack` fills the fullest GPU that still fits
// (Orion's rule); `kSpread` takes the emptiest GPU for each vGPU.
enum class PlacementPolicy { kPack, kSpread };

class VgpuPool {
 public:
  VgpuPool(std::vector<PhysicalGpu> gpus, uint32_t vgpu_count);

  // `gmem_mib` 0 means the default vGPU size (GPU memory / vgpu_count). `ratio` (0..100; 0: best
  // effort) is each vGPU's guaranteed share of its GPU's compute: a GPU takes a vGPU only while the
  // ratios on it add up to at most 100. Errors (kResourceExhausted or kInvalidArgument) say why:
  // count, memory per GPU, free slots, compute left.
  Result<std::vector<Placement>> Admit(uint32_t count, uint64_t gmem_mib,
                                       PlacementPolicy policy = PlacementPolicy::kPack, uint32_t ratio = 0);
  // Marks placements decided elsewhere (the controller) as taken. kFailedPrecondition, with nothing
  // taken, when a slot does not exist, is already taken, or the GPU's memory or compute (ratios
  // over 100) would be exceeded.
  Status Reserve(const std::vector<Placement>& placements);
  void Release(const std::vector<Placement>& placements);

  // Orion's "Final virtual gpu list <vID:pID:mbSize>" body: "0:0:4096,1:0:4096,...".
  std::string FinalList() const;
  uint32_t total_vgpus() const;
  uint32_t free_vgpus() const;
  uint64_t used_bytes() const;   // reserved quota over all GPUs
  uint64_t total_bytes() const;  // memory of all GPUs
  uint64_t used_bytes(size_t gpu) const { return state_[gpu].used_bytes; }
  uint32_t used_ratio(size_t gpu) const { return state_[gpu].used_ratio; }  // sum of its vGPUs' ratios
  uint32_t most_compute_left() const;  // 100 - the smallest used_ratio over GPUs with a free slot
  const std::vector<PhysicalGpu>& gpus() const { return gpus_; }

 private:
  struct Gpu {
    std::vector<uint64_t> slot_bytes;  // 0 = free
    std::vector<uint32_t> slot_ratio;
    uint64_t used_bytes = 0;
    uint32_t used_ratio = 0;
  };
  std::vector<PhysicalGpu> gpus_;
  uint32_t vgpu_count_;
  std::vector<Gpu> state_;
};

}  // namespace orion::pool
