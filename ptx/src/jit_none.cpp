// ptx/src/jit_none.cpp — jit.h without LLVM (CMake found no llvm-14-dev, or ORION_PTX_JIT=OFF): no
// kernel is translated, the interpreter runs every instruction.
#include "jit.h"

namespace orion::ptx::jit {

bool Enabled() { return false; }
const Code* For(const std::shared_ptr<const Kernel>&) { return nullptr; }
void Ran(const std::shared_ptr<const Kernel>&, uint64_t) {}
void Start(const std::shared_ptr<const Kernel>&) {}
std::shared_ptr<const Code> Translate(const Kernel&, std::string* why) {
  *why = "this build has no translator (built without LLVM 14)";
  return nullptr;
}
bool Translatable(const Ins&) { return false; }

}  // namespace orion::ptx::jit
