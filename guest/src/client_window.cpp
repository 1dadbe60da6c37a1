// guest/src/client_window.cpp — Client's data window (client.h): the staging ring bulk copies
// go through (HtoD, DtoH, 2D and array copies, module uploads), the pinned heap behind
// cuMemHostAlloc, and host memory mapped into the window (cuMemHostRegister).
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "client.h"
#include "orion/common/text.h"
#include "state.h"

namespace orion::guest {
namespace {

using ivshmem::Backoff;

constexpr uint64_t kChunk = 1ull << 20;  // bulk copy chunk
constexpr uint64_t kPinnedAlign = 256;

}  // namespace

// ---- Staging -------------------------------------------------------------------------------

void Client::ReclaimLocked() noexcept {
  // S0: acquire pairs with the worker's release store after it executed frame `done`: its reads
  // of the staging bytes of frames <= done are complete.
  const auto done = static_cast<uint32_t>(desc_->server_done_seq.load(std::memory_order_acquire));
  while (!stage_fifo_.empty()) {
    const StageEntry& e = stage_fifo_.front();
    const bool host_done = !e.guest_owned && e.seq != 0 && static_cast<int32_t>(done - e.seq) >= 0;
    if (!e.released && !host_done) break;
    stage_tail_ = e.end;
    stage_fifo_.pop_front();
  }
}

int64_t Client::StageAllocLocked(uint64_t bytes) noexcept {
  const uint64_t cap = layout_.staging_bytes;
  Backoff backoff;
  uint64_t beat = 0, changed = 0;
  for (;;) {
    ReclaimLocked();
    const uint64_t pos = stage_head_ % cap;
    const uint64_t to_end = cap - pos;
    const uint64_t need = bytes <= to_end ? bytes : to_end + bytes;
    if (cap - (stage_head_ - stage_tail_) >= need) {
      if (bytes > to_end) {
        stage_head_ += to_end;
        stage_fifo_.push_back({stage_head_, 0, true, true});
      }
      const uint64_t off = stage_head_ % cap;
      stage_head_ += bytes;
      stage_fifo_.push_back({stage_head_, 0, false, false});
      return static_cast<int64_t>(off);
    }
    if (backoff.sleeping() && ServerGoneLocked(&beat, &changed)) return -1;
    // Everything outstanding may be guest-owned (our own DtoH chunks): the caller must drain.
    bool any_host = false;
    for (const auto& e : stage_fifo_) any_host |= !e.guest_owned && !e.released;
    if (!any_host) return -2;
    if (backoff.sleeping()) RingDoorbell(true);  // staging is full of frames the worker must run
    backoff.Pause();
  }
}

void Client::StageTagLocked(uint32_t seq, bool guest_owned) noexcept {
  stage_fifo_.back().seq = seq;
  stage_fifo_.back().guest_owned = guest_owned;
}

CUresult Client::CopyHtoD(uint64_t dst, const void* src, uint64_t bytes, uint64_t stream, bool sync) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  if (int64_t off = WindowOffset(src, bytes); off >= 0) {
    // Pinned source: zero-copy. A synchronous copy waits, since the caller may reuse the buffer.
    MemcpyReq q{dst, static_cast<uint64_t>(off), bytes, stream};
    FrameHeader h = MakeHeader(Op::kMemcpyHtoD, sizeof q, sync);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    return sync ? WaitReplyLocked(h.seq, static_cast<Op>(h.op), nullptr, 0, nullptr) : CUDA_SUCCESS;
  }
  const auto* s = static_cast<const uint8_t*>(src);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kChunk, bytes - done);
    const int64_t off = StageAllocLocked(n);
    if (off < 0) return broken_ != CUDA_SUCCESS ? broken_ : CUDA_ERROR_UNKNOWN;
    std::memcpy(window_ + off, s + done, n);
    MemcpyReq q{dst + done, static_cast<uint64_t>(off), n, stream};
    FrameHeader h = MakeHeader(Op::kMemcpyHtoD, sizeof q, false);
    StageTagLocked(h.seq, false);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    done += n;
  }
  // Pageable source: like the CUDA driver, return once the bytes are staged.
  return CUDA_SUCCESS;
}

