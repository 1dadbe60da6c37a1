// snapshot_chunks.cpp — device memory in a snapshot, a chunk at a time: raw, all zero, or lz4 where
// that pays (snapshot_chunks.h).
#include "snapshot_chunks.h"

#include <lz4.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace orion::host::detail {
namespace {

constexpr uint32_t kSample = 64 << 10;       // bytes lz4 tries first, to judge a chunk
constexpr uint32_t kTimedWrite = 256 << 10;  // writes this large say how fast the stream is
constexpr double kFirstRatio = 0.5;          // before the stream was timed: compress what halves

double NsSince(std::chrono::steady_clock::time_point t0) {
  return static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
}

// A moving estimate: the new measurement weighs half.
void Blend(double* estimate, double measured) { *estimate = *estimate == 0 ? measured : (*estimate + measured) / 2; }

bool ChunkFail(std::string* why, std::string msg) {
  *why = std::move(msg);
  return false;
}

}  // namespace

bool AllZero(const uint8_t* p, size_t n) {
  constexpr size_t kHead = 16;
  if (n <= kHead) return std::all_of(p, p + n, [](uint8_t b) { return b == 0; });
  uint8_t head[kHead] = {};
  // The first 16 bytes are zero and every byte equals the one 16 before it: memcmp's speed, and
  // it stops at the first difference (random memory costs almost nothing to judge).
  return std::memcmp(p, head, kHead) == 0 && std::memcmp(p, p + kHead, n - kHead) == 0;
}

bool ChunkEncoder::Pays(double ratio, double ns_per_byte) const {
  if (stream_ns_per_byte_ == 0) return ratio <= kFirstRatio;
  return (1 - ratio) * stream_ns_per_byte_ > ns_per_byte;
}

bool ChunkEncoder::Put(ChunkForm form, const void* stored, uint32_t bytes) {
  ChunkCounts& c = out_.chunks;
  ++(form == ChunkForm::kRaw ? c.raw : form == ChunkForm::kZero ? c.zero : c.lz4);
  c.stored += sizeof(ChunkHead) + bytes;
  const ChunkHead h{static_cast<uint32_t>(form), bytes};
  if (!out_.Write(&h, sizeof h)) return false;
  if (bytes == 0) return true;
  const auto t0 = std::chrono::steady_clock::now();
  if (!out_.Write(stored, bytes)) return false;
  if (bytes >= kTimedWrite) Blend(&stream_ns_per_byte_, NsSince(t0) / bytes);
  return true;
}

bool ChunkEncoder::Write(const uint8_t* data, uint32_t n) {
  out_.chunks.memory += n;
  if (out_.compression == Compression::kOff) return Put(ChunkForm::kRaw, data, n);
  if (AllZero(data, n)) return Put(ChunkForm::kZero, nullptr, 0);
  if (n < 2) return Put(ChunkForm::kRaw, data, n);
  const auto* src = reinterpret_cast<const char*>(data);
  packed_.resize(std::max<size_t>(static_cast<size_t>(LZ4_compressBound(static_cast<int>(kSample))), n));
  auto* dst = reinterpret_cast<char*>(packed_.data());
  bool compress = out_.compression == Compression::kAlways;
  if (!compress) {
    const uint32_t sample = std::min(n, kSample);
    const auto t0 = std::chrono::steady_clock::now();
    const int got = LZ4_compress_default(src, dst, static_cast<int>(sample), static_cast<int>(packed_.size()));
    const double ns = NsSince(t0) / sample;
    if (got <= 0) return Put(ChunkForm::kRaw, data, n);
    compress = Pays(static_cast<double>(got) / sample, lz4_ns_per_byte_ == 0 ? ns : lz4_ns_per_byte_);
  }
  if (!compress) return Put(ChunkForm::kRaw, data, n);
  const auto t0 = std::chrono::steady_clock::now();
  // At most n - 1 bytes, or lz4 gives up (0) and the chunk goes as it is.
  const int got = LZ4_compress_default(src, dst, static_cast<int>(n), static_cast<int>(n - 1));
  Blend(&lz4_ns_per_byte_, NsSince(t0) / n);
  if (got <= 0) return Put(ChunkForm::kRaw, data, n);
  return Put(ChunkForm::kLz4, dst, static_cast<uint32_t>(got));
}

bool ReadChunk(SnapshotReader& in, uint8_t* dst, uint32_t n, std::vector<uint8_t>* scratch, std::string* why) {
  const std::string ended = "the snapshot ended inside device memory";
  ChunkHead h{};
  if (!in.Read(&h, sizeof h)) return ChunkFail(why, ended);
  const std::string sizes = std::to_string(h.stored) + " bytes for a chunk of " + std::to_string(n);
  switch (static_cast<ChunkForm>(h.form)) {
    case ChunkForm::kRaw:
      if (h.stored != n) return ChunkFail(why, "a raw chunk of device memory stores " + sizes);
      return in.Read(dst, n) || ChunkFail(why, ended);
    case ChunkForm::kZero:
      if (h.stored != 0) return ChunkFail(why, "a zero chunk of device memory stores " + sizes);
      if (!AllZero(dst, n)) std::memset(dst, 0, n);  // fresh memory is zero already: left untouched
      return true;
    case ChunkForm::kLz4: {
      if (h.stored == 0 || h.stored >= n) return ChunkFail(why, "a compressed chunk of device memory stores " + sizes);
      if (scratch->size() < h.stored) scratch->resize(h.stored);
      if (!in.Read(scratch->data(), h.stored)) return ChunkFail(why, ended);
      const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(scratch->data()), reinterpret_cast<char*>(dst),
                                          static_cast<int>(h.stored), static_cast<int>(n));
      if (got != static_cast<int>(n))
        return ChunkFail(why,
                         "a compressed chunk of device memory does not decode to its " + std::to_string(n) + " bytes");
      return true;
    }
  }
  return ChunkFail(why, "a chunk of device memory in a form that does not exist (" + std::to_string(h.form) + ")");
}

}  // namespace orion::host::detail
