// ptx/src/decode.cpp — opcode text to Ins fields (decode.h), per the PTX ISA's instruction
// descriptions (the section of each family is named where it matters).
#include "decode.h"

#include <cstring>
#include <iterator>

namespace orion::ptx::detail {

std::optional<Ty> TypeOf(std::string_view m) {
  static const std::pair<const char*, Ty> kTypes[] = {
      {"b8", Ty::kB8},     {"b16", Ty::kB16},       {"b32", Ty::kB32}, {"b64", Ty::kB64}, {"b128", Ty::kB128},
      {"u8", Ty::kU8},     {"u16", Ty::kU16},       {"u32", Ty::kU32}, {"u64", Ty::kU64}, {"s8", Ty::kS8},
      {"s16", Ty::kS16},   {"s32", Ty::kS32},       {"s64", Ty::kS64}, {"f16", Ty::kF16}, {"f16x2", Ty::kF16x2},
      {"bf16", Ty::kBF16}, {"bf16x2", Ty::kBF16x2}, {"f32", Ty::kF32}, {"f64", Ty::kF64}, {"pred", Ty::kPred}};
  for (const auto& [n, t] : kTypes)
    if (m == n) return t;
  return std::nullopt;
}

std::optional<Cmp> CmpOf(std::string_view m) {
  static const char* const kNames[] = {"eq", "ne",  "lt",  "le",  "gt",  "ge",  "lo",  "ls",  "hi",
                                       "hs", "equ", "neu", "ltu", "leu", "gtu", "geu", "num", "nan"};
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (m == kNames[i]) return static_cast<Cmp>(i);
  return std::nullopt;
}

std::optional<Rnd> RndOf(std::string_view m) {
  static const char* const kNames[] = {"", "rn", "rz", "rm", "rp", "rna", "rni", "rzi", "rmi", "rpi"};
  for (size_t i = 1; i < std::size(kNames); ++i)
    if (m == kNames[i]) return static_cast<Rnd>(i);
  return std::nullopt;
}

std::vector<std::string_view> SplitDots(std::string_view s) {
  std::vector<std::string_view> parts;
  size_t b = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    if (i == s.size() || s[i] == '.') {
      parts.push_back(s.substr(b, i - b));
      b = i + 1;
    }
  }
  return parts;
}