CUresult Client::CopyDtoH(void* dst, uint64_t src, uint64_t bytes, uint64_t stream, bool async) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  if (int64_t off = WindowOffset(dst, bytes); off >= 0) {
    MemcpyReq q{static_cast<uint64_t>(off), src, bytes, stream};
    if (async) {
      FrameHeader h = MakeHeader(Op::kMemcpyDtoHAsync, sizeof q, false);
      return PushLocked(h, &q, sizeof q, nullptr, 0);
    }
    FrameHeader h = MakeHeader(Op::kMemcpyDtoH, sizeof q, true);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    return WaitReplyLocked(h.seq, static_cast<Op>(h.op), nullptr, 0, nullptr);
  }
  // Pageable destination: pipelined chunks through staging; the call returns when all arrived.
  struct Pending {
    uint32_t seq;
    uint64_t off, len, at;
  };
  std::deque<Pending> pending;
  auto* d = static_cast<uint8_t*>(dst);
  CUresult result = CUDA_SUCCESS;
  uint64_t sent = 0;
  while (sent < bytes || !pending.empty()) {
    if (sent < bytes && result == CUDA_SUCCESS) {
      const uint64_t n = std::min(kChunk, bytes - sent);
      const int64_t off = pending.size() < 24 ? StageAllocLocked(n) : -2;
      if (off == -1) return broken_;
      if (off >= 0) {
        MemcpyReq q{static_cast<uint64_t>(off), src + sent, n, stream};
        FrameHeader h = MakeHeader(Op::kMemcpyDtoH, sizeof q, true);
        StageTagLocked(h.seq, true);
        if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
        pending.push_back({h.seq, static_cast<uint64_t>(off), n, sent});
        sent += n;
        continue;
      }
    }
    if (pending.empty()) break;
    const Pending p = pending.front();
    pending.pop_front();
    CUresult r = WaitReplyLocked(p.seq, Op::kMemcpyDtoH, nullptr, 0, nullptr);
    if (r == CUDA_SUCCESS && result == CUDA_SUCCESS) std::memcpy(d + p.at, window_ + p.off, p.len);
    if (r != CUDA_SUCCESS && result == CUDA_SUCCESS) result = r;
    if (broken_ != CUDA_SUCCESS) return broken_;
    for (auto& e : stage_fifo_) {
      if (e.guest_owned && e.seq == p.seq) e.released = true;
    }
    ReclaimLocked();
    if (result != CUDA_SUCCESS) sent = bytes;  // stop issuing; drain what is in flight
  }
  return result;
}

