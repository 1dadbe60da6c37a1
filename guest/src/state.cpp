#include "state.h"

#include <pthread.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace orion::guest {

State& S() noexcept {
  // Leaked: used by exit handlers. Made at the first driver call; a failure there is fatal anyway.
  static State* s = new State();  // NOLINT(bugprone-unhandled-exception-at-new)
  return *s;
}

namespace {
// The calling thread's context stack. Not a thread_local std::vector: the main thread's C++
// thread_local destructors run at exit() *before* the atexit handlers and static destructors, and
// libraries call the driver from those (cuFFT's cufftDestroy from PyTorch's plan cache pushes and
// pops contexts), which wrote into the freed vector and corrupted the heap ("corrupted
// double-linked list" at exit, issue #20). A plain pointer has no destructor; a pthread key frees
// the vector when a thread other than the main one exits (its destructor does not run at exit()).
thread_local std::vector<GuestCtx*>* t_stack = nullptr;

void FreeCtxStack(void* p) {
  t_stack = nullptr;  // a later call on this thread (another key's destructor) starts a new one
  delete static_cast<std::vector<GuestCtx*>*>(p);
}

struct Coverage {
  std::atomic<uint64_t> calls[static_cast<size_t>(Sym::kCount)]{};
  std::atomic<bool> real[static_cast<size_t>(Sym::kCount)]{};
};
Coverage& Cov() {
  static Coverage* c = new Coverage();
  return *c;
}
const char* const kSymNames[] = {
#define ORION_CUDA_SYMBOL(s) #s,
#include "cuda_api.inc"
#undef ORION_CUDA_SYMBOL
};
}  // namespace

std::vector<GuestCtx*>& CtxStack() noexcept {
  if (t_stack == nullptr) {
    static const pthread_key_t key = [] {
      pthread_key_t k{};
      (void)pthread_key_create(&k, FreeCtxStack);
      return k;
    }();
    t_stack = new std::vector<GuestCtx*>();  // NOLINT(bugprone-unhandled-exception-at-new)
    (void)pthread_setspecific(key, t_stack);
  }
  return *t_stack;
}
GuestCtx* CurrentCtx() noexcept { return t_stack == nullptr || t_stack->empty() ? nullptr : t_stack->back(); }
void SetCurrentCtx(GuestCtx* c) noexcept { ThreadContextHandle() = c == nullptr ? 0 : c->handle; }

void CoverageHit(Sym s, bool real) noexcept {
  auto i = static_cast<size_t>(s);
  Cov().calls[i].fetch_add(1, std::memory_order_relaxed);
  if (!real) return;
  if (!Cov().real[i].load(std::memory_order_relaxed)) Cov().real[i].store(true, std::memory_order_relaxed);
}

const char* SymName(Sym s) noexcept { return kSymNames[static_cast<size_t>(s)]; }

// ORION_COVERAGE=1: at exit, which entry points the program called, how often, and whether each
// is implemented (real) or answered CUDA_ERROR_NOT_SUPPORTED (stub).
__attribute__((destructor)) static void CoverageReport() {
  const char* e = std::getenv("ORION_COVERAGE");
  if (e == nullptr || *e == '\0' || std::strcmp(e, "0") == 0) return;
  size_t called = 0, real = 0;
  std::string lines;
  for (size_t i = 0; i < static_cast<size_t>(Sym::kCount); ++i) {
    uint64_t n = Cov().calls[i].load();
    if (n == 0) continue;
    ++called;
    bool r = Cov().real[i].load();
    real += r;
    lines += std::string("orion-coverage: ") + (r ? "real " : "STUB ") + kSymNames[i] + " " + std::to_string(n) + "\n";
  }
  size_t not_supported = called - real, declined = 0;
  lines += ExportTableCoverage(&called, &real, &not_supported, &declined);
  std::fprintf(stderr, "%sorion-coverage: %zu entry points called, %zu real, %zu not supported, %zu declined\n",
               lines.c_str(), called, real, not_supported, declined);
}

void Mirror::Add(const DeviceRange& r) {
  std::unique_lock l(mu_);
  if (r.kind == RangeKind::kMappedHost) {
    auto it = ranges_.upper_bound(r.base);
    if (it != ranges_.begin()) --it;
    while (it != ranges_.end() && it->first < r.base + r.bytes) {
      if (it->first + it->second.bytes > r.base && it->second.kind == RangeKind::kMappedHost)
        it = ranges_.erase(it);
      else
        ++it;
    }
  }
  ranges_[r.base] = r;
}

void Mirror::RemoveMappedHost(const void* host) {
  std::unique_lock l(mu_);
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    if (it->second.kind == RangeKind::kMappedHost && it->second.host == host)
      it = ranges_.erase(it);
    else
      ++it;
  }
}

bool Mirror::Remove(uint64_t base, DeviceRange* out) {
  std::unique_lock l(mu_);
  auto it = ranges_.find(base);
  if (it == ranges_.end()) return false;
  if (out != nullptr) *out = it->second;
  ranges_.erase(it);
  return true;
}

bool Mirror::RemoveDevice(uint64_t base, DeviceRange* out) {
  std::unique_lock l(mu_);
  auto it = ranges_.find(base);
  if (it == ranges_.end() || it->second.kind != RangeKind::kDevice) return false;
  if (out != nullptr) *out = it->second;
  ranges_.erase(it);
  return true;
}

bool Mirror::Find(uint64_t p, uint64_t bytes, DeviceRange* out) const {
  std::shared_lock l(mu_);
  auto it = ranges_.upper_bound(p);
  if (it == ranges_.begin()) return false;
  --it;
  const DeviceRange& r = it->second;
  if (p < r.base || p - r.base > r.bytes) return false;
  if (p - r.base == r.bytes && bytes != 0) return false;
  uint64_t have = r.bytes - (p - r.base);
  for (auto cur = it; have < bytes;) {  // adjoining VMM mappings
    auto next = std::next(cur);
    if (cur->second.kind != RangeKind::kVmm || next == ranges_.end() || next->second.kind != RangeKind::kVmm ||
        next->first != cur->first + cur->second.bytes)
      return false;
    have += next->second.bytes;
    cur = next;
  }
  if (out != nullptr) *out = r;
  return true;
}

void Mirror::RemoveContext(const GuestCtx* ctx) {
  std::unique_lock l(mu_);
  for (auto it = ranges_.begin(); it != ranges_.end();) {
    if (it->second.ctx == ctx)
      it = ranges_.erase(it);
    else
      ++it;
  }
}

CUresult NeedCtx() noexcept {
  if (!Client::Get().connected()) return CUDA_ERROR_NOT_INITIALIZED;
  return CurrentCtx() == nullptr ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS;
}

bool StreamId(CUstream s, uint64_t* id) noexcept {
  const auto v = reinterpret_cast<uint64_t>(s);
  if (v == 0 || v == reinterpret_cast<uint64_t>(CU_STREAM_LEGACY) ||
      v == reinterpret_cast<uint64_t>(CU_STREAM_PER_THREAD)) {
    *id = 0;  // the context's default stream (per-thread default streams share it; see README)
    return true;
  }
  if (!S().streams.Has(v)) return false;
  *id = v;
  return true;
}

bool IsRegisteredHost(const void* p, uint64_t bytes) noexcept {
  State& s = S();
  std::lock_guard<std::mutex> l(s.mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = s.registered.upper_bound(a);
  if (it == s.registered.begin()) return false;
  --it;
  const uint64_t size = it->second & kRegisteredSize;
  return a >= it->first && a - it->first <= size && bytes <= size - (a - it->first);
}

}  // namespace orion::guest