// tex / suld / sust / txq / suq opcodes -> Ins fields; false (with `why`) for the forms the
// executor refuses: tex.level / tex.grad / tex.base (mipmaps), tld4 (gather), multisample
// geometries and cube surfaces, formatted surface access (suld.p / sust.p), sured, f16 results.
bool DecodeImage(const std::vector<std::string_view>& parts, Ins* ins, std::string* why) {
  const std::string_view base = parts[0];
  if (base == "tld4") {
    *why = "texture gather";
    return false;
  }
  if (base == "sured") {
    *why = "surface reduction";
    return false;
  }
  ins->op = base == "tex"    ? Op::kTex
            : base == "suld" ? Op::kSuld
            : base == "sust" ? Op::kSust
            : base == "txq"  ? Op::kTxq
                             : Op::kSuq;
  const bool surface = ins->op == Op::kSuld || ins->op == Op::kSust;
  const bool query = ins->op == Op::kTxq || ins->op == Op::kSuq;
  bool seen_b = false, seen_query = false;
  int types = 0;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view m = parts[i];
    if (!query && (m == "1d" || m == "2d" || m == "3d")) {
      ins->geom = static_cast<uint8_t>(m[0] - '0');
      continue;
    }
    if (!query && (m == "a1d" || m == "a2d")) {  // PTX ISA "Texture Geometries": {layer, x[, y, _]}
      ins->geom = static_cast<uint8_t>(m[1] - '0');
      ins->layer = kGeomArray;
      continue;
    }
    if (!query && ins->op == Op::kTex && (m == "cube" || m == "acube")) {  // {x, y, z, _} / {layer, x, y, z}
      ins->geom = 3;
      ins->layer = m == "cube" ? kGeomCube : kGeomArrayCube;
      continue;
    }
    if (m == "a1d" || m == "a2d" || m == "cube" || m == "acube" || m == "2dms" || m == "a2dms") {
      *why = "." + std::string(m) + " geometry (multisample textures and cube surfaces are not supported)";
      return false;
    }
    if (ins->op == Op::kTex && (m == "level" || m == "grad" || m == "base")) {
      *why = "mipmapped fetch tex." + std::string(m);
      return false;
    }
    if (!query && m == "v2") {
      ins->vec = 2;
      continue;
    }
    if (!query && m == "v4") {
      ins->vec = 4;
      continue;
    }
    if (surface && m == "b") {
      seen_b = true;
      continue;
    }
    if (surface && m == "p") {
      *why = "formatted surface access (." + std::string(parts[0]) + ".p)";
      return false;
    }
    if (surface && m == "trap") {
      ins->oob = kOobTrap;
      continue;
    }
    if (surface && m == "clamp") {
      ins->oob = kOobClamp;
      continue;
    }
    if (surface && m == "zero") {
      ins->oob = kOobZero;
      continue;
    }
    if (surface && (m == "ca" || m == "cg" || m == "cs" || m == "cv" || m == "wb" || m == "wt")) continue;
    if (query && !seen_query && (m == "width" || m == "height" || m == "depth")) {
      ins->oob = m == "width" ? 0 : m == "height" ? 1 : 2;
      seen_query = true;
      continue;
    }
    if (auto t = TypeOf(m)) {
      if (types == 0)
        ins->type = *t;
      else
        ins->type2 = *t;
      ++types;
      continue;
    }
    *why = "modifier ." + std::string(m);
    return false;
  }
  if (ins->op == Op::kTex) {
    if (ins->geom == 0 || types != 2 || ins->vec != 4) {
      *why = "expected tex.{1d,2d,3d}.v4.dtype.ctype";
      return false;
    }
    if (ins->type != Ty::kF32 && ins->type != Ty::kS32 && ins->type != Ty::kU32) {
      *why = std::string(".") + TyName(ins->type) + " results";
      return false;
    }
    if (ins->type2 != Ty::kF32 && ins->type2 != Ty::kS32) {
      *why = "coordinates must be .f32 or .s32";
      return false;
    }
    if ((ins->layer == kGeomCube || ins->layer == kGeomArrayCube) && ins->type2 != Ty::kF32) {
      *why = "cube coordinates must be .f32";
      return false;
    }
    return true;
  }
  if (surface) {
    if (!seen_b || ins->geom == 0 || types != 1) {
      *why = "expected " + std::string(base) + ".b.{1d,2d,3d}{.v2,.v4}.b{8,16,32,64}.mode";
      return false;
    }
    if (ins->type != Ty::kB8 && ins->type != Ty::kB16 && ins->type != Ty::kB32 && ins->type != Ty::kB64) {
      *why = std::string(".") + TyName(ins->type) + " data";
      return false;
    }
    return true;
  }
  if (!seen_query || types != 1 || ins->type != Ty::kB32) {
    *why = "only " + std::string(base) + ".{width,height,depth}.b32 are supported";
    return false;
  }
  return true;
}

// Converts float immediates to the float width of the operand they stand for.
void FixImmediates(Ins* ins) {
  for (int i = 0; i < ins->nops; ++i) {
    Operand& o = ins->o[i];
    if (o.kind != Operand::kImm || o.imm_kind == 0) continue;
    Ty t = ins->type;
    if (ins->op == Op::kCvt || ins->op == Op::kSet) t = ins->type2;
    if (ins->op == Op::kSlct && i == 3) t = ins->type2;
    if (t == Ty::kF32 && o.imm_kind != 1) {
      double d;
      std::memcpy(&d, &o.imm, 8);
      float fl = static_cast<float>(d);
      uint32_t b;
      std::memcpy(&b, &fl, 4);
      o.imm = b;
      o.imm_kind = 1;
    } else if (t == Ty::kF64 && o.imm_kind == 1) {
      float fl;
      uint32_t b = static_cast<uint32_t>(o.imm);
      std::memcpy(&fl, &b, 4);
      double d = fl;
      std::memcpy(&o.imm, &d, 8);
      o.imm_kind = 2;
    }
  }
}

