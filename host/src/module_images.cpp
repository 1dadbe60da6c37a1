// The module images of a session worker: see module_images.h.
#include "module_images.h"

#include <fcntl.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "orion/common/frame.h"

namespace orion::host {

std::string ModuleImages::Hex(uint64_t lo, uint64_t hi) {
  char b[40];
  std::snprintf(b, sizeof b, "%016" PRIx64 "%016" PRIx64, hi, lo);
  return b;
}

const std::vector<uint8_t>* ModuleImages::Find(uint64_t lo, uint64_t hi, uint64_t bytes) {
  const std::string hex = Hex(lo, hi);
  auto it = held_.find(hex);
  if (it != held_.end()) return it->second.size() == bytes ? &it->second : nullptr;
  if (cache_dir_.empty() || bytes > kMaxHeldImageBytes) return nullptr;
  std::ifstream f(cache_dir_ + "/" + hex, std::ios::binary);
  if (!f) return nullptr;
  std::vector<uint8_t> data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  if (data.size() != bytes || h.low64 != lo || h.high64 != hi) return nullptr;  // corrupt cache entry
  cached_.insert(hex);
  Hold(hex, std::move(data));
  return &held_[hex];
}

void ModuleImages::Hold(const std::string& hex, std::vector<uint8_t> data) {
  while (!held_order_.empty() && held_bytes_ + data.size() > kMaxHeldImageBytes) Drop(held_order_.front());
  held_bytes_ += data.size();
  held_order_.push_back(hex);
  held_[hex] = std::move(data);
}

void ModuleImages::Drop(const std::string& hex) {
  auto it = held_.find(hex);
  if (it != held_.end()) {
    held_bytes_ -= it->second.size();
    held_.erase(it);
  }
  held_order_.erase(std::remove(held_order_.begin(), held_order_.end(), hex), held_order_.end());
}

void ModuleImages::Cache(const std::string& hex, const std::vector<uint8_t>& data) {
  if (cache_dir_.empty() || cached_.count(hex) != 0) return;
  const std::string tmp = cache_dir_ + "/." + hex + "." + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);  // tenants' code: oriond's only
  if (fd < 0) return;
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  ::close(fd);
  if (!ok || ::rename(tmp.c_str(), (cache_dir_ + "/" + hex).c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  cached_.insert(hex);
  namespace fs = std::filesystem;
  std::error_code ec;
  std::vector<std::pair<fs::file_time_type, fs::path>> entries;
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(cache_dir_, ec)) {
    if (!e.is_regular_file(ec) || e.path().filename().string().starts_with(".")) continue;
    total += e.file_size(ec);
    entries.emplace_back(e.last_write_time(ec), e.path());
  }
  if (total <= cache_max_bytes_) return;
  std::sort(entries.begin(), entries.end());
  for (const auto& [when, path] : entries) {
    if (total <= cache_max_bytes_) break;
    if (path.filename() == hex) continue;  // the image just written stays
    const uint64_t size = fs::file_size(path, ec);
    if (fs::remove(path, ec)) total -= size;
  }
}

}  // namespace orion::host
