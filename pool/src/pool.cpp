#include "orion/pool/pool.h"

#include <algorithm>

namespace orion::pool {

VgpuPool::VgpuPool(std::vector<PhysicalGpu> gpus, uint32_t vgpu_count)
    : gpus_(std::move(gpus)), vgpu_count_(std::max<uint32_t>(1, vgpu_count)), state_(gpus_.size()) {
  for (Gpu& g : state_) {
    g.slot_bytes.assign(vgpu_count_, 0);
    g.slot_ratio.assign(vgpu_count_, 0);
  }
}

Result<std::vector<Placement>> VgpuPool::Admit(uint32_t count, uint64_t gmem_mib, PlacementPolicy policy,
                                               uint32_t ratio) {
  if (gpus_.empty()) return ResourceExhausted("this server has no GPU");
  if (count == 0) return InvalidArgument("ORION_VGPU must be at least 1");
  if (ratio > 100) return InvalidArgument("ORION_RATIO must be a percentage 1..100");
  uint64_t largest = 0;
  for (const auto& g : gpus_) largest = std::max(largest, g.total_mem);
  const uint64_t bytes = gmem_mib == 0 ? largest / vgpu_count_ : gmem_mib << 20;
  if (gmem_mib > (uint64_t{1} << 40) || bytes > largest) {
    return InvalidArgument("ORION_GMEM=" + std::to_string(gmem_mib) + " MiB is more than any GPU here has (" +
                           std::to_string(largest >> 20) + " MiB)");
  }
  if (count > total_vgpus()) {
    return ResourceExhausted("ORION_VGPU=" + std::to_string(count) + " is more than this server has (" +
                             std::to_string(total_vgpus()) + " vGPUs)");
  }
  std::vector<Gpu> trial = state_;
  std::vector<Placement> out;
  std::vector<size_t> compute_short;  // GPUs that had the slot and memory, not the compute
  for (uint32_t n = 0; n < count; ++n) {
    int best = -1;
    for (size_t i = 0; i < gpus_.size(); ++i) {
      const Gpu& g = trial[i];
      const bool slot = std::count(g.slot_bytes.begin(), g.slot_bytes.end(), 0u) > 0;
      if (!slot || g.used_bytes + bytes > gpus_[i].total_mem) continue;
      if (g.used_ratio + ratio > 100) {
        compute_short.push_back(i);
        continue;
      }
      if (best < 0) {
        best = static_cast<int>(i);
        continue;
      }
      const uint64_t b = trial[static_cast<size_t>(best)].used_bytes;
      if (policy == PlacementPolicy::kPack ? g.used_bytes > b : g.used_bytes < b) best = static_cast<int>(i);
    }
    if (best < 0) {
      std::string why = "no free vGPU for " + std::to_string(count) + " x " + std::to_string(bytes >> 20) +
                        " MiB: " + std::to_string(free_vgpus()) + " of " + std::to_string(total_vgpus()) +
                        " vGPUs are free";
      if (compute_short.size() == 1) {  // the words oriond's compute admission uses (TakeCompute)
        const Gpu& g = state_[compute_short[0]];
        why = "ORION_RATIO=" + std::to_string(ratio) + " does not fit p-GPU " +
              std::to_string(gpus_[compute_short[0]].index) + ": " + std::to_string(100 - g.used_ratio) +
              "% of its compute is left (its tenants' ratios add up to " + std::to_string(g.used_ratio) + ")";
      } else if (!compute_short.empty()) {
        why = "ORION_RATIO=" + std::to_string(ratio) + " does not fit any p-GPU: at most " +
              std::to_string(most_compute_left()) + "% of a GPU's compute is left (the ratios on a GPU add up to " +
              "at most 100); " + why;
      }
      return ResourceExhausted(why);
    }
    Gpu& g = trial[static_cast<size_t>(best)];
    const auto slot =
        static_cast<uint32_t>(std::find(g.slot_bytes.begin(), g.slot_bytes.end(), 0u) - g.slot_bytes.begin());
    g.slot_bytes[slot] = bytes;
    g.slot_ratio[slot] = ratio;
    g.used_bytes += bytes;
    g.used_ratio += ratio;
    out.push_back({gpus_[static_cast<size_t>(best)].index, slot, bytes, ratio});
  }
  state_ = std::move(trial);
  return out;
}

Status VgpuPool::Reserve(const std::vector<Placement>& placements) {
  std::vector<Gpu> trial = state_;
  for (const Placement& p : placements) {
    size_t i = 0;
    while (i < gpus_.size() && gpus_[i].index != p.pgpu) ++i;
    if (i == gpus_.size() || p.vgpu >= trial[i].slot_bytes.size()) {
      return FailedPrecondition("vGPU " + std::to_string(p.pgpu) + "/" + std::to_string(p.vgpu) +
                                " does not exist here");
    }
    Gpu& g = trial[i];
    if (g.slot_bytes[p.vgpu] != 0 || p.quota_bytes == 0) {
      return FailedPrecondition("vGPU " + std::to_string(p.pgpu) + "/" + std::to_string(p.vgpu) + " is already taken");
    }
    if (g.used_bytes + p.quota_bytes > gpus_[i].total_mem) {
      return FailedPrecondition("GPU " + std::to_string(p.pgpu) + " has not " + std::to_string(p.quota_bytes >> 20) +
                                " MiB free");
    }
    if (p.ratio > 100 || g.used_ratio + p.ratio > 100) {
      return FailedPrecondition("GPU " + std::to_string(p.pgpu) + " has " + std::to_string(100 - g.used_ratio) +
                                "% of its compute left, not " + std::to_string(p.ratio) + "%");
    }
    g.slot_bytes[p.vgpu] = p.quota_bytes;
    g.slot_ratio[p.vgpu] = p.ratio;
    g.used_bytes += p.quota_bytes;
    g.used_ratio += p.ratio;
  }
  state_ = std::move(trial);
  return Status();
}

uint64_t VgpuPool::used_bytes() const {
  uint64_t n = 0;
  for (const Gpu& g : state_) n += g.used_bytes;
  return n;
}

uint64_t VgpuPool::total_bytes() const {
  uint64_t n = 0;
  for (const auto& g : gpus_) n += g.total_mem;
  return n;
}

void VgpuPool::Release(const std::vector<Placement>& placements) {
  for (const Placement& p : placements) {
    for (size_t i = 0; i < gpus_.size(); ++i) {
      if (gpus_[i].index != p.pgpu || p.vgpu >= state_[i].slot_bytes.size()) continue;
      state_[i].used_bytes -= state_[i].slot_bytes[p.vgpu];
      state_[i].slot_bytes[p.vgpu] = 0;
      state_[i].used_ratio -= state_[i].slot_ratio[p.vgpu];
      state_[i].slot_ratio[p.vgpu] = 0;
    }
  }
}

std::string VgpuPool::FinalList() const {
  std::string s;
  for (size_t i = 0; i < gpus_.size(); ++i) {
    for (uint32_t v = 0; v < vgpu_count_; ++v) {
      if (!s.empty()) s += ",";
      s += std::to_string(v) + ":" + std::to_string(gpus_[i].index) + ":" +
           std::to_string((gpus_[i].total_mem / vgpu_count_) >> 20);
    }
  }
  return s;
}

uint32_t VgpuPool::most_compute_left() const {
  uint32_t best = 0;
  for (const Gpu& g : state_) {
    if (std::count(g.slot_bytes.begin(), g.slot_bytes.end(), 0u) > 0) best = std::max(best, 100 - g.used_ratio);
  }
  return best;
}

uint32_t VgpuPool::total_vgpus() const { return static_cast<uint32_t>(gpus_.size()) * vgpu_count_; }

uint32_t VgpuPool::free_vgpus() const {
  uint32_t n = 0;
  for (const Gpu& g : state_) n += static_cast<uint32_t>(std::count(g.slot_bytes.begin(), g.slot_bytes.end(), 0u));
  return n;
}

}  // namespace orion::pool
