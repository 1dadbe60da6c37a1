// Compute share (issue #21, ARCHITECTURE.md §11): a vGPU's share of its physical GPU's compute.
//
// One scheduler per physical GPU lives in memory oriond maps shared before it forks any worker, so
// the GPU's session workers schedule among themselves with no hop through oriond's parent. A tenant
// (a session, or the sessions of one hold: a process tree's share, a job) has a slot with its ratio
// (percent of the GPU, 1..100; 0: best effort) and policy:
//   - share: a guaranteed minimum; the device time tenants leave unused goes to the busy ones in
//     proportion to their weights (work-conserving);
//   - cap:   a ceiling, even on an idle GPU.
// The device runs one tenant's kernel at a time (a GPU time-slices the contexts of different
// processes the same way). When it is free, the waiting tenant with the least virtual time gets it
// (weighted fair queuing: virtual time grows by device time × 100 / weight, the weight being the
// ratio; best-effort tenants share what the guaranteed ratios leave). A tenant that comes back
// after more than kComputeIdleNs idle starts at the least virtual time of the tenants running, so
// it cannot claim the past.
// A tenant between two kernels (its next launch one round trip away) keeps its place for
// kComputeAnticipateNs. A cap tenant spends device-time tokens that refill at ratio% of wall time
// (a token bucket of kComputeCapBurstNs): when it owes time, it waits until it has kComputeCapResumeNs
// again, so it runs a few kernels back to back and then rests, rather than resting after each one
// (a device that has rested starts slower: the sim's executor by about a tenth).
// A running kernel is never preempted: one long kernel can exceed a share for its own duration.
//
// Diagnostics: with ORION_COMPUTE_TRACE=<dir> in oriond's environment each worker writes
// <dir>/compute-<pid>.txt, one line per turn taken (the other tenants' virtual times, whether they
// wait, how long ago they left the device) and ended (its device time); scripts/compute-trace
// summarises them.
//
// Memory: ComputeGpu is plain data (atomics only) at a fixed place in the shared mapping; a worker
// killed while it holds the device is cleared by oriond (Release with its pid).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace orion::host {

inline constexpr uint32_t kComputeSlots = 64;  // tenants per physical GPU
inline constexpr uint32_t kComputeGpus = 64;   // physical GPUs a daemon schedules

inline constexpr uint64_t kComputeIdleNs = 5000000;  // 5 ms without a kernel: idle
// A tenant whose kernel ended less than this ago still competes for the device (its next launch is
// one round trip away): without it, a tenant behind its share would lose the device to whoever
// waits at each of its kernels' ends, and shares would come out even.
inline constexpr uint64_t kComputeAnticipateNs = 2000000;

inline constexpr int64_t kComputeCapBurstNs = 40000000;   // a cap tenant's bucket: 40 ms of device time
inline constexpr int64_t kComputeCapResumeNs = 30000000;  // owing, it rests until it has 30 ms again
// What a rest the machine made longer than asked may leave in the bucket: the tokens of up to
// (80 - 30) ms / ratio of oversleep are kept (166 ms at 30%), not bounded to the 40 ms burst.
inline constexpr int64_t kComputeCapRestBoundNs = 2 * kComputeCapBurstNs;

enum ComputePolicy : uint32_t { kPolicyShare = 0, kPolicyCap = 1 };