CUresult Client::Copy2D(const CUDA_MEMCPY2D& c, uint64_t stream, bool async) noexcept {
  auto is_host = [](CUmemorytype t) { return t == CU_MEMORYTYPE_HOST; };
  if (c.srcMemoryType == CU_MEMORYTYPE_ARRAY || c.dstMemoryType == CU_MEMORYTYPE_ARRAY) {
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const uint64_t w = c.WidthInBytes, hgt = c.Height;
  if (w == 0 || hgt == 0) return CUDA_SUCCESS;
  if ((hgt > 1 && (c.srcPitch < w || c.dstPitch < w))) return CUDA_ERROR_INVALID_VALUE;
  const bool src_host = is_host(c.srcMemoryType), dst_host = is_host(c.dstMemoryType);
  const uint64_t src_dev = c.srcDevice + c.srcY * c.srcPitch + c.srcXInBytes;
  const uint64_t dst_dev = c.dstDevice + c.dstY * c.dstPitch + c.dstXInBytes;
  const auto* src_h = static_cast<const uint8_t*>(c.srcHost) + c.srcY * c.srcPitch + c.srcXInBytes;
  auto* dst_h = static_cast<uint8_t*>(c.dstHost) + c.dstY * c.dstPitch + c.dstXInBytes;
  if (src_host && dst_host) {
    for (uint64_t r = 0; r < hgt; ++r) std::memmove(dst_h + r * c.dstPitch, src_h + r * c.srcPitch, w);
    return CUDA_SUCCESS;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  if (!src_host && !dst_host) {
    Memcpy2DReq q{src_dev, c.srcPitch, dst_dev, c.dstPitch, w, hgt, stream, kSideDevice, kSideDevice};
    FrameHeader h = MakeHeader(Op::kMemcpy2D, sizeof q, false);
    return PushLocked(h, &q, sizeof q, nullptr, 0);
  }
  const CUresult r = StagedRowsLocked(
      Op::kMemcpy2D, w, hgt, src_host ? src_h : nullptr, c.srcPitch, src_host ? nullptr : dst_h, c.dstPitch,
      [&](uint64_t row, uint64_t rows, uint64_t off, uint8_t* req) {
        const Memcpy2DReq q =
            src_host
                ? Memcpy2DReq{off, w, dst_dev + row * c.dstPitch, c.dstPitch, w, rows, stream, kSideWindow, kSideDevice}
                : Memcpy2DReq{
                      src_dev + row * c.srcPitch, c.srcPitch, off, w, w, rows, stream, kSideDevice, kSideWindow};
        std::memcpy(req, &q, sizeof q);
        return static_cast<uint32_t>(sizeof q);
      });
  (void)async;  // host-side destinations are filled before returning, as for pageable memory
  return r;
}

CUresult Client::CopyArray(const CopySide& dst, const CopySide& src, uint64_t w, uint64_t hgt,
                           uint64_t stream) noexcept {
  if (w == 0 || hgt == 0) return CUDA_SUCCESS;
  // The request for rows [row, row + rows) with the window at `off` for the host side.
  auto request = [&](uint64_t row, uint64_t rows, uint64_t off) {
    ArrayCopyReq q{};
    auto fill = [&](const CopySide& c, uint64_t* at, uint64_t* pitch, uint64_t* x, uint64_t* y, uint64_t* z,
                    uint32_t* side) {
      *side = c.kind;
      if (c.kind == kSideArray) {
        *at = c.array;
        *x = c.x;
        *y = c.y + row;
        *z = c.z;
      } else if (c.kind == kSideWindow) {
        *at = off;
        *pitch = w;
      } else {
        *at = c.dptr + row * c.pitch;
        *pitch = c.pitch;
      }
    };
    fill(src, &q.src, &q.src_pitch, &q.src_x, &q.src_y, &q.src_z, &q.src_side);
    fill(dst, &q.dst, &q.dst_pitch, &q.dst_x, &q.dst_y, &q.dst_z, &q.dst_side);
    q.width_bytes = w;
    q.height = rows;
    q.stream = stream;
    return q;
  };
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  if (CUresult r = SyncContextLocked(); r != CUDA_SUCCESS) return r;
  const bool src_host = src.kind == kSideWindow, dst_host = dst.kind == kSideWindow;
  if (!src_host && !dst_host) {
    ArrayCopyReq q = request(0, hgt, 0);
    FrameHeader h = MakeHeader(Op::kMemcpyArray, sizeof q, false);
    return PushLocked(h, &q, sizeof q, nullptr, 0);
  }
  return StagedRowsLocked(Op::kMemcpyArray, w, hgt, src_host ? src.src : nullptr, src.pitch,
                          src_host ? nullptr : dst.dst, dst.pitch,
                          [&](uint64_t row, uint64_t rows, uint64_t off, uint8_t* req) {
                            const ArrayCopyReq q = request(row, rows, off);
                            std::memcpy(req, &q, sizeof q);
                            return static_cast<uint32_t>(sizeof q);
                          });
}

template <class Build>
CUresult Client::StagedRowsLocked(Op op, uint64_t w, uint64_t hgt, const uint8_t* src_h, uint64_t src_pitch,
                                  uint8_t* dst_h, uint64_t dst_pitch, Build build) noexcept {
  if (w > layout_.staging_bytes / 4) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t rows_per_chunk = std::max<uint64_t>(1, kChunk / w);
  for (uint64_t row = 0; row < hgt; row += rows_per_chunk) {
    const uint64_t rows = std::min(rows_per_chunk, hgt - row);
    const int64_t off = StageAllocLocked(rows * w);
    if (off < 0) return broken_ != CUDA_SUCCESS ? broken_ : CUDA_ERROR_UNKNOWN;
    static_assert(sizeof(Memcpy2DReq) <= kMaxStagedRequest && sizeof(ArrayCopyReq) <= kMaxStagedRequest);
    alignas(8) uint8_t req[kMaxStagedRequest];
    const uint32_t len = build(row, rows, static_cast<uint64_t>(off), req);
    if (src_h != nullptr) {
      for (uint64_t r = 0; r < rows; ++r) std::memcpy(window_ + off + r * w, src_h + (row + r) * src_pitch, w);
      FrameHeader h = MakeHeader(op, len, false);
      StageTagLocked(h.seq, false);
      if (CUresult r = PushLocked(h, req, len, nullptr, 0); r != CUDA_SUCCESS) return r;
    } else {
      FrameHeader h = MakeHeader(op, len, true);
      StageTagLocked(h.seq, true);
      if (CUresult r = PushLocked(h, req, len, nullptr, 0); r != CUDA_SUCCESS) return r;
      CUresult r = WaitReplyLocked(h.seq, op, nullptr, 0, nullptr);
      stage_fifo_.back().released = true;
      if (r != CUDA_SUCCESS) return r;
      for (uint64_t k = 0; k < rows; ++k) std::memcpy(dst_h + (row + k) * dst_pitch, window_ + off + k * w, w);
      ReclaimLocked();
    }
  }
  return CUDA_SUCCESS;
}

CUresult Client::UploadBlob(uint64_t hash_lo, uint64_t hash_hi, const uint8_t* data, uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_ != CUDA_SUCCESS) return broken_;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t n = std::min(kChunk, bytes - done);
    const int64_t off = StageAllocLocked(n);
    if (off < 0) return broken_ != CUDA_SUCCESS ? broken_ : CUDA_ERROR_UNKNOWN;
    std::memcpy(window_ + off, data + done, n);
    BlobPutReq q{hash_lo, hash_hi, bytes, done, static_cast<uint64_t>(off), n};
    FrameHeader h = MakeHeader(Op::kBlobPut, sizeof q, false);
    StageTagLocked(h.seq, false);
    if (CUresult r = PushLocked(h, &q, sizeof q, nullptr, 0); r != CUDA_SUCCESS) return r;
    done += n;
  }
  return CUDA_SUCCESS;
}

