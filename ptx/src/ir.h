// ptx/src/ir.h — the executor's decoded form of PTX (internal to orion_ptx).
//
// Parse (parse.cpp) turns text into Funcs of Ins whose registers are numbered per function and
// whose labels are instruction indices in that function. Lower (parse.cpp) builds a Kernel: one
// flat instruction array with the kernel first and every function it calls after it, each with
// its own register range; symbols folded to offsets in their state space. Execute (exec.cpp)
// runs a Kernel.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "orion/ptx/ptx.h"

namespace orion::ptx {

enum class Ty : uint8_t {
  kNone,
  kB8,
  kB16,
  kB32,
  kB64,
  kB128,
  kU8,
  kU16,
  kU32,
  kU64,
  kS8,
  kS16,
  kS32,
  kS64,
  kF16,
  kF16x2,
  kBF16,
  kBF16x2,
  kF32,
  kF64,
  kPred
};
int TyBytes(Ty t);
bool TyFloat(Ty t);
bool TySigned(Ty t);
const char* TyName(Ty t);

enum class Space : uint8_t { kGeneric, kGlobal, kShared, kLocal, kParam, kConst };

// Opcodes the executor implements. Modifiers live in Ins fields.
enum class Op : uint16_t {
  kNop,
  // integer / bit
  kAdd,
  kSub,
  kMul,
  kMad,
  kMul24,
  kMad24,
  kSad,
  kDiv,
  kRem,
  kAbs,
  kNeg,
  kMin,
  kMax,
  kPopc,
  kClz,
  kBfind,
  kBrev,
  kBfe,
  kBfi,
  kPrmt,
  kAnd,
  kOr,
  kXor,
  kNot,
  kCnot,
  kShl,
  kShr,
  kShf,
  kLop3,
  kAddc,
  kSubc,
  kMadc,
  kDp4a,
  kDp2a,
  // float-only
  kFma,
  kRcp,
  kSqrt,
  kRsqrt,
  kSin,
  kCos,
  kLg2,
  kEx2,
  kTanh,
  kCopysign,
  kTestp,
  // comparison / selection
  kSetp,
  kSet,
  kSelp,
  kSlct,
  // data movement / conversion
  kMov,
  kCvt,
  kCvta,
  kLd,
  kLdu,
  kSt,
  kPrefetch,
  kIsspacep,
  kAtom,
  kRed,
  // control
  kBra,
  kCall,
  kRet,
  kExit,
  kTrap,
  kBrkpt,
  kBar,
  kBarRed,
  kBarArrive,
  kMembar,
  kNanosleep,
  // warp
  kShfl,
  kVote,
  kActivemask,
  kMatch,
  kRedux,
  kBarWarp,
  // builtins (extern functions the executor provides)
  kVprintf,
  kAssertFail,
  // textures and surfaces (unified mode: the object is a 64-bit handle)
  kTex,
  kSuld,
  kSust,
  kTxq,
  kSuq,
  // cp.async (non-bulk): global -> shared, done when issued (see exec.cpp)
  kCpAsync,
};
const char* OpName(Op op);

enum class Cmp : uint8_t {
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kLo,
  kLs,
  kHi,
  kHs,
  kEqu,
  kNeu,
  kLtu,
  kLeu,
  kGtu,
  kGeu,
  kNum,
  kNan
};
enum class BoolOp : uint8_t { kNone, kAnd, kOr, kXor };
enum class Rnd : uint8_t { kDefault, kRn, kRz, kRm, kRp, kRna, kRni, kRzi, kRmi, kRpi };
enum class MulMode : uint8_t { kNone, kLo, kHi, kWide };
enum class AtomOp : uint8_t { kAdd, kInc, kDec, kMin, kMax, kAnd, kOr, kXor, kExch, kCas };
enum class ShflMode : uint8_t { kUp, kDown, kBfly, kIdx };
enum class VoteMode : uint8_t { kAll, kAny, kUni, kBallot };

// suld/sust out-of-range handling (PTX ISA: .trap, .clamp, .zero).
enum : uint8_t { kOobTrap, kOobClamp, kOobZero };

inline constexpr uint32_t kNoReg = 0xffffffffu;
inline constexpr uint32_t kNoSym = 0xffffffffu;

// Special registers (%tid.x, ...): Operand::reg holds one of these.
enum Special : uint32_t {
  kTidX,
  kTidY,
  kTidZ,
  kNtidX,
  kNtidY,
  kNtidZ,
  kCtaidX,
  kCtaidY,
  kCtaidZ,
  kNctaidX,
  kNctaidY,
  kNctaidZ,
  kLaneid,
  kWarpid,
  kNwarpid,
  kSmid,
  kNsmid,
  kGridid,
  kClock,
  kClock64,
  kGlobaltimer,
  kLanemaskEq,
  kLanemaskLt,
  kLanemaskLe,
  kLanemaskGt,
  kLanemaskGe,
  kDynSmem,
  kTotalSmem,
  kClusterCtarank,
  kClusterNctarank,
  kIsExplicitCluster,
  kEnvreg0,  // kEnvreg0 + n, n < 32
};

struct Operand {
  enum Kind : uint8_t { kNone, kReg, kImm, kSpecial, kSym, kMem, kVec, kLabel, kSink, kFunc, kList };
  Kind kind = kNone;
  bool neg = false;       // !%p
  uint8_t n = 0;          // kVec / kList: number of entries
  uint8_t imm_kind = 0;   // kImm: 0 integer, 1 0f (f32 bits), 2 0d (f64 bits), 3 decimal (f64 bits)
  uint32_t reg = kNoReg;  // kReg / kMem base register; kSpecial id; kLabel target; kFunc index; kSym symbol
  uint32_t sym = kNoSym;  // kMem: symbol the address is relative to (kNoSym: none)
  uint64_t imm = 0;       // kImm bits; kMem offset (two's complement)
  uint32_t regs[8] = {kNoReg, kNoReg, kNoReg, kNoReg, kNoReg, kNoReg, kNoReg, kNoReg};  // kVec/kList
};

// Ins::sub for kCpAsync.
inline constexpr uint8_t kCpAsyncIgnoreSrc = 1;  // the 4th operand is the ignore-src predicate
inline constexpr uint8_t kCpAsyncCacheHint = 2;  // the last operand is a cache policy (ignored)

enum : uint8_t { kGeomPlain = 0, kGeomArray = 1, kGeomCube = 2, kGeomArrayCube = 3 };

struct Ins {
  Op op = Op::kNop;
  Ty type = Ty::kNone;   // the instruction type (.s32, .f32, ...); for cvt the destination
  Ty type2 = Ty::kNone;  // cvt source type; setp/set/slct compare type
  Space space = Space::kGeneric;
  Cmp cmp = Cmp::kEq;
  BoolOp boolop = BoolOp::kNone;
  Rnd rnd = Rnd::kDefault;
  MulMode mul = MulMode::kNone;
  uint8_t sub = 0;    // AtomOp / ShflMode / VoteMode / redux op / shf mode / bar.red op
  uint8_t vec = 1;    // ld/st/mov vector width
  uint8_t geom = 0;   // tex/suld/sust: spatial coordinates (1, 2, 3; .cube and .acube: 3, a direction)
  uint8_t layer = 0;  // tex/suld/sust: kGeomPlain, kGeomArray (.a1d/.a2d: coordinate 0 is the layer),
                      // kGeomCube, kGeomArrayCube (.acube: coordinate 0 is the cube's layer)
  uint8_t oob = 0;    // suld/sust: out-of-range mode (kOobTrap...); txq/suq: the query (0 width, 1 height, 2 depth)
  bool ftz = false, sat = false, approx = false, cc = false, to = false, wrap = false, uni = false, relu = false;
  bool pred_neg = false;
  uint32_t pred = kNoReg;  // guard predicate register
  uint8_t nops = 0;
  uint8_t fast = 0;        // its FastForm (fast.h), set by Lower: 0 runs it on the general units only
  uint8_t fast_bytes = 0;  // with `fast`: TyBytes(type)
  Operand o[6];
  uint32_t line = 0;  // PTX source line
  uint32_t aux = 0;   // kCall: index into Kernel::calls
};

struct Sym {
  std::string name;
  Space space = Space::kGlobal;
  uint64_t size = 0;
  uint32_t align = 1;
  int32_t func = -1;           // declaring function, -1 for module scope
  bool extern_shared = false;  // `.extern .shared x[]`: the dynamic shared memory
  int32_t var = -1;            // index into Program::vars for module .global/.const
  std::vector<uint8_t> init;
};

struct Func {
  std::string name;
  bool entry = false;
  bool defined = false;
  uint32_t line = 0;
  std::vector<uint32_t> params;  // symbols of the formal parameters, in order
  std::vector<uint32_t> rets;    // symbols of the return parameters
  std::vector<Ins> code;
  uint32_t nregs = 0;
  std::vector<uint32_t> syms;  // symbols declared inside (shared, local, param)
  uint64_t max_threads = 0;    // .maxntid / .reqntid product (0: none declared)
};

// One call site in a lowered kernel: bytes copied into the callee's formals, and back.
struct CallSite {
  uint32_t entry = 0;  // callee's first instruction
  struct Copy {
    uint64_t dst = 0, src = 0;  // param-space offsets (src may be a register: src_reg)
    uint32_t bytes = 0;
    uint32_t src_reg = kNoReg;
    uint64_t imm = 0;
    bool is_imm = false;
  };
  std::vector<Copy> args;  // caller -> callee formal
  std::vector<Copy> rets;  // callee formal (src) -> caller symbol (dst)
};

inline constexpr uint64_t kFuncParamBase = uint64_t{1} << 32;  // param-space offsets of .func params
namespace jit {
struct Code;
}
// A kernel's native translation (jit.h), made at its first launch.
struct JitSlot {
  std::once_flag once;
  std::shared_ptr<jit::Code> code;
};

struct Kernel {
  std::string name;
  std::vector<Ins> code;
  std::vector<CallSite> calls;
  uint32_t nregs = 0;
  uint64_t shared_static = 0;  // bytes
  uint64_t local_bytes = 0;    // per thread
  uint64_t fparam_bytes = 0;   // per thread (.func parameters)
  uint32_t param_bytes = 0;    // kernel parameter buffer
  uint64_t max_threads = 0;    // from .maxntid / .reqntid (0: none)
  std::shared_ptr<JitSlot> jit = std::make_shared<JitSlot>();
  // The registers a thread may read before it wrote them (ReadBeforeWritten): a block clears these
  // when it starts. `read_before_known` false (a Kernel not from Lower): it clears every register.
  bool read_before_known = false;
  std::vector<uint32_t> read_before;
};
// The registers of `k` that some thread may read before every path to the read has written them,
// or false when the kernel is too large to tell cheaply (then: all of them).
bool ReadBeforeWritten(const Kernel& k, std::vector<uint32_t>* regs);

class Program {
 public:
  std::vector<Sym> syms;
  std::vector<Func> funcs;
  std::vector<ModuleVar> vars;
  std::unordered_map<std::string, uint32_t> func_index;
  std::unordered_map<std::string, uint32_t> module_syms;
  // Per function: the first instruction Parse could not decode (text, line). A kernel reaching
  // such a function fails to lower with that instruction named.
  std::map<uint32_t, std::pair<std::string, uint32_t>> unsupported;

  // Lowered kernels, built on first launch.
  Result<std::shared_ptr<const Kernel>> GetKernel(std::string_view name);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<const Kernel>, std::less<>> kernels_;
  std::map<std::string, std::string, std::less<>> kernel_errors_;
};

Result<std::shared_ptr<const Kernel>> Lower(const Program& p, uint32_t func);

}  // namespace orion::ptx
