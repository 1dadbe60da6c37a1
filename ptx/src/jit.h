// ptx/src/jit.h — the PTX executor's translator: a kernel's straight-line runs of fast-form
// instructions (fast.h) compiled to native code with LLVM's ORC JIT, a warp's 32 lanes as the
// lanes of LLVM vectors (<32 x i64> register rows, <32 x i1> masks).
//
// What is translated: a *trace* is a run of instructions of the forms jit.cpp lists (Form: the fast
// forms of fast.h and more), whose operands the translator can read (registers, immediates,
// symbols' addresses and the special registers other than the clocks), with no branch target inside
// it. Everything else (control flow, barriers, calls, atomics, textures, the rarer forms) runs on
// the interpreter (block.h, block_units.h), which stays the reference: a trace means exactly what
// the fast paths (block_fast.h) and the general units mean for every lane, and the unit tests run
// both. A warp collective (shfl.sync, vote.sync) runs in a trace when every member lane that has not
// exited is in the group; otherwise the trace stops before it and the interpreter's waiting rule
// applies.
//
// When: a kernel is planned at its first launch and compiled, on a thread of the process's own,
// once it has run about as long on the interpreter as compiling it would take (Ran): programs whose
// kernels run little never pay for LLVM.
//
// How a trace runs: Block::Step calls its function at one of the trace's entry points (its first
// instruction, or the one after a load, a store or a warp collective) with the running lanes' mask. It runs to the
// trace's end and returns the end's PC, or stops before a load or store some active lane of which
// is not inside the allocation (or shared memory, or parameter buffer) that instruction last hit, or
// not aligned, and returns that instruction's PC having done nothing for it: the interpreter runs it
// (finding the allocation, or faulting with its message) and the trace goes on after it. A trace
// never faults, so every fault still names the instruction, the lane and the PTX line.
//
// Built when CMake finds LLVM 14 (Debian's llvm-14-dev): ORION_PTX_HAVE_JIT. ORION_PTX_JIT=0 in the
// environment turns it off (the interpreter alone), as ORION_PTX_FAST=0 turns the fast paths off.
#pragma once

#include <atomic>
#include <cstddef>
#include <deque>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ir.h"

