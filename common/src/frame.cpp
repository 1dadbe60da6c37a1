#include "orion/common/frame.h"

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
bool OpWantsReply(uint16_t op) noexcept {
  return OpKnown(op) && kOps.e[op].reply == ReplyKind::kSync;
}

}  // namespace orion