// ---- Pinned heap ---------------------------------------------------------------------------

void* Client::PinnedAlloc(uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr || bytes == 0) return nullptr;
  const int64_t off = PinnedAllocLocked((bytes + kPinnedAlign - 1) & ~(kPinnedAlign - 1), kPinnedAlign);
  return off < 0 ? nullptr : window_ + off;
}

int64_t Client::PinnedAllocLocked(uint64_t need, uint64_t align) noexcept {
  for (auto it = pinned_free_.begin(); it != pinned_free_.end(); ++it) {  // first fit
    const uint64_t start = it->first, size = it->second;
    const uint64_t at = (start + align - 1) & ~(align - 1);
    if (at - start > size || need > size - (at - start)) continue;
    pinned_free_.erase(it);
    if (at > start) pinned_free_[start] = at - start;
    if (at + need < start + size) pinned_free_[at + need] = start + size - (at + need);
    pinned_used_[at] = need;
    return static_cast<int64_t>(at);
  }
  return -1;
}

bool Client::PinnedFree(void* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr || static_cast<uint8_t*>(p) < window_) return false;
  return PinnedFreeLocked(static_cast<uint64_t>(static_cast<uint8_t*>(p) - window_));
}

bool Client::PinnedFreeLocked(uint64_t off) noexcept {
  auto it = pinned_used_.find(off);
  if (it == pinned_used_.end()) return false;
  uint64_t start = off, size = it->second;
  pinned_used_.erase(it);
  auto next = pinned_free_.lower_bound(start);
  if (next != pinned_free_.end() && start + size == next->first) {
    size += next->second;
    next = pinned_free_.erase(next);
  }
  if (next != pinned_free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      pinned_free_.erase(prev);
    }
  }
  pinned_free_[start] = size;
  return true;
}

