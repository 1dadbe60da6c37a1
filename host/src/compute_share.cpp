// Compute share: the per-GPU scheduler in shared memory (compute_share.h says how it schedules).
#include "orion/host/compute_share.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace orion::host {
namespace {

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Waits (at most 2 ms: a wake-up lost to a dying worker costs no more) while *word == seen.
void FutexWait(std::atomic<uint32_t>* word, uint32_t seen) {
  timespec ts{0, 2000000};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// ORION_COMPUTE_TRACE=<dir> (oriond's environment, a diagnostic): each worker writes
// <dir>/compute-<pid>.txt, a line per turn taken and ended (TraceTake, TraceLeave). Null: off.
FILE* TraceFile() {
  static FILE* f = [] {
    const char* dir = std::getenv("ORION_COMPUTE_TRACE");
    if (dir == nullptr || *dir == '\0') return static_cast<FILE*>(nullptr);
    const std::string path = std::string(dir) + "/compute-" + std::to_string(getpid()) + ".txt";
    FILE* file = std::fopen(path.c_str(), "a");
    if (file != nullptr) std::setvbuf(file, nullptr, _IOLBF, 0);  // whole lines, also if the worker _exits
    return file;
  }();
  return f;
}

// "take <ns> <slot> <ratio> <vtime> | <slot>:<ratio>:<vtime>:<waiting>:<idle µs> ..." for the other
// tenants, or "leave <ns> <slot> <used ns> <vtime after>".
void TraceTake(const ComputeGpu* gpu, int slot, uint64_t now) {
  FILE* f = TraceFile();
  if (f == nullptr) return;
  const ComputeSlot& me = gpu->slots[slot];
  std::fprintf(f, "take %llu %d %u %llu |", static_cast<unsigned long long>(now), slot, me.ratio,
               static_cast<unsigned long long>(me.vtime.load()));
  const uint32_t limit = std::min(gpu->slot_limit.load(), kComputeSlots);
  for (uint32_t i = 0; i < limit; ++i) {
    const ComputeSlot& s = gpu->slots[i];
    if (static_cast<int>(i) == slot || s.used.load() == 0) continue;
    const uint64_t idle = s.idle_since.load();
    std::fprintf(f, " %u:%u:%llu:%u:%lld", i, s.ratio, static_cast<unsigned long long>(s.vtime.load()),
                 s.waiting.load(), idle == 0 ? -1LL : static_cast<long long>((now - idle) / 1000));
  }
  std::fputc('\n', f);
}

void TraceLeave(const ComputeGpu* gpu, int slot, uint64_t now, uint64_t used) {
  FILE* f = TraceFile();
  if (f == nullptr) return;
  std::fprintf(f, "leave %llu %d %llu %llu\n", static_cast<unsigned long long>(now), slot,
               static_cast<unsigned long long>(used), static_cast<unsigned long long>(gpu->slots[slot].vtime.load()));
}

void SleepNs(uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

}  // namespace

bool ParseComputePolicy(const std::string& name, uint32_t* policy) {
  if (name == "share") {
    *policy = kPolicyShare;
  } else if (name == "cap") {
    *policy = kPolicyCap;
  } else {
    return false;
  }
  return true;
}

const char* ComputePolicyName(uint32_t policy) { return policy == kPolicyCap ? "cap" : "share"; }

uint32_t ComputeRatioSum(const ComputeGpu& g) {
  uint32_t sum = 0;
  for (const ComputeSlot& s : g.slots) {
    if (s.used.load(std::memory_order_acquire) != 0) sum += s.ratio;
  }
  return sum;
}

int TakeComputeSlot(ComputeGpu* g, uint32_t ratio, uint32_t policy, uint32_t session) {
  for (uint32_t i = 0; i < kComputeSlots; ++i) {
    ComputeSlot& s = g->slots[i];
    if (s.used.load(std::memory_order_acquire) != 0) continue;
    s.ratio = ratio;
    s.policy = policy;
    s.session = session;
    s.waiting.store(0);
    s.vtime.store(0);
    s.busy_ns.store(0);
    s.throttled_ns.store(0);
    s.turns.store(0);
    s.idle_since.store(0);
    s.cap_tokens.store(0);
    s.cap_refilled.store(0);
    s.sample_ns.store(NowNs());
    s.sample_busy_ns.store(0);
    s.util_permille.store(0);
    s.used.store(1, std::memory_order_release);
    if (g->slot_limit.load() < i + 1) g->slot_limit.store(i + 1);
    return static_cast<int>(i);
  }
  return -1;
}

void FreeComputeSlot(ComputeGpu* g, int slot) {
  if (slot < 0 || slot >= static_cast<int>(kComputeSlots)) return;
  g->slots[slot].waiting.store(0);
  g->slots[slot].used.store(0, std::memory_order_release);
  g->wake.fetch_add(1);
  FutexWakeAll(&g->wake);
}

namespace {
// Device time over wall time, in permille (at most 1000).
uint32_t Permille(uint64_t busy_ns, uint64_t wall_ns) {
  return static_cast<uint32_t>(std::min<uint64_t>(1000, busy_ns * 1000 / wall_ns));
}
}  // namespace

void MarkComputeSample(ComputeSlot* s) {
  const uint64_t now = NowNs(), busy = s->busy_ns.load();
  const uint64_t then = s->sample_ns.load(), then_busy = s->sample_busy_ns.load();
  if (now > then && busy >= then_busy) {
    s->util_permille.store(Permille(busy - then_busy, now - then));
  }
  s->sample_busy_ns.store(busy);
  s->sample_ns.store(now);
}

uint32_t ComputeUtilization(const ComputeSlot& s) {
  constexpr uint64_t kMinWindowNs = 100000000;
  const uint64_t now = NowNs(), busy = s.busy_ns.load();
  const uint64_t then = s.sample_ns.load(), then_busy = s.sample_busy_ns.load();
  // Before the first full interval there is no earlier one: measure what there is.
  const bool first = s.util_permille.load() == 0 && then_busy == 0;
  if (now > then && busy >= then_busy && (now - then >= kMinWindowNs || first)) {
    return Permille(busy - then_busy, now - then);
  }
  return s.util_permille.load();
}

void ReleaseDeadHolder(ComputeGpu* g, pid_t pid) {
  uint32_t held = static_cast<uint32_t>(pid);
  if (g->holder.compare_exchange_strong(held, 0)) {
    g->wake.fetch_add(1);
    FutexWakeAll(&g->wake);
  }
}

// Best-effort tenants share what the guaranteed ratios leave (at least 1 each).
uint64_t ComputeGate::Weight(uint64_t now) const {
  const ComputeSlot& me = gpu_->slots[slot_];
  if (me.ratio != 0) return me.ratio;
  if (weight_ != 0 && now - weight_ns_ < kWeightTtlNs) return weight_;
  uint32_t guaranteed = 0, best_effort = 0;
  const uint32_t limit = std::min(gpu_->slot_limit.load(std::memory_order_relaxed), kComputeSlots);
  for (uint32_t i = 0; i < limit; ++i) {
    const ComputeSlot& s = gpu_->slots[i];
    if (s.used.load(std::memory_order_relaxed) == 0) continue;
    if (s.ratio != 0) {
      guaranteed += s.ratio;
    } else {
      ++best_effort;
    }
  }
  const uint32_t left = guaranteed < 100 ? 100 - guaranteed : 0;
  weight_ = std::max<uint64_t>(1, left / std::max<uint32_t>(1, best_effort));
  weight_ns_ = now;
  return weight_;
}

// A cap tenant's bucket, refilled to now and less `spent`: ratio% of the wall time since the last
// refill, the sum at most `bound` so that a tenant cannot hoard while it idles. The bound applies to
// what is left after `spent`, so the tokens a long kernel earns while it runs pay for it (bounding
// first lost them: a 30% cap of 80 ms kernels got 25%). After a rest the tenant owed, the bound is
// kComputeCapRestBoundNs: a rest the machine made longer than asked (a loaded or stolen CPU) was
// not idleness, and what it earned meanwhile stays, up to that. Returns the tokens.
int64_t ComputeGate::Refill(int64_t spent, int64_t bound) {
  ComputeSlot& me = gpu_->slots[slot_];
  const uint64_t now = NowNs();
  const uint64_t last = me.cap_refilled.exchange(now, std::memory_order_acq_rel);
  const auto gained = static_cast<int64_t>(last == 0 ? 0 : (now - last) * me.ratio / 100);  // starts empty
  int64_t t = me.cap_tokens.fetch_add(gained - spent, std::memory_order_acq_rel) + gained - spent;
  if (t > bound) {
    me.cap_tokens.fetch_sub(t - bound, std::memory_order_acq_rel);
    t = bound;
  }
  return t;
}

void ComputeGate::Enter() {
  ComputeSlot& me = gpu_->slots[slot_];
  const uint64_t start = NowNs();
  uint64_t ready = start;  // when it may compete (after a cap's rest)
  if (me.policy == kPolicyCap && me.ratio != 0 && me.ratio < 100) {
    // Owing device time: rest until the bucket holds kComputeCapResumeNs again.
    if (int64_t t = Refill(); t < 0) {
      SleepNs(static_cast<uint64_t>(kComputeCapResumeNs - t) * 100 / me.ratio);
      (void)Refill(0, kComputeCapRestBoundNs);
      ready = NowNs();
    }
  }
  const auto self = static_cast<uint32_t>(getpid());
  // Back from idle: not behind the tenants that are running (their least virtual time).
  const uint32_t limit = std::min(gpu_->slot_limit.load(std::memory_order_relaxed), kComputeSlots);
  if (me.waiting.fetch_add(1) == 0 && start - me.idle_since.load(std::memory_order_relaxed) > kComputeIdleNs) {
    uint64_t floor = UINT64_MAX;
    for (uint32_t i = 0; i < limit; ++i) {
      const ComputeSlot& s = gpu_->slots[i];
      if (&s != &me && s.used.load(std::memory_order_relaxed) != 0 && s.waiting.load(std::memory_order_relaxed) != 0)
        floor = std::min(floor, s.vtime.load(std::memory_order_relaxed));
    }
    if (floor != UINT64_MAX && me.vtime.load() < floor) me.vtime.store(floor);
  }
  for (bool first = true;; first = false) {
    const uint32_t seen = gpu_->wake.load(std::memory_order_acquire);
    // Eligible: the device is free and no other waiting tenant has less virtual time (ties: the
    // lower slot).
    bool mine = gpu_->holder.load(std::memory_order_acquire) == 0;
    const uint64_t my_vtime = me.vtime.load(std::memory_order_relaxed);
    const uint64_t now = first ? ready : NowNs();
    const uint32_t lim = first ? limit : std::min(gpu_->slot_limit.load(std::memory_order_relaxed), kComputeSlots);
    for (uint32_t i = 0; mine && i < lim; ++i) {
      const ComputeSlot& s = gpu_->slots[i];
      if (&s == &me || s.used.load(std::memory_order_relaxed) == 0) continue;
      const uint64_t idle = s.idle_since.load(std::memory_order_relaxed);
      const bool competes = s.waiting.load(std::memory_order_relaxed) != 0 ||
                            (idle != 0 && now - idle < kComputeAnticipateNs && s.policy != kPolicyCap);
      if (!competes) continue;
      const uint64_t v = s.vtime.load(std::memory_order_relaxed);
      mine = v > my_vtime || (v == my_vtime && static_cast<int>(i) > slot_);
    }
    uint32_t free = 0;
    if (mine && gpu_->holder.compare_exchange_strong(free, self, std::memory_order_acq_rel)) {
      entered_ns_ = first ? ready : NowNs();  // taken at once: no second clock read
      TraceTake(gpu_, slot_, entered_ns_);
      break;
    }
    // Counted before the wait (seq_cst, against Leave's bump of `wake` then read of `sleepers`):
    // either Leave sees this sleeper and wakes it, or the futex sees `wake` moved and returns.
    gpu_->sleepers.fetch_add(1);
    FutexWait(&gpu_->wake, seen);
    gpu_->sleepers.fetch_sub(1);
  }
  me.throttled_ns.fetch_add(entered_ns_ - start, std::memory_order_relaxed);
}

bool ComputeGate::Contended() const {
  const ComputeSlot& me = gpu_->slots[slot_];
  if (me.waiting.load(std::memory_order_relaxed) > 1) return true;  // this worker's own turn counts 1
  const uint32_t limit = std::min(gpu_->slot_limit.load(std::memory_order_relaxed), kComputeSlots);
  for (uint32_t i = 0; i < limit; ++i) {
    const ComputeSlot& s = gpu_->slots[i];
    if (&s != &me && s.used.load(std::memory_order_relaxed) != 0 && s.waiting.load(std::memory_order_relaxed) != 0)
      return true;
  }
  return false;
}

void ComputeGate::Leave() {
  ComputeSlot& me = gpu_->slots[slot_];
  const uint64_t now = NowNs();
  const uint64_t used = now - entered_ns_;
  me.busy_ns.fetch_add(used, std::memory_order_relaxed);
  me.turns.fetch_add(1, std::memory_order_relaxed);
  me.vtime.fetch_add(used * 100 / Weight(now), std::memory_order_relaxed);
  TraceLeave(gpu_, slot_, now, used);
  me.idle_since.store(now, std::memory_order_relaxed);
  me.waiting.fetch_sub(1, std::memory_order_acq_rel);
  gpu_->holder.store(0, std::memory_order_release);
  gpu_->wake.fetch_add(1);
  if (gpu_->sleepers.load() != 0) FutexWakeAll(&gpu_->wake);
  if (me.policy == kPolicyCap && me.ratio != 0 && me.ratio < 100) {
    (void)Refill(static_cast<int64_t>(used));  // a ceiling: spent
  }
}

ComputeTurns::~ComputeTurns() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  ended_.notify_all();
  if (keeper_.joinable()) keeper_.join();
  // A turn still held ends with the worker process: oriond frees the device of a dead holder.
}

ComputeTurns::Turn* ComputeTurns::Find(ComputeGate* g) {
  for (Turn& t : turns_)
    if (t.gate == g) return &t;
  return nullptr;
}

bool ComputeTurns::Holding(ComputeGate* g) {
  std::lock_guard<std::mutex> l(mu_);
  return Find(g) != nullptr;
}

void ComputeTurns::EndAll() {
  std::lock_guard<std::mutex> l(mu_);
  for (Turn& t : turns_) t.gate->Leave();
  turns_.clear();
  ended_.notify_all();
}

void ComputeTurns::BeginLaunch(ComputeGate* g, Stream s) {
  std::unique_lock<std::mutex> l(mu_);
  Turn* t = Find(g);
  if (t != nullptr && t->closing_ns != 0) {
    // The slice is over and another tenant waits: this launch belongs to a next turn, after the
    // keeper has seen this one's work finish (or given up on it).
    ended_.wait(l, [&] { return Find(g) == nullptr || stop_; });
    t = Find(g);
  }
  if (t == nullptr) {
    l.unlock();
    g->Enter();  // may wait for other tenants; only this thread makes turns of `g`
    l.lock();
    try {
      turns_.push_back(Turn{g, NowNs(), 0, 0, {}});
      if (!keeper_.joinable()) keeper_ = std::thread([this] { Keep(); });
    } catch (...) {  // no memory or no thread: this launch runs ungated
      if (!turns_.empty() && turns_.back().gate == g) turns_.pop_back();
      l.unlock();
      g->Leave();
      return;
    }
    t = &turns_.back();
    wake_.notify_all();
  }
  ++t->launching;
  for (const Stream& x : t->streams)
    if (x == s) return;
  try {
    t->streams.push_back(s);
  } catch (...) {
  }
}

void ComputeTurns::EndLaunch(ComputeGate* g) {
  std::lock_guard<std::mutex> l(mu_);
  if (Turn* t = Find(g); t != nullptr && t->launching > 0) --t->launching;
}

void ComputeTurns::Forget(void* stream) {
  std::lock_guard<std::mutex> l(mu_);
  for (Turn& t : turns_) {
    std::erase_if(t.streams, [&](const Stream& x) { return stream == nullptr || x.second == stream; });
  }
}

void ComputeTurns::Keep() {
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    if (turns_.empty()) {
      wake_.wait(l, [&] { return stop_ || !turns_.empty(); });
      continue;
    }
    const uint64_t now = NowNs();
    for (size_t i = 0; i < turns_.size();) {
      Turn& t = turns_[i];
      bool end = t.launching == 0;
      for (size_t k = 0; end && k < t.streams.size(); ++k) end = !busy_(t.streams[k]);
      if (!end && t.closing_ns == 0 && now - t.since_ns >= slice_ns_ &&
          (t.gate->Contended() || (t.gate->policy() == kPolicyCap && t.gate->ratio() != 0 && t.gate->ratio() < 100)))
        t.closing_ns = now;
      if (!end && t.closing_ns != 0 && now - t.closing_ns >= grace_ns_) end = true;
      if (end) {
        t.gate->Leave();
        turns_.erase(turns_.begin() + static_cast<std::ptrdiff_t>(i));
        ended_.notify_all();
      } else {
        ++i;
      }
    }
    wake_.wait_for(l, std::chrono::microseconds(poll_us_));
  }
}

}  // namespace orion::host
