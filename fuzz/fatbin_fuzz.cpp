// fatbin_fuzz — orion::fatbin (host/include/orion/fatbin/fatbin.h) on hostile module images: what a
// client passes to cuModuleLoadData / cuLibraryLoadData reaches ParseImage, ExtractPtx, PtxArch and
// ImageSize in oriond.
//
//   scripts/fuzz                      # builds build-fuzz/fatbin_fuzz and runs it on fuzz/corpus/fatbin_fuzz
//   build-fuzz/fatbin_fuzz -max_len=65536 CORPUS_DIR
//
// The first input byte picks prefer_sm; the rest is the image, copied into an exact-size buffer so
// that any read past its end is reported. Seeds: small nvcc outputs (fatbins: multi-arch,
// compressed with zstd and LZ4, PTX-only; cubins; PTX text) of tests/data/*.cu.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>

#include "orion/fatbin/fatbin.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint32_t prefer_sm = data[0];
  const size_t n = size - 1;
  const auto image = std::make_unique<uint8_t[]>(n == 0 ? 1 : n);
  if (n != 0) std::memcpy(image.get(), data + 1, n);
  const std::span<const uint8_t> img(image.get(), n);

  auto m = orion::fatbin::ParseImage(img, prefer_sm);
  if (m.ok()) {
    for (const auto& k : m->kernels) {
      // Invariants the sim backend relies on.
      for (size_t i = 0; i < k.params.size(); ++i) {
        Check(k.params[i].ordinal == i);
        Check(uint64_t{k.params[i].offset} + k.params[i].size <= k.param_bytes);
      }
      Check(m->FindKernel(k.name) != nullptr);
    }
    for (const auto& g : m->globals) {
      Check(g.init.empty() || g.init.size() == g.size);
      Check(m->FindGlobal(g.name) != nullptr);
    }
  }

  auto ptx = orion::fatbin::ExtractPtx(img, prefer_sm);
  auto arch = orion::fatbin::PtxArch(img, prefer_sm);
  // PtxArch reads the entry headers only, ExtractPtx decompresses: where both succeed they name the
  // same entry. (PtxArch may succeed where ExtractPtx fails on a corrupt payload.)
  if (ptx.ok()) {
    Check(arch.ok());
    Check(*arch == ptx->arch);
    Check(ptx->text.size() <= orion::fatbin::kMaxDecompressedBytes);
  }

  auto sz = orion::fatbin::ImageSize(image.get(), n);
  if (sz.ok()) Check(*sz <= n);
  return 0;
}
