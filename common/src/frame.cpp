#include "orion/common/frame.h"

#include <cstring>

namespace orion {
namespace {

struct OpEntry {
  const char* name;
  ReplyKind reply;
};

// Dense table indexed by op number; generated from ops.def.
constexpr uint16_t kOpTableSize = 128;
constexpr auto MakeTable() {
  struct Table { OpEntry e[kOpTableSize]{}; } t{};
#define ORION_OP(name, number, reply)                                         \
  static_assert((number) > 0 && (number) < kOpTableSize, "op number out of table");  \
  t.e[number] = OpEntry{#name, ReplyKind::reply};
#include "orion/common/ops.def"
  return t;
}
constexpr auto kOps = MakeTable();

// Duplicate op numbers are a compile error: two equal case labels.
[[maybe_unused]] constexpr bool OpNumbersUnique(uint16_t x) {
  switch (x) {
#define ORION_OP(name, number, reply) case number:
#include "orion/common/ops.def"
      return true;
    default:
      return false;
  }
}

}  // namespace

const char* OpName(uint16_t op) noexcept { return op < kOpTableSize ? kOps.e[op].name : nullptr; }
bool OpKnown(uint16_t op) noexcept { return OpName(op) != nullptr; }
bool FrameWindowRanges(uint16_t op, const uint8_t* payload, uint32_t len, WindowRanges* out) noexcept {
  *out = WindowRanges{};
  auto get = [&](auto* v) {
    if (len < sizeof(*v)) return false;
    std::memcpy(v, payload, sizeof(*v));
    return true;
  };
  switch (static_cast<Op>(op)) {
    case Op::kMemcpyHtoD: {
      MemcpyReq q;
      if (!get(&q)) return false;
      out->reads[out->nreads++] = {q.src, q.bytes};
      return true;
    }
    case Op::kMemcpyDtoH:
    case Op::kMemcpyDtoHAsync: {
      MemcpyReq q;
      if (!get(&q)) return false;
      out->writes[out->nwrites++] = {q.dst, q.bytes};
      return true;
    }
    case Op::kBlobPut: {
      BlobPutReq q;
      if (!get(&q)) return false;
      out->reads[out->nreads++] = {q.window_offset, q.bytes};
      return true;
    }
    case Op::kMemcpy2D: {
      Memcpy2DReq q;
      if (!get(&q)) return false;
      if (q.height == 0 || q.width_bytes == 0) return true;
      if (q.height > (1ull << 24) || q.src_pitch > (1ull << 40) || q.dst_pitch > (1ull << 40) ||
          q.width_bytes > (1ull << 40))
        return true;  // the session refuses it; nothing crosses
      if (q.src_side == kSideWindow) out->reads[out->nreads++] = {q.src, (q.height - 1) * q.src_pitch + q.width_bytes};
      if (q.dst_side == kSideWindow) out->writes[out->nwrites++] = {q.dst, (q.height - 1) * q.dst_pitch + q.width_bytes};
      return true;
    }
    default:
      return true;
  }
}

bool OpWantsReply(uint16_t op) noexcept {
  return OpKnown(op) && kOps.e[op].reply == ReplyKind::kSync;
}

}  // namespace orion
