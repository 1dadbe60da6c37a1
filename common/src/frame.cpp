#include "orion/common/frame.h"

#include <cstring>

namespace orion {
namespace {

struct OpEntry {
  const char* name;
  ReplyKind reply;
  OpShape shape;
  uint32_t req_bytes;  // sizeof the request struct (0: none)
};

// Dense table indexed by op number; generated from ops.def.
constexpr uint16_t kOpTableSize = 128;
constexpr auto MakeTable() {
  struct Table {
    OpEntry e[kOpTableSize]{};
  } t{};
#define ORION_OP(name, number, reply, req, shape)                                   \
  static_assert((number) > 0 && (number) < kOpTableSize, "op number out of table"); \
  t.e[number] = OpEntry{#name, ReplyKind::reply, OpShape::shape, RequestBytes<req>()};
#include "orion/common/ops.def"
  return t;
}
constexpr auto kOps = MakeTable();

// Duplicate op numbers are a compile error: two equal case labels.
[[maybe_unused]] constexpr bool OpNumbersUnique(uint16_t x) {
  switch (x) {
#define ORION_OP(name, number, ...) case number:
#include "orion/common/ops.def"
    return true;
    default: return false;
  }
}

}  // namespace

const char* OpName(uint16_t op) noexcept { return op < kOpTableSize ? kOps.e[op].name : nullptr; }
bool OpKnown(uint16_t op) noexcept { return OpName(op) != nullptr; }
bool Span2D(uint64_t height, uint64_t pitch, uint64_t row_bytes, uint64_t* span) noexcept {
  if (height == 0 || row_bytes == 0 || height > kMax2DHeight || row_bytes > kMax2DPitch || pitch > kMax2DPitch) {
    return false;
  }
  if (height > 1 && pitch < row_bytes) return false;
  uint64_t rows = 0;
  return CheckedMul(height - 1, pitch, &rows) && CheckedAdd(rows, row_bytes, span);
}

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
      uint64_t src_span = 0, dst_span = 0;
      if (!Span2D(q.height, q.src_pitch, q.width_bytes, &src_span) ||
          !Span2D(q.height, q.dst_pitch, q.width_bytes, &dst_span)) {
        return true;  // empty, or the session refuses it: nothing crosses
      }
      if (q.src_side == kSideWindow) out->reads[out->nreads++] = {q.src, src_span};
      if (q.dst_side == kSideWindow) out->writes[out->nwrites++] = {q.dst, dst_span};
      return true;
    }
    case Op::kMemcpyArray: {
      ArrayCopyReq q;
      if (!get(&q)) return false;
      uint64_t src_span = 0, dst_span = 0;
      if (q.src_side == kSideWindow && Span2D(q.height, q.src_pitch, q.width_bytes, &src_span)) {
        out->reads[out->nreads++] = {q.src, src_span};
      }
      if (q.dst_side == kSideWindow && Span2D(q.height, q.dst_pitch, q.width_bytes, &dst_span)) {
        out->writes[out->nwrites++] = {q.dst, dst_span};
      }
      return true;
    }
    default: return true;
  }
}

bool CheckRequestShape(uint16_t op, uint32_t len, std::string* why) {
  if (!OpKnown(op)) {
    *why = "unknown op " + std::to_string(op);
    return false;
  }
  const OpEntry& e = kOps.e[op];
  bool ok = len <= kMaxPayload;
  const char* expected = "";
  switch (e.shape) {
    case OpShape::kEmpty:
      ok = ok && len == 0;
      expected = "expected none";
      break;
    case OpShape::kFixed:
      ok = ok && len == e.req_bytes;
      expected = "expected exactly";
      break;
    case OpShape::kHead:
      ok = ok && len >= e.req_bytes;
      expected = "expected at least";
      break;
    case OpShape::kOwn:
      ok = false;
      expected = "not a request the session dispatches";
      break;
  }
  if (ok) return true;
  *why = "a payload of " + std::to_string(len) + " bytes, " + expected;
  if (e.shape == OpShape::kFixed || e.shape == OpShape::kHead) *why += " " + std::to_string(e.req_bytes);
  if (e.shape == OpShape::kHead) *why += " (at most " + std::to_string(kMaxPayload) + ")";
  return false;
}

bool OpWantsReply(uint16_t op) noexcept { return OpKnown(op) && kOps.e[op].reply == ReplyKind::kSync; }

}  // namespace orion