struct ComputeSlot {
  std::atomic<uint32_t> used{0};  // 0: free
  uint32_t ratio = 0;             // 1..100; 0: best effort
  uint32_t policy = kPolicyShare;
  uint32_t session = 0;                   // the first session of the tenant (for the logs)
  std::atomic<uint32_t> waiting{0};       // its workers waiting for the device or running a kernel now
  std::atomic<uint64_t> idle_since{0};    // when the last of them left the device (monotonic ns)
  std::atomic<uint64_t> vtime{0};         // virtual time (ns × 100 / weight)
  std::atomic<uint64_t> busy_ns{0};       // device time its kernels used
  std::atomic<uint64_t> throttled_ns{0};  // time its workers waited for the device or a cap
  std::atomic<uint64_t> turns{0};         // times it took the device (a sim kernel; a cuda backend turn)
  // cap: device time it may still use (ns; negative: owed), refilled at ratio% of wall time.
  std::atomic<int64_t> cap_tokens{0};
  std::atomic<uint64_t> cap_refilled{0};  // when the tokens were last refilled (monotonic ns)
  // Utilization (NVML's, for this tenant): oriond samples busy_ns about once a second
  // (MarkComputeSample); a worker measures from the last sample (ComputeUtilization).
  std::atomic<uint64_t> sample_ns{0};       // when (monotonic ns)
  std::atomic<uint64_t> sample_busy_ns{0};  // busy_ns then
  std::atomic<uint32_t> util_permille{0};   // device time / wall time over the interval that ended then
};

struct ComputeGpu {
  std::atomic<uint32_t> holder{0};      // pid of the worker whose kernel runs; 0: the device is free
  std::atomic<uint32_t> wake{0};        // futex word, bumped at each release
  std::atomic<uint32_t> sleepers{0};    // workers asleep on `wake` (a release with none makes no syscall)
  std::atomic<uint32_t> slot_limit{0};  // slots [0, slot_limit) have been used: scans stop there
  ComputeSlot slots[kComputeSlots];
};

// Parses a policy name ("share", "cap"); false for any other.
bool ParseComputePolicy(const std::string& name, uint32_t* policy);
const char* ComputePolicyName(uint32_t policy);

// oriond's side (its main loop only).
// The sum of the ratios of the GPU's tenants (share and cap alike: both are promised).
uint32_t ComputeRatioSum(const ComputeGpu& g);
// A free slot for a new tenant (its counters zeroed), or -1 when the GPU has kComputeSlots.
int TakeComputeSlot(ComputeGpu* g, uint32_t ratio, uint32_t policy, uint32_t session);
// The tenant is gone; if a worker of it (`pid`, exited) held the device, the device is freed.
void FreeComputeSlot(ComputeGpu* g, int slot);
void ReleaseDeadHolder(ComputeGpu* g, pid_t pid);
// oriond's periodic sample of a tenant's device time (for ComputeUtilization).
void MarkComputeSample(ComputeSlot* s);

// The tenant's utilization, in permille of wall time: its kernels' device time over the time since
// oriond's last sample when that is at least 100 ms, else over the interval before it (NVML's "past
// sample period", between 1/6 s and 1 s). Any process may call it.
uint32_t ComputeUtilization(const ComputeSlot& s);

// A worker's side: its tenant's slot on the GPU one of its vGPUs is on.
class ComputeGate {
 public:
  ComputeGate(ComputeGpu* gpu, int slot) : gpu_(gpu), slot_(slot) {}
  // Waits until this tenant may run a kernel on the device, and takes the device.
  void Enter();
  // The kernel (Enter .. now) is over: charges its device time and frees the device; a cap tenant
  // then waits out the rest of its period.
  void Leave();
  // Whether another tenant, or another worker of this one, waits for the device now (a holder that
  // keeps the device across kernels ends its turn early then: the cuda backend's turns).
  bool Contended() const;
  uint32_t ratio() const { return gpu_->slots[slot_].ratio; }
  uint32_t policy() const { return gpu_->slots[slot_].policy; }
  uint64_t busy_ns() const { return gpu_->slots[slot_].busy_ns.load(); }
  uint64_t throttled_ns() const { return gpu_->slots[slot_].throttled_ns.load(); }
  uint32_t utilization_permille() const { return ComputeUtilization(gpu_->slots[slot_]); }

