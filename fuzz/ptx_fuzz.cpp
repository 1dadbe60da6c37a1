// ptx_fuzz — the sim backend's PTX executor (ptx/include/orion/ptx/ptx.h) and the PTX linker
// (ptx/include/orion/ptx/link.h) on hostile PTX text: what a client passes to cuModuleLoadData (a
// PTX image, or a fatbin's PTX entry) and to cuLinkAddData.
//
// Input: two bytes (little-endian) where the text is split for the linker, one launch-selector
// byte, one texture byte (the shape of the textures and surfaces kernels read: every handle names
// one), then the PTX text. Each run
//   * parses the whole text (ptx::Parse), and checks Vars / HasKernel;
//   * links the two halves (ptx::LinkText; one module when the split is at either end) and parses
//     the result;
//   * launches up to three kernels of the parsed text (the `.entry` names in it: those with index
//     = selector mod 8, modulo 8), each on a 1x1x1 grid of 1 thread (32 when the selector's top bit
//     is set), with a 5 ms timeout, one worker, 256 bytes of dynamic shared memory, parameters
//     pointing at a 64 KiB allocation, and the module's variables allocated: the launch lowers the
//     kernel (where unsupported instructions are refused) and runs it until it ends, faults or
//     times out; when the selector's bits 4-6 are all set, the kernel is translated to native code
//     first (ptx::Translated), so its traces run as native code.
// Nothing the executor does may touch memory outside the allocations it was given (ASan).
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "orion/ptx/link.h"
#include "orion/ptx/ptx.h"
#include "test_memory.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// Device memory at fake addresses, a gap after each allocation: the executor tests' own
// (ptx/src/test_memory.h), with every handle a texture / surface.
class Memory : public orion::ptx::TestMemory {
 public:
  // Every handle is a texture / surface: its shape and sampling come from the handle's bits mixed
  // with the input's texture byte (format, channels, 1D/2D/3D, address modes, filtering, coordinates).
  bool FindTexture(uint64_t handle, orion::ptx::ImageView* out) override { return View(handle, out); }
  bool FindSurface(uint64_t handle, orion::ptx::ImageView* out) override { return View(handle ^ 0x5a5a, out); }
  uint8_t texture_bits = 0;

 private:
  bool View(uint64_t handle, orion::ptx::ImageView* v) {
    static constexpr uint32_t kFormats[8] = {
        CU_AD_FORMAT_UNSIGNED_INT8, CU_AD_FORMAT_UNSIGNED_INT16, CU_AD_FORMAT_UNSIGNED_INT32, CU_AD_FORMAT_SIGNED_INT8,
        CU_AD_FORMAT_SIGNED_INT16,  CU_AD_FORMAT_SIGNED_INT32,   CU_AD_FORMAT_HALF,           CU_AD_FORMAT_FLOAT};
    static constexpr uint32_t kElem[8] = {1, 2, 4, 1, 2, 4, 2, 4};
    static constexpr uint32_t kChannels[4] = {1, 2, 4, 4};
    const uint64_t h = (handle * 0x9E3779B97F4A7C15ull) ^ (uint64_t{texture_bits} * 0x0101010101010101ull);
    *v = orion::ptx::ImageView{};
    const uint32_t f = static_cast<uint32_t>(texture_bits & 7);
    v->format = kFormats[f];
    v->channels = kChannels[(texture_bits >> 3) & 3];
    v->dims = 1 + ((texture_bits >> 5) % 3);
    v->width = 1 + (h & 15);
    v->height = v->dims >= 2 ? 1 + ((h >> 4) & 7) : 1;
    v->depth = v->dims == 3 ? 1 + ((h >> 7) & 3) : 1;
    v->row_pitch = v->width * kElem[f] * v->channels;
    v->slice_pitch = v->row_pitch * v->height;
    v->bytes = v->slice_pitch * v->depth;
    for (int i = 0; i < 3; ++i) v->address_mode[i] = static_cast<uint32_t>((h >> (10 + 2 * i)) & 3);
    v->filter_mode = static_cast<uint32_t>((h >> 16) & 1);
    v->normalized_coords = (h >> 17) & 1;
    v->read_as_integer = (h >> 18) & 1;
    v->border_color[0] = 0.5f;
    auto& buf = images_.emplace_back(v->bytes);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 37 + (h >> 20));
    v->data = buf.data();
    return true;
  }
  std::deque<std::vector<uint8_t>> images_;  // views' bytes, alive until the launch is over
};

// PTX_FUZZ_TRACE=1: each launch's result on stderr (to check what a seed reaches).
bool Trace() {
  static const bool on = std::getenv("PTX_FUZZ_TRACE") != nullptr;
  return on;
}

