// driver_races.cpp — application threads racing through the driver API (pure driver API, no cudart).
//
//   driver_races init   the first cuInit stalls inside initialisation (run with
//                       ORION_TEST_INIT_DELAY_MS, a guest-runtime test hook) while 8 more threads call
//                       cuInit and use the primary context at once: every call must succeed, and all
//                       threads must get the same primary context.
//   driver_races free   8 threads allocate, check and free device memory at once (the sim backend
//                       hands freed addresses out again): each thread's own allocation stays known
//                       (cuMemGetAddressRange) until that thread frees it, and every free succeeds.
//   driver_races flags  threads set and read the current context's flags at once (a data race
//                       without the runtime's lock; TSan builds see it).
//   driver_races mixed  8 threads, each with its own stream, pinned buffer and device buffer, copy,
//                       set and compare at once (sync and async copies, memsets, events, stream
//                       queries, context-wide synchronizations): every byte read back is checked.
//                       The multithreaded client the ThreadSanitizer build runs (scripts/sanitize).
//   driver_races tiny   (quota accounting, not a race) one-byte cuMemAlloc's until the quota
//                       (ORION_GMEM) refuses one, at most 20000; prints "TINY allocated=<n>".
// Output: CHECK lines and DONE (orion_test.h).
#include <cuda.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "orion_test.h"

namespace {

const char* Name(CUresult r) {
  const char* s = nullptr;
  cuGetErrorName(r, &s);
  return s != nullptr ? s : "?";
}

int InitRace() {
  CUresult first = CUDA_ERROR_UNKNOWN;
  std::thread initialiser([&] { first = cuInit(0); });
  usleep(300 * 1000);  // the initialiser is connected now, and stalled before it finishes
  const int kThreads = 8;
  std::vector<std::string> errors(kThreads);
  std::vector<CUcontext> ctxs(kThreads, nullptr);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, &errors, &ctxs] {
      CUresult r = cuInit(0);
      if (r != CUDA_SUCCESS) {
        errors[t] = ot::fmt("cuInit %s", Name(r));
        return;
      }
      unsigned flags = 0;
      int active = 0;
      r = cuDevicePrimaryCtxGetState(0, &flags, &active);
      if (r != CUDA_SUCCESS) {
        errors[t] = ot::fmt("cuDevicePrimaryCtxGetState %s", Name(r));
        return;
      }
      r = cuDevicePrimaryCtxRetain(&ctxs[t], 0);
      if (r != CUDA_SUCCESS || ctxs[t] == nullptr) {
        errors[t] = ot::fmt("cuDevicePrimaryCtxRetain %s", Name(r));
        return;
      }
    });
  }
  for (auto& th : pool) th.join();
  initialiser.join();
  ot::check("init_first_thread", first == CUDA_SUCCESS, Name(first));
  for (int t = 0; t < kThreads; ++t) {
    ot::check(ot::fmt("init_thread%d", t), errors[t].empty(), errors[t]);
    ot::check(ot::fmt("init_thread%d_same_primary", t), ctxs[t] != nullptr && ctxs[t] == ctxs[0]);
  }
  return ot::finish();
}

int FreeRace() {
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS) {
    ot::check("setup", false, "cuInit / cuDevicePrimaryCtxRetain");
    return ot::finish();
  }
  const int kThreads = 8, kIters = 400;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, ctx, &errors] {
      if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        errors[t] = "cuCtxSetCurrent";
        return;
      }
      ot::Rng rng(77 + t);
      for (int i = 0; i < kIters && errors[t].empty(); ++i) {
        const size_t bytes = 1 + rng.next() % (3 << 20);
        CUdeviceptr p = 0;
        CUresult r = cuMemAlloc(&p, bytes);
        if (r != CUDA_SUCCESS) {
          errors[t] = ot::fmt("iteration %d: cuMemAlloc %s", i, Name(r));
          break;
        }
        CUdeviceptr base = 0;
        size_t size = 0;
        r = cuMemGetAddressRange(&base, &size, p);
        if (r != CUDA_SUCCESS || base != p || size != bytes) {
          errors[t] = ot::fmt("iteration %d: own allocation 0x%llx lost: cuMemGetAddressRange %s", i,
                              (unsigned long long)p, Name(r));
          break;
        }
        r = cuMemsetD8(p, static_cast<unsigned char>(t), bytes);
        if (r != CUDA_SUCCESS) {
          errors[t] = ot::fmt("iteration %d: cuMemsetD8 %s", i, Name(r));
          break;
        }
        r = cuMemFree(p);
        if (r != CUDA_SUCCESS) {
          errors[t] = ot::fmt("iteration %d: cuMemFree(0x%llx) %s", i, (unsigned long long)p, Name(r));
          break;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) ot::check(ot::fmt("free_thread%d", t), errors[t].empty(), errors[t]);
  return ot::finish();
}

int FlagsRace() {
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS) {
    ot::check("setup", false, "cuInit / cuDevicePrimaryCtxRetain");
    return ot::finish();
  }
  std::atomic<int> bad{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < 4; ++t) {
    pool.emplace_back([t, ctx, &bad] {
      cuCtxSetCurrent(ctx);
      for (int i = 0; i < 2000; ++i) {
        const unsigned want = (t & 1) ? CU_CTX_SCHED_SPIN : CU_CTX_SCHED_YIELD;
        if (cuCtxSetFlags(want) != CUDA_SUCCESS) ++bad;
        unsigned got = 0;
        if (cuCtxGetFlags(&got) != CUDA_SUCCESS || (got != CU_CTX_SCHED_SPIN && got != CU_CTX_SCHED_YIELD)) ++bad;
      }
    });
  }
  for (auto& th : pool) th.join();
  ot::check("ctx_flags_threads", bad.load() == 0, ot::fmt("%d bad calls", bad.load()));
  return ot::finish();
}

