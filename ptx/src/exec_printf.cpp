// ptx/src/exec_printf.cpp — the executor's device printf (vprintf) and assert (__assertfail), and
// reading a builtin call's arguments. Block member functions (block.h), kept apart from the hot path.
#include "block.h"

namespace orion::ptx::exec {

// A builtin's argument: the 8-byte value the caller stored in its parameter.
bool Block::BuiltinArg(Warp& w, int lane, const Ins& ins, size_t i, uint64_t* out) {
  const CallSite& cs = k_.calls[ins.aux];
  if (i >= cs.args.size()) {
    SetFault(CUDA_ERROR_LAUNCH_FAILED, "builtin called with too few arguments at " + Where(w, lane, ins));
    return false;
  }
  const CallSite::Copy& c = cs.args[i];
  if (c.src_reg != kNoReg) {
    *out = w.regs[c.src_reg * 32 + static_cast<uint32_t>(lane)];
    return true;
  }
  const uint32_t n = std::min<uint32_t>(c.bytes, 8);
  uint8_t* p = Mem(Space::kParam, c.dst, 1, w, lane, false, ins);
  if (p == nullptr || (n > 1 && Mem(Space::kParam, c.dst + n - 1, 1, w, lane, false, ins) == nullptr)) return false;
  *out = 0;
  std::memcpy(out, p, n);
  return true;
}

// A NUL-terminated string in device memory (at most `max` bytes).
bool Block::DeviceString(Warp& w, int lane, const Ins& ins, uint64_t addr, std::string* out, size_t max) {
  out->clear();
  for (size_t i = 0; i < max; ++i) {
    const uint8_t* p = Mem(Space::kGeneric, addr + i, 1, w, lane, false, ins);
    if (p == nullptr) return false;
    if (*p == 0) return true;
    out->push_back(static_cast<char>(*p));
  }
  return true;
}

// vprintf(format, args): formats on the host as the CUDA runtime does (args packed, each aligned
// to its size).
bool Block::Printf(Warp& w, int lane, const Ins& ins) {
  uint64_t fmt_addr = 0, args = 0;
  if (!BuiltinArg(w, lane, ins, 0, &fmt_addr) || !BuiltinArg(w, lane, ins, 1, &args)) return false;
  std::string fmt;
  if (!DeviceString(w, lane, ins, fmt_addr, &fmt)) return false;
  std::string out;
  uint64_t off = 0;
  auto arg = [&](uint32_t bytes, uint64_t* v) -> bool {
    off = (off + bytes - 1) / bytes * bytes;
    const uint8_t* p = Mem(Space::kGeneric, args + off, bytes, w, lane, false, ins);
    if (p == nullptr) return false;
    *v = Load(p, static_cast<int>(bytes));
    off += bytes;
    return true;
  };
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    size_t j = i + 1;
    while (j < fmt.size() && std::strchr("-+ #0123456789.*", fmt[j]) != nullptr) ++j;
    int longs = 0;
    bool half = false;
    while (j < fmt.size() && std::strchr("hlLqjzt", fmt[j]) != nullptr) {
      if (fmt[j] == 'l' || fmt[j] == 'q' || fmt[j] == 'j' || fmt[j] == 'z' || fmt[j] == 't' || fmt[j] == 'L') ++longs;
      if (fmt[j] == 'h') half = true;
      ++j;
    }
    if (j >= fmt.size()) break;
    const char conv = fmt[j];
    std::string spec = fmt.substr(i, j - i);
    if (spec.find('*') != std::string::npos) {  // width/precision from the args: not used by nvcc's printf
      spec.erase(std::remove(spec.begin(), spec.end(), '*'), spec.end());
    }
    // Strip length modifiers; we pass 64-bit values with ll.
    std::string flags;
    for (char c : spec)
      if (std::strchr("hlLqjzt", c) == nullptr) flags.push_back(c);
    char buf[512];
    uint64_t v = 0;
    switch (conv) {
      case '%': out.push_back('%'); break;
      case 'd':
      case 'i': {
        if (!arg(longs ? 8 : 4, &v)) return false;
        const long long s = longs ? static_cast<long long>(v) : static_cast<long long>(static_cast<int32_t>(v));
        std::snprintf(buf, sizeof buf, (flags + "lld").c_str(),
                      half ? static_cast<long long>(static_cast<int16_t>(s)) : s);
        out += buf;
        break;
      }
      case 'u':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!arg(longs ? 8 : 4, &v)) return false;
        if (conv == 'c') {
          std::snprintf(buf, sizeof buf, (flags + "c").c_str(), static_cast<int>(v & 0xff));
        } else {
          const unsigned long long u = longs ? v : (v & 0xffffffffu);
          std::snprintf(buf, sizeof buf, (flags + "ll" + conv).c_str(), u);
        }
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
      case 'a':
      case 'A':
        if (!arg(8, &v)) return false;
        std::snprintf(buf, sizeof buf, (flags + conv).c_str(), F64(v));
        out += buf;
        break;
      case 'p':
        if (!arg(8, &v)) return false;
        std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
        out += buf;
        break;
      case 's': {
        if (!arg(8, &v)) return false;
        std::string s;
        if (v == 0)
          s = "(null)";
        else if (!DeviceString(w, lane, ins, v, &s))
          return false;
        std::snprintf(buf, sizeof buf, (flags + "s").c_str(), s.c_str());
        out += buf;
        break;
      }
      default: out += fmt.substr(i, j - i + 1);
    }
    i = j;
  }
  if (printf_ != nullptr && printf_->size() < cfg_.printf_limit) {
    printf_->append(out, 0, std::min<size_t>(out.size(), cfg_.printf_limit - printf_->size()));
  }
  // vprintf returns the number of arguments; callers ignore it.
  const CallSite& cs = k_.calls[ins.aux];
  for (const CallSite::Copy& c : cs.rets) {
    uint8_t* p = Mem(Space::kParam, c.dst, 4, w, lane, true, ins);
    if (p == nullptr) return false;
    const uint32_t zero = 0;
    std::memcpy(p, &zero, 4);
  }
  return true;
}

