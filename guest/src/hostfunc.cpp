// Exported driver API: host functions in stream order — cuLaunchHostFunc and cuStreamAddCallback.
//
// A host function runs in this process, on Orion's host-function thread, once the work issued
// before it on its stream has completed; work issued on that stream after it waits until it has
// returned (CUDA driver API reference, cuLaunchHostFunc). How:
//   - the call records an internal event on the stream (an EventRecord frame) and queues the
//     function behind it; it returns at once;
//   - the host-function thread waits for the event (EventQuery with a back-off from 20 us to 1 ms,
//     only while functions are queued: no thread runs and nothing is polled otherwise), then runs
//     the function, in order per stream;
//   - the next stream-ordered call on that stream (a launch, copy, memset, event record or wait,
//     synchronize; on the legacy default stream, or a blocking stream after a function on the
//     legacy stream, as CUDA's implicit synchronization says) waits in the client until the
//     functions queued before it have returned (HostFuncGate, called from the hooks every such
//     call already passes through).
// As CUDA says, a host function must not call CUDA; cuLaunchHostFunc skips it when the context
// has a sticky error, cuStreamAddCallback passes the stream's status to it.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "export.h"
#include "state.h"

using namespace orion;
using namespace orion::guest;

namespace {

struct Item {
  uint64_t stream = 0;
  uint64_t event = 0;
  CUhostFn fn = nullptr;          // cuLaunchHostFunc
  CUstreamCallback cb = nullptr;  // cuStreamAddCallback
  CUstream handle = nullptr;
  void* data = nullptr;
};

struct HostFuncs {
  std::mutex mu;
  std::condition_variable cv;                   // a function finished, or a new one was queued
  std::map<uint64_t, std::deque<Item>> queues;  // per stream, in issue order
  std::vector<uint64_t> free_events;            // internal events to reuse
  size_t queued = 0;
  bool thread_started = false;
};
HostFuncs& H() {
  static HostFuncs* h = new HostFuncs;  // never destroyed: the thread may outlive main
  return *h;
}
std::atomic<size_t> g_pending{0};
thread_local bool t_on_host_thread = false;
constexpr size_t kMaxQueued = 65536;  // bounded, as every table a program can grow

bool NonBlocking(uint64_t stream) {
  uint64_t v = 0;
  return stream != 0 && S().streams.Get(stream, &v) && ((v >> 32) & CU_STREAM_NON_BLOCKING) != 0;
}

// Whether work on `stream` must wait for the functions queued on `q`'s stream (requires the lock).
bool MustWait(uint64_t stream, uint64_t on) {
  if (stream == ~uint64_t{0} || stream == on) return true;
  if (stream == 0) return !NonBlocking(on);  // the legacy stream waits for every blocking stream
  return on == 0 && !NonBlocking(stream);    // a blocking stream waits for the legacy stream
}

void Loop() {
  t_on_host_thread = true;
  HostFuncs& h = H();
  std::unique_lock l(h.mu);
  for (;;) {
    h.cv.wait(l, [&] { return h.queued > 0; });
    // The oldest function of each stream whose event has completed runs; the others wait.
    bool ran = false;
    uint32_t sleep_us = 20;
    while (!ran) {
      for (auto& [stream, q] : h.queues) {
        if (q.empty()) continue;
        Item it = q.front();
        l.unlock();
        HandleReq eq{it.event};
        const CUresult st = Client::Get().Call(Op::kEventQuery, &eq, sizeof eq);
        if (st == CUDA_ERROR_NOT_READY) {
          l.lock();
          continue;
        }
        if (it.fn != nullptr) {
          if (st == CUDA_SUCCESS) it.fn(it.data);  // not called when the context is in error
        } else {
          it.cb(it.handle, st, it.data);
        }
        l.lock();
        q.pop_front();
        h.free_events.push_back(it.event);
        --h.queued;
        g_pending.fetch_sub(1, std::memory_order_release);
        h.cv.notify_all();
        ran = true;
        break;
      }
      if (!ran) {
        l.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(sleep_us));
        sleep_us = std::min<uint32_t>(sleep_us * 2, 1000);
        l.lock();
      }
    }
  }
}

