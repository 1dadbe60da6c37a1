// ptx/src/parse.cpp — PTX text to Funcs (Parse). Opcodes are decoded by decode.cpp; a kernel is made
// one flat instruction array by lower.cpp.
//
// The accepted syntax is what NVVM (nvcc 11..13) and hand-written PTX use: module directives
// (.version .target .address_size .file .section), module variables (.global .const .shared with
// .align, arrays and initialisers), .entry/.func declarations and definitions, and bodies made of
// .reg/.local/.shared/.param declarations, nested { } scopes, labels, and instructions with guard
// predicates. Debug directives (.loc, .pragma, .section blocks) are skipped.
#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "decode.h"
#include "ir.h"

namespace orion::ptx {

int TyBytes(Ty t) {
  switch (t) {
    case Ty::kB8:
    case Ty::kU8:
    case Ty::kS8: return 1;
    case Ty::kB16:
    case Ty::kU16:
    case Ty::kS16:
    case Ty::kF16:
    case Ty::kBF16: return 2;
    case Ty::kB32:
    case Ty::kU32:
    case Ty::kS32:
    case Ty::kF32:
    case Ty::kF16x2:
    case Ty::kBF16x2: return 4;
    case Ty::kB64:
    case Ty::kU64:
    case Ty::kS64:
    case Ty::kF64: return 8;
    case Ty::kB128: return 16;
    case Ty::kPred: return 1;
    case Ty::kNone: return 0;
  }
  return 0;
}
bool TyFloat(Ty t) {
  return t == Ty::kF16 || t == Ty::kF16x2 || t == Ty::kBF16 || t == Ty::kBF16x2 || t == Ty::kF32 || t == Ty::kF64;
}
bool TySigned(Ty t) { return t == Ty::kS8 || t == Ty::kS16 || t == Ty::kS32 || t == Ty::kS64; }
const char* TyName(Ty t) {
  static const char* const kNames[] = {"none", "b8",    "b16",  "b32",    "b64", "b128", "u8",
                                       "u16",  "u32",   "u64",  "s8",     "s16", "s32",  "s64",
                                       "f16",  "f16x2", "bf16", "bf16x2", "f32", "f64",  "pred"};
  return kNames[static_cast<int>(t)];
}

const char* OpName(Op op) {
  static const char* const kNames[] = {
      "nop",      "add",        "sub",   "mul",     "mad",           "mul24",   "mad24",        "sad",
      "div",      "rem",        "abs",   "neg",     "min",           "max",     "popc",         "clz",
      "bfind",    "brev",       "bfe",   "bfi",     "prmt",          "and",     "or",           "xor",
      "not",      "cnot",       "shl",   "shr",     "shf",           "lop3",    "addc",         "subc",
      "madc",     "dp4a",       "dp2a",  "fma",     "rcp",           "sqrt",    "rsqrt",        "sin",
      "cos",      "lg2",        "ex2",   "tanh",    "copysign",      "testp",   "setp",         "set",
      "selp",     "slct",       "mov",   "cvt",     "cvta",          "ld",      "ldu",          "st",
      "prefetch", "isspacep",   "atom",  "red",     "bra",           "call",    "ret",          "exit",
      "trap",     "brkpt",      "bar",   "bar.red", "bar.arrive",    "membar",  "nanosleep",    "shfl",
      "vote",     "activemask", "match", "redux",   "bar.warp.sync", "vprintf", "__assertfail", "tex",
      "suld",     "sust",       "txq",   "suq",     "cp.async"};
  return kNames[static_cast<int>(op)];
}

namespace {

using detail::CmpOf;
using detail::Decode;
using detail::FixImmediates;
using detail::RndOf;
using detail::SplitDots;
using detail::TypeOf;

// ---- lexer ----------------------------------------------------------------------------------

struct Tok {
  enum Kind : uint8_t { kEnd, kIdent, kNum, kStr, kPunct } kind = kEnd;
  std::string_view text;
  uint32_t line = 0;
};

bool IdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '%' || c == '.';
}
bool IdentChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '$' || c == '.'; }

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}
  Tok Next() {
    Skip();
    Tok t;
    t.line = line_;
    if (i_ >= s_.size()) return t;
    const size_t b = i_;
    const char c = s_[i_];
    if (c == '"') {
      ++i_;
      while (i_ < s_.size() && s_[i_] != '"') {
        if (s_[i_] == '\n') ++line_;
        ++i_;
      }
      if (i_ < s_.size()) ++i_;
      t.kind = Tok::kStr;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      ++i_;
      while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' ||
                                ((s_[i_] == '+' || s_[i_] == '-') && (s_[i_ - 1] == 'e' || s_[i_ - 1] == 'E') &&
                                 !(s_[b] == '0' && b + 1 < s_.size() &&
                                   (s_[b + 1] == 'x' || s_[b + 1] == 'X' || s_[b + 1] == 'f' || s_[b + 1] == 'F' ||
                                    s_[b + 1] == 'd' || s_[b + 1] == 'D')))))
        ++i_;
      t.kind = Tok::kNum;
    } else if (IdentStart(c)) {
      ++i_;
      while (i_ < s_.size()) {
        if (c == '.' && s_[i_] == '.') {
          break;  // a directive ends at the next '.': ".reg.b16" (cuda_fp16's inline asm) is ".reg" ".b16"
        } else if (IdentChar(s_[i_])) {
          ++i_;
        } else if (s_[i_] == ':' && i_ + 2 < s_.size() && s_[i_ + 1] == ':' && IdentChar(s_[i_ + 2])) {
          i_ += 2;  // .shared::cta, .L2::128B
        } else {
          break;
        }
      }
      t.kind = Tok::kIdent;
    } else {
      ++i_;
      t.kind = Tok::kPunct;
    }
    t.text = s_.substr(b, i_ - b);
    return t;
  }

 private:
  void Skip() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\n') {
        ++line_;
        ++i_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++i_;
      } else if (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '/') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '*') {
        i_ += 2;
        while (i_ + 1 < s_.size() && !(s_[i_] == '*' && s_[i_ + 1] == '/')) {
          if (s_[i_] == '\n') ++line_;
          ++i_;
        }
        i_ += 2;
      } else {
        break;
      }
    }
  }
  std::string_view s_;
  size_t i_ = 0;
  uint32_t line_ = 1;
};

