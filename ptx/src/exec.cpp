// ptx/src/exec.cpp — runs a lowered Kernel: blocks on a pool of host threads, warps of 32 lanes in
// lockstep inside a block. See ptx.h for the semantics and ir.h for the instruction form.
//
// The block itself is block.h (state, scheduling) with block_memory.h, block_units.h and alu.h.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include <pthread.h>
#include <unistd.h>

#include "block.h"

namespace orion::ptx {

bool exec::FastPaths() {
  static const bool on = [] {
    const char* e = std::getenv("ORION_PTX_FAST");
    return e == nullptr || std::strcmp(e, "0") != 0;
  }();
  return on;
}

void jit::CallFloat(const Ins* ins, const uint64_t* a, const uint64_t* b, const uint64_t* c, uint64_t* d,
                    uint32_t mask) {
  exec::FloatLanes(*ins, [&](const Ins& unit) {
    for (uint32_t m = mask; m != 0; m &= m - 1) {
      const int l = std::countr_zero(m);
      d[l] = exec::FloatLane(unit, a[l], b[l], c[l]);
    }
  });
}

void jit::CallConvert(const Ins* ins, const uint64_t* a, uint64_t* d, uint32_t mask) {
  for (; mask != 0; mask &= mask - 1) {
    const int l = std::countr_zero(mask);
    d[l] = exec::Convert(*ins, a[l]);
  }
}

using exec::Block;
using exec::Fault;

namespace {

// Host threads that run a launch's blocks beside the launching thread, kept between launches (a
// thread started per launch cost ~35 us each: more than a small kernel's work). Threads are
// started as launches need them, with small stacks (the executor keeps its state on the heap), and
// wait for work on a condition variable; they belong to the process that started them (a fork
// starts its own).
class BlockPool {
 public:
  // Runs `work` on the calling thread and on up to `extra` pool threads at once, and returns once
  // every run has returned. `work` takes blocks until none is left, so a pool run that has not
  // started by the time the caller's run returns is not needed any more (and when no pool thread
  // can be started, the caller's run does all the work).
  void Run(const std::function<void()>& work, uint64_t extra) {
    Job job{&work, extra, 0};
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pid_ != getpid()) {  // a forked child: its parent's threads are not here
        pid_ = getpid();
        threads_ = idle_ = 0;
        jobs_.clear();
      }
      while (idle_ < Waiting() + extra && threads_ < kMaxThreads) {
        if (!Start()) break;
      }
      jobs_.push_back(&job);
    }
    cv_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mu_);
    // Runs not started yet are not needed: the blocks are all taken.
    if (job.to_start > 0) {
      job.to_start = 0;
      jobs_.erase(std::remove(jobs_.begin(), jobs_.end(), &job), jobs_.end());
    }
    done_.wait(lock, [&] { return job.running == 0; });
  }

 private:
  struct Job {
    const std::function<void()>* work;
    uint64_t to_start;  // pool runs still to begin
    uint64_t running;   // pool runs under way
  };
  static constexpr uint64_t kMaxThreads = 256;

  uint64_t Waiting() const {
    uint64_t n = 0;
    for (const Job* j : jobs_) n += j->to_start;
    return n;
  }
  bool Start() {  // mu_ held
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    const bool ok = pthread_create(
                        &t, &attr,
                        [](void* self) -> void* {
                          static_cast<BlockPool*>(self)->Loop();
                          return nullptr;
                        },
                        this) == 0;
    pthread_attr_destroy(&attr);
    if (ok) ++threads_, ++idle_;
    return ok;
  }
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    const pid_t mine = pid_;
    for (;;) {
      cv_.wait(lock, [&] { return !jobs_.empty() || pid_ != mine; });
      if (pid_ != mine) return;
      Job* job = jobs_.front();
      if (--job->to_start == 0) jobs_.pop_front();
      ++job->running;
      --idle_;
      lock.unlock();
      (*job->work)();
      lock.lock();
      ++idle_;
      if (--job->running == 0 && job->to_start == 0) done_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, done_;
  std::deque<Job*> jobs_;
  uint64_t threads_ = 0, idle_ = 0;
  pid_t pid_ = getpid();
};

BlockPool& Pool() {
  static BlockPool* pool = new BlockPool();  // leaked: its threads may outlive static destructors
  return *pool;
}

}  // namespace

Status Prepare(Program& p, std::string_view kernel) {
  auto k = p.GetKernel(kernel);
  return k.ok() ? Status::Ok() : k.status();
}

Result<KernelResources> Resources(Program& p, std::string_view kernel) {
  auto k = p.GetKernel(kernel);
  if (!k.ok()) return k.status();
  return KernelResources{(*k)->shared_static, (*k)->local_bytes + (*k)->fparam_bytes};
}

Result<Translation> Translated(Program& p, std::string_view kernel, bool wait) {
  auto k = p.GetKernel(kernel);
  if (!k.ok()) return k.status();
  Translation t;
  t.enabled = jit::Enabled();
  t.instructions = static_cast<uint32_t>((*k)->code.size());
  const jit::Code* code = jit::For(*k);
  if (code == nullptr) {
    t.why = !t.enabled ? "the translator is off" : "nothing to translate, or too much (jit.h kMaxTranslated)";
    return t;
  }
  if (wait) {
    jit::Start(*k);
    jit::Wait(*code);
  }
  t.translated = code->translated;
  t.traces = static_cast<uint32_t>(code->traces.size());
  const int state = code->state.load(std::memory_order_acquire);
  t.ready = state == jit::Code::kReady;
  if (t.ready) t.milliseconds = code->milliseconds;
  t.why = state == jit::Code::kPending ? "being compiled" : state == jit::Code::kFailed ? code->why : "";
  return t;
}