// __assertfail(message, file, line, function, charSize): the device's assert message, then the
// launch ends with CUDA_ERROR_ASSERT.
void Block::Assert(Warp& w, int lane, const Ins& ins) {
  uint64_t msg = 0, file = 0, line = 0, func = 0;
  std::string m = "?", f = "?", fn = "?";
  if (BuiltinArg(w, lane, ins, 0, &msg)) (void)DeviceString(w, lane, ins, msg, &m, 1024);
  if (fault_->code != CUDA_SUCCESS) return;
  if (BuiltinArg(w, lane, ins, 1, &file)) (void)DeviceString(w, lane, ins, file, &f, 1024);
  if (fault_->code != CUDA_SUCCESS) return;
  (void)BuiltinArg(w, lane, ins, 2, &line);
  if (BuiltinArg(w, lane, ins, 3, &func)) (void)DeviceString(w, lane, ins, func, &fn, 1024);
  if (fault_->code != CUDA_SUCCESS) return;
  const uint32_t t = w.index * 32 + static_cast<uint32_t>(lane);
  const uint32_t bx = cfg_.block[0], by = cfg_.block[1];
  char buf[2048];
  std::snprintf(buf, sizeof buf, "%s:%u: %s: block: [%u,%u,%u], thread: [%u,%u,%u] Assertion `%s` failed.\n", f.c_str(),
                static_cast<unsigned>(line), fn.c_str(), ctaid_[0], ctaid_[1], ctaid_[2], t % bx, (t / bx) % by,
                t / (bx * by), m.c_str());
  if (printf_ != nullptr && printf_->size() < cfg_.printf_limit) printf_->append(buf);
  SetFault(CUDA_ERROR_ASSERT, std::string("device-side assert: ") + buf);
}

}  // namespace orion::ptx::exec
