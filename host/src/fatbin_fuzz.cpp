// libFuzzer entry point for orion::fatbin::ParseImage / ImageSize (hostile client images).
//
//   clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -Ihost/include -Icommon/include \
//     host/src/fatbin_fuzz.cpp host/src/fatbin.cpp common/src/status.cpp -llz4 -lzstd -o fatbin_fuzz
//   ./fatbin_fuzz -max_len=65536 CORPUS_DIR   # seed it with the nvcc fixtures of fatbin_test
//
// The first input byte picks prefer_sm; the rest is the image, copied into an exact-size buffer so
// that any read past its end is reported.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "orion/host/fatbin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint32_t prefer_sm = data[0];
  const size_t n = size - 1;
  const auto image = std::make_unique<uint8_t[]>(n == 0 ? 1 : n);
  if (n != 0) std::memcpy(image.get(), data + 1, n);
  auto m = orion::fatbin::ParseImage({image.get(), n}, prefer_sm);
  if (m.ok()) {
    for (const auto& k : m->kernels) {
      // Invariants the sim backend relies on.
      for (size_t i = 0; i < k.params.size(); ++i) {
        if (k.params[i].ordinal != i) __builtin_trap();
        if (uint64_t{k.params[i].offset} + k.params[i].size > k.param_bytes) __builtin_trap();
      }
    }
  }
  (void)orion::fatbin::ImageSize(image.get(), n);
  return 0;
}