bool Client::PinnedRange(const void* p, void** base, uint64_t* bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr) return false;
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < window_ || b >= window_ + layout_.window_bytes) return false;
  const auto off = static_cast<uint64_t>(b - window_);
  auto it = pinned_used_.upper_bound(off);
  if (it == pinned_used_.begin()) return false;
  --it;
  if (off >= it->first + it->second) return false;
  *base = window_ + it->first;
  *bytes = it->second;
  return true;
}

namespace {
// Whether [start, end) is covered by private anonymous mappings only (the heap, the stack, anonymous
// mmaps): the memory MapIntoWindow may move. A shared or file-backed mapping (another region, a
// mapped file) must keep being what it is. From /proc/self/maps (proc(5)).
bool AnonymousPrivate(uint64_t start, uint64_t end) noexcept {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  char line[512];
  uint64_t covered = start;
  bool ok = true;
  while (ok && covered < end && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long long lo = 0, hi = 0, offset = 0, inode = 0;
    char perms[8] = {}, dev[16] = {};
    int path_at = 0;
    if (std::sscanf(line, "%llx-%llx %7s %llx %15s %llu %n", &lo, &hi, perms, &offset, dev, &inode, &path_at) < 6)
      continue;
    if (hi <= covered || lo >= end) continue;
    const char* path = line + path_at;
    const bool special = path[0] == '[' && std::strncmp(path, "[heap]", 6) != 0 &&
                         std::strncmp(path, "[stack", 6) != 0 && std::strncmp(path, "[anon", 5) != 0;
    if (lo > covered || perms[3] != 'p' || inode != 0 || special) ok = false;
    covered = hi;
  }
  std::fclose(f);
  return ok && covered >= end;
}
}  // namespace