int Mixed() {
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS) {
    ot::check("setup", false, "cuInit / cuDevicePrimaryCtxRetain");
    return ot::finish();
  }
  const int kThreads = 8, kIters = 60;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    pool.emplace_back([t, ctx, &errors] {
      auto fail = [&](int i, const char* what, CUresult r) {
        if (errors[t].empty()) errors[t] = ot::fmt("iteration %d: %s %s", i, what, Name(r));
      };
      if (CUresult r = cuCtxSetCurrent(ctx); r != CUDA_SUCCESS) return fail(-1, "cuCtxSetCurrent", r);
      CUstream stream = nullptr;
      CUevent done = nullptr;
      if (CUresult r = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS)
        return fail(-1, "cuStreamCreate", r);
      if (CUresult r = cuEventCreate(&done, CU_EVENT_DEFAULT); r != CUDA_SUCCESS) return fail(-1, "cuEventCreate", r);
      ot::Rng rng(1000 + t);
      const size_t kMax = 1 << 20;
      void* pinned = nullptr;
      if (CUresult r = cuMemAllocHost(&pinned, kMax); r != CUDA_SUCCESS) return fail(-1, "cuMemAllocHost", r);
      std::vector<uint8_t> want(kMax), got(kMax);
      for (int i = 0; i < kIters && errors[t].empty(); ++i) {
        const size_t bytes = 1 + rng.next() % kMax;
        CUdeviceptr d = 0;
        if (CUresult r = cuMemAlloc(&d, bytes); r != CUDA_SUCCESS) {
          fail(i, "cuMemAlloc", r);
          break;
        }
        rng.fill(want.data(), bytes);
        CUresult r = CUDA_SUCCESS;
        if (i % 2 == 0) {
          r = cuMemcpyHtoD(d, want.data(), bytes);  // synchronous, from pageable memory
        } else {
          std::memcpy(pinned, want.data(), bytes);  // asynchronous, from pinned memory
          r = cuMemcpyHtoDAsync(d, pinned, bytes, stream);
        }
        if (r != CUDA_SUCCESS) {
          fail(i, "cuMemcpyHtoD", r);
          cuMemFree(d);
          break;
        }
        // A stretch in the middle set to the thread's byte, on the thread's stream.
        const size_t from = bytes / 4, len = bytes / 2;
        if ((r = cuMemsetD8Async(d + from, static_cast<unsigned char>(0xA0 + t), len, stream)) != CUDA_SUCCESS) {
          fail(i, "cuMemsetD8Async", r);
        } else if ((r = cuMemcpyDtoHAsync(pinned, d, bytes, stream)) != CUDA_SUCCESS) {
          fail(i, "cuMemcpyDtoHAsync", r);
        } else if ((r = cuEventRecord(done, stream)) != CUDA_SUCCESS) {
          fail(i, "cuEventRecord", r);
        } else if ((r = (i % 3 == 0 ? cuCtxSynchronize() : cuEventSynchronize(done))) != CUDA_SUCCESS) {
          fail(i, "synchronize", r);
        } else if ((r = cuStreamQuery(stream)) != CUDA_SUCCESS) {
          fail(i, "cuStreamQuery after the event", r);
        }
        if (errors[t].empty()) {
          std::memcpy(got.data(), pinned, bytes);
          std::memset(want.data() + from, 0xA0 + t, len);
          if (std::memcmp(got.data(), want.data(), bytes) != 0) {
            size_t k = 0;
            while (got[k] == want[k]) ++k;
            errors[t] =
                ot::fmt("iteration %d: byte %zu of %zu read back 0x%02x, wrote 0x%02x", i, k, bytes, got[k], want[k]);
          }
        }
        if ((r = cuMemFree(d)) != CUDA_SUCCESS) fail(i, "cuMemFree", r);
      }
      cuMemFreeHost(pinned);
      cuEventDestroy(done);
      cuStreamDestroy(stream);
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) ot::check(ot::fmt("mixed_thread%d", t), errors[t].empty(), errors[t]);
  return ot::finish();
}

int Tiny() {
  CUcontext ctx = nullptr;
  if (cuInit(0) != CUDA_SUCCESS || cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS ||
      cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
    ot::check("setup", false, "cuInit / cuDevicePrimaryCtxRetain");
    return ot::finish();
  }
  std::vector<CUdeviceptr> held;
  CUresult last = CUDA_SUCCESS;
  while (held.size() < 20000) {
    CUdeviceptr p = 0;
    last = cuMemAlloc(&p, 1);
    if (last != CUDA_SUCCESS) break;
    held.push_back(p);
  }
  printf("TINY allocated=%zu\n", held.size());
  ot::check("tiny_refused_with_oom", held.size() == 20000 || last == CUDA_ERROR_OUT_OF_MEMORY, Name(last));
  bool freed = true;
  for (CUdeviceptr p : held) freed = cuMemFree(p) == CUDA_SUCCESS && freed;
  ot::check("tiny_freed", freed);
  CUdeviceptr p = 0;
  ot::check("tiny_alloc_after_free", cuMemAlloc(&p, 1 << 20) == CUDA_SUCCESS && cuMemFree(p) == CUDA_SUCCESS);
  return ot::finish();
}

}  // namespace

int main(int argc, char** argv) {
  ot::init_output();
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "init") return InitRace();
  if (mode == "free") return FreeRace();
  if (mode == "flags") return FlagsRace();
  if (mode == "mixed") return Mixed();
  if (mode == "tiny") return Tiny();
  fprintf(stderr, "usage: driver_races init|free|flags|mixed|tiny\n");
  return 2;
}