 private:
  uint64_t Weight(uint64_t now) const;
  int64_t Refill(int64_t spent = 0, int64_t bound = kComputeCapBurstNs);
  ComputeGpu* gpu_;
  int slot_;
  uint64_t entered_ns_ = 0;
  // A best-effort tenant's weight changes only when tenants come or go: recomputed at most every
  // kWeightTtlNs (a scan of every slot per kernel costs launches a few percent).
  static constexpr uint64_t kWeightTtlNs = 10000000;
  mutable uint64_t weight_ = 0, weight_ns_ = 0;
};

// Turns: how a backend whose kernels run asynchronously (the cuda backend) gates them. The device is
// held in turns that span launches rather than per kernel (the sim's way): a launch under a gate
// takes the turn (ComputeGate::Enter, which waits for this tenant's place) unless this worker holds
// it. A keeper thread ends the turn (ComputeGate::Leave, charging the turn's wall time as device
// time) as soon as every stream launched on in the turn is idle (`busy` says no; a launch in
// progress keeps the turn), polled every `poll_us`. When another tenant waits (Contended) or the
// tenant is capped, a turn that has lasted `slice_ns` closes: the worker's next launch waits until
// the turn's work has finished and the turn has ended, then takes a new turn in its place among the
// tenants. So a turn's charge is the wall time the device did this tenant's work alone, and a GPU's
// tenants alternate in slices of about `slice_ns` plus the kernels in flight. Work still running
// `grace_ns` after the slice ends the turn anyway (it may be waiting for another tenant's work, IPC
// events), so no tenant holds the device while it waits for another.
// Thread-safety: BeginLaunch/EndLaunch/Forget from the worker's thread; `busy` runs on the keeper
// thread, under the object's lock (never while BeginLaunch waits in Enter).
class ComputeTurns {
 public:
  // A stream a turn launched on: the backend's (context, stream) handles; the context is set for
  // the default streams, whose handle means a different stream in each context.
  using Stream = std::pair<void*, void*>;
  using BusyFn = std::function<bool(const Stream&)>;
  static constexpr uint64_t kSliceNs = 10000000;   // 10 ms
  static constexpr uint64_t kGraceNs = 100000000;  // 100 ms
  static constexpr int kPollUs = 250;

  explicit ComputeTurns(BusyFn busy, uint64_t slice_ns = kSliceNs, uint64_t grace_ns = kGraceNs, int poll_us = kPollUs)
      : busy_(std::move(busy)), slice_ns_(slice_ns), grace_ns_(grace_ns), poll_us_(poll_us) {}
  ~ComputeTurns();
  ComputeTurns(const ComputeTurns&) = delete;
  ComputeTurns& operator=(const ComputeTurns&) = delete;

  // Around one launch on `s` under `g`: BeginLaunch may wait (for the tenant's place, or for its own
  // closing turn to end).
  void BeginLaunch(ComputeGate* g, Stream s);
  void EndLaunch(ComputeGate* g);
  // A destroyed stream (nullptr: every stream; a context is gone) is not polled again.
  void Forget(void* stream);
  // Whether this worker holds a turn of `g` now.
  bool Holding(ComputeGate* g);
  // Ends every turn this worker holds now, its work finished or not (the gates must still exist).
  // A worker that exits holding a turn needs none of this: oriond frees a dead holder's device.
  void EndAll();

 private:
  struct Turn {
    ComputeGate* gate = nullptr;
    uint64_t since_ns = 0;
    int launching = 0;        // launches being submitted now
    uint64_t closing_ns = 0;  // when its slice ended with others waiting (0: open)
    std::vector<Stream> streams;
  };
  Turn* Find(ComputeGate* g);
  void Keep();

  BusyFn busy_;
  const uint64_t slice_ns_, grace_ns_;
  const int poll_us_;
  std::mutex mu_;                  // guards everything below
  std::condition_variable wake_;   // wakes the keeper (a turn began, the object closes)
  std::condition_variable ended_;  // wakes a launch waiting for its closing turn's end
  std::vector<Turn> turns_;        // held turns, one per gate at most
  std::thread keeper_;             // started at the first turn
  bool stop_ = false;
};

}  // namespace orion::host