// The names after `.entry` in `text` (a lexical scan; what Parse accepted decides what runs).
std::vector<std::string> EntryNames(std::string_view text) {
  std::vector<std::string> names;
  size_t pos = 0;
  while ((pos = text.find(".entry", pos)) != std::string_view::npos && names.size() < 64) {
    pos += 6;
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\t' || text[pos] == '\n' || text[pos] == '\r'))
      ++pos;
    const size_t start = pos;
    while (pos < text.size() && (std::isalnum(static_cast<unsigned char>(text[pos])) || text[pos] == '_' ||
                                 text[pos] == '$' || text[pos] == '%' || text[pos] == '.')) {
      ++pos;
    }
    if (pos > start) names.emplace_back(text.substr(start, pos - start));
  }
  return names;
}

void Launch(orion::ptx::Program& prog, std::string_view text, uint8_t selector, uint8_t texture_bits) {
  const auto names = EntryNames(text);
  const auto& vars = orion::ptx::Vars(prog);
  uint64_t var_bytes = 0;
  for (const auto& v : vars) {
    Check(v.init.size() <= v.size);
    var_bytes += v.size;
    if (v.size > (uint64_t{1} << 20) || var_bytes > (uint64_t{4} << 20)) return;  // not worth the memory
  }
  int launched = 0;
  for (size_t i = selector % 8; i < names.size() && launched < 3; i += 8) {
    if (!orion::ptx::HasKernel(prog, names[i])) continue;  // (a .func, say)
    ++launched;
    Memory mem;
    mem.texture_bits = texture_bits;
    const uint64_t buf = mem.Alloc(64 << 10);
    std::vector<uint64_t> var_addrs;
    for (const auto& v : vars) {
      const uint64_t a = mem.Alloc(v.size == 0 ? 1 : v.size);
      if (!v.init.empty()) std::memcpy(mem.Host(a), v.init.data(), v.init.size());
      var_addrs.push_back(a);
    }
    // Every 8-byte parameter slot points into the buffer (a 32-bit scalar read of one is 0x100 * slot).
    std::vector<uint8_t> params(4096);
    for (size_t s = 0; s < params.size() / 8; ++s) {
      const uint64_t p = buf + 0x100 * (s % 256);
      std::memcpy(params.data() + 8 * s, &p, 8);
    }
    std::string out;
    orion::ptx::LaunchConfig cfg;
    cfg.block[0] = (selector & 0x80) ? 32 : 1;
    cfg.dynamic_smem = 256;
    cfg.params = params.data();
    cfg.param_bytes = static_cast<uint32_t>(params.size());
    cfg.var_addrs = var_addrs.data();
    cfg.timeout_ms = 5;
    cfg.workers = 1;
    cfg.printf_out = &out;
    cfg.printf_limit = 4096;
    // One input in eight has the kernel translated to native code before it runs (ptx/src/jit.h):
    // the traces' code runs on the fuzzer's memory too (otherwise the translator thread may or may
    // not be done by then). Compiling takes milliseconds, so not every input.
    if ((selector & 0x70) == 0x70) (void)orion::ptx::Translated(prog, names[i], true);  // (lowering may fail)
    const auto r = orion::ptx::Launch(prog, names[i], cfg, mem);
    if (Trace()) {
      std::fprintf(stderr, "ptx_fuzz: %s -> %d %s (%llu warp instructions)\n", names[i].c_str(),
                   static_cast<int>(r.code), r.message.c_str(), static_cast<unsigned long long>(r.warp_instructions));
    }
    Check(out.size() <= 4096 + 1024);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t split_at = data[0] | (size_t{data[1]} << 8);
  const uint8_t selector = data[2];
  const uint8_t texture_bits = data[3];
  // An exact-size copy: a read past the end of the text is reported.
  const size_t n = size - 4;
  const auto buf = std::make_unique<char[]>(n == 0 ? 1 : n);
  if (n != 0) std::memcpy(buf.get(), data + 4, n);
  const std::string_view text(buf.get(), n);

  auto prog = orion::ptx::Parse(text);
  if (prog.ok()) {
    for (const auto& name : EntryNames(text)) (void)orion::ptx::HasKernel(**prog, name);
    Launch(**prog, text, selector, texture_bits);
  }

  const size_t split = split_at < n ? split_at : n;
  std::vector<std::string_view> modules;
  if (split > 0) modules.push_back(text.substr(0, split));
  if (split < n) modules.push_back(text.substr(split));
  auto linked = orion::ptx::LinkText(modules);
  if (linked.ok()) {
    auto again = orion::ptx::Parse(*linked);
    (void)again;
  }
  return 0;
}
