// The module images a session worker holds, by content hash (XXH3-128, as the client names them in
// BlobPut and ModuleLoad): images uploaded or read from the host's disk cache wait in memory for
// their ModuleLoad, at most kMaxHeldImageBytes in all (the oldest go first; a client whose image
// was dropped is asked for its bytes again); an image that loaded (so it parsed) is written to the
// disk cache, which is kept under its size bound by removing the oldest entries.
//
//   ModuleImages images(cache_dir, cache_max_bytes);
//   const auto* img = images.Find(lo, hi, bytes);        // memory, else the disk cache, else null
//   images.Hold(ModuleImages::Hex(lo, hi), std::move(upload));
//   images.Cache(hex, *img); images.Drop(hex);           // after a successful load
//
// One per session worker; not thread-safe. Session workers run in parallel processes on the same
// cache directory: their writes are atomic (rename) and their evictions may overlap, which only
// removes a file twice.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace orion::host {

class ModuleImages {
 public:
  // `cache_dir` "" : memory only.
  ModuleImages(std::string cache_dir, uint64_t cache_max_bytes)
      : cache_dir_(std::move(cache_dir)), cache_max_bytes_(cache_max_bytes) {}

  static std::string Hex(uint64_t lo, uint64_t hi);  // the 32-hex-digit name of a hash

  // The image with this hash and size: held in memory, or read from the disk cache (and checked
  // against its hash); null when neither has it.
  const std::vector<uint8_t>* Find(uint64_t lo, uint64_t hi, uint64_t bytes);
  void Hold(const std::string& hex, std::vector<uint8_t> data);
  void Drop(const std::string& hex);
  // Writes an image that loaded to the disk cache (once), then evicts down to cache_max_bytes.
  void Cache(const std::string& hex, const std::vector<uint8_t>& data);

 private:
  std::string cache_dir_;
  uint64_t cache_max_bytes_;
  std::map<std::string, std::vector<uint8_t>> held_;  // images awaiting ModuleLoad
  std::deque<std::string> held_order_;                // oldest first
  uint64_t held_bytes_ = 0;
  std::set<std::string> cached_;  // images known to be in the disk cache
};

}  // namespace orion::host
