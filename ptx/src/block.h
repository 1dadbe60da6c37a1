// ptx/src/block.h — one thread block of a launch, as the executor runs it: its warps of 32 lanes
// in lockstep, their registers, shared and local memory, barriers, and the instructions' semantics.
// Private to ptx/src. exec.cpp runs blocks (Launch); the block's cold parts live apart:
// exec_image.cpp (texture and surface instructions) and exec_printf.cpp (device printf and
// assert). Its hot path (Step, Exec, the integer and floating-point units) stays inline here.
//
// Scheduling inside a warp (min-PC): each lane has its own program counter; the warp runs the
// lanes at the lowest PC among those that can run, as one group, until a branch. Paths that
// diverged reconverge when the lagging group reaches the PC where the others wait. A warp runs
// until all its lanes have exited or wait at a barrier; then the next warp runs. When every warp of
// the block waits, the barrier opens.
#pragma once

#include <algorithm>
#include <bit>
#include <cfenv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>

#include <pthread.h>
#include <sched.h>

#include "half.h"
#include "ir.h"

namespace orion::ptx::exec {

constexpr uint32_t kFull = 0xffffffffu;

// ---- bits and numbers ------------------------------------------------------------------------

inline float F32(uint64_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b)); }
inline uint64_t B32(float f) { return std::bit_cast<uint32_t>(f); }
inline double F64(uint64_t b) { return std::bit_cast<double>(b); }
inline uint64_t B64(double d) { return std::bit_cast<uint64_t>(d); }
inline float H2F(uint64_t h) { return HalfToFloat(static_cast<uint16_t>(h)); }
inline uint64_t F2H(float f) { return FloatToHalf(f); }
inline float BF2F(uint64_t h) { return std::bit_cast<float>(static_cast<uint32_t>(static_cast<uint16_t>(h)) << 16); }
inline uint64_t F2BF(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if (std::isnan(f)) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return u >> 16;
}
inline uint64_t Trunc(uint64_t v, int bytes) { return bytes >= 8 ? v : v & ((uint64_t{1} << (8 * bytes)) - 1); }
inline int64_t SExt(uint64_t v, int bytes) {
  if (bytes >= 8) return static_cast<int64_t>(v);
  const int sh = 64 - 8 * bytes;
  return static_cast<int64_t>(v << sh) >> sh;
}
inline float FtzF(float f) { return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f; }

// Directed rounding for one operation (the file is built with -frounding-math).
class RoundScope {
 public:
  explicit RoundScope(Rnd r) {
    int mode = -1;
    switch (r) {
      case Rnd::kRz:
      case Rnd::kRzi: mode = FE_TOWARDZERO; break;
      case Rnd::kRm:
      case Rnd::kRmi: mode = FE_DOWNWARD; break;
      case Rnd::kRp:
      case Rnd::kRpi: mode = FE_UPWARD; break;
      default: break;
    }
    if (mode >= 0) {
      saved_ = std::fegetround();
      std::fesetround(mode);
    }
  }
  ~RoundScope() {
    if (saved_ >= 0) std::fesetround(saved_);
  }
  RoundScope(const RoundScope&) = delete;
  RoundScope& operator=(const RoundScope&) = delete;

 private:
  int saved_ = -1;
};

inline bool Directed(Rnd r) {
  return r == Rnd::kRz || r == Rnd::kRm || r == Rnd::kRp || r == Rnd::kRzi || r == Rnd::kRmi || r == Rnd::kRpi;
}