CUresult Enqueue(CUstream hs, CUhostFn fn, CUstreamCallback cb, void* data) {
  if (CUresult r = NeedCtx(); r != CUDA_SUCCESS) return r;
  if (fn == nullptr && cb == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t stream = 0;
  if (!StreamId(hs, &stream)) return CUDA_ERROR_INVALID_HANDLE;
  if (fn != nullptr) {
    if (CUresult r; CaptureHostFunc(stream, fn, data, &r)) return r;  // captured: a host node
  } else if (CUresult r; CaptureRefuse(stream, "a stream callback (cuStreamAddCallback)", &r)) {
    return r;
  }
  HostFuncs& h = H();
  uint64_t event = 0;
  {
    std::lock_guard l(h.mu);
    if (h.queued >= kMaxQueued) return CUDA_ERROR_OUT_OF_MEMORY;
    if (!h.free_events.empty()) {
      event = h.free_events.back();
      h.free_events.pop_back();
    }
  }
  if (event == 0) {
    EventCreateReq q{CU_EVENT_DISABLE_TIMING, 0};
    HandleRep rep{};
    if (CUresult r = Client::Get().Call(Op::kEventCreate, &q, sizeof q, &rep, sizeof rep); r != CUDA_SUCCESS) return r;
    event = rep.handle;
  }
  // Stream order first: the function comes after what was issued on the stream before it.
  HostFuncGate(stream);
  EventRecordReq rq{event, stream};
  if (CUresult r = Client::Get().Send(Op::kEventRecord, &rq, sizeof rq); r != CUDA_SUCCESS) return r;
  std::lock_guard l(h.mu);
  h.queues[stream].push_back(Item{stream, event, fn, cb, hs, data});
  ++h.queued;
  g_pending.fetch_add(1, std::memory_order_release);
  if (!h.thread_started) {
    std::thread(Loop).detach();
    h.thread_started = true;
  }
  h.cv.notify_all();
  return CUDA_SUCCESS;
}

}  // namespace

namespace orion::guest {

CUresult LaunchHostFunc(CUstream hs, CUhostFn fn, void* data) noexcept { return Enqueue(hs, fn, nullptr, data); }

void HostFuncGate(uint64_t stream) noexcept {
  if (g_pending.load(std::memory_order_acquire) == 0 || t_on_host_thread) return;
  HostFuncs& h = H();
  std::unique_lock l(h.mu);
  h.cv.wait(l, [&] {
    for (auto& [on, q] : h.queues) {
      if (!q.empty() && MustWait(stream, on)) return false;
    }
    return true;
  });
}

bool HostFuncPending(uint64_t stream) noexcept {
  if (g_pending.load(std::memory_order_acquire) == 0) return false;
  std::lock_guard l(H().mu);
  for (auto& [on, q] : H().queues) {
    if (!q.empty() && MustWait(stream, on)) return true;
  }
  return false;
}

}  // namespace orion::guest

extern "C" {

ORION_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void* userData) {
  ORION_API(cuLaunchHostFunc);
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Enqueue(hStream, fn, nullptr, userData);
}
ORION_EXPORT CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData) {
  ORION_API(cuLaunchHostFunc_ptsz);
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Enqueue(hStream, fn, nullptr, userData);
}
ORION_EXPORT CUresult CUDAAPI cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void* userData,
                                                  unsigned int flags) {
  ORION_API(cuStreamAddCallback);
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return Enqueue(hStream, nullptr, callback, userData);
}
ORION_EXPORT CUresult CUDAAPI cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void* userData,
                                                       unsigned int flags) {
  ORION_API(cuStreamAddCallback_ptsz);
  if (callback == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  return Enqueue(hStream, nullptr, callback, userData);
}

}  // extern "C"