std::optional<uint32_t> SpecialOf(std::string_view n) {
  static const std::pair<const char*, uint32_t> kRegs[] = {{"%tid.x", kTidX},
                                                           {"%tid.y", kTidY},
                                                           {"%tid.z", kTidZ},
                                                           {"%ntid.x", kNtidX},
                                                           {"%ntid.y", kNtidY},
                                                           {"%ntid.z", kNtidZ},
                                                           {"%ctaid.x", kCtaidX},
                                                           {"%ctaid.y", kCtaidY},
                                                           {"%ctaid.z", kCtaidZ},
                                                           {"%nctaid.x", kNctaidX},
                                                           {"%nctaid.y", kNctaidY},
                                                           {"%nctaid.z", kNctaidZ},
                                                           {"%laneid", kLaneid},
                                                           {"%warpid", kWarpid},
                                                           {"%nwarpid", kNwarpid},
                                                           {"%smid", kSmid},
                                                           {"%nsmid", kNsmid},
                                                           {"%gridid", kGridid},
                                                           {"%clock", kClock},
                                                           {"%clock64", kClock64},
                                                           {"%globaltimer", kGlobaltimer},
                                                           {"%lanemask_eq", kLanemaskEq},
                                                           {"%lanemask_lt", kLanemaskLt},
                                                           {"%lanemask_le", kLanemaskLe},
                                                           {"%lanemask_gt", kLanemaskGt},
                                                           {"%lanemask_ge", kLanemaskGe},
                                                           {"%dynamic_smem_size", kDynSmem},
                                                           {"%total_smem_size", kTotalSmem},
                                                           {"%cluster_ctarank", kClusterCtarank},
                                                           {"%cluster_nctarank", kClusterNctarank},
                                                           {"%is_explicit_cluster", kIsExplicitCluster}};
  for (const auto& [name, id] : kRegs)
    if (n == name) return id;
  if (n.starts_with("%envreg")) {
    uint32_t k = 0;
    for (char c : n.substr(7)) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
      k = k * 10 + static_cast<uint32_t>(c - '0');
    }
    if (k < 32) return kEnvreg0 + k;
  }
  return std::nullopt;
}

