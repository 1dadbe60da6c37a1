// ptx/src/lower.cpp — a parsed kernel and the functions it calls to one flat instruction array
// (Lower, ir.h): calls resolved, labels to instruction indices, variables given their addresses,
// registers renumbered per kernel. Program::GetKernel lowers a kernel once and keeps it.
#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include "fast.h"
#include "ir.h"

namespace orion::ptx {

// ---- lowering -------------------------------------------------------------------------------

Result<std::shared_ptr<const Kernel>> Lower(const Program& p, uint32_t kfunc) {
  // Functions reachable from the kernel, in first-call order; recursion is refused.
  std::vector<uint32_t> order{kfunc};
  std::vector<int> state(p.funcs.size(), 0);  // 0 unseen, 1 on stack, 2 done
  std::string error;
  std::function<bool(uint32_t)> visit = [&](uint32_t f) -> bool {
    state[f] = 1;
    for (const Ins& ins : p.funcs[f].code) {
      if (ins.op != Op::kCall) continue;
      for (int i = 0; i < ins.nops; ++i) {
        if (ins.o[i].kind != Operand::kFunc) continue;
        const uint32_t g = ins.o[i].reg;
        if (!p.funcs[g].defined) {
          error = "PTX line " + std::to_string(ins.line) + ": call to " + p.funcs[g].name +
                  ", which the module does not define (only vprintf and __assertfail are built in)";
          return false;
        }
        if (state[g] == 1) {
          error =
              "PTX line " + std::to_string(ins.line) + ": recursive call to " + p.funcs[g].name + " (not supported)";
          return false;
        }
        if (state[g] == 0) {
          order.push_back(g);
          if (!visit(g)) return false;
        }
      }
    }
    state[f] = 2;
    return true;
  };
  if (!visit(kfunc)) return Status(Code::kUnimplemented, error);
  for (uint32_t f : order) {
    auto u = p.unsupported.find(f);
    if (u != p.unsupported.end())
      return Status(Code::kUnimplemented, "PTX line " + std::to_string(u->second.second) + ": instruction '" +
                                              u->second.first + "' is not supported by the sim executor");
  }

  auto k = std::make_shared<Kernel>();
  k->name = p.funcs[kfunc].name;
  k->max_threads = p.funcs[kfunc].max_threads;
  // Symbol offsets: shared (block), local (thread), param (kernel buffer or thread scratch).
  std::unordered_map<uint32_t, uint64_t> offset;
  auto place = [](uint64_t* cursor, const Sym& s) {
    const uint64_t a = s.align == 0 ? 1 : s.align;
    *cursor = (*cursor + a - 1) / a * a;
    const uint64_t at = *cursor;
    *cursor += s.size;
    return at;
  };
  uint64_t shared = 0;
  std::vector<uint32_t> extern_shared;
  for (uint32_t i = 0; i < p.syms.size(); ++i) {
    const Sym& s = p.syms[i];
    if (s.space != Space::kShared) continue;
    bool mine = s.func < 0;
    for (uint32_t f : order) mine = mine || s.func == static_cast<int32_t>(f);
    if (!mine) continue;
    if (s.extern_shared) {
      extern_shared.push_back(i);
      continue;
    }
    offset[i] = place(&shared, s);
  }
  shared = (shared + 15) / 16 * 16;
  for (uint32_t i : extern_shared) offset[i] = shared;  // dynamic shared memory follows the static
  k->shared_static = shared;
  uint64_t local = 0;
  uint64_t fparam = kFuncParamBase;
  for (uint32_t f : order) {
    for (uint32_t i : p.funcs[f].syms) {
      const Sym& s = p.syms[i];
      if (s.space == Space::kLocal) offset[i] = place(&local, s);
      if (s.space == Space::kParam) offset[i] = place(&fparam, s);
    }
    if (f == kfunc) {
      for (uint32_t i : p.funcs[f].params) {
        uint64_t off = 0;
        std::memcpy(&off, p.syms[i].init.data(), 8);
        offset[i] = off;
        k->param_bytes = static_cast<uint32_t>(std::max<uint64_t>(k->param_bytes, off + p.syms[i].size));
      }
    } else {
      for (uint32_t i : p.funcs[f].params) offset[i] = place(&fparam, p.syms[i]);
      for (uint32_t i : p.funcs[f].rets) offset[i] = place(&fparam, p.syms[i]);
    }
  }
  k->local_bytes = (local + 15) / 16 * 16;
  k->fparam_bytes = (fparam - kFuncParamBase + 15) / 16 * 16;

  // Code: each function after the previous, registers and labels rebased.
  std::vector<uint32_t> code_base(p.funcs.size(), 0), reg_base(p.funcs.size(), 0);
  uint32_t pc = 0, regs = 0;
  for (uint32_t f : order) {
    code_base[f] = pc;
    reg_base[f] = regs;
    pc += static_cast<uint32_t>(p.funcs[f].code.size()) + 1;  // + an implicit ret at the end
    regs += p.funcs[f].nregs;
  }
  k->nregs = regs;
  k->code.reserve(pc);
  auto fold = [&](Operand& o, uint32_t f, const Ins& ins) -> Status {
    auto rebase = [&](uint32_t r) { return r == kNoReg ? r : r + reg_base[f]; };
    switch (o.kind) {
      case Operand::kReg: o.reg = rebase(o.reg); break;
      case Operand::kLabel: o.reg += code_base[f]; break;
      case Operand::kVec:
        for (int i = 0; i < o.n; ++i) o.regs[i] = rebase(o.regs[i]);
        break;
      case Operand::kMem: o.reg = rebase(o.reg); [[fallthrough]];
      case Operand::kSym: {
        const uint32_t sidx = o.kind == Operand::kMem ? o.sym : o.reg;
        if (sidx == kNoSym) break;
        const Sym& s = p.syms[sidx];
        if (s.var >= 0) {
          // Module .global/.const: the address is known at launch (var_addrs).
          if (o.kind == Operand::kMem)
            o.sym = static_cast<uint32_t>(s.var);
          else
            o.reg = static_cast<uint32_t>(s.var) | 0x80000000u;
          break;
        }
        auto it = offset.find(sidx);
        if (it == offset.end())
          return InvalidArgument("PTX line " + std::to_string(ins.line) + ": symbol " + s.name +
                                 " is not in reach of kernel " + k->name);
        if (o.kind == Operand::kMem) {
          o.imm += it->second;
          o.sym = kNoSym;
        } else {
          o.kind = Operand::kImm;
          o.imm += it->second;
          o.reg = kNoReg;
        }
        break;
      }
      default: break;
    }
    return Status::Ok();
  };
  for (uint32_t f : order) {
    for (const Ins& src : p.funcs[f].code) {
      Ins ins = src;
      if (ins.pred != kNoReg) ins.pred += reg_base[f];
      if (ins.op == Op::kCall || ins.op == Op::kVprintf || ins.op == Op::kAssertFail) {
        // Operands: [(rets)], func, [(args)] -> a CallSite.
        CallSite cs;
        const Operand* rets = nullptr;
        const Operand* args = nullptr;
        uint32_t callee = 0;
        bool seen_func = false;
        for (int i = 0; i < ins.nops; ++i) {
          const Operand& o = ins.o[i];
          if (o.kind == Operand::kFunc) {
            callee = o.reg;
            seen_func = true;
          } else if (o.kind == Operand::kList) {
            (seen_func ? args : rets) = &o;
          }
        }
        const Func& cf = p.funcs[callee];
        auto copies = [&](const Operand* list, const std::vector<uint32_t>& formals, bool to_callee,
                          std::vector<CallSite::Copy>* out) -> Status {
          const size_t n = list == nullptr ? 0 : list->n;
          if (n != formals.size() && cf.defined)
            return InvalidArgument("PTX line " + std::to_string(ins.line) + ": call to " + cf.name + " with " +
                                   std::to_string(n) + " values for " + std::to_string(formals.size()) + " parameters");
          for (size_t i = 0; i < n; ++i) {
            CallSite::Copy c;
            const uint32_t e = list->regs[i];
            const bool is_sym = (e & 0x80000000u) != 0 && e != kNoReg;
            uint64_t actual = 0;
            if (is_sym) {
              auto it = offset.find(e & 0x7fffffffu);
              if (it == offset.end())
                return InvalidArgument("PTX line " + std::to_string(ins.line) + ": call argument is not a parameter");
              actual = it->second;
            }
            const uint64_t formal = cf.defined ? offset.at(formals[i]) : 0;
            c.bytes = static_cast<uint32_t>(i < formals.size() ? p.syms[formals[i]].size : 8);
            if (to_callee) {
              c.dst = formal;
              if (is_sym)
                c.src = actual;
              else
                c.src_reg = e + reg_base[f];
            } else {
              c.src = formal;
              if (!is_sym)
                return InvalidArgument("PTX line " + std::to_string(ins.line) + ": return value into a register");
              c.dst = actual;
            }
            if (!cf.defined) {  // builtin: args are read in place
              c.dst = is_sym ? actual : 0;
            }
            out->push_back(c);
          }
          return Status::Ok();
        };
        if (Status s = copies(args, cf.params, true, &cs.args); !s.ok()) return s;
        if (Status s = copies(rets, cf.rets, false, &cs.rets); !s.ok()) return s;
        cs.entry = cf.defined ? code_base[callee] : 0;
        ins.aux = static_cast<uint32_t>(k->calls.size());
        k->calls.push_back(std::move(cs));
        ins.nops = 0;
      } else {
        for (int i = 0; i < ins.nops; ++i) {
          if (Status s = fold(ins.o[i], f, ins); !s.ok()) return s;
        }
      }
      ins.fast = FastFormOf(ins);
      ins.fast_bytes = static_cast<uint8_t>(TyBytes(ins.type));
      k->code.push_back(ins);
    }
    Ins ret;
    ret.op = Op::kRet;
    ret.line = p.funcs[f].code.empty() ? p.funcs[f].line : p.funcs[f].code.back().line;
    k->code.push_back(ret);
  }
  k->read_before_known = ReadBeforeWritten(*k, &k->read_before);
  return std::shared_ptr<const Kernel>(std::move(k));
}

// A forward "definitely written" analysis over each thread's paths (PTX registers are undefined
// until written; the executor clears those some path reads first, so a kernel that reads one gets
// the same value every run). An unpredicated instruction writes its destinations whole (Block::Set
// stores all 64 bits); a predicated one writes nothing for sure; stores, barriers (bar.red's
// destination is written when the barrier opens) and control transfers write none, and every
// other register operand counts as a read.
bool ReadBeforeWritten(const Kernel& k, std::vector<uint32_t>* regs) {
  const auto n = static_cast<uint32_t>(k.code.size());
  const uint32_t words = (k.nregs + 63) / 64;
  regs->clear();
  if (words == 0 || n == 0) return true;                        // no registers: none to clear
  if (uint64_t{n} * words > (uint64_t{1} << 22)) return false;  // 32 MiB of bit sets at most
  // How many leading operands an unpredicated `ins` writes whole (its destinations: d, or d|p when
  // o[0].n is 1 — setp, shfl, match; a vector destination's every register), or 0.
  auto destinations = [&](const Ins& ins) -> int {
    if (ins.pred != kNoReg || ins.nops == 0) return 0;
    switch (ins.op) {
      case Op::kSt:
      case Op::kRed:
      case Op::kBar:
      case Op::kBarRed:  // its destination is written when the barrier opens
      case Op::kBarArrive:
      case Op::kBarWarp:
      case Op::kBra:
      case Op::kCall:
      case Op::kRet:
      case Op::kExit:
      case Op::kTrap:
      case Op::kBrkpt:
      case Op::kMembar:
      case Op::kNanosleep:
      case Op::kPrefetch:
      case Op::kSust:
      case Op::kCpAsync:
      case Op::kVprintf:
      case Op::kAssertFail:
      case Op::kNop: return 0;
      default: break;
    }
    const Operand& d = ins.o[0];
    if (d.kind != Operand::kReg && d.kind != Operand::kVec) return 0;
    const bool pair = d.kind == Operand::kReg && d.n == 1 && ins.nops > 1 && ins.o[1].kind == Operand::kReg;
    return pair ? 2 : 1;
  };
  auto written = [&](const Ins& ins, auto&& f) {
    const int dsts = destinations(ins);
    for (int i = 0; i < dsts; ++i) {
      const Operand& o = ins.o[i];
      if (o.kind == Operand::kReg && o.reg != kNoReg) f(o.reg);
      if (o.kind == Operand::kVec)
        for (int j = 0; j < o.n && j < 8; ++j)
          if (o.regs[j] != kNoReg && (o.regs[j] & 0x80000000u) == 0) f(o.regs[j]);
    }
  };
  auto reads = [&](const Ins& ins, auto&& f) {
    if (ins.pred != kNoReg) f(ins.pred);
    const int dsts = destinations(ins);
    for (int i = 0; i < ins.nops; ++i) {
      const Operand& o = ins.o[i];
      if (i < dsts) continue;
      if ((o.kind == Operand::kReg || o.kind == Operand::kMem) && o.reg != kNoReg) f(o.reg);
      if (o.kind == Operand::kVec || o.kind == Operand::kList)
        for (int j = 0; j < o.n && j < 8; ++j)
          if (o.regs[j] != kNoReg && (o.regs[j] & 0x80000000u) == 0) f(o.regs[j]);
    }
    if (ins.op == Op::kCall && ins.aux < k.calls.size())
      for (const CallSite::Copy& c : k.calls[ins.aux].args)
        if (c.src_reg != kNoReg) f(c.src_reg);
  };
  // in[pc]: registers written on every path to pc (all ones until a path reaches it).
  std::vector<uint64_t> in(static_cast<size_t>(n) * words, ~uint64_t{0});
  std::vector<uint32_t> work;
  std::vector<bool> queued(n, false);
  auto root = [&](uint32_t pc) {
    if (pc >= n) return;
    std::fill_n(&in[static_cast<size_t>(pc) * words], words, 0);
    if (!queued[pc]) queued[pc] = true, work.push_back(pc);
  };
  root(0);
  for (const CallSite& cs : k.calls) root(cs.entry);
  std::vector<uint64_t> out(words);
  while (!work.empty()) {
    const uint32_t pc = work.back();
    work.pop_back();
    queued[pc] = false;
    const Ins& ins = k.code[pc];
    std::copy_n(&in[static_cast<size_t>(pc) * words], words, out.begin());
    written(ins, [&](uint32_t w) {
      if (w < k.nregs) out[w / 64] |= uint64_t{1} << (w % 64);
    });
    auto flow = [&](uint32_t to) {
      if (to >= n) return;
      uint64_t* dst = &in[static_cast<size_t>(to) * words];
      bool changed = false;
      for (uint32_t i = 0; i < words; ++i) {
        const uint64_t v = dst[i] & out[i];
        changed |= v != dst[i];
        dst[i] = v;
      }
      if (changed && !queued[to]) queued[to] = true, work.push_back(to);
    };
    const bool ends =
        ins.pred == kNoReg && (ins.op == Op::kBra || ins.op == Op::kRet || ins.op == Op::kExit || ins.op == Op::kTrap);
    if (ins.op == Op::kBra) flow(ins.o[0].reg);
    if (!ends) flow(pc + 1);
  }
  std::vector<bool> read(k.nregs, false);
  for (uint32_t pc = 0; pc < n; ++pc) {
    const uint64_t* before = &in[static_cast<size_t>(pc) * words];
    reads(k.code[pc], [&](uint32_t r) {
      if (r < k.nregs && !((before[r / 64] >> (r % 64)) & 1)) read[r] = true;
    });
  }
  regs->clear();
  for (uint32_t r = 0; r < k.nregs; ++r)
    if (read[r]) regs->push_back(r);
  return true;
}

Result<std::shared_ptr<const Kernel>> Program::GetKernel(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = kernels_.find(name); it != kernels_.end()) return it->second;
  if (auto it = kernel_errors_.find(name); it != kernel_errors_.end()) return Status(Code::kUnimplemented, it->second);
  auto f = func_index.find(std::string(name));
  if (f == func_index.end() || !funcs[f->second].entry || !funcs[f->second].defined)
    return NotFound("no kernel " + std::string(name) + " in the PTX");
  auto k = Lower(*this, f->second);
  if (!k.ok()) {
    kernel_errors_.emplace(std::string(name), k.status().message());
    return k.status();
  }
  kernels_.emplace(std::string(name), *k);
  return *k;
}

}  // namespace orion::ptx
