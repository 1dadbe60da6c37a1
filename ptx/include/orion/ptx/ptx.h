// orion/ptx/ptx.h — executes PTX kernels on the CPU, for the sim backend (no GPU).
//
// A module's PTX text (what nvcc embeds next to SASS, or what a program passes to cuModuleLoadData)
// is parsed once into a Program. Each kernel is lowered once, at its first launch, to a flat array
// of decoded instructions (registers resolved to indices, labels to instruction numbers, the
// functions it calls copied in with their own registers). A launch then runs the grid block by
// block; inside a block, warps of 32 lanes run in lockstep with an active mask.
//
// Semantics follow the PTX ISA (PTX ISA 9.0, "Parallel Thread Execution ISA", NVIDIA):
//   * SIMT: a warp executes the instruction at the lowest program counter among its lanes that can
//     run (min-PC scheduling: divergent paths reconverge where they meet again, which is the
//     immediate post-dominator for structured code). Warp collectives (shfl.sync, vote.sync,
//     match.sync, redux.sync, bar.warp.sync) wait until every lane of their member mask arrives.
//   * bar.sync / barrier.sync / bar.red: all non-exited threads of the block (exited threads count
//     as arrived).
//   * State spaces: global (the session's allocations, every access bounds-checked through
//     GlobalMemory), shared (per block: static + dynamic), local (per thread), param (the kernel's
//     parameter buffer; per-thread for .func calls), const (module globals in device memory).
//     Generic addresses: shared and local live in two windows (kSharedWindow, kLocalWindow) that
//     cvta converts to and from; everything else is global.
//   * An access outside every allocation ends the launch with CUDA_ERROR_ILLEGAL_ADDRESS, a
//     misaligned one with CUDA_ERROR_MISALIGNED_ADDRESS; `trap` with CUDA_ERROR_LAUNCH_FAILED;
//     `__assertfail` with CUDA_ERROR_ASSERT; exceeding the timeout with CUDA_ERROR_LAUNCH_TIMEOUT.
//     Nothing outside the session's memory is ever touched.
//   * An instruction the executor does not implement fails the *parse* of its kernel (at the first
//     launch) with CUDA_ERROR_NOT_SUPPORTED and the instruction named: never a silent no-op.
//
//   * Textures and surfaces, unified mode only (the object is a 64-bit CUtexObject / CUsurfObject
//     in a .u64 register or a .param; see ImageView and GlobalMemory::FindTexture): tex.{1d,2d,3d}
//     .v4.{f32,s32,u32}.{f32,s32} (tex1Dfetch / tex1D / tex2D / tex3D: nearest-point and linear
//     filtering, wrap / clamp / mirror / border, normalized coordinates, 8/16-bit integers read as
//     normalized floats or as integers, HALF), suld.b / sust.b.{1d,2d,3d}{,.v2,.v4}.b{8,16,32,64}
//     .{trap,clamp,zero} (x in bytes), txq / suq .{width,height,depth}.b32. Linear filtering keeps
//     the weights in float (a GPU rounds them to 8 fractional bits: results may differ by up to 1/256
//     of the texel difference). An unknown handle, a view the executor cannot use, a texel outside
//     the view's `bytes`, or a .trap surface access out of range ends the launch with
//     CUDA_ERROR_ILLEGAL_ADDRESS.
//
// Not implemented (named in the error when met): mipmapped, gather, layered, cube and multisample
// texture fetches (tex.level, tex.grad, tex.base, tld4, .a1d/.a2d/.cube/.acube/.2dms/.a2dms),
// f16 tex results, formatted surface access (suld.p, sust.p), sured, txq / suq queries other than
// width / height / depth, .texref / .surfref / .samplerref variables (the pre-CUDA-12 texture
// references: a module declaring one does not parse), tensor cores (mma, wmma, wgmma), bulk copies
// (cp.async.bulk / TMA) and cp.async completed through an mbarrier, indirect calls, recursion,
// clusters' distributed shared memory. Plain cp.async (global -> shared, 4/8/16 bytes, src-size
// zero-fill, ignore-src) copies when it issues, so its commit_group / wait_group / wait_all are
// already satisfied (an order the PTX memory model allows).
//
// Thread-safety: a Program is immutable after Parse except for its lowered-kernel cache, which is
// guarded; several launches of one Program may run at once from different threads.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "orion/common/status.h"