namespace orion::ptx::jit {

// The allocation a global load or store last hit (GlobalMemory::Span's layout).
struct Span {
  uint64_t base = 0;
  uint64_t bytes = 0;
  uint8_t* host = nullptr;
};

// What a trace reads and writes, set by the block before each call (every field 8 bytes: the
// generated code loads them by index, kField*).
struct Frame {
  uint64_t* regs = nullptr;             // the warp's registers, [reg * 32 + lane]
  const uint64_t* tid = nullptr;        // the warp's %tid.x, %tid.y, %tid.z rows, [3 * 32]
  const uint64_t* special = nullptr;    // lane-invariant special registers by id (ir.h Special), [kSpecials]
  const uint64_t* var_addrs = nullptr;  // module variables' device addresses (LaunchConfig::var_addrs)
  Span* spans = nullptr;                // per global load or store of the kernel (Code::slot_of)
  uint8_t* shared = nullptr;            // the block's shared memory
  uint64_t shared_bytes = 0;
  const uint8_t* params = nullptr;  // the kernel's parameter buffer
  uint64_t param_bytes = 0;
  uint64_t lane_ins = 0;  // lane-instructions run (a trace adds its own)
  uint64_t group = 0;     // the lanes running (bit l: lane l)
  uint64_t live = 0;      // the warp's lanes that have not exited (a warp collective waits for them)
};
enum FrameField {
  kFieldRegs,
  kFieldTid,
  kFieldSpecial,
  kFieldVarAddrs,
  kFieldSpans,
  kFieldShared,
  kFieldSharedBytes,
  kFieldParams,
  kFieldParamBytes,
  kFieldLaneIns,
  kFieldGroup,
  kFieldLive,
};
static_assert(offsetof(Frame, live) == 8 * kFieldLive && sizeof(Frame) == 8 * (kFieldLive + 1));
static_assert(sizeof(Span) == 24);

// Lane-invariant special registers the block fills (Frame::special): every id below this.
inline constexpr uint32_t kSpecials = kEnvreg0 + 32;

// A trace's native code: runs from entry point `pc` and returns the PC where it stopped (the trace's
// end, or a load or store it left to the interpreter).
using TraceFn = uint32_t (*)(Frame* frame, uint32_t pc);

// A kernel's translation: the plan (which instructions form traces, where they can be entered) is
// made at once; the native code comes later, from a thread of its own once the kernel has run enough
// (Ran, Start), and each trace's `fn` stays nullptr (the interpreter runs it) until then.
struct Code {
  struct Trace {
    uint32_t begin = 0, end = 0;       // instructions [begin, end)
    std::atomic<TraceFn> fn{nullptr};  // set (release) once compiled
  };
  enum State : int { kPending, kReady, kFailed };
  std::deque<Trace> traces;
  std::vector<uint32_t> entry;    // per PC: 1 + the index of the trace that can be entered there, or 0
  std::vector<uint32_t> slot_of;  // per PC: the global access's Frame::spans slot, or kNoSlot
  uint32_t slots = 0;
  uint32_t translated = 0;           // instructions inside traces
  std::atomic<int> state{kPending};  // notified when it leaves kPending
  // Compiled once the kernel has run this many warp instructions on the interpreter (Ran): about
  // as long as compiling it takes, so a kernel that runs little is never compiled.
  uint64_t threshold = 0;
  std::atomic<uint64_t> work{0};    // warp instructions run so far
  std::atomic<bool> queued{false};  // handed to the translator thread
  // Set before `state` leaves kPending:
  double milliseconds = 0;       // the compilation's time
  std::string why;               // kFailed: why (LLVM's words)
  std::shared_ptr<void> engine;  // the LLJIT that holds the code (the functions live as long as it)
};
inline constexpr uint32_t kNoSlot = 0xffffffffu;

// Kernels with more instructions to translate than this run on the interpreter (LLVM's time and
// memory grow with the code: about 1 ms of one core per instruction, measured on ptx_bench's SGEMM).
inline constexpr uint32_t kMaxTranslated = 20000;

// The interpreter's own per-lane units, which a trace calls for the forms it does not compile itself
// (the float unit's transcendentals and its rarer types and modifiers; conversions with .sat or
// halves): d[l] = FloatLane(*ins, a[l], b[l], c[l]) (alu.h), d[l] = Convert(*ins, a[l]), for the
// lanes of `mask` (exec.cpp, built with -frounding-math as the units are).
void CallFloat(const Ins* ins, const uint64_t* a, const uint64_t* b, const uint64_t* c, uint64_t* d, uint32_t mask);
void CallConvert(const Ins* ins, const uint64_t* a, uint64_t* d, uint32_t mask);

// Whether translation is built in and not turned off (ORION_PTX_JIT=0). Read once.
bool Enabled();

// The translation of `k` (planned once per Kernel, at its first launch: Kernel::jit holds it), or
// nullptr when there is none (not Enabled, nothing to translate, or too much). With
// ORION_PTX_JIT=sync it is compiled here, before this returns; otherwise on the process's
// translator thread once the kernel has run Code::threshold warp instructions (Ran), or when asked
// (Start). A failure is logged once to stderr (the interpreter runs the kernel).
const Code* For(const std::shared_ptr<const Kernel>& k);

// Counts `warp_instructions` more run by `k` (a block's, as it ends): past the threshold, its
// compilation starts.
void Ran(const std::shared_ptr<const Kernel>& k, uint64_t warp_instructions);

// Hands `k`'s translation to the translator thread now, if it has one and it was not handed yet.
void Start(const std::shared_ptr<const Kernel>& k);

// Instructions of interpretation a translated instruction's compilation is worth (Code::threshold):
// the interpreter runs ~20M warp instructions/s on a core, LLVM about 1 ms per instruction.
inline constexpr uint64_t kWarpInstructionsPerTranslated = 10000;

// Returns once `code` is compiled (or has failed).
inline void Wait(const Code& code) {
  for (int s = code.state.load(std::memory_order_acquire); s == Code::kPending;
       s = code.state.load(std::memory_order_acquire))
    code.state.wait(s, std::memory_order_acquire);
}

// Plans and compiles `k` now, without the cache: nullptr with `why` set when it cannot (for tests).
std::shared_ptr<const Code> Translate(const Kernel& k, std::string* why);

// Whether the translator runs `ins` (a trace may contain it).
bool Translatable(const Ins& ins);

}  // namespace orion::ptx::jit