// cp.async (PTX ISA 9.0, "Data Movement and Conversion Instructions: cp.async"): the executor
// copies when the instruction issues, which is one order the PTX memory model allows (the data is
// only guaranteed in shared memory after the wait), so commit_group / wait_group / wait_all have
// nothing left to wait for. Bulk (TMA) and mbarrier-completed forms are refused.
bool DecodeCpAsync(const std::vector<std::string_view>& parts, Ins* ins, std::string* why) {
  *why = "";
  if (parts.size() < 3 || parts[1] != "async") return false;
  if (parts.size() == 3 && (parts[2] == "commit_group" || parts[2] == "wait_group" || parts[2] == "wait_all")) {
    ins->op = Op::kMembar;  // every copy is complete already
    return true;
  }
  if (parts[2] == "bulk") {
    *why = "bulk copies (TMA)";
    return false;
  }
  if (parts[2] == "mbarrier") {
    *why = "completion through an mbarrier";
    return false;
  }
  if (parts.size() < 5 || (parts[2] != "ca" && parts[2] != "cg") ||
      (parts[3] != "shared" && parts[3] != "shared::cta") || parts[4] != "global")
    return false;
  for (size_t i = 5; i < parts.size(); ++i) {
    if (parts[i] == "L2::cache_hint") {
      ins->sub |= kCpAsyncCacheHint;
    } else if (parts[i] != "L2::64B" && parts[i] != "L2::128B" && parts[i] != "L2::256B") {
      return false;
    }
  }
  ins->op = Op::kCpAsync;
  ins->space = Space::kShared;
  return true;
}

// The modifiers that mean the same on every instruction that takes them: a state space, a flag,
// a vector width, or nothing the executor needs to act on (ordering and scope qualifiers: it runs
// one thread at a time in program order, which every memory-model qualifier allows; cache
// operators and hints). Looked up after the type and rounding modifiers, before an op's own.
struct Modifier {
  std::string_view name;
  void (*apply)(Ins*);
};
const Modifier* CommonModifier(std::string_view m) {
  static constexpr auto kNothing = [](Ins*) {};
  static const Modifier kModifiers[] = {
      {"global", [](Ins* i) { i->space = Space::kGlobal; }},
      {"local", [](Ins* i) { i->space = Space::kLocal; }},
      {"const", [](Ins* i) { i->space = Space::kConst; }},
      {"ftz", [](Ins* i) { i->ftz = true; }},
      {"sat", [](Ins* i) { i->sat = true; }},
      {"satfinite", [](Ins* i) { i->sat = true; }},
      {"approx", [](Ins* i) { i->approx = true; }},
      {"relu", [](Ins* i) { i->relu = true; }},
      {"cc", [](Ins* i) { i->cc = true; }},
      {"to", [](Ins* i) { i->to = true; }},
      {"uni", [](Ins* i) { i->uni = true; }},
      {"wrap", [](Ins* i) { i->wrap = true; }},
      {"clamp", [](Ins* i) { i->wrap = false; }},
      {"v2", [](Ins* i) { i->vec = 2; }},
      {"v4", [](Ins* i) { i->vec = 4; }},
      {"v8", [](Ins* i) { i->vec = 8; }},
      {"full", kNothing},
      {"sync", kNothing},
      {"aligned", kNothing},
      {"volatile", kNothing},
      {"relaxed", kNothing},
      {"acquire", kNothing},
      {"release", kNothing},
      {"acq_rel", kNothing},
      {"sc", kNothing},
      {"weak", kNothing},
      {"cta", kNothing},
      {"gpu", kNothing},
      {"sys", kNothing},
      {"cluster", kNothing},
      {"gl", kNothing},
      {"ca", kNothing},
      {"cg", kNothing},
      {"cs", kNothing},
      {"lu", kNothing},
      {"cv", kNothing},
      {"wb", kNothing},
      {"wt", kNothing},
      {"nc", kNothing},
      {"noftz", kNothing},
      {"mmio", kNothing},
      {"L1", kNothing},
      {"L2", kNothing},
      {"proxy", kNothing},
      {"async", kNothing},
      {"b8x16", kNothing},
      {"NaN", kNothing},
      {"xorsign", kNothing},
      {"abs", kNothing},
  };
  for (const Modifier& mod : kModifiers) {
    if (mod.name == m) return &mod;
  }
  return nullptr;
}

