// ptx/src/block.h — one thread block of a launch, as the executor runs it: its warps of 32 lanes
// in lockstep, their registers, shared and local memory, barriers, and the instructions' semantics.
// Private to ptx/src. exec.cpp runs blocks (Launch). This file holds the state and the scheduler
// (Run, RunWarp, Step, calls, warp collectives, barriers); the rest of the block is in files by job:
//   block_memory.h  state spaces, loads and stores, atomics   (inline: included at the end here)
//   block_units.h   Exec and the integer and float units      (inline: included at the end here)
//   alu.h           arithmetic with no block state: FEval, Compare, Convert, bit casts, rounding
//   exec_image.cpp  texture and surface instructions           (cold: out of line)
//   exec_printf.cpp device printf and assert                   (cold: out of line)
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
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "alu.h"
#include "ir.h"
#include "jit.h"

namespace orion::ptx::exec {

constexpr uint32_t kFull = 0xffffffffu;

// Whether the fast paths (block_fast.h) run: yes unless ORION_PTX_FAST=0 (the general units alone,
// the reference, to compare). Read once (exec.cpp).
bool FastPaths();

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
  std::vector<uint64_t> tid;   // %tid.x, .y, .z per lane, [3 * 32] (for translated code: jit.h)
  std::vector<Frame> stack[32];
  uint32_t in_call = 0;           // lanes whose stack is not empty (inside a .func)
  uint32_t barrier_dst[32] = {};  // bar.red destination register per lane (kNoReg: none)
  uint8_t barrier_op[32] = {};
};

// The lanes of `w` whose state is `s` (bit l: lane l).
inline uint32_t StateMask(const Warp& w, LaneState s) {
#if defined(__SSE2__)
  const __m128i want = _mm_set1_epi8(static_cast<char>(s));
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.state));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.state + 16));
  return static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(lo, want))) |
         static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(hi, want))) << 16;
#else
  uint32_t m = 0;
  for (int l = 0; l < 32; ++l) m |= static_cast<uint32_t>(w.state[l] == s) << l;
  return m;
#endif
}

// The lanes of `w` whose program counter is `pc`.
inline uint32_t PcMask(const Warp& w, uint32_t pc) {
#if defined(__SSE2__)
  const __m128i want = _mm_set1_epi32(static_cast<int>(pc));
  uint32_t m = 0;
  for (int q = 0; q < 8; ++q) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.pc + 4 * q));
    m |= static_cast<uint32_t>(_mm_movemask_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(v, want)))) << (4 * q);
  }
  return m;
#else
  uint32_t m = 0;
  for (int l = 0; l < 32; ++l) m |= static_cast<uint32_t>(w.pc[l] == pc) << l;
  return m;
#endif
}

struct Fault {
  CUresult code = CUDA_SUCCESS;
  std::string message;
};