// ---- parser ---------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::string_view text) : lx_(text) { Advance(); }

  Result<std::shared_ptr<Program>> Run() {
    p_ = std::make_shared<Program>();
    while (t_.kind != Tok::kEnd) {
      if (Status s = TopLevel(); !s.ok()) return s;
    }
    return p_;
  }

 private:
  // -- token helpers --
  void Advance() { t_ = lx_.Next(); }
  bool Is(std::string_view s) const { return t_.kind != Tok::kEnd && t_.text == s; }
  bool Accept(std::string_view s) {
    if (!Is(s)) return false;
    Advance();
    return true;
  }
  Status Error(const std::string& what) const {
    return InvalidArgument("PTX line " + std::to_string(t_.line) + ": " + what +
                           (t_.kind == Tok::kEnd ? " (at end of text)" : " (at '" + std::string(t_.text) + "')"));
  }
  Status Expect(std::string_view s) {
    if (Accept(s)) return Status::Ok();
    return Error("expected '" + std::string(s) + "'");
  }
  Result<std::string_view> Ident() {
    if (t_.kind != Tok::kIdent) return Error("expected a name");
    std::string_view s = t_.text;
    Advance();
    return s;
  }
  Result<uint64_t> Integer() {
    bool neg = Accept("-");
    if (t_.kind != Tok::kNum) return Error("expected a number");
    auto v = ParseInt(t_.text);
    if (!v) return Error("bad integer");
    Advance();
    return neg ? ~*v + 1 : *v;
  }
  static std::optional<uint64_t> ParseInt(std::string_view s) {
    if (!s.empty() && (s.back() == 'U' || s.back() == 'u')) s.remove_suffix(1);
    if (s.empty()) return std::nullopt;
    int base = 10;
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
      base = 16;
      s.remove_prefix(2);
    } else if (s.size() > 2 && s[0] == '0' && (s[1] == 'b' || s[1] == 'B')) {
      base = 2;
      s.remove_prefix(2);
    } else if (s.size() > 1 && s[0] == '0') {
      base = 8;
      s.remove_prefix(1);
    }
    uint64_t v = 0;
    for (char c : s) {
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        return std::nullopt;
      if (d >= base) return std::nullopt;
      v = v * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    }
    return v;
  }
  // A numeric literal as an immediate operand.
  static std::optional<Operand> NumberOperand(std::string_view s, bool neg) {
    Operand o;
    o.kind = Operand::kImm;
    if (s.size() == 10 && s[0] == '0' && (s[1] == 'f' || s[1] == 'F')) {
      auto v = ParseInt(std::string("0x") + std::string(s.substr(2)));
      if (!v) return std::nullopt;
      o.imm = *v ^ (neg ? 0x80000000u : 0);
      o.imm_kind = 1;
      return o;
    }
    if (s.size() == 18 && s[0] == '0' && (s[1] == 'd' || s[1] == 'D')) {
      auto v = ParseInt(std::string("0x") + std::string(s.substr(2)));
      if (!v) return std::nullopt;
      o.imm = *v ^ (neg ? 0x8000000000000000ull : 0);
      o.imm_kind = 2;
      return o;
    }
    const bool is_float = s.find_first_of(".eE") != std::string_view::npos &&
                          !(s.size() > 1 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'));
    if (is_float) {
      double d = std::strtod(std::string(s).c_str(), nullptr);
      if (neg) d = -d;
      std::memcpy(&o.imm, &d, 8);
      o.imm_kind = 3;
      return o;
    }
    auto v = ParseInt(s);
    if (!v) return std::nullopt;
    o.imm = neg ? ~*v + 1 : *v;
    return o;
  }

  // Skips to the matching '}' of a '{' just consumed.
  void SkipBlock() {
    int depth = 1;
    while (t_.kind != Tok::kEnd && depth > 0) {
      if (Is("{")) ++depth;
      if (Is("}")) --depth;
      Advance();
    }
  }
  void SkipStatement() {
    while (t_.kind != Tok::kEnd && !Is(";")) Advance();
    Accept(";");
  }

  // -- module level --
  Status TopLevel() {
    if (Is(".version") || Is(".target") || Is(".address_size") || Is(".file")) {
      const uint32_t line = t_.line;
      while (t_.kind != Tok::kEnd && t_.line == line) Advance();  // one line each
      return Status::Ok();
    }
    if (Accept(".section")) {
      while (t_.kind != Tok::kEnd && !Is("{")) Advance();
      if (Accept("{")) SkipBlock();
      return Status::Ok();
    }
    if (Accept(".pragma")) {
      SkipStatement();
      return Status::Ok();
    }
    bool is_extern = false;
    bool is_weak = false;
    for (;;) {
      if (Accept(".visible") || Accept(".common")) continue;
      if (Accept(".weak")) {
        is_weak = true;
        continue;
      }
      if (Accept(".extern")) {
        is_extern = true;
        continue;
      }
      break;
    }
    (void)is_weak;
    if (Is(".entry") || Is(".func")) return Function(is_extern);
    if (Is(".global") || Is(".const") || Is(".shared") || Is(".local")) return Variable(-1, is_extern);
    return Error("unexpected module-level token");
  }

  // [.align N] [.vN] .type name[[N]]... [= init];   (the state space token is current)
  struct Decl {
    Space space = Space::kGlobal;
    uint32_t align = 0;
    uint32_t vec = 1;
    Ty type = Ty::kNone;
    std::string_view name;
    uint64_t count = 1;
    bool unsized = false;
    bool ptr = false;
  };
  Result<Decl> Declarator() {
    Decl d;
    if (Accept(".global"))
      d.space = Space::kGlobal;
    else if (Accept(".const"))
      d.space = Space::kConst;
    else if (Accept(".shared"))
      d.space = Space::kShared;
    else if (Accept(".local"))
      d.space = Space::kLocal;
    else if (Accept(".param"))
      d.space = Space::kParam;
    else
      return Error("expected a state space");
    for (;;) {
      if (Accept(".align")) {
        auto a = Integer();
        if (!a.ok()) return a.status();
        // `.param .u64 .ptr .global .align 1 p`: after .ptr, .align is the pointee's alignment.
        if (!d.ptr) d.align = static_cast<uint32_t>(*a);
      } else if (Accept(".v2")) {
        d.vec = 2;
      } else if (Accept(".v4")) {
        d.vec = 4;
      } else if (Accept(".ptr")) {
        d.ptr = true;
      } else if (Is(".global") || Is(".const") || Is(".shared") || Is(".local")) {
        Advance();  // .param .u64 .ptr .global .align 1 name
      } else if (t_.kind == Tok::kIdent && t_.text.size() > 1 && t_.text[0] == '.' && TypeOf(t_.text.substr(1))) {
        d.type = *TypeOf(t_.text.substr(1));
        Advance();
      } else {
        break;
      }
    }
    if (d.type == Ty::kNone) return Error("declaration without a type");
    auto name = Ident();
    if (!name.ok()) return name.status();
    d.name = *name;
    while (Accept("[")) {
      if (Accept("]")) {
        d.unsized = true;
        continue;
      }
      auto n = Integer();
      if (!n.ok()) return n.status();
      if (Status s = Expect("]"); !s.ok()) return s;
      d.count *= *n;
    }
    return d;
  }
  uint64_t DeclBytes(const Decl& d) const {
    return d.unsized ? 0 : static_cast<uint64_t>(TyBytes(d.type)) * d.vec * d.count;
  }

  Status Variable(int32_t func, bool is_extern) {
    auto d = Declarator();
    if (!d.ok()) return d.status();
    Sym s;
    s.name = std::string(d->name);
    s.space = d->space;
    s.size = DeclBytes(*d);
    if (s.size > (uint64_t{1} << 32)) return Error("variable larger than 4 GiB");
    s.align = d->align != 0 ? d->align : static_cast<uint32_t>(TyBytes(d->type) * d->vec);
    s.func = func;
    s.extern_shared = d->space == Space::kShared && (is_extern || d->unsized);
    if (Accept("=")) {
      if (Status st = Initializer(*d, &s.init); !st.ok()) return st;
      if (d->unsized) s.size = s.init.size();  // `x[] = {...}`: sized by its initialiser (as fatbin.cpp)
    }
    if (Status st = Expect(";"); !st.ok()) return st;
    if (is_extern && !s.extern_shared) return Status::Ok();  // defined in another module
    const uint32_t idx = static_cast<uint32_t>(p_->syms.size());
    if (func < 0 && (s.space == Space::kGlobal || s.space == Space::kConst)) {
      s.var = static_cast<int32_t>(p_->vars.size());
      p_->vars.push_back({s.name, s.size, s.init});
    }
    if (func < 0) {
      p_->module_syms[s.name] = idx;
    } else {
      scopes_.back()[s.name] = Name{Name::kSym, idx};
      p_->funcs[static_cast<size_t>(func)].syms.push_back(idx);
    }
    p_->syms.push_back(std::move(s));
    return Status::Ok();
  }

  Status Initializer(const Decl& d, std::vector<uint8_t>* out) {
    const int elem = TyBytes(d.type);
    auto one = [&]() -> Status {
      bool neg = Accept("-");
      if (t_.kind != Tok::kNum) return Error("unsupported initialiser (only numeric constants are)");
      auto o = NumberOperand(t_.text, neg);
      if (!o) return Error("bad number in initialiser");
      Advance();
      uint64_t bits = o->imm;
      if (d.type == Ty::kF32 && o->imm_kind >= 2) {
        double v;
        std::memcpy(&v, &bits, 8);
        float f = static_cast<float>(v);
        uint32_t b32;
        std::memcpy(&b32, &f, 4);
        bits = b32;
      } else if (d.type == Ty::kF64 && o->imm_kind == 1) {
        float f;
        uint32_t b32 = static_cast<uint32_t>(bits);
        std::memcpy(&f, &b32, 4);
        double v = f;
        std::memcpy(&bits, &v, 8);
      }
      for (int i = 0; i < elem; ++i) out->push_back(static_cast<uint8_t>(bits >> (8 * i)));
      return Status::Ok();
    };
    std::function<Status()> list = [&]() -> Status {
      if (Accept("{")) {
        if (Accept("}")) return Status::Ok();
        do {
          if (Status s = list(); !s.ok()) return s;
        } while (Accept(","));
        return Expect("}");
      }
      return one();
    };
    if (Status s = list(); !s.ok()) return s;
    if (out->size() > DeclBytes(d) && !d.unsized) out->resize(DeclBytes(d));
    return Status::Ok();
  }

  // ( .param .type name, ... )
  Status ParamList(uint32_t fidx, std::vector<uint32_t>* out, bool entry) {
    if (Status s = Expect("("); !s.ok()) return s;
    uint64_t offset = 0;
    if (!Accept(")")) {
      do {
        if (!Is(".param") && !Is(".reg")) return Error("expected .param");
        const bool is_reg = Is(".reg");
        if (is_reg) return Error(".reg parameters are not supported");
        auto d = Declarator();
        if (!d.ok()) return d.status();
        Sym s;
        s.name = std::string(d->name);
        s.space = Space::kParam;
        s.size = DeclBytes(*d);
        s.align = d->align != 0 ? d->align : static_cast<uint32_t>(TyBytes(d->type) * d->vec);
        if (s.align == 0) s.align = 1;
        s.func = static_cast<int32_t>(fidx);
        if (entry) {  // kernel parameters: their offset in the parameter buffer (PTX ABI)
          offset = (offset + s.align - 1) / s.align * s.align;
          s.init.resize(8);
          std::memcpy(s.init.data(), &offset, 8);
          offset += s.size;
        }
        const uint32_t idx = static_cast<uint32_t>(p_->syms.size());
        p_->syms.push_back(std::move(s));
        out->push_back(idx);
      } while (Accept(","));
      if (Status s = Expect(")"); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status Function(bool is_extern) {
    const bool entry = Is(".entry");
    const uint32_t line = t_.line;
    Advance();
    Func f;
    f.entry = entry;
    f.line = line;
    const uint32_t fidx = static_cast<uint32_t>(p_->funcs.size());
    std::vector<uint32_t> rets;
    if (!entry && Is("(")) {
      if (Status s = ParamList(fidx, &rets, false); !s.ok()) return s;
    }
    auto name = Ident();
    if (!name.ok()) return name.status();
    f.name = std::string(*name);
    std::vector<uint32_t> params;
    if (Is("(")) {
      if (Status s = ParamList(fidx, &params, entry); !s.ok()) return s;
    }
    // Performance directives until the body or ';'. .maxntid/.reqntid bound the block size.
    uint64_t max_threads = 0;
    while (t_.kind != Tok::kEnd && !Is("{") && !Is(";")) {
      if (Accept(".maxntid") || Accept(".reqntid")) {
        uint64_t n = 1;
        do {
          auto v = Integer();
          if (!v.ok()) return v.status();
          n *= std::max<uint64_t>(*v, 1);
        } while (Accept(","));
        max_threads = max_threads == 0 ? n : std::min(max_threads, n);
        continue;
      }
      Advance();
    }
    auto existing = p_->func_index.find(f.name);
    uint32_t idx = fidx;
    if (existing != p_->func_index.end()) {
      idx = existing->second;  // a declaration earlier, the definition now (or a repeat)
    } else {
      p_->func_index[f.name] = fidx;
      p_->funcs.push_back(std::move(f));
    }
    Func& fn = p_->funcs[idx];
    if (Accept(";")) {
      if (fn.params.empty()) fn.params = params;
      if (fn.rets.empty()) fn.rets = rets;
      return Status::Ok();
    }
    (void)is_extern;
    if (fn.defined) return Error("function " + fn.name + " defined twice");
    fn.params = params;
    fn.rets = rets;
    fn.max_threads = max_threads;
    for (uint32_t s : params) p_->syms[s].func = static_cast<int32_t>(idx);
    for (uint32_t s : rets) p_->syms[s].func = static_cast<int32_t>(idx);
    fn.defined = true;
    fn.entry = entry;
    if (Status s = Expect("{"); !s.ok()) return s;
    func_ = idx;
    scopes_.clear();
    scopes_.emplace_back();
    for (uint32_t s : params) scopes_.back()[p_->syms[s].name] = Name{Name::kSym, s};
    for (uint32_t s : rets) scopes_.back()[p_->syms[s].name] = Name{Name::kSym, s};
    labels_.clear();
    fixups_.clear();
    unsupported_.clear();
    if (Status s = Body(); !s.ok()) return s;
    for (const auto& [ins, slot, label, line2] : fixups_) {
      auto it = labels_.find(label);
      if (it == labels_.end())
        return InvalidArgument("PTX line " + std::to_string(line2) + ": undefined label " + label);
      fn.code[ins].o[slot].reg = it->second;
    }
    if (!unsupported_.empty()) unsupported_by_func_[idx] = unsupported_;
    return Status::Ok();
  }

  // -- function bodies --
  struct Name {
    enum Kind : uint8_t { kReg, kSym } kind;
    uint32_t index;
  };

  Status Body() {
    int depth = 1;
    while (depth > 0) {
      if (t_.kind == Tok::kEnd) return Error("unterminated function body");
      if (Accept("{")) {
        ++depth;
        scopes_.emplace_back();
        continue;
      }
      if (Accept("}")) {
        --depth;
        scopes_.pop_back();
        continue;
      }
      if (Is(".reg")) {
        if (Status s = RegDecl(); !s.ok()) return s;
        continue;
      }
      if (Is(".local") || Is(".shared") || Is(".param") || Is(".const") || Is(".global")) {
        if (Is(".param")) {
          if (Status s = Variable(static_cast<int32_t>(func_), false); !s.ok()) return s;
        } else {
          if (Status s = Variable(static_cast<int32_t>(func_), false); !s.ok()) return s;
        }
        continue;
      }
      if (Accept(".extern")) {
        if (Status s = Variable(static_cast<int32_t>(func_), true); !s.ok()) return s;
        continue;
      }
      if (Is(".pragma") || Is(".loc") || Is(".maxnreg") || Is(".maxntid") || Is(".reqntid") || Is(".minnctapersm")) {
        if (Is(".loc")) {
          const uint32_t line = t_.line;
          while (t_.kind != Tok::kEnd && t_.line == line && !Is(";")) Advance();
          Accept(";");
        } else {
          SkipStatement();
        }
        continue;
      }
      if (t_.kind == Tok::kIdent && t_.text[0] != '.') {
        // label?
        Tok save = t_;
        Lexer lx_save = lx_;
        Advance();
        if (Accept(":")) {
          labels_[std::string(save.text)] = static_cast<uint32_t>(p_->funcs[func_].code.size());
          continue;
        }
        t_ = save;
        lx_ = lx_save;
      }
      if (Status s = Instruction(); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status RegDecl() {
    Advance();  // .reg
    uint32_t vec = 1;
    if (Accept(".v2"))
      vec = 2;
    else if (Accept(".v4"))
      vec = 4;
    if (t_.kind != Tok::kIdent || t_.text[0] != '.' || !TypeOf(t_.text.substr(1)))
      return Error("expected a register type");
    const bool pred = *TypeOf(t_.text.substr(1)) == Ty::kPred;
    Advance();
    if (vec != 1) return Error("vector registers are not supported");
    Func& f = p_->funcs[func_];
    do {
      auto name = Ident();
      if (!name.ok()) return name.status();
      if (Accept("<")) {
        auto n = Integer();
        if (!n.ok()) return n.status();
        if (Status s = Expect(">"); !s.ok()) return s;
        if (*n > 1000000) return Error("too many registers");
        for (uint64_t i = 0; i < *n; ++i) {
          if (pred) pred_regs_.insert({func_, f.nregs});
          scopes_.back()[std::string(*name) + std::to_string(i)] = Name{Name::kReg, f.nregs++};
        }
      } else {
        if (pred) pred_regs_.insert({func_, f.nregs});
        scopes_.back()[std::string(*name)] = Name{Name::kReg, f.nregs++};
      }
    } while (Accept(","));
    return Expect(";");
  }

  const Name* Lookup(std::string_view n) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(std::string(n));
      if (f != it->end()) return &f->second;
    }
    return nullptr;
  }

  // One operand. `label_ok`: a bare name may be a label (branch target).
  Status ParseOperand(Operand* o, bool label_ok, uint32_t ins_index, uint32_t slot) {
    if (Accept("!")) {
      if (Status s = ParseOperand(o, false, ins_index, slot); !s.ok()) return s;
      o->neg = true;
      return Status::Ok();
    }
    if (Accept("[")) {
      o->kind = Operand::kMem;
      if (t_.kind == Tok::kIdent) {
        auto n = Ident();
        const Name* nm = Lookup(*n);
        if (nm != nullptr && nm->kind == Name::kReg) {
          o->reg = nm->index;
        } else if (nm != nullptr) {
          o->sym = nm->index;
        } else if (auto m = p_->module_syms.find(std::string(*n)); m != p_->module_syms.end()) {
          o->sym = m->second;
        } else {
          return Error("unknown name " + std::string(*n));
        }
      } else {
        auto v = Integer();
        if (!v.ok()) return v.status();
        o->imm = *v;
      }
      while (Is("+") || Is("-")) {
        const bool minus = Is("-");
        Advance();
        auto v = Integer();
        if (!v.ok()) return v.status();
        o->imm += minus ? ~*v + 1 : *v;
      }
      return Expect("]");
    }
    if (Accept("{") || Is("(")) {
      const bool paren = Accept("(");
      o->kind = paren ? Operand::kList : Operand::kVec;
      const char* close = paren ? ")" : "}";
      if (!Accept(close)) {
        do {
          if (o->n >= 8) return Error("too many vector elements");
          if (Accept("_")) {
            o->regs[o->n++] = kNoReg;
            continue;
          }
          auto n = Ident();
          if (!n.ok()) return n.status();
          const Name* nm = Lookup(*n);
          if (nm == nullptr) return Error("unknown name " + std::string(*n));
          // In a call list, entries are param symbols (kSym) or registers; mark symbols.
          o->regs[o->n++] = nm->kind == Name::kReg ? nm->index : (nm->index | 0x80000000u);
        } while (Accept(","));
        if (Status s = Expect(close); !s.ok()) return s;
      }
      return Status::Ok();
    }
    if (Is("-") || t_.kind == Tok::kNum) {
      const bool neg = Accept("-");
      if (t_.kind != Tok::kNum) return Error("expected a number");
      auto v = NumberOperand(t_.text, neg);
      if (!v) return Error("bad number");
      Advance();
      *o = *v;
      return Status::Ok();
    }
    if (Accept("_")) {
      o->kind = Operand::kSink;
      return Status::Ok();
    }
    if (t_.kind != Tok::kIdent) return Error("expected an operand");
    std::string_view n = t_.text;
    Advance();
    if (auto sp = SpecialOf(n)) {
      o->kind = Operand::kSpecial;
      o->reg = *sp;
      return Status::Ok();
    }
    if (n == "WARP_SZ" && Lookup(n) == nullptr) {
      // PTX ISA 9.0, "Predefined Identifiers": WARP_SZ is the warp size as a constant (nvcc
      // emits it for warpSize).
      o->kind = Operand::kImm;
      o->imm = 32;
      return Status::Ok();
    }
    if (const Name* nm = Lookup(n)) {
      if (nm->kind == Name::kReg) {
        o->kind = Operand::kReg;
        o->reg = nm->index;
      } else {
        o->kind = Operand::kSym;
        o->reg = nm->index;
      }
    } else if (auto m = p_->module_syms.find(std::string(n)); m != p_->module_syms.end()) {
      o->kind = Operand::kSym;
      o->reg = m->second;
    } else if (auto f = p_->func_index.find(std::string(n)); f != p_->func_index.end()) {
      o->kind = Operand::kFunc;
      o->reg = f->second;
    } else if (label_ok) {
      o->kind = Operand::kLabel;
      fixups_.push_back({ins_index, slot, std::string(n), t_.line});
    } else {
      return Error("unknown name " + std::string(n));
    }
    if (Accept("+")) {  // sym+imm as a value (address arithmetic)
      auto v = Integer();
      if (!v.ok()) return v.status();
      o->imm = *v;
    }
    return Status::Ok();
  }

  Status Instruction() {
    Ins ins;
    ins.line = t_.line;
    if (Accept("@")) {
      ins.pred_neg = Accept("!");
      auto n = Ident();
      if (!n.ok()) return n.status();
      const Name* nm = Lookup(*n);
      if (nm == nullptr || nm->kind != Name::kReg) return Error("guard is not a predicate register");
      ins.pred = nm->index;
    }
    if (t_.kind != Tok::kIdent) return Error("expected an instruction");
    const std::string opcode(t_.text);
    Advance();
    Func& f = p_->funcs[func_];
    const uint32_t index = static_cast<uint32_t>(f.code.size());
    std::string why;
    const bool known = Decode(opcode, &ins, &why);
    if (known && IsImageOp(ins.op)) return ImageInstruction(ins, opcode, index);
    const bool is_call = ins.op == Op::kCall;
    // Operands.
    if (!Is(";")) {
      do {
        if (ins.nops >= 6) return Error("too many operands");
        const bool label_ok = ins.op == Op::kBra || is_call || !known;
        Operand& o = ins.o[ins.nops];
        if (Status s = ParseOperand(&o, label_ok, index, ins.nops); !s.ok()) {
          if (known) return s;
          SkipStatement();
          unsupported_.push_back({opcode, ins.line});
          f.code.push_back(Ins{});
          return Status::Ok();
        }
        ++ins.nops;
        if (Accept("|")) {  // setp's second destination: p|q
          if (ins.nops >= 6) return Error("too many operands");
          if (Status s = ParseOperand(&ins.o[ins.nops], false, index, ins.nops); !s.ok()) return s;
          ins.o[ins.nops - 1].n = 1;  // mark: a second destination follows
          ++ins.nops;
        }
      } while (Accept(","));
    }
    if (Status s = Expect(";"); !s.ok()) return s;
    if (!known) {
      unsupported_.push_back({opcode + (why.empty() ? "" : " (" + why + ")"), ins.line});
      f.code.push_back(Ins{});
      return Status::Ok();
    }
    FixImmediates(&ins);
    if (ins.op == Op::kCpAsync) {
      // [dst], [src], cp-size {, src-size | ignore-src} {, cache-policy}
      const int args = ins.nops - ((ins.sub & kCpAsyncCacheHint) != 0 ? 1 : 0);
      if (args < 3 || args > 4 || ins.o[0].kind != Operand::kMem || ins.o[1].kind != Operand::kMem ||
          ins.o[2].kind != Operand::kImm || (ins.o[2].imm != 4 && ins.o[2].imm != 8 && ins.o[2].imm != 16))
        return Error("cp.async: expected [dst], [src], cp-size (4, 8 or 16){, src-size | ignore-src}");
      if (args == 4 && ins.o[3].kind == Operand::kReg && pred_regs_.count({func_, ins.o[3].reg}) != 0)
        ins.sub |= kCpAsyncIgnoreSrc;
    }
    if (is_call) {
      // call[.uni] [(rets),] func, [(args)]: builtins become their own ops.
      const Operand* fn = nullptr;
      for (int i = 0; i < ins.nops; ++i)
        if (ins.o[i].kind == Operand::kFunc) fn = &ins.o[i];
      if (fn == nullptr) {
        unsupported_.push_back({"call through a register (indirect call)", ins.line});
        f.code.push_back(Ins{});
        return Status::Ok();
      }
      const std::string& callee = p_->funcs[fn->reg].name;
      if (!p_->funcs[fn->reg].defined) {
        if (callee == "vprintf")
          ins.op = Op::kVprintf;
        else if (callee == "__assertfail")
          ins.op = Op::kAssertFail;
      }
    }
    f.code.push_back(ins);
    return Status::Ok();
  }

  static bool IsImageOp(Op op) {
    return op == Op::kTex || op == Op::kSuld || op == Op::kSust || op == Op::kTxq || op == Op::kSuq;
  }

  // The operands of tex / suld / sust / txq / suq (the opcode is decoded):
  //   tex.geom.v4.dtype.ctype  d, [a, c];     suld.b.geom{.vec}.dtype.mode  d, [a, c];
  //   sust.b.geom{.vec}.ctype.mode  [a, c], s;     txq.query.b32 / suq.query.b32  d, [a];
  // `a` is the texture / surface object: a .u64 register, or a .param variable holding it (unified
  // mode; .texref / .surfref variables are not supported). `c` is a vector of coordinate registers
  // (`{x}`, `{x, y}`, `{x, y, z, _}`; a lone register for 1d). Laid out as: tex/suld: o[0] d, o[1] a,
  // o[2] c; sust: o[0] a, o[1] c, o[2] s; txq/suq: o[0] d, o[1] a.
  Status ImageInstruction(Ins ins, const std::string& opcode, uint32_t index) {
    Func& f = p_->funcs[func_];
    auto refuse = [&](const std::string& what) {
      SkipStatement();
      unsupported_.push_back({opcode + " (" + what + ")", ins.line});
      f.code.push_back(Ins{});
      return Status::Ok();
    };
    const bool query = ins.op == Op::kTxq || ins.op == Op::kSuq;
    if (ins.op == Op::kSust) {
      if (Status s = ImageOperand(&ins.o[0], &ins.o[1], true); !s.ok()) return s;
      if (Status s = Expect(","); !s.ok()) return s;
      if (Status s = ParseOperand(&ins.o[2], false, index, 2); !s.ok()) return s;
    } else {
      if (Status s = ParseOperand(&ins.o[0], false, index, 0); !s.ok()) return s;
      if (Is("|")) return refuse("predicate destination");
      if (Status s = Expect(","); !s.ok()) return s;
      if (Status s = ImageOperand(&ins.o[1], &ins.o[2], !query); !s.ok()) return s;
    }
    ins.nops = query ? 2 : 3;
    if (Is(",")) return refuse("offset, depth-compare or level-of-detail operands");
    if (Status s = Expect(";"); !s.ok()) return s;
    // Shapes: coordinates for every dimension; as many data registers as the vector width.
    if (!query) {
      const Operand& c = ins.o[ins.op == Op::kSust ? 1 : 2];
      const int coords = ins.geom + (ins.layer == kGeomArray || ins.layer == kGeomArrayCube ? 1 : 0);
      if (c.n < coords)
        return InvalidArgument("PTX line " + std::to_string(ins.line) + ": " + opcode + " needs " +
                               std::to_string(coords) + " coordinates");
      for (int i = 0; i < coords; ++i)
        if (c.regs[i] == kNoReg)
          return InvalidArgument("PTX line " + std::to_string(ins.line) + ": " + opcode + " coordinate " +
                                 std::to_string(i) + " is '_'");
    }
    const Operand& data = ins.o[ins.op == Op::kSust ? 2 : 0];
    const int want = ins.op == Op::kTex ? 4 : query ? 1 : ins.vec;
    const bool ok =
        data.kind == Operand::kVec
            ? (data.n >= 1 && data.n <= want && (ins.op == Op::kTex || data.n == want))
            : (want == 1 || ins.op == Op::kTex) && (data.kind == Operand::kReg || data.kind == Operand::kSink ||
                                                    (ins.op == Op::kSust && data.kind == Operand::kImm));
    if (!ok)
      return InvalidArgument("PTX line " + std::to_string(ins.line) + ": " + opcode + " has " +
                             (data.kind == Operand::kVec ? std::to_string(data.n) : std::string("one")) +
                             " data operands for a vector of " + std::to_string(want));
    f.code.push_back(ins);
    return Status::Ok();
  }

  // `[a, c]` (or `[a]` without coordinates): the handle into `handle`, the coordinates into `coords`.
  Status ImageOperand(Operand* handle, Operand* coords, bool want_coords) {
    if (Status s = Expect("["); !s.ok()) return s;
    auto n = Ident();
    if (!n.ok()) return n.status();
    const Name* nm = Lookup(*n);
    if (nm != nullptr && nm->kind == Name::kReg) {
      handle->kind = Operand::kReg;
      handle->reg = nm->index;
    } else if (nm != nullptr && p_->syms[nm->index].space == Space::kParam) {
      handle->kind = Operand::kMem;  // the handle is read from the parameter
      handle->sym = nm->index;
    } else {
      return Error("texture/surface operand " + std::string(*n) +
                   " is neither a .u64 register nor a .param (.texref/.surfref variables are not supported)");
    }
    if (want_coords) {
      if (Status s = Expect(","); !s.ok()) return s;
      coords->kind = Operand::kVec;
      auto one = [&]() -> Status {
        if (coords->n >= 4) return Error("too many coordinates");
        if (Accept("_")) {
          coords->regs[coords->n++] = kNoReg;
          return Status::Ok();
        }
        auto r = Ident();
        if (!r.ok()) return r.status();
        const Name* rn = Lookup(*r);
        if (rn == nullptr || rn->kind != Name::kReg) return Error("texture/surface coordinates must be registers");
        coords->regs[coords->n++] = rn->index;
        return Status::Ok();
      };
      if (Accept("{")) {
        do {
          if (Status s = one(); !s.ok()) return s;
        } while (Accept(","));
        if (Status s = Expect("}"); !s.ok()) return s;
      } else if (Status s = one(); !s.ok()) {
        return s;
      }
    }
    return Expect("]");
  }

  Lexer lx_;
  Tok t_;
  std::shared_ptr<Program> p_;
  uint32_t func_ = 0;
  std::set<std::pair<uint32_t, uint32_t>> pred_regs_;  // (function, register) declared .pred
  std::vector<std::unordered_map<std::string, Name>> scopes_;
  std::unordered_map<std::string, uint32_t> labels_;
  struct Fixup {
    uint32_t ins;
    uint32_t slot;
    std::string label;
    uint32_t line;
  };
  std::vector<Fixup> fixups_;
  struct Unsupported {
    std::string what;
    uint32_t line;
  };
  std::vector<Unsupported> unsupported_;

 public:
  std::map<uint32_t, std::vector<Unsupported>> unsupported_by_func_;
};

}  // namespace

Result<std::shared_ptr<Program>> Parse(std::string_view text) {
  Parser parser(text);
  auto p = parser.Run();
  if (!p.ok()) return p.status();
  for (const auto& [f, list] : parser.unsupported_by_func_)
    (*p)->unsupported[f] = {list.front().what, list.front().line};
  return *p;
}

const std::vector<ModuleVar>& Vars(const Program& p) { return p.vars; }

bool HasKernel(const Program& p, std::string_view name) {
  auto it = p.func_index.find(std::string(name));
  return it != p.func_index.end() && p.funcs[it->second].entry && p.funcs[it->second].defined;
}

uint32_t PtxIsaVersion(std::string_view text) {
  Lexer lex(text);
  for (Tok t = lex.Next(); t.kind != Tok::kEnd; t = lex.Next()) {
    if (t.kind != Tok::kIdent || t.text != ".version") continue;
    const Tok v = lex.Next();
    if (v.kind != Tok::kNum) return 0;
    const size_t dot = v.text.find('.');
    if (dot == std::string_view::npos || dot == 0 || dot > 4 || v.text.size() - dot - 1 == 0 ||
        v.text.size() - dot - 1 > 4)
      return 0;
    uint32_t major = 0, minor = 0;
    for (char c : v.text.substr(0, dot)) {
      if (c < '0' || c > '9') return 0;
      major = major * 10 + static_cast<uint32_t>(c - '0');
    }
    for (char c : v.text.substr(dot + 1)) {
      if (c < '0' || c > '9') return 0;
      minor = minor * 10 + static_cast<uint32_t>(c - '0');
    }
    return major * 100 + minor;
  }
  return 0;
}

uint32_t MaxPtxIsaVersion(int driver_version) {
  const int major = driver_version / 1000, minor = (driver_version % 1000) / 10;
  if (major >= 13) return static_cast<uint32_t>((major - 4) * 100 + minor);  // 13.0: 9.0, 13.1: 9.1
  if (major == 12) {
    // 12.0..12.5: 8.0..8.5; 12.6: 8.5; 12.7: 8.6; 12.8: 8.7; 12.9: 8.8.
    static const uint32_t kIsa[10] = {800, 801, 802, 803, 804, 805, 805, 806, 807, 808};
    return kIsa[std::min(minor, 9)];
  }
  return 700 + static_cast<uint32_t>(std::max(0, minor));  // CUDA 11.x: PTX 7.x
}

}  // namespace orion::ptx