// The modifiers one op family gives its own meaning (PTX ISA 9.0, each instruction's syntax). They
// are looked up before the common ones: in `vote.sync.uni` the word is the vote's mode, in
// `bra.uni` a hint.
enum class Family : uint8_t {
  kNone,
  kBar,
  kSetp,
  kMul,
  kAtom,
  kShfl,
  kVote,
  kMatch,
  kRedux,
  kBfind,
  kShf,
  kPrmt,
  kTestp
};
Family FamilyOf(Op op) {
  switch (op) {
    case Op::kBar:
    case Op::kBarRed: return Family::kBar;
    case Op::kSetp:
    case Op::kSet: return Family::kSetp;
    case Op::kMul:
    case Op::kMad:
    case Op::kMul24:
    case Op::kMad24:
    case Op::kMadc: return Family::kMul;
    case Op::kAtom:
    case Op::kRed: return Family::kAtom;
    case Op::kShfl: return Family::kShfl;
    case Op::kVote: return Family::kVote;
    case Op::kMatch: return Family::kMatch;
    case Op::kRedux: return Family::kRedux;
    case Op::kBfind: return Family::kBfind;
    case Op::kShf: return Family::kShf;
    case Op::kPrmt: return Family::kPrmt;
    case Op::kTestp: return Family::kTestp;
    default: return Family::kNone;
  }
}
struct FamilyModifier {
  enum Field : uint8_t { kSub, kMul, kBoolOp, kOp };  // the Ins field it sets
  Family family;
  std::string_view name;
  Field field;
  uint16_t value;
  void Apply(Ins* ins) const {
    switch (field) {
      case kSub: ins->sub = static_cast<uint8_t>(value); break;
      case kMul: ins->mul = static_cast<MulMode>(value); break;
      case kBoolOp: ins->boolop = static_cast<BoolOp>(value); break;
      case kOp: ins->op = static_cast<Op>(value); break;
    }
  }
};
template <typename E>
constexpr uint16_t V(E e) {
  return static_cast<uint16_t>(e);
}
const FamilyModifier* FamilyModifierOf(Op op, std::string_view m) {
  using F = FamilyModifier;
  static constexpr FamilyModifier kModifiers[] = {
      {Family::kBar, "red", F::kOp, V(Op::kBarRed)},
      {Family::kBar, "arrive", F::kOp, V(Op::kBarArrive)},
      {Family::kBar, "warp", F::kOp, V(Op::kBarWarp)},
      {Family::kBar, "popc", F::kSub, 0},  // bar.red's operation
      {Family::kBar, "and", F::kSub, 1},
      {Family::kBar, "or", F::kSub, 2},
      {Family::kSetp, "and", F::kBoolOp, V(BoolOp::kAnd)},
      {Family::kSetp, "or", F::kBoolOp, V(BoolOp::kOr)},
      {Family::kSetp, "xor", F::kBoolOp, V(BoolOp::kXor)},
      {Family::kMul, "lo", F::kMul, V(MulMode::kLo)},
      {Family::kMul, "hi", F::kMul, V(MulMode::kHi)},
      {Family::kMul, "wide", F::kMul, V(MulMode::kWide)},
      {Family::kAtom, "add", F::kSub, V(AtomOp::kAdd)},
      {Family::kAtom, "inc", F::kSub, V(AtomOp::kInc)},
      {Family::kAtom, "dec", F::kSub, V(AtomOp::kDec)},
      {Family::kAtom, "min", F::kSub, V(AtomOp::kMin)},
      {Family::kAtom, "max", F::kSub, V(AtomOp::kMax)},
      {Family::kAtom, "and", F::kSub, V(AtomOp::kAnd)},
      {Family::kAtom, "or", F::kSub, V(AtomOp::kOr)},
      {Family::kAtom, "xor", F::kSub, V(AtomOp::kXor)},
      {Family::kAtom, "exch", F::kSub, V(AtomOp::kExch)},
      {Family::kAtom, "cas", F::kSub, V(AtomOp::kCas)},
      {Family::kShfl, "up", F::kSub, V(ShflMode::kUp)},
      {Family::kShfl, "down", F::kSub, V(ShflMode::kDown)},
      {Family::kShfl, "bfly", F::kSub, V(ShflMode::kBfly)},
      {Family::kShfl, "idx", F::kSub, V(ShflMode::kIdx)},
      {Family::kVote, "all", F::kSub, V(VoteMode::kAll)},
      {Family::kVote, "any", F::kSub, V(VoteMode::kAny)},
      {Family::kVote, "uni", F::kSub, V(VoteMode::kUni)},
      {Family::kVote, "ballot", F::kSub, V(VoteMode::kBallot)},
      {Family::kMatch, "any", F::kSub, 0},
      {Family::kMatch, "all", F::kSub, 1},
      {Family::kRedux, "add", F::kSub, 0},
      {Family::kRedux, "min", F::kSub, 1},
      {Family::kRedux, "max", F::kSub, 2},
      {Family::kRedux, "and", F::kSub, 3},
      {Family::kRedux, "or", F::kSub, 4},
      {Family::kRedux, "xor", F::kSub, 5},
      {Family::kBfind, "shiftamt", F::kSub, 1},
      {Family::kShf, "l", F::kSub, 0},
      {Family::kShf, "r", F::kSub, 1},
      {Family::kPrmt, "f4e", F::kSub, 1},  // prmt's mode (0: the default, a generic permute)
      {Family::kPrmt, "b4e", F::kSub, 2},
      {Family::kPrmt, "rc8", F::kSub, 3},
      {Family::kPrmt, "ecl", F::kSub, 4},
      {Family::kPrmt, "ecr", F::kSub, 5},
      {Family::kPrmt, "rc16", F::kSub, 6},
      {Family::kTestp, "finite", F::kSub, 0},
      {Family::kTestp, "infinite", F::kSub, 1},
      {Family::kTestp, "number", F::kSub, 2},
      {Family::kTestp, "notanumber", F::kSub, 3},
      {Family::kTestp, "normal", F::kSub, 4},
      {Family::kTestp, "subnormal", F::kSub, 5},
  };
  const Family family = FamilyOf(op);
  if (family == Family::kNone) return nullptr;
  for (const FamilyModifier& mod : kModifiers) {
    if (mod.family == family && mod.name == m) return &mod;
  }
  return nullptr;
}