LaunchResult Launch(Program& p, std::string_view kernel, const LaunchConfig& cfg, GlobalMemory& mem) {
  LaunchResult res;
  auto k = p.GetKernel(kernel);
  if (!k.ok()) {
    res.code = k.status().code() == Code::kNotFound ? CUDA_ERROR_NOT_FOUND : CUDA_ERROR_NOT_SUPPORTED;
    res.message = k.status().message();
    return res;
  }
  const Kernel& kern = **k;
  if (cfg.param_bytes < kern.param_bytes) {
    res.code = CUDA_ERROR_INVALID_VALUE;
    res.message = "parameter buffer of " + std::to_string(cfg.param_bytes) + " bytes; the kernel's PTX needs " +
                  std::to_string(kern.param_bytes);
    return res;
  }
  const uint64_t threads = uint64_t{cfg.block[0]} * cfg.block[1] * cfg.block[2];
  if (kern.max_threads != 0 && threads > kern.max_threads) {
    res.code = CUDA_ERROR_INVALID_VALUE;
    res.message = "a block of " + std::to_string(threads) + " threads exceeds the kernel's .maxntid/.reqntid " +
                  std::to_string(kern.max_threads);
    return res;
  }
  const uint64_t blocks = uint64_t{cfg.grid[0]} * cfg.grid[1] * cfg.grid[2];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg.timeout_ms);
  const uint32_t workers = static_cast<uint32_t>(std::max<uint64_t>(1, std::min<uint64_t>(cfg.workers, blocks)));
  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  Fault fault;
  uint64_t fault_block = UINT64_MAX;
  // Planned at the kernel's first launch; compiled on a thread of its own once it has run enough.
  const jit::Code* code = jit::For(*k);
  auto work = [&] {
    Block b(kern, cfg, mem, stop, deadline, code);
    Fault f;
    std::string out;
    uint64_t wi = 0, li = 0;
    for (;;) {
      const uint64_t i = next.fetch_add(1);
      if (i >= blocks || stop.load()) break;
      // A block looks at the deadline every 65536 warp instructions of its own: a grid of many
      // short blocks is bounded here.
      if (cfg.timeout_ms != 0 && std::chrono::steady_clock::now() > deadline) {
        std::lock_guard<std::mutex> lock(mu);
        if (fault.code == CUDA_SUCCESS || i < fault_block) {
          fault = Fault{CUDA_ERROR_LAUNCH_TIMEOUT, "the kernel ran longer than the sim kernel timeout (" +
                                                       std::to_string(cfg.timeout_ms) + " ms)"};
          fault_block = i;
        }
        stop = true;
        break;
      }
      const uint32_t ctaid[3] = {static_cast<uint32_t>(i % cfg.grid[0]),
                                 static_cast<uint32_t>((i / cfg.grid[0]) % cfg.grid[1]),
                                 static_cast<uint32_t>(i / (uint64_t{cfg.grid[0]} * cfg.grid[1]))};
      out.clear();
      const uint64_t before = wi;
      const bool ok = b.Run(ctaid, &f, cfg.printf_out != nullptr ? &out : nullptr, &wi, &li);
      if (code != nullptr) jit::Ran(*k, wi - before);  // past its threshold, the kernel is compiled
      std::lock_guard<std::mutex> lock(mu);
      if (cfg.printf_out != nullptr && cfg.printf_out->size() < cfg.printf_limit)
        cfg.printf_out->append(out, 0, std::min<size_t>(out.size(), cfg.printf_limit - cfg.printf_out->size()));
      if (!ok) {
        if (f.code != CUDA_ERROR_LAUNCH_FAILED || f.message != "stopped") {
          if (fault.code == CUDA_SUCCESS || i < fault_block) {
            fault = f;
            fault_block = i;
          }
        }
        stop = true;
        break;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    res.warp_instructions += wi;
    res.thread_instructions += li;
  };
  // A cooperative launch has all blocks resident at once: one host thread per block, so blocks
  // spinning in grid.sync() never wait for a block that has not started. Otherwise `workers`
  // threads take blocks in turn. Threads get small stacks (the executor keeps its state on the heap).
  const uint64_t host_threads = cfg.cooperative ? blocks : workers;
  if (host_threads <= 1) {
    work();
  } else if (!cfg.cooperative) {
    Pool().Run(work, host_threads - 1);
  } else {
    std::function<void()> fn = work;
    auto entry = [](void* arg) -> void* {
      (*static_cast<std::function<void()>*>(arg))();
      return nullptr;
    };
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 1 << 20);
    std::vector<pthread_t> started;
    for (uint64_t i = 0; i < host_threads; ++i) {
      pthread_t t;
      if (pthread_create(&t, &attr, entry, &fn) != 0) {
        stop = true;
        std::lock_guard<std::mutex> lock(mu);
        if (fault.code == CUDA_SUCCESS)
          fault = Fault{CUDA_ERROR_OUT_OF_MEMORY, "cannot start the host threads the launch needs"};
        break;
      }
      started.push_back(t);
    }
    for (pthread_t t : started) pthread_join(t, nullptr);
    pthread_attr_destroy(&attr);
  }
  res.code = fault.code;
  res.message = fault.message;
  return res;
}

}  // namespace orion::ptx
