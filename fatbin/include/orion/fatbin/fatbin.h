// orion/fatbin/fatbin.h — understand CUDA module images without a GPU.
//
// The daemon's "sim" backend receives the bytes a client passed to cuModuleLoadData /
// cuLibraryLoadData and must answer cuModuleGetFunction, cuFuncGetParamInfo, cuModuleGetGlobal and
// marshal kernel arguments. This module extracts exactly that: kernel names with their parameter
// layouts, and global (__device__ / __constant__) variables with their sizes.
//
// Accepted images (all HOSTILE: every offset and length is checked, nothing is trusted):
//   * a fatbin container (magic 0xBA55ED50). Only the first container is read; bytes after
//     header_size + payload_size are ignored (a __fatBinC_Wrapper_t points at one container).
//   * an ELF cubin (64-bit little-endian, EM_CUDA).
//   * NUL-terminated PTX text.
// A __fatBinC_Wrapper_t (magic 0x466243B1) is rejected: the caller must resolve it to its data
// pointer first (the pointer is a guest address).
//
// Checked against nvcc 13.0 output: sm_75..sm_120 cubins (executable and -rdc relocatable, -G),
// multi-arch fatbins, zstd- and LZ4-compressed entries, PTX-only fatbins, nvcc -ptx text.
// Not handled (rejected with an error, or as noted): fatbin versions other than 1; 32-bit or
// big-endian ELF; LTO-IR and other entry kinds (skipped); the pre-CUDA-4 `.const[bank]` PTX
// syntax; texture/surface/sampler references (not reported as globals). A kernel whose .nv.info
// has no parameter records gets an empty parameter list.
//
//   auto m = orion::fatbin::ParseImage(bytes, /*prefer_sm=*/90);
//   if (!m.ok()) return m.status();
//   const Kernel* k = m->FindKernel("_Z6kernelPfi");
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "orion/common/status.h"

namespace orion::fatbin {

struct KernelParam {
  uint32_t ordinal;  // 0-based position in the kernel's signature
  uint32_t offset;   // byte offset in the parameter buffer
  uint32_t size;     // bytes
  bool operator==(const KernelParam&) const = default;
};

struct Kernel {
  std::string name;                 // mangled name, as cuModuleGetFunction receives it
  std::vector<KernelParam> params;  // sorted by ordinal, ascending; ordinals are 0..n-1
  uint32_t param_bytes = 0;         // total parameter buffer size (EIATTR_CBANK_PARAM_SIZE, or
                                    // the end of the last parameter when computed from PTX)
};

// __device__ / __constant__ / __managed__ variables: ELF STT_OBJECT symbols defined in a
// .nv.global* or .nv.constant* section, or module-scope .global / .const declarations in PTX.
struct Global {
  std::string name;
  uint64_t size = 0;
  std::vector<uint8_t> init;  // initial bytes (size of them) when the image has them; else zeroed
};

struct Module {
  std::vector<Kernel> kernels;
  std::vector<Global> globals;
  uint32_t sm_arch = 0;  // e.g. 90 for the chosen cubin; 0 if from PTX
  bool from_ptx = false;
  const Kernel* FindKernel(std::string_view name) const;
  const Global* FindGlobal(std::string_view name) const;
};

// Upper bound on a decompressed fatbin entry; larger claims are rejected before allocating.
inline constexpr uint64_t kMaxDecompressedBytes = uint64_t{256} << 20;

// Parses a fatbin container, an ELF cubin or NUL-terminated PTX (see above).
// From a fatbin, `prefer_sm` picks the cubin entry: the highest arch <= prefer_sm, else the lowest.
// With no cubin entry, the PTX entry is parsed the same way (highest arch <= prefer_sm, else
// lowest). Compressed entries (LZ4 or zstd) are decompressed. Errors name what is wrong:
// kInvalidArgument for an unrecognised or malformed image, kOutOfRange for an offset or length
// outside its buffer, kDataLoss for a corrupt compressed entry, kResourceExhausted for a size over
// kMaxDecompressedBytes, kNotFound for a fatbin with neither a cubin nor a PTX entry.
orion::Result<Module> ParseImage(std::span<const uint8_t> image, uint32_t prefer_sm = 90);

// The PTX text of an image: a fatbin's PTX entry (highest arch <= prefer_sm, else the lowest;
// decompressed), or the image itself when it is PTX. kNotFound for a cubin or a SASS-only fatbin.
struct PtxEntry {
  std::string text;
  uint32_t arch = 0;  // the entry's compute_XX (0 for a bare PTX image)
};
orion::Result<PtxEntry> ExtractPtx(std::span<const uint8_t> image, uint32_t prefer_sm = 90);
// The arch of the PTX entry ExtractPtx would return (0 for a bare PTX image), from the entry
// headers alone (nothing decompressed); the same errors.
orion::Result<uint32_t> PtxArch(std::span<const uint8_t> image, uint32_t prefer_sm = 90);

// Size in bytes of the image starting at `p`, reading at most `max` bytes: fatbin header_size +
// payload_size; ELF the furthest end of the ELF header, section/program header tables, sections
// (except SHT_NOBITS) and segments; PTX strlen + 1. An error if the image is not recognised or
// does not fit in `max` bytes.
orion::Result<uint64_t> ImageSize(const uint8_t* p, uint64_t max);

}  // namespace orion::fatbin
