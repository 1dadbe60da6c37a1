// test_memory.h — device memory for the executor's unit tests and benchmark: allocations at fake
// device addresses, never adjacent (so an access past one end is outside every allocation).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "orion/ptx/ptx.h"

namespace orion::ptx {

class TestMemory : public GlobalMemory {
 public:
  uint64_t Alloc(uint64_t bytes) {
    const uint64_t addr = next_;
    blocks_[addr].resize(bytes);
    next_ += ((bytes + 0xfffff) & ~uint64_t{0xfffff}) + 0x100000;  // a 1 MiB gap after each
    return addr;
  }
  uint8_t* Host(uint64_t addr) { return blocks_.at(addr).data(); }
  template <class T>
  uint64_t Upload(const std::vector<T>& v) {
    const uint64_t a = Alloc(v.size() * sizeof(T));
    std::memcpy(Host(a), v.data(), v.size() * sizeof(T));
    return a;
  }
  template <class T>
  std::vector<T> Download(uint64_t a, size_t n) {
    std::vector<T> v(n);
    std::memcpy(v.data(), Host(a), n * sizeof(T));
    return v;
  }
  bool Find(uint64_t addr, Span* out) override {
    auto it = blocks_.upper_bound(addr);
    if (it == blocks_.begin()) return false;
    --it;
    if (addr - it->first >= it->second.size()) return false;
    *out = Span{it->first, it->second.size(), it->second.data()};
    return true;
  }
  // Texture and surface objects: the handle a kernel receives (a CUtexObject / CUsurfObject) for a
  // view the test describes. Handles of the two kinds never coincide.
  uint64_t AddTexture(const ImageView& v) {
    textures_[next_handle_] = v;
    return next_handle_++;
  }
  uint64_t AddSurface(const ImageView& v) {
    surfaces_[next_handle_] = v;
    return next_handle_++;
  }
  bool FindTexture(uint64_t handle, ImageView* out) override { return Lookup(textures_, handle, out); }
  bool FindSurface(uint64_t handle, ImageView* out) override { return Lookup(surfaces_, handle, out); }
  uint64_t texture_lookups = 0;  // FindTexture / FindSurface calls (hits and misses)

 private:
  bool Lookup(const std::map<uint64_t, ImageView>& m, uint64_t handle, ImageView* out) {
    ++texture_lookups;
    auto it = m.find(handle);
    if (it == m.end()) return false;
    *out = it->second;
    return true;
  }
  std::map<uint64_t, std::vector<uint8_t>> blocks_;
  uint64_t next_ = 0x200000000000ull;
  std::map<uint64_t, ImageView> textures_, surfaces_;
  uint64_t next_handle_ = 1;
};

}  // namespace orion::ptx