class Block {
 public:
  // `jit`: the kernel's translation (jit.h), or nullptr to interpret every instruction.
  Block(const Kernel& k, const LaunchConfig& cfg, GlobalMemory& mem, std::atomic<bool>& stop,
        std::chrono::steady_clock::time_point deadline, const jit::Code* jit = nullptr)
      : k_(k), cfg_(cfg), mem_(mem), stop_(stop), deadline_(deadline), fast_(FastPaths()), jit_(jit) {
    threads_ = cfg.block[0] * cfg.block[1] * cfg.block[2];
    nwarps_ = (threads_ + 31) / 32;
    shared_.resize(k.shared_static + cfg.dynamic_smem);
    local_.resize(k.local_bytes * threads_);
    fparam_.resize(k.fparam_bytes * threads_);
    warps_.resize(nwarps_);
    for (uint32_t w = 0; w < nwarps_; ++w) warps_[w].regs.resize(static_cast<size_t>(k.nregs) * 32);
    if (jit_ != nullptr) {
      // What traces read: each warp's %tid rows, the lane-invariant special registers (Run fills
      // them), and per global access the allocation it last hit.
      jit_spans_.resize(jit_->slots);
      jit_special_.assign(jit::kSpecials, 0);
      for (uint32_t w = 0; w < nwarps_; ++w) {
        Warp& wp = warps_[w];
        wp.index = w;
        wp.tid.resize(3 * 32);
        for (uint32_t d = 0; d < 3; ++d)
          for (int l = 0; l < 32; ++l) wp.tid[d * 32 + static_cast<uint32_t>(l)] = Special(wp, kTidX + d, l);
      }
      for (uint32_t id = kNtidX; id < jit::kSpecials; ++id)
        if (id != kClock && id != kClock64 && id != kGlobaltimer) jit_special_[id] = Special(warps_[0], id, 0);
      jf_.spans = jit_spans_.data();
      jf_.special = jit_special_.data();
      jf_.var_addrs = cfg_.var_addrs;
      jf_.shared = shared_.data();
      jf_.shared_bytes = shared_.size();
      jf_.params = cfg_.params;
      jf_.param_bytes = cfg_.param_bytes;
    }
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
        wp.barrier_dst[l] = kNoReg;
      }
      for (uint32_t m = wp.in_call; m != 0; m &= m - 1) wp.stack[std::countr_zero(m)].clear();
      wp.in_call = 0;
      // Registers start at 0 where a thread may read one before writing it (Kernel::read_before).
      if (k_.read_before_known) {
        for (uint32_t r : k_.read_before) std::fill_n(&wp.regs[static_cast<size_t>(r) * 32], 32, 0);
      } else {
        std::fill(wp.regs.begin(), wp.regs.end(), 0);
      }
    }
    if (jit_ != nullptr) {  // the block's own special registers (the launch's: the constructor)
      for (uint32_t id : {kCtaidX, kCtaidY, kCtaidZ, kSmid}) jit_special_[id] = Special(warps_[0], id, 0);
    }
    for (;;) {
      bool progressed = false;
      for (Warp& w : warps_) {
        if (RunWarp(w)) progressed = true;
        if (fault_->code != CUDA_SUCCESS) return false;
      }
      // Everyone waits (or has exited): open the barrier, or finish. A warp that gave up its turn
      // (a loop, nanosleep) can still run: it gets another turn first.
      bool waiting = false, running = false, live = false;
      for (Warp& w : warps_) {
        waiting |= StateMask(w, kAtBarrier) != 0;
        running |= StateMask(w, kRun) != 0;
        live |= StateMask(w, kExited) != kFull;
      }
      if (running) continue;
      if (waiting) {
        ReleaseBarrier();
        continue;
      }
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
    if (!red_pending_) {  // bar.sync alone: the waiting lanes run again
      for (Warp& w : warps_)
        for (uint32_t m = StateMask(w, kAtBarrier); m != 0; m &= m - 1) w.state[std::countr_zero(m)] = kRun;
      return;
    }
    red_pending_ = false;
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

  // ---- memory (block_memory.h) ----
  // Host address of [addr, addr+bytes) in `sp`, or nullptr with the fault set.
  uint8_t* Mem(Space sp, uint64_t addr, uint32_t bytes, const Warp& w, int lane, bool write, const Ins& ins);
  static std::string Hex(uint64_t v) {
    char b[24];
    std::snprintf(b, sizeof b, "%llx", static_cast<unsigned long long>(v));
    return b;
  }
  uint64_t Address(const Warp& w, const Operand& o, int lane) const;
  static uint64_t Load(const uint8_t* p, int bytes);
  static void Store(uint8_t* p, uint64_t v, int bytes);
  // atom.* and red.* for lane `l`; `want_old`: atom (the old value goes to operand 0).
  bool Atomic(Warp& w, int l, const Ins& ins, bool want_old);

  // ---- the warp loop ----
  // Runs warp `w` until none of its lanes can run. True if it executed anything.
  bool RunWarp(Warp& w) {
    bool any = false;
    for (;;) {
      // The group: runnable lanes at the lowest PC (and lanes waiting at a collective there).
      uint32_t minpc = UINT32_MAX;
      const uint32_t runnable = StateMask(w, kRun), collective = StateMask(w, kAtCollective);
      if (runnable != 0) {
        // Commonly every runnable lane is at one PC (a converged warp).
        minpc = w.pc[std::countr_zero(runnable)];
        if ((runnable & ~PcMask(w, minpc)) != 0)
          for (uint32_t m = runnable; m != 0; m &= m - 1) minpc = std::min(minpc, w.pc[std::countr_zero(m)]);
      }
      bool force = false;
      if (runnable == 0) {
        if (collective == 0 || StateMask(w, kAtBarrier) != 0) return any;
        // Only lanes at a collective remain and no barrier can bring the others: run it with
        // whoever is there (undefined in PTX; we do not hang).
        for (uint32_t m = collective; m != 0; m &= m - 1) minpc = std::min(minpc, w.pc[std::countr_zero(m)]);
        force = true;
      }
      const uint32_t group = (runnable | collective) & PcMask(w, minpc);
      for (uint32_t m = group & collective; m != 0; m &= m - 1) w.state[std::countr_zero(m)] = kRun;
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
    // The group reconverges where the first of the warp's other runnable lanes waits (all of them
    // wait above `pc`, which is the lowest): their PCs do not change while the group runs. The
    // group's own PCs are written when its straight-line run ends, not after every instruction.
    uint32_t meet = UINT32_MAX;
    for (uint32_t m = StateMask(w, kRun) & ~group; m != 0; m &= m - 1) meet = std::min(meet, w.pc[std::countr_zero(m)]);
    for (;;) {
      if (pc >= k_.code.size()) {
        SetFault(CUDA_ERROR_LAUNCH_FAILED, "ran past the end of the kernel");
        return false;
      }
      // A trace (jit.h) that can be entered here and ends at or before the reconvergence point:
      // its native code runs the group to its end, or to a load or store it leaves to the units.
      bool left = false;
      if (jit_ != nullptr && jit_->entry[pc] != 0) {
        const jit::Code::Trace& t = jit_->traces[jit_->entry[pc] - 1];
        const jit::TraceFn fn = t.fn.load(std::memory_order_acquire);  // nullptr: not compiled yet
        if (fn != nullptr && meet >= t.end) {
          jf_.regs = w.regs.data();
          jf_.tid = w.tid.data();
          jf_.group = group;
          jf_.live = ~StateMask(w, kExited) & kFull;
          jit_special_[kWarpid] = w.index;
          const uint32_t stop = fn(&jf_, pc);
          lane_ins_ += jf_.lane_ins;
          jf_.lane_ins = 0;
          const uint64_t before = warp_ins_;
          warp_ins_ += stop - pc;
          w.steps += stop - pc;
          if (cfg_.cooperative && (before >> 10) != (warp_ins_ >> 10)) sched_yield();
          if ((before >> 16) != (warp_ins_ >> 16) && !Watch()) return false;
          pc = stop;
          if (pc == meet) {
            for (int l = 0; l < 32; ++l)
              if ((group >> l) & 1) w.pc[l] = pc;
            return true;
          }
          if (pc == t.end) continue;
          left = true;
        }
      }
      // Blocks of a cooperative launch spin on each other in grid.sync(): let the others run.
      if (cfg_.cooperative && (warp_ins_ & 0x3ff) == 0) sched_yield();
      if ((++warp_ins_ & 0xffff) == 0 && !Watch()) return false;
      ++w.steps;
      const Ins& ins = k_.code[pc];
      uint32_t mask = group;
      if (ins.pred != kNoReg) {
        uint32_t m = 0;
        const uint64_t* pr = &w.regs[ins.pred * 32];
        for (int l = 0; l < 32; ++l) m |= static_cast<uint32_t>(pr[l] & 1) << l;
        mask = group & (ins.pred_neg ? ~m : m);
      }
      lane_ins_ += LaneCount(mask);
      // Control flow ends the group's straight-line run.
      switch (ins.op) {
        case Op::kBra: {
          const uint32_t target = ins.o[0].reg;
          if (mask == group || mask == 0) {
            // Every lane of the group goes the same way: it runs on here while it stays below the
            // reconvergence point (and its loop has not used up the warp's turn).
            const uint32_t next = mask != 0 ? target : pc + 1;
            const bool turn_over = mask != 0 && target <= pc && (++w.back_branches & (kBackBranchesPerTurn - 1)) == 0;
            if (next < meet && !turn_over) {
              pc = next;
              continue;
            }
            for (int l = 0; l < 32; ++l)
              if ((group >> l) & 1) w.pc[l] = next;
            yield_ = yield_ || turn_over;
            return true;
          }
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
              red_pending_ = true;
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
          if (mask != 0 && !(ins.fast != 0 && fast_ && ExecFast(w, mask, ins)) && !Exec(w, mask, ins)) return false;
          // A load or store a trace left here: the next time, the trace tries the allocation it hit.
          if (left && jit_->slot_of[pc] != jit::kNoSlot)
            jit_spans_[jit_->slot_of[pc]] = {span_.base, span_.bytes, span_.host};
          break;
      }
      ++pc;
      // Reconverge with lanes already waiting here.
      if (pc == meet) {
        for (int l = 0; l < 32; ++l)
          if ((group >> l) & 1) w.pc[l] = pc;
        return true;
      }
    }
  }

  // The watchdog, every 65536 warp instructions: false with the fault set when the launch was
  // stopped or ran past its time.
  bool Watch() {
    if (stop_.load(std::memory_order_relaxed)) {
      SetFault(CUDA_ERROR_LAUNCH_FAILED, "stopped");
      return false;
    }
    if (cfg_.timeout_ms != 0 && std::chrono::steady_clock::now() > deadline_) {
      SetFault(CUDA_ERROR_LAUNCH_TIMEOUT,
               "the kernel ran longer than the sim kernel timeout (" + std::to_string(cfg_.timeout_ms) + " ms)");
      return false;
    }
    return true;
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
      w.in_call |= 1u << l;
      w.pc[l] = cs.entry;
    }
    return true;
  }
  bool Ret(Warp& w, uint32_t mask, const Ins& ins) {
    if ((mask & w.in_call) == 0) {  // the kernel's own ret: those lanes are done
      for (uint32_t m = mask; m != 0; m &= m - 1) w.state[std::countr_zero(m)] = kExited;
      return true;
    }
    for (int l = 0; l < 32; ++l) {
      if (!((mask >> l) & 1)) continue;
      if (w.stack[l].empty()) {
        w.state[l] = kExited;
        continue;
      }
      const Frame f = w.stack[l].back();
      w.stack[l].pop_back();
      if (w.stack[l].empty()) w.in_call &= ~(1u << l);
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

  // ---- the instruction units (block_units.h) ----
  // Runs `ins` on the lanes of `mask`; false with the fault set if the launch must end.
  bool Exec(Warp& w, uint32_t mask, const Ins& ins);
  // The fast paths (block_fast.h): false when `ins` is left to Exec, untouched.
  bool ExecFast(Warp& w, uint32_t mask, const Ins& ins);
  const uint64_t* Row(const Warp& w, const Operand& o, uint32_t mask, uint64_t* tmp) const;
  bool NearSpan(uint64_t addr);
  bool ExecFloat(Warp& w, uint32_t mask, const Ins& ins);
  // The integer unit: `n` bytes, `sg` signed.
  bool ExecInt(Warp& w, uint32_t mask, const Ins& ins, int n, bool sg);
  // Fails the launch: an instruction no unit executes (never a silent no-op).
  bool Unsupported(Warp& w, uint32_t mask, const Ins& ins);

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
  // Element `i` of a vector operand {a, b, ...} (block_units.h).
  uint64_t VecReg(const Warp& w, const Operand& o, int i, int lane) const;

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

  const Kernel& k_;
  const LaunchConfig& cfg_;
  GlobalMemory& mem_;
  std::atomic<bool>& stop_;
  std::chrono::steady_clock::time_point deadline_;
  bool fast_;                          // the fast paths run (FastPaths)
  const jit::Code* jit_;               // the kernel's translation, or nullptr
  jit::Frame jf_;                      // what its traces read (Step sets the warp's part)
  std::vector<jit::Span> jit_spans_;   // per global access: the allocation it last hit
  std::vector<uint64_t> jit_special_;  // lane-invariant special registers by id
  uint32_t threads_ = 0, nwarps_ = 0;
  uint32_t ctaid_[3] = {};
  std::vector<uint8_t> shared_, local_, fparam_;
  std::vector<Warp> warps_;
  std::vector<uint8_t> red_vals_;
  GlobalMemory::Span span_{0, 0, nullptr};
  GlobalMemory::Span recent_[4] = {};  // allocations hit recently (NearSpan), round robin
  uint32_t recent_next_ = 0;
  std::vector<ImageSlot> images_;  // texture / surface views resolved in this launch
  Fault* fault_ = nullptr;
  std::string* printf_ = nullptr;
  uint64_t warp_ins_ = 0, lane_ins_ = 0;
  bool yield_ = false;        // the running warp gives up its turn (see kBackBranchesPerTurn)
  bool red_pending_ = false;  // a bar.red waits: ReleaseBarrier hands out its result
};

}  // namespace orion::ptx::exec

// The block's inline parts by job (each needs the class above).
#include "block_memory.h"  // IWYU pragma: export
#include "block_units.h"   // IWYU pragma: export
#include "block_fast.h"    // IWYU pragma: export