// Opcode text -> Ins fields. False (with `why`) for what the executor does not implement.
bool Decode(const std::string& text, Ins* ins, std::string* why) {
  auto parts = SplitDots(text);
  const std::string_view base = parts[0];
  if (base == "cp") return DecodeCpAsync(parts, ins, why);
  if (base == "tex" || base == "tld4" || base == "suld" || base == "sust" || base == "sured" || base == "txq" ||
      base == "suq")
    return DecodeImage(parts, ins, why);
  static const std::pair<const char*, Op> kOps[] = {
      {"add", Op::kAdd},
      {"sub", Op::kSub},
      {"mul", Op::kMul},
      {"mad", Op::kMad},
      {"mul24", Op::kMul24},
      {"mad24", Op::kMad24},
      {"sad", Op::kSad},
      {"div", Op::kDiv},
      {"rem", Op::kRem},
      {"abs", Op::kAbs},
      {"neg", Op::kNeg},
      {"min", Op::kMin},
      {"max", Op::kMax},
      {"popc", Op::kPopc},
      {"clz", Op::kClz},
      {"bfind", Op::kBfind},
      {"brev", Op::kBrev},
      {"bfe", Op::kBfe},
      {"bfi", Op::kBfi},
      {"prmt", Op::kPrmt},
      {"and", Op::kAnd},
      {"or", Op::kOr},
      {"xor", Op::kXor},
      {"not", Op::kNot},
      {"cnot", Op::kCnot},
      {"shl", Op::kShl},
      {"shr", Op::kShr},
      {"shf", Op::kShf},
      {"lop3", Op::kLop3},
      {"addc", Op::kAddc},
      {"subc", Op::kSubc},
      {"madc", Op::kMadc},
      {"dp4a", Op::kDp4a},
      {"dp2a", Op::kDp2a},
      {"fma", Op::kFma},
      {"rcp", Op::kRcp},
      {"sqrt", Op::kSqrt},
      {"rsqrt", Op::kRsqrt},
      {"sin", Op::kSin},
      {"cos", Op::kCos},
      {"lg2", Op::kLg2},
      {"ex2", Op::kEx2},
      {"tanh", Op::kTanh},
      {"copysign", Op::kCopysign},
      {"testp", Op::kTestp},
      {"setp", Op::kSetp},
      {"set", Op::kSet},
      {"selp", Op::kSelp},
      {"slct", Op::kSlct},
      {"mov", Op::kMov},
      {"cvt", Op::kCvt},
      {"cvta", Op::kCvta},
      {"ld", Op::kLd},
      {"ldu", Op::kLdu},
      {"st", Op::kSt},
      {"prefetch", Op::kPrefetch},
      {"prefetchu", Op::kPrefetch},
      {"isspacep", Op::kIsspacep},
      {"atom", Op::kAtom},
      {"red", Op::kRed},
      {"bra", Op::kBra},
      {"call", Op::kCall},
      {"ret", Op::kRet},
      {"exit", Op::kExit},
      {"trap", Op::kTrap},
      {"brkpt", Op::kBrkpt},
      {"bar", Op::kBar},
      {"barrier", Op::kBar},
      {"membar", Op::kMembar},
      {"fence", Op::kMembar},
      {"nanosleep", Op::kNanosleep},
      {"shfl", Op::kShfl},
      {"vote", Op::kVote},
      {"activemask", Op::kActivemask},
      {"match", Op::kMatch},
      {"redux", Op::kRedux},
      {"discard", Op::kPrefetch},
      {"applypriority", Op::kPrefetch},
      {"createpolicy", Op::kNop},
      // Programmatic dependent launch (sm_90): grids run one after another here, so waiting for
      // the previous grid and releasing the next are already satisfied.
      {"griddepcontrol", Op::kMembar}};
  bool found = false;
  for (const auto& [n, op] : kOps) {
    if (base == n) {
      ins->op = op;
      found = true;
      break;
    }
  }
  if (!found) {
    *why = "";
    return false;
  }
  if (ins->op == Op::kNop) {
    *why = "";
    return false;
  }
  bool first_type = true;
  bool seen_cmp = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view m = parts[i];
    if (auto t = TypeOf(m)) {
      if (first_type)
        ins->type = *t;
      else
        ins->type2 = *t;
      first_type = false;
      continue;
    }
    if (auto r = RndOf(m)) {
      ins->rnd = *r;
      continue;
    }
    if (m == "shared" || m.starts_with("shared::")) {
      if (m == "shared::cluster") {
        *why = "distributed shared memory";
        return false;
      }
      ins->space = Space::kShared;
      continue;
    }
    if (m == "param" || m.starts_with("param::")) {
      ins->space = Space::kParam;
      continue;
    }
    if (const FamilyModifier* mod = FamilyModifierOf(ins->op, m)) {
      mod->Apply(ins);
      continue;
    }
    if ((ins->op == Op::kSetp || ins->op == Op::kSet) && !seen_cmp) {
      if (auto c = CmpOf(m)) {
        ins->cmp = *c;
        seen_cmp = true;
        continue;
      }
    }
    if (const Modifier* mod = CommonModifier(m)) {
      mod->apply(ins);
      continue;
    }
    if (m.starts_with("L1::") || m.starts_with("L2::")) continue;  // cache and eviction hints
    if (ins->op == Op::kSlct) continue;                            // slct.dtype.s32/f32 handled by types
    if (ins->op == Op::kMembar || ins->op == Op::kPrefetch || ins->op == Op::kIsspacep) continue;
    if (ins->op == Op::kCvta && (m == "global" || m == "shared" || m == "local" || m == "const" || m == "param"))
      continue;
    *why = "modifier ." + std::string(m);
    return false;
  }
  if ((ins->op == Op::kSetp || ins->op == Op::kSet) && !seen_cmp) {
    *why = "no comparison";
    return false;
  }
  // setp/set: one type is the comparison type (set: .dtype.stype).
  if (ins->op == Op::kSetp) ins->type2 = ins->type;
  if (ins->op == Op::kLdu) ins->op = Op::kLd;
  return true;
}

}  // namespace orion::ptx::detail