namespace orion::ptx {

// Generic-address windows for the shared and local state spaces (never valid device addresses).
inline constexpr uint64_t kSharedWindow = 0x0000100000000000ull;
inline constexpr uint64_t kLocalWindow = 0x0000110000000000ull;
inline constexpr uint64_t kWindowBytes = 0x0000010000000000ull;

// What a texture or surface object (CUtexObject / CUsurfObject, a 64-bit handle a kernel receives as
// a parameter) reads and writes: a CUDA array, or linear / pitched device memory, as the sim backend
// resolves the handle. Texels are `channels` elements of `format`, rows `row_pitch` bytes apart,
// slices `slice_pitch` bytes apart; `data` holds at least `bytes` bytes (every access stays inside).
// Sources: CUDA driver API reference, CUDA_RESOURCE_DESC / CUDA_TEXTURE_DESC; CUDA C++ Programming
// Guide, "Texture Fetching" (the addressing and filtering rules).
//
// How the executor reads a view (what the sim backend fills in):
//   * Textures: texel (x, y, z) is the `channels` elements of `format` at byte z * slice_pitch +
//     y * row_pitch + x * texel bytes. Float coordinates are scaled by width / height / depth when
//     `normalized_coords`; integer coordinates (tex1Dfetch) are texel indices and never filtered.
//     Wrap and mirror apply only to normalized coordinates (the guide supports them only there);
//     otherwise they act as clamp. A linear-memory texture (CU_RESOURCE_TYPE_LINEAR, tex1Dfetch)
//     reads 0 out of range on a GPU: give it address_mode[0] = BORDER and a zero border_color.
//     FLOAT and HALF texels, and 8/16-bit integers unless `read_as_integer`, are returned as floats
//     (integers normalized to [0,1] / [-1,1]); 32-bit integers are returned as integers. Channels
//     the format lacks read as 0, a missing alpha as 1. Linear filtering applies to float results.
//   * Surfaces: the same layout; suld/sust address x in bytes (within width * texel bytes), y and z
//     in texels. Sampling fields are ignored.
//   * dims is informational: the instruction's geometry decides how many coordinates are used
//     (a 1D view needs height = depth = 1, a 2D one depth = 1).
struct ImageView {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint32_t format = 0;    // CUarray_format: CU_AD_FORMAT_{UNSIGNED,SIGNED}_INT{8,16,32}, HALF, FLOAT
  uint32_t channels = 1;  // 1, 2 or 4
  uint32_t dims = 1;      // 1, 2 or 3
  uint64_t width = 0, height = 1, depth = 1;  // texels; a layered or cubemap array: depth = its layers
  bool layered = false;                       // CUDA_ARRAY3D_LAYERED (tex/suld .a1d/.a2d/.acube)
  bool cubemap = false;                       // CUDA_ARRAY3D_CUBEMAP: 6 faces (x 6 per layer) of width x width
  uint64_t row_pitch = 0, slice_pitch = 0;    // bytes
  // Sampling (textures only; surfaces ignore these).
  uint32_t address_mode[3] = {};   // CUaddress_mode: WRAP, CLAMP, MIRROR, BORDER
  uint32_t filter_mode = 0;        // CUfilter_mode: POINT, LINEAR
  bool normalized_coords = false;  // CU_TRSF_NORMALIZED_COORDINATES
  bool read_as_integer = false;    // CU_TRSF_READ_AS_INTEGER: 8/16-bit integers are not made [0,1] floats
  float border_color[4] = {};
};

// The device memory a launch may touch: the session's allocations, textures and surfaces.
class GlobalMemory {
 public:
  struct Span {
    uint64_t base = 0;        // device address of the allocation
    uint64_t bytes = 0;       // its size
    uint8_t* host = nullptr;  // where its bytes live in this process
  };
  virtual ~GlobalMemory() = default;
  // The allocation containing device address `addr`; false if none does.
  virtual bool Find(uint64_t addr, Span* out) = 0;
  // The session's texture / surface object `handle`; false if it has none by that handle (the
  // instruction then fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS, as a bad pointer would).
  // `handle` is the 64-bit value the kernel received (the CUtexObject / CUsurfObject the program
  // passed as a kernel argument). The executor calls these at the first use of a handle by each
  // worker thread of a launch and keeps the view for the rest of that launch: `data` must stay
  // valid (and the object's memory allocated) until Launch returns. Called from the launch's worker
  // threads, possibly concurrently.
  virtual bool FindTexture(uint64_t handle, ImageView* out) {
    (void)handle;
    (void)out;
    return false;
  }
  virtual bool FindSurface(uint64_t handle, ImageView* out) {
    (void)handle;
    (void)out;
    return false;
  }
};

// A module-scope variable (.global / .const) the launch needs in device memory.
struct ModuleVar {
  std::string name;
  uint64_t size = 0;
  std::vector<uint8_t> init;  // initial bytes (may be shorter than size: the rest is zero)
};

class Program;

// Parses PTX text. Errors name the line. Instructions are checked when a kernel is first lowered.
Result<std::shared_ptr<Program>> Parse(std::string_view text);

// The module's `.version` as major * 100 + minor (8.5 -> 805), read from the text without parsing
// it; 0 when there is none or it is malformed (more than 4 digits a part).
uint32_t PtxIsaVersion(std::string_view text);
// The newest PTX ISA version a driver of `driver_version` (cuDriverGetVersion's 1000 * major +
// 10 * minor) JIT-compiles, in the same form. A newer module fails to load with
// CUDA_ERROR_UNSUPPORTED_PTX_VERSION. Source: PTX ISA 9.0, "PTX ISA Version" release notes
// (CUDA 12.0 introduced PTX 8.0, ..., 12.8 8.7, 12.9 8.8, 13.0 9.0; 13.x ships 9.x).
uint32_t MaxPtxIsaVersion(int driver_version);

// Module-scope .global and .const variables, in declaration order.
const std::vector<ModuleVar>& Vars(const Program& p);
bool HasKernel(const Program& p, std::string_view name);

struct LaunchConfig {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t dynamic_smem = 0;
  const uint8_t* params = nullptr;  // the kernel's parameter buffer (laid out per the PTX ABI)
  uint32_t param_bytes = 0;
  // Device address of each entry of Vars(program), same order (allocated by the caller).
  const uint64_t* var_addrs = nullptr;
  uint64_t timeout_ms = 0;  // 0: none
  uint32_t workers = 1;     // host threads running blocks in parallel
  // Cooperative launch: every block runs at once on its own host thread, and %envreg1:%envreg2 hold
  // `grid_workspace` (>= 8 zeroed device bytes), where cooperative groups' grid.sync() counts
  // arrivals. Without it, %envreg* read 0 and grid.sync() traps, as on a GPU.
  bool cooperative = false;
  uint64_t grid_workspace = 0;
  std::string* printf_out = nullptr;  // device printf text is appended here (nullptr: dropped)
  uint64_t printf_limit = 1 << 20;    // bytes of printf text kept per launch (cudaLimitPrintfFifoSize)
};

struct LaunchResult {
  CUresult code = CUDA_SUCCESS;
  std::string message;               // why it failed: instruction, lane, address
  uint64_t warp_instructions = 0;    // instructions issued (one per warp step)
  uint64_t thread_instructions = 0;  // lane-instructions executed
};

// Lowers `kernel` now, as its first launch would, and says whether the executor can run it:
// kNotFound when the PTX does not define it, another error (naming the instruction or form) when
// it uses one the executor does not implement. A launch would fail the same way. Thread-safe.
Status Prepare(Program& p, std::string_view kernel);

// What each block of `kernel` holds while it runs, from its declarations (bytes): static shared
// memory per block, and local memory (`.local`, plus the space for its calls' parameters) per
// thread. Lowers the kernel as Prepare does, with the same errors.
struct KernelResources {
  uint64_t shared_static = 0;
  uint64_t local_per_thread = 0;
};
Result<KernelResources> Resources(Program& p, std::string_view kernel);

// How much of `kernel` runs as native code (the translator, ptx/src/jit.h): its straight-line runs of
// the commonest instruction forms are compiled with LLVM on a thread of the process's own, after its
// first launch (or first call here), while launches run on the interpreter until that is done.
// With `wait`, this returns once the compilation is over (it starts it if need be). Lowers the
// kernel as Prepare does, with the same errors. Thread-safe.
struct Translation {
  bool enabled = false;       // built with LLVM and not turned off (ORION_PTX_JIT=0, ORION_PTX_FAST=0)
  uint32_t instructions = 0;  // the lowered kernel's (its functions' included)
  uint32_t translated = 0;    // those inside traces
  uint32_t traces = 0;
  bool ready = false;       // the traces' native code is in use
  double milliseconds = 0;  // ready: what compiling them took (one thread)
  std::string why;          // not ready: why (not yet compiled, too large, LLVM's error)
};
Result<Translation> Translated(Program& p, std::string_view kernel, bool wait);

// Runs one launch of `kernel` to completion (or to its first fault).
LaunchResult Launch(Program& p, std::string_view kernel, const LaunchConfig& cfg, GlobalMemory& mem);

}  // namespace orion::ptx