CUresult Client::MapIntoWindow(void* p, uint64_t bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (window_ == nullptr || network_ || region_ == nullptr) return CUDA_ERROR_NOT_SUPPORTED;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uint64_t start = a & ~(page - 1);
  uint64_t end = 0;
  if (__builtin_add_overflow(a, bytes, &end) || end > UINTPTR_MAX - page) return CUDA_ERROR_INVALID_VALUE;
  end = (end + page - 1) & ~(page - 1);
  const uint64_t len = end - start;
  if (!AnonymousPrivate(start, end)) {
    LogWarn(
        "cuMemHostRegister(DEVICEMAP): only private anonymous memory (heap, stack, anonymous mmap) can be "
        "mapped for the device; this range is shared or file-backed");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  const auto window_file = static_cast<uint64_t>(window_ - region_->data());
  if (window_file % page != 0) return CUDA_ERROR_NOT_SUPPORTED;
  for (const auto& [ptr, m] : window_mappings_) {
    if (m.page_start < end && start < m.page_start + m.len) return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  // A page-aligned block of the pinned heap.
  const int64_t at = PinnedAllocLocked(len, page);
  if (at < 0) {
    LogWarn("cuMemHostRegister(DEVICEMAP): " + std::to_string(len >> 10) +
            " KiB do not fit in the data window's pinned heap");
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const auto off = static_cast<uint64_t>(at);
  auto give_back = [&] { (void)PinnedFreeLocked(off); };
  std::memcpy(window_ + off, reinterpret_cast<void*>(start), len);
  const int fd = ::open(region_->path().c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    give_back();
    LogWarn("cuMemHostRegister(DEVICEMAP): cannot reopen " + region_->path());
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  void* m = ::mmap(reinterpret_cast<void*>(start), len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
                   static_cast<off_t>(window_file + off));
  ::close(fd);
  if (m == MAP_FAILED) {
    give_back();
    LogWarn("cuMemHostRegister(DEVICEMAP): mapping the window over the registered pages failed");
    return CUDA_ERROR_NOT_SUPPORTED;
  }
  window_mappings_[a] = WindowMapping{start, len, off};
  return CUDA_SUCCESS;
}

bool Client::UnmapFromWindow(void* p) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = window_mappings_.find(reinterpret_cast<uintptr_t>(p));
  if (it == window_mappings_.end()) return false;
  const WindowMapping w = it->second;
  window_mappings_.erase(it);
  // Private pages again, with the bytes they hold now (the window copy is the same memory).
  void* tmp = ::mmap(nullptr, w.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp != MAP_FAILED) {
    std::memcpy(tmp, window_ + w.off, w.len);
    // mremap moves the private copy over the shared pages atomically: no moment without memory.
    if (::mremap(tmp, w.len, w.len, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(w.page_start)) ==
        MAP_FAILED) {
      ::munmap(tmp, w.len);
      LogWarn("cuMemHostUnregister: the registered pages stay shared with the window");
      return true;  // the program's memory still holds its bytes; the heap block stays taken
    }
  } else {
    LogWarn("cuMemHostUnregister: the registered pages stay shared with the window");
    return true;
  }
  (void)PinnedFreeLocked(w.off);
  return true;
}

void* Client::WindowAlias(const void* p, void** base, uint64_t* bytes) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  const auto a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [ptr, m] : window_mappings_) {
    if (a >= m.page_start && a < m.page_start + m.len) {
      *base = window_ + m.off;
      *bytes = m.len;
      return window_ + m.off + (a - m.page_start);
    }
  }
  return nullptr;
}

int64_t Client::WindowOffset(const void* p, uint64_t bytes) const noexcept {
  if (window_ == nullptr) return -1;
  const auto* b = static_cast<const uint8_t*>(p);
  const uint8_t* heap = window_ + layout_.staging_bytes;
  const uint8_t* end = window_ + layout_.window_bytes;
  if (b < heap || b >= end || bytes > static_cast<uint64_t>(end - b)) return -1;
  return b - window_;
}

}  // namespace orion::guest

namespace orion::guest {

bool Client::PrivateWindowLocked() noexcept {
  const uint64_t bytes = layout_.window_bytes;
  void* copy = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) return false;
  std::memcpy(copy, window_, bytes);
  // Atomically over the region's pages: no moment where the window's addresses are unmapped.
  if (mremap(copy, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, window_) == MAP_FAILED) {
    const int e = errno;
    munmap(copy, bytes);
    errno = e;
    return false;
  }
  return true;
}

bool Client::SharedWindowLocked() noexcept {
  const uint64_t bytes = layout_.window_bytes;
  const auto file_offset = static_cast<off_t>(window_ - region_->data());
  const int fd = ::open(region_->path().c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return false;
  void* shared = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, file_offset);
  const int e = errno;
  ::close(fd);
  if (shared == MAP_FAILED) {
    errno = e;
    return false;
  }
  std::memcpy(shared, window_, bytes);
  if (mremap(shared, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, window_) == MAP_FAILED) {
    const int e2 = errno;
    munmap(shared, bytes);
    errno = e2;
    return false;
  }
  return true;
}

}  // namespace orion::guest