// Lanes in a mask, without relying on a POPCNT instruction (the baseline x86-64 has none).
inline uint64_t LaneCount(uint32_t m) {
  m = m - ((m >> 1) & 0x55555555u);
  m = (m & 0x33333333u) + ((m >> 2) & 0x33333333u);
  return (((m + (m >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24;
}

// ---- state -----------------------------------------------------------------------------------

enum LaneState : uint8_t { kRun, kExited, kAtBarrier, kAtCollective };
// A warp's turn ends after this many backward branches (a power of two), so that warps of a block
// interleave: enough that a loop rarely switches warps, few enough that a spin-wait ends quickly.
inline constexpr uint32_t kBackBranchesPerTurn = 256;

struct Frame {
  uint32_t ret_pc;
  uint32_t call;
};

struct Warp {
  uint32_t index = 0;
  uint32_t lanes = 0;  // mask of lanes that exist (the last warp may be partial)
  uint32_t pc[32] = {};
  uint8_t state[32] = {};
  uint32_t carry = 0;          // CC.CF per lane
  uint64_t steps = 0;          // instructions issued (for %clock)
  uint32_t back_branches = 0;  // backward branches taken (a turn ends every kBackBranchesPerTurn)
  std::vector<uint64_t> regs;  // [reg][lane]
  std::vector<Frame> stack[32];
  uint32_t barrier_dst[32] = {};  // bar.red destination register per lane (kNoReg: none)
  uint8_t barrier_op[32] = {};
};

struct Fault {
  CUresult code = CUDA_SUCCESS;
  std::string message;
};

class Block {
 public:
  Block(const Kernel& k, const LaunchConfig& cfg, GlobalMemory& mem, std::atomic<bool>& stop,
        std::chrono::steady_clock::time_point deadline)
      : k_(k), cfg_(cfg), mem_(mem), stop_(stop), deadline_(deadline) {
    threads_ = cfg.block[0] * cfg.block[1] * cfg.block[2];
    nwarps_ = (threads_ + 31) / 32;
    shared_.resize(k.shared_static + cfg.dynamic_smem);
    local_.resize(k.local_bytes * threads_);
    fparam_.resize(k.fparam_bytes * threads_);
    warps_.resize(nwarps_);
    for (uint32_t w = 0; w < nwarps_; ++w) warps_[w].regs.resize(static_cast<size_t>(k.nregs) * 32);
  }

  // Runs block `ctaid`; false with `fault` set if the launch must end.
  bool Run(const uint32_t ctaid[3], Fault* fault, std::string* printf_out, uint64_t* warp_ins, uint64_t* lane_ins) {
    std::memcpy(ctaid_, ctaid, sizeof ctaid_);
    fault_ = fault;
    printf_ = printf_out;
    std::fill(shared_.begin(), shared_.end(), 0);
    for (uint32_t w = 0; w < nwarps_; ++w) {
      Warp& wp = warps_[w];
      wp.index = w;
      const uint32_t n = std::min<uint32_t>(32, threads_ - w * 32);
      wp.lanes = n == 32 ? kFull : ((1u << n) - 1);
      wp.carry = 0;
      wp.steps = 0;
      wp.back_branches = 0;
      for (int l = 0; l < 32; ++l) {
        wp.pc[l] = 0;
        wp.state[l] = (wp.lanes >> l) & 1 ? kRun : kExited;
        wp.stack[l].clear();
        wp.barrier_dst[l] = kNoReg;
      }
      std::fill(wp.regs.begin(), wp.regs.end(), 0);
    }
    for (;;) {
      bool progressed = false;
      for (Warp& w : warps_) {
        if (RunWarp(w)) progressed = true;
        if (fault_->code != CUDA_SUCCESS) return false;
      }
      // Everyone waits (or has exited): open the barrier, or finish. A warp that gave up its turn
      // (a loop, nanosleep) can still run: it gets another turn first.
      bool waiting = false, running = false;
      for (Warp& w : warps_)
        for (int l = 0; l < 32; ++l) {
          waiting = waiting || w.state[l] == kAtBarrier;
          running = running || w.state[l] == kRun;
        }
      if (running) continue;
      if (waiting) {
        ReleaseBarrier();
        continue;
      }
      bool live = false;
      for (Warp& w : warps_)
        for (int l = 0; l < 32; ++l) live = live || w.state[l] != kExited;
      if (!live) break;
      if (!progressed) {
        SetFault(CUDA_ERROR_LAUNCH_FAILED, "warps deadlocked (a warp collective whose members never arrive)");
        return false;
      }
    }
    *warp_ins += warp_ins_;
    *lane_ins += lane_ins_;
    warp_ins_ = lane_ins_ = 0;
    return true;
  }

 private:
  void SetFault(CUresult code, std::string msg) {
    if (fault_->code == CUDA_SUCCESS) {
      fault_->code = code;
      fault_->message = std::move(msg);
    }
  }
  std::string Where(const Warp& w, int lane, const Ins& ins) const {
    const uint32_t t = w.index * 32 + static_cast<uint32_t>(lane);
    const uint32_t bx = cfg_.block[0], by = cfg_.block[1];
    return std::string(OpName(ins.op)) + " at PTX line " + std::to_string(ins.line) + ", block (" +
           std::to_string(ctaid_[0]) + "," + std::to_string(ctaid_[1]) + "," + std::to_string(ctaid_[2]) +
           "), thread (" + std::to_string(t % bx) + "," + std::to_string((t / bx) % by) + "," +
           std::to_string(t / (bx * by)) + ")";
  }

  void ReleaseBarrier() {
    // bar.red: reduce the predicates of every arriving thread, then hand out the result.
    uint64_t popc = 0;
    bool all = true, any = false;
    for (Warp& w : warps_)
      for (int l = 0; l < 32; ++l)
        if (w.state[l] == kAtBarrier && w.barrier_dst[l] != kNoReg) {
          const bool v = red_vals_[w.index * 32 + static_cast<uint32_t>(l)] != 0;
          popc += v;
          all = all && v;
          any = any || v;
        }
    for (Warp& w : warps_)
      for (int l = 0; l < 32; ++l) {
        if (w.state[l] != kAtBarrier) continue;
        w.state[l] = kRun;
        if (w.barrier_dst[l] != kNoReg) {
          const uint8_t op = w.barrier_op[l];
          w.regs[w.barrier_dst[l] * 32 + static_cast<uint32_t>(l)] = op == 0 ? popc : op == 1 ? all : any;
          w.barrier_dst[l] = kNoReg;
        }
      }
  }

  // ---- operands ----
  uint64_t Special(const Warp& w, uint32_t id, int lane) const {
    const uint32_t t = w.index * 32 + static_cast<uint32_t>(lane);
    const uint32_t bx = cfg_.block[0], by = cfg_.block[1];
    const uint32_t bit = 1u << lane;
    switch (id) {
      case kTidX: return t % bx;
      case kTidY: return (t / bx) % by;
      case kTidZ: return t / (bx * by);
      case kNtidX: return cfg_.block[0];
      case kNtidY: return cfg_.block[1];
      case kNtidZ: return cfg_.block[2];
      case kCtaidX: return ctaid_[0];
      case kCtaidY: return ctaid_[1];
      case kCtaidZ: return ctaid_[2];
      case kNctaidX: return cfg_.grid[0];
      case kNctaidY: return cfg_.grid[1];
      case kNctaidZ: return cfg_.grid[2];
      case kLaneid: return static_cast<uint64_t>(lane);
      case kWarpid: return w.index;
      case kNwarpid: return 64;
      case kSmid: return (ctaid_[0] + ctaid_[1] * cfg_.grid[0]) % 132;
      case kNsmid: return 132;
      case kGridid: return 1;
      case kClock:
      case kClock64:
        // The SM clock: host time at the device's reported clock rate (1.98 GHz), so clock64()
        // spin loops wait for the time they ask for, as on a GPU.
        return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::steady_clock::now().time_since_epoch())
                                         .count()) *
                   198 / 100 +
               w.steps;
      case kGlobaltimer:
        return static_cast<uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
                .count());
      case kLanemaskEq: return bit;
      case kLanemaskLt: return bit - 1;
      case kLanemaskLe: return (bit - 1) | bit;
      case kLanemaskGt: return ~((bit - 1) | bit) & kFull;
      case kLanemaskGe: return ~(bit - 1) & kFull;
      case kDynSmem: return cfg_.dynamic_smem;
      case kTotalSmem: return shared_.size();
      case kClusterCtarank: return 0;
      case kClusterNctarank: return 1;
      case kIsExplicitCluster: return 0;
      case kEnvreg0 + 1: return cfg_.cooperative ? cfg_.grid_workspace >> 32 : 0;
      case kEnvreg0 + 2: return cfg_.cooperative ? cfg_.grid_workspace & 0xffffffffu : 0;
      default: return 0;  // other %envregN: 0
    }
  }
  uint64_t Val(const Warp& w, const Operand& o, int lane) const {
    switch (o.kind) {
      case Operand::kReg: return w.regs[o.reg * 32 + static_cast<uint32_t>(lane)];
      case Operand::kImm: return o.imm;
      case Operand::kSpecial: return Special(w, o.reg, lane);
      case Operand::kSym: return cfg_.var_addrs[o.reg & 0x7fffffffu] + o.imm;
      default: return 0;
    }
  }
  bool Pred(const Warp& w, const Operand& o, int lane) const {
    const bool v = (Val(w, o, lane) & 1) != 0;
    return o.neg ? !v : v;
  }
  void Set(Warp& w, const Operand& o, int lane, uint64_t v) {
    if (o.kind == Operand::kReg) w.regs[o.reg * 32 + static_cast<uint32_t>(lane)] = v;
  }

  // ---- memory ----
  // Host address of [addr, addr+bytes) in `sp`, or nullptr with the fault set.
  uint8_t* Mem(Space sp, uint64_t addr, uint32_t bytes, const Warp& w, int lane, bool write, const Ins& ins) {
    // Fast path: an aligned access inside the allocation the last global access hit.
    if ((sp == Space::kGlobal || sp == Space::kGeneric) && (addr & (bytes - 1)) == 0 &&
        addr - span_.base < span_.bytes && bytes <= span_.bytes - (addr - span_.base))
      return span_.host + (addr - span_.base);
    // Parameters live in a constant bank on the GPU: NVVM loads 8-byte fields of `.align 4` byte
    // arrays at 4-aligned offsets there, so only memory-backed spaces require natural alignment.
    if (bytes > 1 && (addr & (bytes - 1)) != 0 && sp != Space::kParam) {
      SetFault(CUDA_ERROR_MISALIGNED_ADDRESS,
               "misaligned " + std::to_string(bytes) + "-byte access to 0x" + Hex(addr) + " by " + Where(w, lane, ins));
      return nullptr;
    }
    const uint32_t t = w.index * 32 + static_cast<uint32_t>(lane);
    if (sp == Space::kGeneric) {
      if (addr - kSharedWindow < kWindowBytes) {
        sp = Space::kShared;
        addr -= kSharedWindow;
      } else if (addr - kLocalWindow < kWindowBytes) {
        sp = Space::kLocal;
        addr -= kLocalWindow;
      } else {
        sp = Space::kGlobal;
      }
    }
    switch (sp) {
      case Space::kShared:
        if (addr <= shared_.size() && bytes <= shared_.size() - addr) return shared_.data() + addr;
        break;
      case Space::kLocal:
        if (addr <= k_.local_bytes && bytes <= k_.local_bytes - addr) return local_.data() + t * k_.local_bytes + addr;
        break;
      case Space::kParam:
        if (addr >= kFuncParamBase) {
          const uint64_t off = addr - kFuncParamBase;
          if (off <= k_.fparam_bytes && bytes <= k_.fparam_bytes - off)
            return fparam_.data() + t * k_.fparam_bytes + off;
        } else if (!write && addr <= cfg_.param_bytes && bytes <= cfg_.param_bytes - addr) {
          return const_cast<uint8_t*>(cfg_.params) + addr;
        }
        break;
      case Space::kGlobal:
      case Space::kConst:
      case Space::kGeneric: {
        if (addr - span_.base < span_.bytes && bytes <= span_.bytes - (addr - span_.base))
          return span_.host + (addr - span_.base);
        GlobalMemory::Span s;
        if (mem_.Find(addr, &s) && addr - s.base < s.bytes && bytes <= s.bytes - (addr - s.base)) {
          span_ = s;
          return s.host + (addr - s.base);
        }
        break;
      }
    }
    static const char* const kSpace[] = {"generic", "global", "shared", "local", "param", "const"};
    SetFault(CUDA_ERROR_ILLEGAL_ADDRESS, std::string(write ? "write" : "read") + " of " + std::to_string(bytes) +
                                             " bytes at " + kSpace[static_cast<int>(sp)] + " address 0x" + Hex(addr) +
                                             " outside the session's memory by " + Where(w, lane, ins));
    return nullptr;
  }
  static std::string Hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
  }
  uint64_t Address(const Warp& w, const Operand& o, int lane) const {
    uint64_t a = o.imm;
    if (o.reg != kNoReg) a += w.regs[o.reg * 32 + static_cast<uint32_t>(lane)];
    if (o.sym != kNoSym) a += cfg_.var_addrs[o.sym];
    return a;
  }
  static uint64_t Load(const uint8_t* p, int bytes) {
    switch (bytes) {  // fixed sizes: inlined moves instead of a memcpy call per lane
      case 1: return *p;
      case 2: {
        uint16_t v;
        std::memcpy(&v, p, 2);
        return v;
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, p, 4);
        return v;
      }
      case 8: {
        uint64_t v;
        std::memcpy(&v, p, 8);
        return v;
      }
      default: {
        uint64_t v = 0;
        std::memcpy(&v, p, static_cast<size_t>(std::min(bytes, 8)));
        return v;
      }
    }
  }
  static void Store(uint8_t* p, uint64_t v, int bytes) {
    switch (bytes) {
      case 1: *p = static_cast<uint8_t>(v); break;
      case 2: {
        const auto x = static_cast<uint16_t>(v);
        std::memcpy(p, &x, 2);
        break;
      }
      case 4: {
        const auto x = static_cast<uint32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      default: std::memcpy(p, &v, static_cast<size_t>(std::min(bytes, 8))); break;
    }
  }

  // ---- the warp loop ----
  // Runs warp `w` until none of its lanes can run. True if it executed anything.
  bool RunWarp(Warp& w) {
    bool any = false;
    for (;;) {
      // The group: runnable lanes at the lowest PC (and lanes waiting at a collective there).
      uint32_t minpc = UINT32_MAX;
      uint32_t runnable = 0, collective = 0, barrier = 0;
      for (int l = 0; l < 32; ++l) {
        const uint8_t s = w.state[l];
        if (s == kRun) {
          runnable |= 1u << l;
          minpc = std::min(minpc, w.pc[l]);
        } else if (s == kAtCollective) {
          collective |= 1u << l;
        } else if (s == kAtBarrier) {
          barrier |= 1u << l;
        }
      }
      bool force = false;
      if (runnable == 0) {
        if (collective == 0 || barrier != 0) return any;
        // Only lanes at a collective remain and no barrier can bring the others: run it with
        // whoever is there (undefined in PTX; we do not hang).
        for (int l = 0; l < 32; ++l)
          if ((collective >> l) & 1) minpc = std::min(minpc, w.pc[l]);
        force = true;
      }
      uint32_t group = 0;
      for (int l = 0; l < 32; ++l)
        if (((runnable | collective) >> l) & 1 && w.pc[l] == minpc) group |= 1u << l;
      for (int l = 0; l < 32; ++l)
        if ((group >> l) & 1) w.state[l] = kRun;
      any = true;
      if (!Step(w, group, minpc, force)) return any;
      if (yield_) {
        yield_ = false;
        return any;
      }
    }
  }

  // Runs `group` (all at `pc`) until its lanes leave straight-line code. False on a fault.
  bool Step(Warp& w, uint32_t group, uint32_t pc, bool force) {
    const uint32_t others = [&] {
      uint32_t m = 0;
      for (int l = 0; l < 32; ++l)
        if (w.state[l] == kRun && !((group >> l) & 1)) m |= 1u << l;
      return m;
    }();
    for (;;) {
      if (pc >= k_.code.size()) {
        SetFault(CUDA_ERROR_LAUNCH_FAILED, "ran past the end of the kernel");
        return false;
      }
      // Blocks of a cooperative launch spin on each other in grid.sync(): let the others run.
      if (cfg_.cooperative && (warp_ins_ & 0x3ff) == 0) sched_yield();
      if ((++warp_ins_ & 0xffff) == 0) {
        if (stop_.load(std::memory_order_relaxed)) {
          SetFault(CUDA_ERROR_LAUNCH_FAILED, "stopped");
          return false;
        }
        if (cfg_.timeout_ms != 0 && std::chrono::steady_clock::now() > deadline_) {
          SetFault(CUDA_ERROR_LAUNCH_TIMEOUT,
                   "the kernel ran longer than the sim kernel timeout (" + std::to_string(cfg_.timeout_ms) + " ms)");
          return false;
        }
      }
      ++w.steps;
      const Ins& ins = k_.code[pc];
      uint32_t mask = group;
      if (ins.pred != kNoReg) {
        uint32_t m = 0;
        const uint64_t* pr = &w.regs[ins.pred * 32];
        for (int l = 0; l < 32; ++l)
          if (((group >> l) & 1) && (((pr[l] & 1) != 0) != ins.pred_neg)) m |= 1u << l;
        mask = m;
      }
      lane_ins_ += LaneCount(mask);
      // Control flow ends the group's straight-line run.
      switch (ins.op) {
        case Op::kBra: {
          const uint32_t target = ins.o[0].reg;
          for (int l = 0; l < 32; ++l)
            if ((group >> l) & 1) w.pc[l] = (mask >> l) & 1 ? target : pc + 1;
          // Forward progress: a warp that keeps looping lets the block's other warps run now and
          // then, so a warp spinning on memory another warp must write (a software barrier) ends.
          if (mask != 0 && target <= pc && (++w.back_branches & (kBackBranchesPerTurn - 1)) == 0) yield_ = true;
          return true;
        }
        case Op::kNanosleep:  // a thread that sleeps gives the other warps their turn
          for (int l = 0; l < 32; ++l)
            if ((group >> l) & 1) w.pc[l] = pc + 1;
          yield_ = true;
          return true;
        case Op::kExit:
          for (int l = 0; l < 32; ++l)
            if ((mask >> l) & 1) w.state[l] = kExited;
          if (mask == group) return true;
          group &= ~mask;
          break;
        case Op::kRet:
          if (!Ret(w, mask, pc)) return false;
          for (int l = 0; l < 32; ++l)
            if (((group & ~mask) >> l) & 1) w.pc[l] = pc + 1;
          return true;
        case Op::kCall:
          if (!Call(w, mask, ins, pc)) return false;
          for (int l = 0; l < 32; ++l)
            if (((group & ~mask) >> l) & 1) w.pc[l] = pc + 1;
          return true;
        case Op::kBar:
        case Op::kBarRed:
          if (ins.op == Op::kBarRed) {
            red_vals_.resize(static_cast<size_t>(nwarps_) * 32);
            for (int l = 0; l < 32; ++l) {
              if (!((mask >> l) & 1)) continue;
              // bar.red.popc.u32 d, a{, b}, {!}c   /   bar.red.and.pred p, a{, b}, {!}c
              const Operand& c = ins.o[ins.nops - 1];
              red_vals_[w.index * 32 + static_cast<uint32_t>(l)] = Pred(w, c, l);
              w.barrier_dst[l] = ins.o[0].reg;
              w.barrier_op[l] = ins.sub;
            }
          }
          for (int l = 0; l < 32; ++l) {
            if (!((group >> l) & 1)) continue;
            w.pc[l] = pc + 1;
            if ((mask >> l) & 1) w.state[l] = kAtBarrier;
          }
          return true;
        case Op::kShfl:
        case Op::kVote:
        case Op::kMatch:
        case Op::kRedux:
        case Op::kBarWarp: {
          const uint32_t members = static_cast<uint32_t>(Val(w, ins.o[ins.nops - 1], std::countr_zero(group | 1u)));
          uint32_t live = 0;
          for (int l = 0; l < 32; ++l)
            if (w.state[l] != kExited) live |= 1u << l;
          if (!force && (members & live & ~group) != 0) {
            for (int l = 0; l < 32; ++l)
              if ((group >> l) & 1) w.state[l] = kAtCollective, w.pc[l] = pc;
            return true;
          }
          if (!Collective(w, mask, group, ins)) return false;
          break;
        }
        case Op::kTrap:
        case Op::kBrkpt:
          if (mask != 0) {
            SetFault(CUDA_ERROR_LAUNCH_FAILED, std::string(ins.op == Op::kTrap ? "trap" : "brkpt") + " executed by " +
                                                   Where(w, std::countr_zero(mask), ins));
            return false;
          }
          break;
        case Op::kVprintf:
          for (int l = 0; l < 32; ++l)
            if ((mask >> l) & 1 && !Printf(w, l, ins)) return false;
          break;
        case Op::kAssertFail:
          if (mask != 0) {
            Assert(w, std::countr_zero(mask), ins);
            return false;
          }
          break;
        default:
          if (mask != 0 && !Exec(w, mask, ins)) return false;
          break;
      }
      ++pc;
      for (int l = 0; l < 32; ++l)
        if ((group >> l) & 1) w.pc[l] = pc;
      // Reconverge with lanes already waiting here.
      if (others != 0) {
        for (int l = 0; l < 32; ++l)
          if ((others >> l) & 1 && w.pc[l] == pc) return true;
      }
    }
  }

  // ---- calls ----
  bool Call(Warp& w, uint32_t mask, const Ins& ins, uint32_t pc) {
    const CallSite& cs = k_.calls[ins.aux];
    for (int l = 0; l < 32; ++l) {
      if (!((mask >> l) & 1)) continue;
      for (const CallSite::Copy& c : cs.args) {
        uint8_t* dst = Mem(Space::kParam, c.dst, 1, w, l, true, ins);
        if (dst == nullptr || (c.bytes > 0 && Mem(Space::kParam, c.dst + c.bytes - 1, 1, w, l, true, ins) == nullptr))
          return false;
        if (c.src_reg != kNoReg) {
          const uint64_t v = w.regs[c.src_reg * 32 + static_cast<uint32_t>(l)];
          std::memcpy(dst, &v, std::min<uint32_t>(c.bytes, 8));
        } else {
          uint8_t* src = Mem(Space::kParam, c.src, 1, w, l, false, ins);
          if (src == nullptr ||
              (c.bytes > 0 && Mem(Space::kParam, c.src + c.bytes - 1, 1, w, l, false, ins) == nullptr))
            return false;
          std::memmove(dst, src, c.bytes);
        }
      }
      if (w.stack[l].size() >= 1024) {
        SetFault(CUDA_ERROR_LAUNCH_FAILED, "call stack overflow at " + Where(w, l, ins));
        return false;
      }
      w.stack[l].push_back(Frame{pc + 1, ins.aux});
      w.pc[l] = cs.entry;
    }
    return true;
  }
  bool Ret(Warp& w, uint32_t mask, const Ins& ins) {
    for (int l = 0; l < 32; ++l) {
      if (!((mask >> l) & 1)) continue;
      if (w.stack[l].empty()) {
        w.state[l] = kExited;
        continue;
      }
      const Frame f = w.stack[l].back();
      w.stack[l].pop_back();
      for (const CallSite::Copy& c : k_.calls[f.call].rets) {
        uint8_t* dst = Mem(Space::kParam, c.dst, 1, w, l, true, ins);
        uint8_t* src = Mem(Space::kParam, c.src, 1, w, l, false, ins);
        if (dst == nullptr || src == nullptr) return false;
        if (c.bytes > 1 && (Mem(Space::kParam, c.dst + c.bytes - 1, 1, w, l, true, ins) == nullptr ||
                            Mem(Space::kParam, c.src + c.bytes - 1, 1, w, l, false, ins) == nullptr))
          return false;
        std::memmove(dst, src, c.bytes);
      }
      w.pc[l] = f.ret_pc;
    }
    return true;
  }
  bool Ret(Warp& w, uint32_t mask, uint32_t pc) { return Ret(w, mask, k_.code[pc]); }

  // A builtin's argument: the 8-byte value the caller stored in its parameter.
  bool BuiltinArg(Warp& w, int lane, const Ins& ins, size_t i, uint64_t* out);
  // A NUL-terminated string in device memory (at most `max` bytes).
  bool DeviceString(Warp& w, int lane, const Ins& ins, uint64_t addr, std::string* out, size_t max = 4096);

  // vprintf(format, args): formats on the host as the CUDA runtime does (args packed, each aligned
  // to its size).
  bool Printf(Warp& w, int lane, const Ins& ins);

  // __assertfail(message, file, line, function, charSize): the device's assert message, then the
  // launch ends with CUDA_ERROR_ASSERT.
  void Assert(Warp& w, int lane, const Ins& ins);

  // ---- warp collectives ----
  bool Collective(Warp& w, uint32_t mask, uint32_t group, const Ins& ins) {
    switch (ins.op) {
      case Op::kBarWarp: return true;
      case Op::kShfl: {
        // shfl.sync.mode.b32 d[|p], a, b, c, membermask (PTX ISA: shfl.sync)
        const bool has_p = ins.o[0].n == 1;
        const int a_i = has_p ? 2 : 1;
        uint64_t src[32];
        for (int l = 0; l < 32; ++l) src[l] = (group >> l) & 1 ? Val(w, ins.o[a_i], l) : 0;
        for (int l = 0; l < 32; ++l) {
          if (!((mask >> l) & 1)) continue;
          const uint32_t b = static_cast<uint32_t>(Val(w, ins.o[a_i + 1], l)) & 31;
          const uint32_t c = static_cast<uint32_t>(Val(w, ins.o[a_i + 2], l));
          const uint32_t segmask = (c >> 8) & 31;
          const uint32_t cval = c & 31;
          const uint32_t lane = static_cast<uint32_t>(l);
          const uint32_t max_lane = (lane & segmask) | (cval & ~segmask);
          const uint32_t min_lane = lane & segmask;
          int64_t j = 0;
          bool pval = false;
          switch (static_cast<ShflMode>(ins.sub)) {
            case ShflMode::kUp:
              j = static_cast<int64_t>(lane) - b;
              pval = j >= static_cast<int64_t>(max_lane);
              break;
            case ShflMode::kDown:
              j = lane + b;
              pval = j <= max_lane;
              break;
            case ShflMode::kBfly:
              j = lane ^ b;
              pval = j <= max_lane;
              break;
            case ShflMode::kIdx:
              j = min_lane | (b & ~segmask);
              pval = j <= max_lane;
              break;
          }
          if (!pval || j < 0 || j > 31) j = l;
          Set(w, ins.o[0], l, src[j] & 0xffffffffu);
          if (has_p) Set(w, ins.o[1], l, pval);
        }
        return true;
      }
      case Op::kVote: {
        // vote.sync.{all,any,uni}.pred d, {!}a, membermask; vote.sync.ballot.b32 d, {!}a, membermask
        const uint32_t members = static_cast<uint32_t>(Val(w, ins.o[2], std::countr_zero(mask | 1u))) & mask;
        uint32_t ballot = 0;
        for (int l = 0; l < 32; ++l)
          if ((members >> l) & 1 && Pred(w, ins.o[1], l)) ballot |= 1u << l;
        uint64_t r = 0;
        switch (static_cast<VoteMode>(ins.sub)) {
          case VoteMode::kAll: r = ballot == members; break;
          case VoteMode::kAny: r = ballot != 0; break;
          case VoteMode::kUni: r = ballot == 0 || ballot == members; break;
          case VoteMode::kBallot: r = ballot; break;
        }
        for (int l = 0; l < 32; ++l)
          if ((mask >> l) & 1) Set(w, ins.o[0], l, r);
        return true;
      }
      case Op::kMatch: {
        // match.any.sync.b32 d, a, membermask; match.all.sync.b32 d[|p], a, membermask
        const bool has_p = ins.o[0].n == 1;
        const int a_i = has_p ? 2 : 1;
        const uint32_t members = static_cast<uint32_t>(Val(w, ins.o[a_i + 1], std::countr_zero(mask | 1u))) & mask;
        const int bytes = TyBytes(ins.type);
        for (int l = 0; l < 32; ++l) {
          if (!((mask >> l) & 1)) continue;
          const uint64_t v = Trunc(Val(w, ins.o[a_i], l), bytes);
          uint32_t same = 0;
          for (int m = 0; m < 32; ++m)
            if ((members >> m) & 1 && Trunc(Val(w, ins.o[a_i], m), bytes) == v) same |= 1u << m;
          if (ins.sub == 0) {
            Set(w, ins.o[0], l, same);
          } else {
            const bool all = same == members;
            Set(w, ins.o[0], l, all ? members : 0);
            if (has_p) Set(w, ins.o[1], l, all);
          }
        }
        return true;
      }
      case Op::kRedux: {
        // redux.sync.op.type d, a, membermask
        const uint32_t members = static_cast<uint32_t>(Val(w, ins.o[2], std::countr_zero(mask | 1u))) & mask;
        const bool sgn = TySigned(ins.type);
        uint64_t acc = 0;
        bool first = true;
        for (int l = 0; l < 32; ++l) {
          if (!((members >> l) & 1)) continue;
          const uint64_t v = Trunc(Val(w, ins.o[1], l), 4);
          if (first) {
            acc = v;
            first = false;
            continue;
          }
          switch (ins.sub) {
            case 0: acc = (acc + v) & 0xffffffffu; break;
            case 1:
              acc = sgn ? (static_cast<int32_t>(v) < static_cast<int32_t>(acc) ? v : acc) : std::min(acc, v);
              break;
            case 2:
              acc = sgn ? (static_cast<int32_t>(v) > static_cast<int32_t>(acc) ? v : acc) : std::max(acc, v);
              break;
            case 3: acc &= v; break;
            case 4: acc |= v; break;
            case 5: acc ^= v; break;
          }
        }
        for (int l = 0; l < 32; ++l)
          if ((mask >> l) & 1) Set(w, ins.o[0], l, acc);
        return true;
      }
      default: return true;
    }
  }

  // ---- everything else ----
  template <class F>
  void Lanes(uint32_t mask, F f) {
    while (mask != 0) {
      const int l = std::countr_zero(mask);
      mask &= mask - 1;
      f(l);
    }
  }

  // Float operation on the instruction's float type (scalars, f16x2/bf16x2 pairs).
  template <class Fn>
  uint64_t FEval(const Ins& ins, uint64_t a, uint64_t b, uint64_t c, Fn fn) const {
    auto post32 = [&](float r) {
      if (ins.ftz) r = FtzF(r);
      if (ins.sat) r = std::isnan(r) ? 0.0f : std::fmin(std::fmax(r, 0.0f), 1.0f);
      if (ins.relu && (std::isnan(r) || r < 0)) r = std::isnan(r) ? r : 0.0f;
      return r;
    };
    switch (ins.type) {
      case Ty::kF32: {
        const float x = ins.ftz ? FtzF(F32(a)) : F32(a), y = ins.ftz ? FtzF(F32(b)) : F32(b),
                    z = ins.ftz ? FtzF(F32(c)) : F32(c);
        if (!Directed(ins.rnd)) return B32(post32(fn(x, y, z)));
        RoundScope rs(ins.rnd);
        return B32(post32(fn(x, y, z)));
      }
      case Ty::kF64: {
        std::optional<RoundScope> rs;
        if (Directed(ins.rnd)) rs.emplace(ins.rnd);
        double r = fn(F64(a), F64(b), F64(c));
        if (ins.sat) r = std::isnan(r) ? 0.0 : std::fmin(std::fmax(r, 0.0), 1.0);
        return B64(r);
      }
      case Ty::kF16: return F2H(post32(fn(H2F(a), H2F(b), H2F(c))));
      case Ty::kBF16: return F2BF(post32(fn(BF2F(a), BF2F(b), BF2F(c))));
      case Ty::kF16x2:
        return F2H(post32(fn(H2F(a), H2F(b), H2F(c)))) |
               (F2H(post32(fn(H2F(a >> 16), H2F(b >> 16), H2F(c >> 16)))) << 16);
      case Ty::kBF16x2:
        return F2BF(post32(fn(BF2F(a), BF2F(b), BF2F(c)))) |
               (F2BF(post32(fn(BF2F(a >> 16), BF2F(b >> 16), BF2F(c >> 16)))) << 16);
      default: return 0;
    }
  }

  bool Compare(Cmp cmp, Ty t, uint64_t a, uint64_t b) const {
    if (TyFloat(t)) {
      double x, y;
      if (t == Ty::kF64)
        x = F64(a), y = F64(b);
      else if (t == Ty::kF32)
        x = F32(a), y = F32(b);
      else if (t == Ty::kBF16)
        x = BF2F(a), y = BF2F(b);
      else
        x = H2F(a), y = H2F(b);
      const bool un = std::isnan(x) || std::isnan(y);
      switch (cmp) {
        case Cmp::kEq: return !un && x == y;
        case Cmp::kNe: return !un && x != y;
        case Cmp::kLt: return !un && x < y;
        case Cmp::kLe: return !un && x <= y;
        case Cmp::kGt: return !un && x > y;
        case Cmp::kGe: return !un && x >= y;
        case Cmp::kEqu: return un || x == y;
        case Cmp::kNeu: return un || x != y;
        case Cmp::kLtu: return un || x < y;
        case Cmp::kLeu: return un || x <= y;
        case Cmp::kGtu: return un || x > y;
        case Cmp::kGeu: return un || x >= y;
        case Cmp::kNum: return !un;
        case Cmp::kNan: return un;
        default: return false;
      }
    }
    const int n = TyBytes(t);
    if (TySigned(t) && cmp <= Cmp::kGe) {
      const int64_t x = SExt(a, n), y = SExt(b, n);
      switch (cmp) {
        case Cmp::kEq: return x == y;
        case Cmp::kNe: return x != y;
        case Cmp::kLt: return x < y;
        case Cmp::kLe: return x <= y;
        case Cmp::kGt: return x > y;
        case Cmp::kGe: return x >= y;
        default: return false;
      }
    }
    const uint64_t x = Trunc(a, n), y = Trunc(b, n);
    switch (cmp) {
      case Cmp::kEq: return x == y;
      case Cmp::kNe: return x != y;
      case Cmp::kLt:
      case Cmp::kLo: return x < y;
      case Cmp::kLe:
      case Cmp::kLs: return x <= y;
      case Cmp::kGt:
      case Cmp::kHi: return x > y;
      case Cmp::kGe:
      case Cmp::kHs: return x >= y;
      default: return false;
    }
  }

  // cvt: destination ins.type, source ins.type2.
  uint64_t Convert(const Ins& ins, uint64_t v) const {
    const Ty dt = ins.type, st = ins.type2;
    const int dn = TyBytes(dt), sn = TyBytes(st);
    if (!TyFloat(dt) && !TyFloat(st)) {
      if (ins.sat) {
        const bool ss = TySigned(st), ds = TySigned(dt);
        const int64_t lo = ds ? -(int64_t{1} << (8 * dn - 1)) : 0;
        const uint64_t hi =
            ds ? (uint64_t{1} << (8 * dn - 1)) - 1 : (dn >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * dn)) - 1);
        if (ss) {
          const int64_t x = SExt(v, sn);
          if (x < lo) return Trunc(static_cast<uint64_t>(lo), dn);
          if (x > 0 && static_cast<uint64_t>(x) > hi) return hi;
          return Trunc(static_cast<uint64_t>(x), dn);
        }
        const uint64_t x = Trunc(v, sn);
        return x > hi ? hi : x;
      }
      const uint64_t x = TySigned(st) ? static_cast<uint64_t>(SExt(v, sn)) : Trunc(v, sn);
      return TySigned(dt) ? static_cast<uint64_t>(SExt(x, dn)) : Trunc(x, dn);
    }
    // Source to a double (exact for every source float; ints up to 2^53 exact, larger ones are
    // converted directly below).
    auto src_float = [&]() -> double {
      switch (st) {
        case Ty::kF32: return ins.ftz ? FtzF(F32(v)) : F32(v);
        case Ty::kF64: return F64(v);
        case Ty::kF16: return H2F(v);
        case Ty::kBF16: return BF2F(v);
        default: return 0;
      }
    };
    if (!TyFloat(dt)) {  // float -> int: round as asked, saturate, NaN -> 0
      double x = src_float();
      if (std::isnan(x)) return 0;
      switch (ins.rnd) {
        case Rnd::kRni:
        case Rnd::kRn: x = std::nearbyint(x); break;  // default rounding is to nearest even
        case Rnd::kRmi:
        case Rnd::kRm: x = std::floor(x); break;
        case Rnd::kRpi:
        case Rnd::kRp: x = std::ceil(x); break;
        default: x = std::trunc(x); break;
      }
      if (TySigned(dt)) {
        const double lo = -std::ldexp(1.0, 8 * dn - 1), hi = std::ldexp(1.0, 8 * dn - 1);
        if (x <= lo) return Trunc(static_cast<uint64_t>(static_cast<int64_t>(lo)), dn);
        if (x >= hi) return Trunc((uint64_t{1} << (8 * dn - 1)) - 1, dn);
        return Trunc(static_cast<uint64_t>(static_cast<int64_t>(x)), dn);
      }
      if (x <= 0) return 0;
      if (x >= std::ldexp(1.0, 8 * dn)) return dn >= 8 ? UINT64_MAX : (uint64_t{1} << (8 * dn)) - 1;
      return static_cast<uint64_t>(x);
    }
    // -> float
    RoundScope rs(ins.rnd);
    auto finish32 = [&](float f) {
      if (ins.ftz) f = FtzF(f);
      if (ins.sat) f = std::isnan(f) ? 0.0f : std::fmin(std::fmax(f, 0.0f), 1.0f);
      return f;
    };
    if (!TyFloat(st)) {  // int -> float
      const bool s = TySigned(st);
      const int64_t si = SExt(v, sn);
      const uint64_t ui = Trunc(v, sn);
      switch (dt) {
        case Ty::kF64: return B64(s ? static_cast<double>(si) : static_cast<double>(ui));
        case Ty::kF32: return B32(finish32(s ? static_cast<float>(si) : static_cast<float>(ui)));
        case Ty::kF16: return F2H(s ? static_cast<float>(si) : static_cast<float>(ui));
        case Ty::kBF16: return F2BF(s ? static_cast<float>(si) : static_cast<float>(ui));
        default: return 0;
      }
    }
    // float -> float
    const bool to_int = ins.rnd == Rnd::kRni || ins.rnd == Rnd::kRzi || ins.rnd == Rnd::kRmi || ins.rnd == Rnd::kRpi;
    double x = src_float();
    if (to_int) {
      switch (ins.rnd) {
        case Rnd::kRni: x = std::nearbyint(x); break;
        case Rnd::kRzi: x = std::trunc(x); break;
        case Rnd::kRmi: x = std::floor(x); break;
        default: x = std::ceil(x); break;
      }
    }
    switch (dt) {
      case Ty::kF64: return B64(ins.sat ? (std::isnan(x) ? 0.0 : std::fmin(std::fmax(x, 0.0), 1.0)) : x);
      case Ty::kF32: return B32(finish32(static_cast<float>(x)));
      case Ty::kF16: return F2H(finish32(static_cast<float>(x)));
      case Ty::kBF16: return F2BF(finish32(static_cast<float>(x)));
      default: return 0;
    }
  }

  bool Atomic(Warp& w, int l, const Ins& ins, bool want_old) {
    const int d = want_old ? 1 : 0;  // operand index of the address
    const Operand& am = ins.o[d];
    const uint64_t addr = Address(w, am, l);
    const Ty t = ins.type;
    const int n = TyBytes(t);
    uint8_t* p = Mem(ins.space == Space::kGeneric ? Space::kGeneric : ins.space, addr, static_cast<uint32_t>(n), w, l,
                     true, ins);
    if (p == nullptr) return false;
    const uint64_t b = Val(w, ins.o[d + 1], l);
    const uint64_t c = ins.nops > d + 2 ? Val(w, ins.o[d + 2], l) : 0;
    const AtomOp op = static_cast<AtomOp>(ins.sub);
    uint64_t old = 0;
    auto rmw = [&](auto* ptr, auto f) {
      using T = std::remove_pointer_t<decltype(ptr)>;
      T cur = __atomic_load_n(ptr, __ATOMIC_RELAXED);
      for (;;) {
        const T nv = f(cur);
        if (__atomic_compare_exchange_n(ptr, &cur, nv, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return cur;
      }
    };
    if (n == 4 || n == 8) {
      auto run = [&](auto* ptr) {
        using T = std::remove_pointer_t<decltype(ptr)>;
        const T bv = static_cast<T>(b), cv = static_cast<T>(c);
        const bool sgn = TySigned(t);
        switch (op) {
          case AtomOp::kAdd:
            if (t == Ty::kF32)
              return static_cast<uint64_t>(rmw(ptr, [&](T x) { return static_cast<T>(B32(F32(x) + F32(bv))); }));
            if (t == Ty::kF64)
              return static_cast<uint64_t>(rmw(ptr, [&](T x) { return static_cast<T>(B64(F64(x) + F64(bv))); }));
            if (t == Ty::kF16x2 || t == Ty::kBF16x2)
              return static_cast<uint64_t>(rmw(ptr, [&](T x) {
                Ins add = ins;
                add.ftz = add.sat = false;
                add.rnd = Rnd::kDefault;
                return static_cast<T>(FEval(add, x, bv, 0, [](auto p1, auto p2, auto) { return p1 + p2; }));
              }));
            return static_cast<uint64_t>(__atomic_fetch_add(ptr, bv, __ATOMIC_SEQ_CST));
          case AtomOp::kAnd: return static_cast<uint64_t>(__atomic_fetch_and(ptr, bv, __ATOMIC_SEQ_CST));
          case AtomOp::kOr: return static_cast<uint64_t>(__atomic_fetch_or(ptr, bv, __ATOMIC_SEQ_CST));
          case AtomOp::kXor: return static_cast<uint64_t>(__atomic_fetch_xor(ptr, bv, __ATOMIC_SEQ_CST));
          case AtomOp::kExch: return static_cast<uint64_t>(__atomic_exchange_n(ptr, bv, __ATOMIC_SEQ_CST));
          case AtomOp::kCas: {
            T expected = bv;
            __atomic_compare_exchange_n(ptr, &expected, cv, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
            return static_cast<uint64_t>(expected);
          }
          case AtomOp::kInc:
            return static_cast<uint64_t>(rmw(ptr, [&](T x) { return x >= bv ? T{0} : static_cast<T>(x + 1); }));
          case AtomOp::kDec:
            return static_cast<uint64_t>(
                rmw(ptr, [&](T x) { return (x == 0 || x > bv) ? bv : static_cast<T>(x - 1); }));
          case AtomOp::kMin:
          case AtomOp::kMax: {
            const bool mn = op == AtomOp::kMin;
            if (t == Ty::kF32 || t == Ty::kF64) {
              return static_cast<uint64_t>(rmw(ptr, [&](T x) {
                const double xv = n == 4 ? F32(x) : F64(x), bvv = n == 4 ? F32(bv) : F64(bv);
                return (mn ? bvv < xv : bvv > xv) ? bv : x;
              }));
            }
            return static_cast<uint64_t>(rmw(ptr, [&](T x) {
              const bool less = sgn ? SExt(bv, n) < SExt(x, n) : bv < x;
              return (mn ? less : (!less && bv != x)) ? bv : x;
            }));
          }
        }
        return uint64_t{0};
      };
      old = n == 4 ? Trunc(run(reinterpret_cast<uint32_t*>(p)), 4) : run(reinterpret_cast<uint64_t*>(p));
    } else if (n == 2 && (op == AtomOp::kAdd || op == AtomOp::kCas || op == AtomOp::kExch || op == AtomOp::kMin ||
                          op == AtomOp::kMax)) {
      auto* ptr = reinterpret_cast<uint16_t*>(p);
      old = rmw(ptr, [&](uint16_t x) -> uint16_t {
        switch (op) {
          case AtomOp::kCas: return x == static_cast<uint16_t>(b) ? static_cast<uint16_t>(c) : x;
          case AtomOp::kExch: return static_cast<uint16_t>(b);
          case AtomOp::kAdd: {
            if (t == Ty::kF16) return static_cast<uint16_t>(F2H(H2F(x) + H2F(b)));
            if (t == Ty::kBF16) return static_cast<uint16_t>(F2BF(BF2F(x) + BF2F(b)));
            return static_cast<uint16_t>(x + b);
          }
          default: {
            const float xv = t == Ty::kBF16 ? BF2F(x) : H2F(x), bv = t == Ty::kBF16 ? BF2F(b) : H2F(b);
            const bool mn = op == AtomOp::kMin;
            return (mn ? bv < xv : bv > xv) ? static_cast<uint16_t>(b) : x;
          }
        }
      });
    } else {
      SetFault(CUDA_ERROR_NOT_SUPPORTED,
               std::string("atom/red of ") + TyName(t) + " is not supported by the sim executor");
      return false;
    }
    if (want_old) Set(w, ins.o[0], l, old);
    return true;
  }

  bool Exec(Warp& w, uint32_t mask, const Ins& ins) {
    const Ty t = ins.type;
    const int n = TyBytes(t);
    const bool fl = TyFloat(t);
    const bool sg = TySigned(t);
    switch (ins.op) {
      case Op::kNop:
      case Op::kMembar:
      case Op::kPrefetch:
      case Op::kNanosleep:
      case Op::kBarArrive: return true;
      case Op::kMov: {
        const Operand& d = ins.o[0];
        const Operand& a = ins.o[1];
        if (d.kind == Operand::kVec) {  // unpack: mov.b64 {lo, hi}, x
          const int e = n / d.n;
          Lanes(mask, [&](int l) {
            const uint64_t v = Val(w, a, l);
            for (int i = 0; i < d.n; ++i)
              if (d.regs[i] != kNoReg) w.regs[d.regs[i] * 32 + static_cast<uint32_t>(l)] = Trunc(v >> (8 * e * i), e);
          });
        } else if (a.kind == Operand::kVec) {  // pack: mov.b64 x, {lo, hi}
          const int e = n / a.n;
          Lanes(mask, [&](int l) {
            uint64_t v = 0;
            for (int i = 0; i < a.n; ++i)
              if (a.regs[i] != kNoReg) v |= Trunc(w.regs[a.regs[i] * 32 + static_cast<uint32_t>(l)], e) << (8 * e * i);
            Set(w, d, l, v);
          });
        } else {
          Lanes(mask, [&](int l) { Set(w, d, l, t == Ty::kPred ? (Val(w, a, l) & 1) : Trunc(Val(w, a, l), n)); });
        }
        return true;
      }
      case Op::kCvt:
        if (n == 0 || TyBytes(ins.type2) == 0) return Unsupported(w, mask, ins);  // `cvt.rzi`: no types
        if (ins.o[0].kind == Operand::kReg && (t == Ty::kF16x2 || t == Ty::kBF16x2)) {
          // cvt.rn.f16x2.f32 d, a, b: a to the upper half, b to the lower.
          Ins one = ins;
          one.type = t == Ty::kF16x2 ? Ty::kF16 : Ty::kBF16;
          Lanes(mask, [&](int l) {
            Set(w, ins.o[0], l, (Convert(one, Val(w, ins.o[1], l)) << 16) | Convert(one, Val(w, ins.o[2], l)));
          });
          return true;
        }
        Lanes(mask, [&](int l) { Set(w, ins.o[0], l, Convert(ins, Val(w, ins.o[1], l))); });
        return true;
      case Op::kCvta:
        Lanes(mask, [&](int l) {
          uint64_t v = Val(w, ins.o[1], l);
          const uint64_t base = ins.space == Space::kShared  ? kSharedWindow
                                : ins.space == Space::kLocal ? kLocalWindow
                                                             : 0;
          v = ins.to ? v - base : v + base;
          Set(w, ins.o[0], l, Trunc(v, n));
        });
        return true;
      case Op::kIsspacep:
        Lanes(mask, [&](int l) {
          const uint64_t v = Val(w, ins.o[1], l);
          const bool sh = v - kSharedWindow < kWindowBytes, lo = v - kLocalWindow < kWindowBytes;
          bool r = ins.space == Space::kShared ? sh : ins.space == Space::kLocal ? lo : (!sh && !lo);
          Set(w, ins.o[0], l, r);
        });
        return true;
      case Op::kLd: {
        const Operand& d = ins.o[0];
        const int cnt = d.kind == Operand::kVec ? d.n : 1;
        const int e = n;
        for (int l = 0; l < 32; ++l) {
          if (!((mask >> l) & 1)) continue;
          const uint64_t addr = Address(w, ins.o[1], l);
          const uint8_t* p = Mem(ins.space, addr, static_cast<uint32_t>(e * cnt), w, l, false, ins);
          if (p == nullptr) return false;
          for (int i = 0; i < cnt; ++i) {
            uint64_t v = Load(p + e * i, e);
            if (sg) v = static_cast<uint64_t>(SExt(v, e));
            if (d.kind == Operand::kVec) {
              if (d.regs[i] != kNoReg) w.regs[d.regs[i] * 32 + static_cast<uint32_t>(l)] = v;
            } else {
              Set(w, d, l, v);
            }
          }
        }
        return true;
      }
      case Op::kSt: {
        const Operand& a = ins.o[1];
        const int cnt = a.kind == Operand::kVec ? a.n : 1;
        const int e = n;
        for (int l = 0; l < 32; ++l) {
          if (!((mask >> l) & 1)) continue;
          const uint64_t addr = Address(w, ins.o[0], l);
          uint8_t* p = Mem(ins.space, addr, static_cast<uint32_t>(e * cnt), w, l, true, ins);
          if (p == nullptr) return false;
          for (int i = 0; i < cnt; ++i) {
            const uint64_t v = a.kind == Operand::kVec
                                   ? (a.regs[i] == kNoReg ? 0 : w.regs[a.regs[i] * 32 + static_cast<uint32_t>(l)])
                                   : Val(w, a, l);
            Store(p + e * i, v, e);
          }
        }
        return true;
      }
      case Op::kCpAsync: {
        // cp.async [dst], [src], cp-size {, src-size | ignore-src}: copied now (parse.cpp says why
        // that is allowed); bytes past src-size are zero-filled.
        const uint32_t cp = static_cast<uint32_t>(ins.o[2].imm);
        const int args = ins.nops - ((ins.sub & kCpAsyncCacheHint) != 0 ? 1 : 0);
        for (int l = 0; l < 32; ++l) {
          if (!((mask >> l) & 1)) continue;
          uint64_t src_size = cp;
          if (args == 4)
            src_size = (ins.sub & kCpAsyncIgnoreSrc) != 0 ? (Pred(w, ins.o[3], l) ? 0 : cp)
                                                          : static_cast<uint32_t>(Val(w, ins.o[3], l));
          if (src_size > cp) {
            SetFault(CUDA_ERROR_LAUNCH_FAILED, "cp.async src-size " + std::to_string(src_size) +
                                                   " larger than its cp-size (" + Where(w, l, ins) + ")");
            return false;
          }
          uint8_t* d = Mem(Space::kShared, Address(w, ins.o[0], l), cp, w, l, true, ins);
          if (d == nullptr) return false;
          const uint64_t src = Address(w, ins.o[1], l);
          uint8_t tmp[16] = {};
          if ((src_size & (src_size - 1)) == 0 && src_size != 0) {
            const uint8_t* s = Mem(Space::kGlobal, src, static_cast<uint32_t>(src_size), w, l, false, ins);
            if (s == nullptr) return false;
            std::memcpy(tmp, s, src_size);
          } else {
            for (uint64_t i = 0; i < src_size; ++i) {
              const uint8_t* s = Mem(Space::kGlobal, src + i, 1, w, l, false, ins);
              if (s == nullptr) return false;
              tmp[i] = *s;
            }
          }
          std::memcpy(d, tmp, cp);
        }
        return true;
      }
      case Op::kAtom:
      case Op::kRed:
        for (int l = 0; l < 32; ++l)
          if ((mask >> l) & 1 && !Atomic(w, l, ins, ins.op == Op::kAtom)) return false;
        return true;
      case Op::kActivemask: Lanes(mask, [&](int l) { Set(w, ins.o[0], l, mask); }); return true;
      case Op::kSelp:
        Lanes(mask,
              [&](int l) { Set(w, ins.o[0], l, Pred(w, ins.o[3], l) ? Val(w, ins.o[1], l) : Val(w, ins.o[2], l)); });
        return true;
      case Op::kSlct:
        Lanes(mask, [&](int l) {
          const uint64_t c = Val(w, ins.o[3], l);
          const bool ge =
              ins.type2 == Ty::kF32 ? !(F32(c) < 0.0f) && !std::isnan(F32(c)) : static_cast<int32_t>(c) >= 0;
          Set(w, ins.o[0], l, ge ? Val(w, ins.o[1], l) : Val(w, ins.o[2], l));
        });
        return true;
      case Op::kSetp: {
        const bool dual = ins.o[0].n == 1;
        const int a = dual ? 2 : 1;
        Lanes(mask, [&](int l) {
          bool r = Compare(ins.cmp, ins.type2, Val(w, ins.o[a], l), Val(w, ins.o[a + 1], l));
          bool q = !r;
          if (ins.boolop != BoolOp::kNone) {
            const bool c = Pred(w, ins.o[a + 2], l);
            auto comb = [&](bool x) {
              return ins.boolop == BoolOp::kAnd ? (x && c) : ins.boolop == BoolOp::kOr ? (x || c) : (x != c);
            };
            r = comb(r);
            q = comb(q);
          }
          Set(w, ins.o[0], l, r);
          if (dual) Set(w, ins.o[1], l, q);
        });
        return true;
      }
      case Op::kSet:
        Lanes(mask, [&](int l) {
          bool r = Compare(ins.cmp, ins.type2, Val(w, ins.o[1], l), Val(w, ins.o[2], l));
          if (ins.boolop != BoolOp::kNone) {
            const bool c = Pred(w, ins.o[3], l);
            r = ins.boolop == BoolOp::kAnd ? (r && c) : ins.boolop == BoolOp::kOr ? (r || c) : (r != c);
          }
          Set(w, ins.o[0], l, t == Ty::kF32 ? (r ? B32(1.0f) : 0) : (r ? Trunc(UINT64_MAX, n) : 0));
        });
        return true;
      case Op::kTestp:
        Lanes(mask, [&](int l) {
          const double x = t == Ty::kF64 ? F64(Val(w, ins.o[1], l)) : F32(Val(w, ins.o[1], l));
          bool r = false;
          switch (ins.sub) {
            case 0: r = std::isfinite(x); break;
            case 1: r = std::isinf(x); break;
            case 2: r = !std::isnan(x); break;
            case 3: r = std::isnan(x); break;
            case 4: r = t == Ty::kF64 ? std::isnormal(x) : std::isnormal(static_cast<float>(x)); break;
            case 5:
              r = t == Ty::kF64 ? std::fpclassify(x) == FP_SUBNORMAL
                                : std::fpclassify(static_cast<float>(x)) == FP_SUBNORMAL;
              break;
          }
          Set(w, ins.o[0], l, r);
        });
        return true;
      case Op::kTex:
      case Op::kSuld:
      case Op::kSust:
      case Op::kTxq:
      case Op::kSuq:
        for (int l = 0; l < 32; ++l)
          if ((mask >> l) & 1 && !ImageLane(w, l, ins)) return false;
        return true;
      default: break;
    }
    if (fl) return ExecFloat(w, mask, ins);
    if (t == Ty::kPred) {
      if (ins.op != Op::kAnd && ins.op != Op::kOr && ins.op != Op::kXor && ins.op != Op::kNot)
        return Unsupported(w, mask, ins);
      Lanes(mask, [&](int l) {
        const bool a = Pred(w, ins.o[1], l);
        const bool b = ins.nops > 2 ? Pred(w, ins.o[2], l) : false;
        const bool r = ins.op == Op::kAnd   ? (a && b)
                       : ins.op == Op::kOr  ? (a || b)
                       : ins.op == Op::kXor ? (a != b)
                                            : !a;
        Set(w, ins.o[0], l, r);
      });
      return true;
    }
    if (n == 0) return Unsupported(w, mask, ins);  // integer arithmetic without a type (`abs;`)
    return ExecInt(w, mask, ins, n, sg);
  }

  // ---- textures and surfaces ----
  // tex / suld / sust / txq / suq in unified mode: the object is a 64-bit handle (CUtexObject /
  // CUsurfObject) resolved through GlobalMemory::FindTexture / FindSurface into an ImageView, once
  // per worker thread and launch (a small cache; the view's `data` must stay valid until Launch
  // returns, as a Span's must). Every texel access is checked against [0, view.bytes): a view whose
  // `bytes` cannot hold the texel an instruction addresses fails the launch with
  // CUDA_ERROR_ILLEGAL_ADDRESS (it is never read or written past `bytes`, and never clamped to fit).
  // Sources: PTX ISA 9.0 (tex, suld, sust, txq, suq); CUDA C++ Programming Guide, "Texture Fetching"
  // (addressing modes, nearest-point and linear filtering) and "Texture and Surface Memory" (read
  // modes, surface byte addressing).
  struct ImageSlot {
    uint64_t handle = 0;
    bool surface = false;
    ImageView view;
  };

  static int FormatBytes(uint32_t f);
  // Why the executor cannot use view `v` ("" if it can).
  static std::string ViewProblem(const ImageView& v, bool surface);
  static uint64_t TexelBytes(const ImageView& v) { return static_cast<uint64_t>(FormatBytes(v.format)) * v.channels; }
  // Byte offset of (x bytes, row y, slice z) if [offset, offset + size) lies inside the view's memory.
  static bool ByteOffset(const ImageView& v, uint64_t xb, uint64_t y, uint64_t z, uint64_t size, uint64_t* off);

  // The view of texture / surface object `handle`; false with the fault set if there is none.
  bool ResolveImage(uint64_t handle, bool surface, const Warp& w, int lane, const Ins& ins, ImageView* out);
  // The object operand: a register, or a .param holding the handle.
  bool HandleValue(const Warp& w, const Operand& o, int lane, const Ins& ins, uint64_t* h);
  uint64_t VecReg(const Warp& w, const Operand& o, int i, int lane) const {
    return o.regs[i] == kNoReg ? 0 : w.regs[o.regs[i] * 32 + static_cast<uint32_t>(lane)];
  }

  // Whether fetches of `v` return floats: FLOAT and HALF texels, and 8/16-bit integers unless read
  // as integers (cudaReadModeNormalizedFloat; 32-bit integers are always returned as integers).
  static bool FloatResult(const ImageView& v);
  // Channel `c` of the texel at `p` as returned by a fetch: float bits, or a 32-bit integer.
  // Programming Guide, "Texture Memory": with cudaReadModeNormalizedFloat "the full range of the
  // integer type is mapped to [0.0, 1.0] for unsigned integer type and [-1.0, 1.0] for signed integer
  // type; for example, an unsigned 8-bit texture element with the value 0xff reads as 1"; the most
  // negative signed value (-128, -32768) reads as -1.0 as well.
  static uint32_t Channel(const ImageView& v, const uint8_t* p, uint32_t c, bool fl);
  // The integer texel coordinate of float `x` (floor), NaN as 0, bounded to +-2^62.
  static int64_t FloorIndex(float x);
  // Texel index `i` of a dimension of `n` texels under address mode `mode`; -1: the border colour.
  // Programming Guide, "Texture Fetching": wrap and mirror are only supported with normalized
  // coordinates; with unnormalized (and integer) coordinates they act as clamp here.
  static int64_t AddressIndex(int64_t i, uint64_t n, uint32_t mode, bool normalized);
  static uint32_t SatI32(float f);

  // One texel's four channels at indices `idx` (-1 anywhere: the border colour), as a fetch returns
  // them. Channels the format lacks read as 0 and a missing alpha as 1 (1.0f for float results):
  // the Programming Guide does not say; this is the component substitution of the graphics APIs
  // (OpenGL 4.6, 15.2.1 "Texture Access"; Vulkan "Format Conversion"), which NVIDIA hardware follows.
  bool FetchTexel(const ImageView& v, const int64_t idx[3], bool fl, uint32_t out[4], const Warp& w, int lane,
                  const Ins& ins, uint64_t handle);

  bool ImageLane(Warp& w, int l, const Ins& ins);

  // tex.{1d,2d,3d}.v4.dtype.{f32,s32}: Programming Guide, "Texture Fetching". Float coordinates are
  // scaled by the size when normalized; nearest-point sampling reads texel floor(x); linear filtering
  // (float results, float coordinates) blends the 2/4/8 texels around x - 0.5 with weights
  // alpha = frac(x - 0.5) kept in float (the hardware rounds alpha to 8 fractional bits, so a GPU's
  // result may differ by up to 1/256 of the texel difference). Integer coordinates (tex1Dfetch) are
  // texel indices, never filtered, addressed as unnormalized ones. Integer results (read as integer,
  // 32-bit integer formats) are point-sampled. The destination receives the bits the fetch returns
  // (float or integer, decided by the view as on the GPU; .s32 sign-extends them in the register).
  bool TexLane(Warp& w, int l, const Ins& ins);

  // suld.b / sust.b: unformatted access of vec x .bN bytes at (x bytes, y rows, z slices) (PTX ISA:
  // "the lowest dimension coordinate represents a byte offset into the surface and is not scaled").
  // Out of range (x < 0, x + size past the row's width * texel bytes, y or z outside the height or
  // depth): .trap fails the launch with CUDA_ERROR_ILLEGAL_ADDRESS; .clamp moves the access to the
  // nearest in-range location (x to [0, row - size], rounded down to a multiple of the access size;
  // y and z to the edge); .zero loads zeros and drops stores. x need not be a multiple of the size.
  bool SurfaceLane(Warp& w, int l, const Ins& ins);

  bool Unsupported(Warp& w, uint32_t mask, const Ins& ins) {
    SetFault(CUDA_ERROR_NOT_SUPPORTED, std::string("instruction ") + OpName(ins.op) + "." + TyName(ins.type) +
                                           " is not supported by the sim executor (" +
                                           Where(w, std::countr_zero(mask | 1u), ins) + ")");
    return false;
  }

  bool ExecFloat(Warp& w, uint32_t mask, const Ins& ins) {
    auto un = [&](auto fn) {
      Lanes(mask, [&](int l) {
        Set(w, ins.o[0], l, FEval(ins, Val(w, ins.o[1], l), 0, 0, [&](auto a, auto, auto) { return fn(a); }));
      });
      return true;
    };
    auto bin = [&](auto fn) {
      Lanes(mask, [&](int l) {
        Set(w, ins.o[0], l,
            FEval(ins, Val(w, ins.o[1], l), Val(w, ins.o[2], l), 0, [&](auto a, auto b, auto) { return fn(a, b); }));
      });
      return true;
    };
    switch (ins.op) {
      case Op::kAdd: return bin([](auto a, auto b) { return a + b; });
      case Op::kSub: return bin([](auto a, auto b) { return a - b; });
      case Op::kMul: return bin([](auto a, auto b) { return a * b; });
      case Op::kDiv: return bin([](auto a, auto b) { return a / b; });
      case Op::kMin: return bin([](auto a, auto b) { return std::fmin(a, b); });
      case Op::kMax: return bin([](auto a, auto b) { return std::fmax(a, b); });
      case Op::kCopysign: return bin([](auto a, auto b) { return std::copysign(b, a); });
      case Op::kFma:
      case Op::kMad:
        Lanes(mask, [&](int l) {
          Set(w, ins.o[0], l,
              FEval(ins, Val(w, ins.o[1], l), Val(w, ins.o[2], l), Val(w, ins.o[3], l),
                    [](auto a, auto b, auto c) { return std::fma(a, b, c); }));
        });
        return true;
      case Op::kAbs: return un([](auto a) { return std::fabs(a); });
      case Op::kNeg: return un([](auto a) { return -a; });
      case Op::kRcp: return un([](auto a) { return decltype(a)(1) / a; });
      case Op::kSqrt: return un([](auto a) { return std::sqrt(a); });
      case Op::kRsqrt: return un([](auto a) { return decltype(a)(1) / std::sqrt(a); });
      case Op::kSin: return un([](auto a) { return std::sin(a); });
      case Op::kCos: return un([](auto a) { return std::cos(a); });
      case Op::kLg2: return un([](auto a) { return std::log2(a); });
      case Op::kEx2: return un([](auto a) { return std::exp2(a); });
      case Op::kTanh: return un([](auto a) { return std::tanh(a); });
      default: return Unsupported(w, mask, ins);
    }
  }

  bool ExecInt(Warp& w, uint32_t mask, const Ins& ins, int n, bool sg) {
    const uint32_t bits = static_cast<uint32_t>(8 * n);
    auto A = [&](int l) { return Val(w, ins.o[1], l); };
    auto B = [&](int l) { return Val(w, ins.o[2], l); };
    auto C = [&](int l) { return Val(w, ins.o[3], l); };
    auto put = [&](int l, uint64_t v) { Set(w, ins.o[0], l, Trunc(v, n)); };
    auto clamp_s = [&](__int128 v) -> uint64_t {
      const __int128 lo = -(static_cast<__int128>(1) << (bits - 1)), hi = (static_cast<__int128>(1) << (bits - 1)) - 1;
      return static_cast<uint64_t>(static_cast<int64_t>(v < lo ? lo : v > hi ? hi : v));
    };
    // Fast paths for the most common forms: no carry, no saturation, low half.
    if (!ins.cc && !ins.sat) {
      switch (ins.op) {
        case Op::kAdd: Lanes(mask, [&](int l) { put(l, A(l) + B(l)); }); return true;
        case Op::kSub: Lanes(mask, [&](int l) { put(l, A(l) - B(l)); }); return true;
        case Op::kMul:
          if (ins.mul == MulMode::kLo || ins.mul == MulMode::kNone) {
            Lanes(mask, [&](int l) { put(l, A(l) * B(l)); });
            return true;
          }
          if (ins.mul == MulMode::kWide && n == 4) {
            Lanes(mask, [&](int l) {
              Set(w, ins.o[0], l,
                  sg ? static_cast<uint64_t>(SExt(A(l), 4) * SExt(B(l), 4)) : Trunc(A(l), 4) * Trunc(B(l), 4));
            });
            return true;
          }
          break;
        case Op::kMad:
          if (ins.mul == MulMode::kLo) {
            Lanes(mask, [&](int l) { put(l, A(l) * B(l) + C(l)); });
            return true;
          }
          if (ins.mul == MulMode::kWide && n == 4) {
            Lanes(mask, [&](int l) {
              Set(w, ins.o[0], l,
                  (sg ? static_cast<uint64_t>(SExt(A(l), 4) * SExt(B(l), 4)) : Trunc(A(l), 4) * Trunc(B(l), 4)) + C(l));
            });
            return true;
          }
          break;
        default: break;
      }
    }
    switch (ins.op) {
      case Op::kAdd:
      case Op::kSub:
      case Op::kAddc:
      case Op::kSubc: {
        const bool sub = ins.op == Op::kSub || ins.op == Op::kSubc;
        const bool use_cf = ins.op == Op::kAddc || ins.op == Op::kSubc;
        uint32_t carry_out = w.carry;
        Lanes(mask, [&](int l) {
          const uint64_t cf = use_cf ? (w.carry >> l) & 1 : 0;
          if (ins.sat && sg) {
            const __int128 r = sub ? static_cast<__int128>(SExt(A(l), n)) - SExt(B(l), n)
                                   : static_cast<__int128>(SExt(A(l), n)) + SExt(B(l), n);
            put(l, clamp_s(r));
            return;
          }
          const unsigned __int128 a = Trunc(A(l), n), b = Trunc(B(l), n);
          unsigned __int128 r = sub ? a - b - cf : a + b + cf;
          if (ins.cc) {
            const bool c = sub ? (a < b + cf) : ((r >> bits) & 1) != 0;
            carry_out = (carry_out & ~(1u << l)) | (static_cast<uint32_t>(c) << l);
          }
          put(l, static_cast<uint64_t>(r));
        });
        if (ins.cc) w.carry = carry_out;
        return true;
      }
      case Op::kMul:
      case Op::kMad:
      case Op::kMadc: {
        const bool mad = ins.op != Op::kMul;
        uint32_t carry_out = w.carry;
        Lanes(mask, [&](int l) {
          const __int128 a = sg ? static_cast<__int128>(SExt(A(l), n)) : static_cast<__int128>(Trunc(A(l), n));
          const __int128 b = sg ? static_cast<__int128>(SExt(B(l), n)) : static_cast<__int128>(Trunc(B(l), n));
          const __int128 p = a * b;
          uint64_t r;
          int rn = n;
          switch (ins.mul) {
            case MulMode::kHi: r = static_cast<uint64_t>(p >> bits); break;
            case MulMode::kWide:
              r = static_cast<uint64_t>(p);
              rn = 2 * n;
              break;
            default: r = static_cast<uint64_t>(p); break;
          }
          if (mad) {
            const uint64_t c = C(l);
            const uint64_t cf = ins.op == Op::kMadc ? (w.carry >> l) & 1 : 0;
            if (ins.sat && sg && rn == 4) {
              put(l, clamp_s(static_cast<__int128>(static_cast<int32_t>(r)) + static_cast<int32_t>(c)));
              return;
            }
            const unsigned __int128 s = static_cast<unsigned __int128>(Trunc(r, rn)) + Trunc(c, rn) + cf;
            if (ins.cc) carry_out = (carry_out & ~(1u << l)) | (static_cast<uint32_t>((s >> (8 * rn)) & 1) << l);
            r = static_cast<uint64_t>(s);
          }
          Set(w, ins.o[0], l, Trunc(r, rn));
        });
        if (ins.cc) w.carry = carry_out;
        return true;
      }
      case Op::kMul24:
      case Op::kMad24:
        Lanes(mask, [&](int l) {
          const int64_t a = sg ? SExt(A(l) & 0xffffff, 3) : static_cast<int64_t>(A(l) & 0xffffff);
          const int64_t b = sg ? SExt(B(l) & 0xffffff, 3) : static_cast<int64_t>(B(l) & 0xffffff);
          const int64_t p = a * b;
          uint64_t r = ins.mul == MulMode::kHi ? static_cast<uint64_t>(p >> 16) : static_cast<uint64_t>(p);
          if (ins.op == Op::kMad24) r += C(l);
          put(l, r);
        });
        return true;
      case Op::kSad:
        Lanes(mask, [&](int l) {
          const int64_t a = sg ? SExt(A(l), n) : static_cast<int64_t>(Trunc(A(l), n));
          const int64_t b = sg ? SExt(B(l), n) : static_cast<int64_t>(Trunc(B(l), n));
          put(l, static_cast<uint64_t>(a > b ? a - b : b - a) + C(l));
        });
        return true;
      case Op::kDiv:
      case Op::kRem:
        Lanes(mask, [&](int l) {
          const bool div = ins.op == Op::kDiv;
          if (sg) {
            const int64_t a = SExt(A(l), n), b = SExt(B(l), n);
            if (b == 0) return put(l, div ? UINT64_MAX : static_cast<uint64_t>(a));
            if (b == -1) return put(l, div ? static_cast<uint64_t>(-static_cast<__int128>(a)) : 0);
            put(l, static_cast<uint64_t>(div ? a / b : a % b));
          } else {
            const uint64_t a = Trunc(A(l), n), b = Trunc(B(l), n);
            if (b == 0) return put(l, div ? UINT64_MAX : a);
            put(l, div ? a / b : a % b);
          }
        });
        return true;
      case Op::kAbs:
        Lanes(mask, [&](int l) {
          const int64_t a = SExt(A(l), n);
          put(l, static_cast<uint64_t>(a < 0 ? -static_cast<__int128>(a) : a));
        });
        return true;
      case Op::kNeg: Lanes(mask, [&](int l) { put(l, ~A(l) + 1); }); return true;
      case Op::kMin:
      case Op::kMax:
        Lanes(mask, [&](int l) {
          const bool mn = ins.op == Op::kMin;
          bool less;
          if (sg)
            less = SExt(A(l), n) < SExt(B(l), n);
          else
            less = Trunc(A(l), n) < Trunc(B(l), n);
          uint64_t r = (mn == less) ? A(l) : B(l);
          if (ins.relu && sg && SExt(r, n) < 0) r = 0;
          put(l, r);
        });
        return true;
      case Op::kPopc:
        Lanes(mask, [&](int l) { Set(w, ins.o[0], l, static_cast<uint64_t>(std::popcount(Trunc(A(l), n)))); });
        return true;
      case Op::kClz:
        Lanes(mask, [&](int l) {
          const uint64_t a = Trunc(A(l), n);
          Set(w, ins.o[0], l,
              a == 0 ? bits : static_cast<uint64_t>(std::countl_zero(a) - (64 - static_cast<int>(bits))));
        });
        return true;
      case Op::kBfind:
        Lanes(mask, [&](int l) {
          uint64_t a = Trunc(A(l), n);
          if (sg && SExt(a, n) < 0) a = Trunc(~a, n);
          uint64_t r = a == 0 ? 0xffffffffu : static_cast<uint64_t>(63 - std::countl_zero(a));
          if (a != 0 && ins.sub == 1) r = bits - 1 - r;  // .shiftamt: a left-shift amount
          Set(w, ins.o[0], l, r);
        });
        return true;
      case Op::kBrev:
        Lanes(mask, [&](int l) {
          uint64_t a = Trunc(A(l), n), r = 0;
          for (uint32_t i = 0; i < bits; ++i) r |= ((a >> i) & 1) << (bits - 1 - i);
          put(l, r);
        });
        return true;
      case Op::kBfe:
        Lanes(mask, [&](int l) {
          const uint64_t a = Trunc(A(l), n);
          const uint32_t pos = static_cast<uint32_t>(B(l)) & 0xff, len = static_cast<uint32_t>(C(l)) & 0xff;
          uint64_t r = 0;
          bool sbit = false;
          if (sg) {
            const uint32_t msb = pos + len - 1 >= bits ? bits - 1 : pos + len - 1;
            sbit = len == 0 ? false : ((a >> msb) & 1) != 0;
          }
          for (uint32_t i = 0; i < bits; ++i) {
            const bool bit = i < len && pos + i < bits ? ((a >> (pos + i)) & 1) != 0 : sbit;
            r |= static_cast<uint64_t>(bit) << i;
          }
          put(l, r);
        });
        return true;
      case Op::kBfi:
        Lanes(mask, [&](int l) {
          // bfi.b32 f, a, b, c, d: insert a's low d bits into b at c.
          const uint64_t a = A(l), b = Trunc(B(l), n);
          const uint32_t pos = static_cast<uint32_t>(C(l)) & 0xff,
                         len = static_cast<uint32_t>(Val(w, ins.o[4], l)) & 0xff;
          uint64_t r = b;
          for (uint32_t i = 0; i < len && pos + i < bits; ++i) {
            r = (r & ~(uint64_t{1} << (pos + i))) | (((a >> i) & 1) << (pos + i));
          }
          put(l, r);
        });
        return true;
      case Op::kPrmt:
        Lanes(mask, [&](int l) {
          const uint64_t src = (Trunc(B(l), 4) << 32) | Trunc(A(l), 4);
          const uint32_t c = static_cast<uint32_t>(C(l));
          auto byte = [&](uint32_t i) { return static_cast<uint32_t>((src >> (8 * (i & 7))) & 0xff); };
          uint32_t r = 0;
          for (uint32_t i = 0; i < 4; ++i) {
            uint32_t v = 0;
            const uint32_t c2 = c & 3;
            switch (ins.sub) {
              case 0: {
                const uint32_t sel = (c >> (4 * i)) & 0xf;
                v = byte(sel & 7);
                if (sel & 8) v = (v & 0x80) ? 0xff : 0;
                break;
              }
              case 1: v = byte(c2 + i); break;                 // f4e
              case 2: v = byte((c2 - i) & 7); break;           // b4e
              case 3: v = byte(c2); break;                     // rc8
              case 4: v = byte(std::max(i, c2)); break;        // ecl
              case 5: v = byte(std::min(i, c2)); break;        // ecr
              case 6: v = byte((c & 1) * 2 + (i & 1)); break;  // rc16
            }
            r |= v << (8 * i);
          }
          put(l, r);
        });
        return true;
      case Op::kAnd: Lanes(mask, [&](int l) { put(l, A(l) & B(l)); }); return true;
      case Op::kOr: Lanes(mask, [&](int l) { put(l, A(l) | B(l)); }); return true;
      case Op::kXor: Lanes(mask, [&](int l) { put(l, A(l) ^ B(l)); }); return true;
      case Op::kNot: Lanes(mask, [&](int l) { put(l, ~A(l)); }); return true;
      case Op::kCnot: Lanes(mask, [&](int l) { put(l, Trunc(A(l), n) == 0 ? 1 : 0); }); return true;
      case Op::kShl:
        Lanes(mask, [&](int l) {
          const uint64_t s = Trunc(B(l), 4);
          put(l, s >= bits ? 0 : A(l) << s);
        });
        return true;
      case Op::kShr:
        Lanes(mask, [&](int l) {
          const uint64_t s = Trunc(B(l), 4);
          if (sg) {
            const int64_t a = SExt(A(l), n);
            put(l, static_cast<uint64_t>(a >> std::min<uint64_t>(s, 63)));
          } else {
            put(l, s >= bits ? 0 : Trunc(A(l), n) >> s);
          }
        });
        return true;
      case Op::kShf:
        Lanes(mask, [&](int l) {
          const uint64_t v = (Trunc(B(l), 4) << 32) | Trunc(A(l), 4);
          uint32_t s = static_cast<uint32_t>(C(l));
          s = ins.wrap ? (s & 31) : std::min<uint32_t>(s, 32);
          Set(w, ins.o[0], l, ins.sub == 0 ? Trunc((v << s) >> 32, 4) : Trunc(v >> s, 4));
        });
        return true;
      case Op::kLop3:
        Lanes(mask, [&](int l) {
          const uint64_t a = A(l), b = B(l), c = C(l);
          const uint32_t lut = static_cast<uint32_t>(Val(w, ins.o[4], l));
          uint64_t r = 0;
          for (uint32_t i = 0; i < 8; ++i)
            if ((lut >> i) & 1) r |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
          put(l, r);
        });
        return true;
      case Op::kDp4a:
      case Op::kDp2a:
        Lanes(mask, [&](int l) {
          const uint32_t a = static_cast<uint32_t>(A(l)), b = static_cast<uint32_t>(B(l));
          const bool as = TySigned(ins.type), bs = TySigned(ins.type2);
          int64_t acc = static_cast<int64_t>(as || bs ? SExt(C(l), 4) : static_cast<int64_t>(Trunc(C(l), 4)));
          if (ins.op == Op::kDp4a) {
            for (int i = 0; i < 4; ++i) {
              const int64_t x = as ? static_cast<int8_t>(a >> (8 * i)) : static_cast<int64_t>((a >> (8 * i)) & 0xff);
              const int64_t y = bs ? static_cast<int8_t>(b >> (8 * i)) : static_cast<int64_t>((b >> (8 * i)) & 0xff);
              acc += x * y;
            }
          } else {
            const int hi = ins.mul == MulMode::kHi ? 2 : 0;
            for (int i = 0; i < 2; ++i) {
              const int64_t x =
                  as ? static_cast<int16_t>(a >> (16 * i)) : static_cast<int64_t>((a >> (16 * i)) & 0xffff);
              const int64_t y =
                  bs ? static_cast<int8_t>(b >> (8 * (i + hi))) : static_cast<int64_t>((b >> (8 * (i + hi))) & 0xff);
              acc += x * y;
            }
          }
          Set(w, ins.o[0], l, Trunc(static_cast<uint64_t>(acc), 4));
        });
        return true;
      default: return Unsupported(w, mask, ins);
    }
  }

  const Kernel& k_;
  const LaunchConfig& cfg_;
  GlobalMemory& mem_;
  std::atomic<bool>& stop_;
  std::chrono::steady_clock::time_point deadline_;
  uint32_t threads_ = 0, nwarps_ = 0;
  uint32_t ctaid_[3] = {};
  std::vector<uint8_t> shared_, local_, fparam_;
  std::vector<Warp> warps_;
  std::vector<uint8_t> red_vals_;
  GlobalMemory::Span span_{0, 0, nullptr};
  std::vector<ImageSlot> images_;  // texture / surface views resolved in this launch
  Fault* fault_ = nullptr;
  std::string* printf_ = nullptr;
  uint64_t warp_ins_ = 0, lane_ins_ = 0;
  bool yield_ = false;  // the running warp gives up its turn (see kBackBranchesPerTurn)
};

}  // namespace orion::ptx::exec
