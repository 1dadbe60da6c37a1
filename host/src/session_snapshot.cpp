// session_snapshot.cpp — a session's state as a stream of records, and a session made again from
// one: the first step of live migration (issue #24; docs/design/migration.md, "The order to build
// it in", step 1). Session::Snapshot and Session::Restore (session_impl.h).
//
// The stream: a sequence of records, each a RecordHead, then `meta` bytes (a fixed struct of its
// kind, then names, images, attribute lists), then `contents` bytes of device memory, as chunks of
// 4 MiB, each raw, all zero, or lz4-compressed (snapshot_chunks.h; never held whole). Snapshot writes them in
// dependency order: the header, contexts, device allocations, VMM reservations, physical allocations, mappings,
// modules, their variables, functions, module-variable table entries, streams, events, launch scratch, the end. Restore
// checks each as hostile input: sizes against its kind, handles against the header and its own
// tables, devices against its placements, memory against its quota.
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "session_impl.h"
#include "snapshot_chunks.h"

namespace orion::host::detail {
namespace {

constexpr char kMagic[8] = {'O', 'R', 'I', 'O', 'N', 'S', 'N', 'P'};
constexpr uint32_t kVersion = 2;  // 2: device memory in chunks, raw, zero or lz4 (snapshot_chunks.h)
constexpr uint64_t kChunk = kSnapshotChunk;
constexpr uint64_t kAheadChunks = 4;    // allocations of this many chunks or more are committed ahead (ReadContents)
constexpr int kMadvPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14; glibc 2.36 names it)
constexpr uint64_t kMaxMeta = fatbin::kMaxDecompressedBytes + (uint64_t{1} << 20);
constexpr uint32_t kMaxName = 4 * kNameLen;

enum RecKind : uint32_t {
  kRecHeader = 1,
  kRecContext,
  kRecAlloc,
  kRecReservation,
  kRecPhysical,
  kRecMapping,
  kRecModule,
  kRecGlobal,
  kRecFunction,
  kRecStream,
  kRecEvent,
  kRecScratch,
  kRecEnd,
  kRecMipmap,     // 14: a mipmapped array, its level handles, the bytes of every level
  kRecArray,      // 15: a CUDA array that is no level, and its bytes
  kRecTexObject,  // 16: a texture or surface object, as the client asked for it
  kRecManifest,   // 17: before the header, sent when the move is asked for: the allocations to prepare
};

struct RecordHead {
  uint32_t kind;
  uint32_t flags;     // 0 (reserved)
  uint64_t meta;      // bytes of the record's struct and its variable parts
  uint64_t contents;  // bytes of device memory after them (as chunks: snapshot_chunks.h)
};
// A CUDA array (kRecArray) or mipmapped array (kRecMipmap, then `desc.levels` uint64 level handles,
// 0 for a level never asked for), as created; `destroyed`: destroyed by the program, alive for the
// texture or surface objects that use it.
struct ArrayObjRec {
  uint64_t id;
  uint32_t dev, destroyed;
  ArrayCreateReq desc;
};
struct MipmapObjRec {
  uint64_t id;
  uint32_t dev, destroyed;
  MipmapCreateReq desc;
};
struct TexObjRec {
  uint64_t object;
  uint32_t dev, surface;
  TexObjectReq req;
};
// One allocation of the manifest: the target allocates and commits it while the program still
// runs at the source (the restore then fills it); `pad` 0.
struct ManifestEntry {
  uint64_t addr, bytes;
  uint32_t dev, pad;
};
struct HeaderRec {
  char magic[8];
  uint32_t version;
  uint32_t devices;
  char backend[8];  // Backend::name()
  uint64_t next_handle, next_physical, cur_ctx;
  uint32_t cur_dev, pad;
  int64_t realtime_ns;  // CLOCK_REALTIME at the snapshot: the move's gap, for event timing
};
struct ContextRec {
  uint64_t id;
  uint32_t dev, flags, primary, limits;  // then `limits` LimitRec
};
struct LimitRec {
  uint32_t limit, pad;
  uint64_t value;
};
struct AllocRec {
  uint64_t addr, bytes;
  uint32_t dev;
  uint32_t counted;  // 1: device memory (contents follow); 0: a module variable's table entry
};
struct ReservationRec {
  uint64_t addr, bytes;
};
struct PhysicalRec {
  uint64_t id, handle, bytes;  // handle: 0 once released
  uint32_t dev, released;
};
struct MappingRec {
  uint64_t addr, bytes, physical, offset;
  uint32_t accessible, access_dev, access_flags, pad;  // contents follow when accessible
};
struct ModuleRec {
  uint64_t id, ctx, hash_lo, hash_hi, image_bytes;  // then the image
};
struct GlobalRec {
  uint64_t module, addr, bytes;
  uint32_t name_len, pad;  // then the name; `bytes` of contents follow
};
struct FunctionRec {
  uint64_t id, module;
  uint32_t name_len, attrs;  // then the name, then `attrs` AttrRec
};
struct AttrRec {
  int32_t attr, value;
};
struct StreamRec {
  uint64_t id, ctx;
  uint32_t flags;
  int32_t priority;
  uint32_t attrs, pad;  // then `attrs` StreamAttrRec
};
struct StreamAttrRec {
  uint32_t attr, pad;
  uint8_t value[64];
};
struct EventRec {
  uint64_t id, ctx;
  uint32_t flags;
  int32_t timing;  // CUresult of cuEventElapsedTime(event, the snapshot's mark)
  double ms_before;
};
struct ScratchRec {
  uint32_t dev, pad;
  uint64_t bytes;
};

template <typename T>
void Append(std::vector<uint8_t>* v, const T& x) {
  const auto* b = reinterpret_cast<const uint8_t*>(&x);
  v->insert(v->end(), b, b + sizeof x);
}
void AppendBytes(std::vector<uint8_t>* v, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  v->insert(v->end(), b, b + n);
}

bool WriteRecord(SnapshotWriter& out, uint32_t kind, const std::vector<uint8_t>& meta, uint64_t contents) {
  const RecordHead h{kind, 0, meta.size(), contents};
  return out.Write(&h, sizeof h) && (meta.empty() || out.Write(meta.data(), meta.size()));
}

// Reads a record's meta: a T, then what follows it.
class Cursor {
 public:
  explicit Cursor(std::span<const uint8_t> b) : b_(b) {}
  template <typename T>
  bool Get(T* x) {
    if (sizeof(T) > b_.size() - at_) return false;
    std::memcpy(x, b_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(size_t n, std::span<const uint8_t>* out) {
    if (n > b_.size() - at_) return false;
    *out = b_.subspan(at_, n);
    at_ += n;
    return true;
  }
  bool Name(uint32_t len, std::string* out) {
    std::span<const uint8_t> s;
    if (len == 0 || len > kMaxName || !Bytes(len, &s)) return false;
    out->assign(reinterpret_cast<const char*>(s.data()), s.size());
    return out->find('\0') == std::string::npos;
  }
  bool Done() const { return at_ == b_.size(); }

 private:
  std::span<const uint8_t> b_;
  size_t at_ = 0;
};

int64_t RealtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

std::string Hex(uint64_t v) { return fmt::format("{:#x}", v); }

bool Fail(std::string* why, std::string msg) {
  *why = std::move(msg);
  return false;
}

}  // namespace

// ---- Snapshot ----

bool Session::CanMove(std::string* why) {
  if (!ipc_exports_.empty() || !ipc_imports_.empty() || !ipc_event_exports_.empty() || !lingering_.empty() ||
      !adopted_.empty())
    return Fail(why, "it shares memory or events with another process through CUDA IPC");
  for (const auto& [addr, a] : allocs_) {
    if (a.window) return Fail(why, "it maps host memory for the device, which stays with this host");
  }
  // A physical allocation's bytes are read through its accessible mappings: all of them must be.
  for (auto& [pid, ph] : physicals_) {
    std::map<uint64_t, uint64_t> shown;  // offset -> end
    for (const auto& [addr, m] : mappings_) {
      if (m.physical == pid && m.accessible) shown[m.offset] = std::max(shown[m.offset], m.offset + m.bytes);
    }
    uint64_t covered = 0;
    for (const auto& [off, end] : shown) {
      if (off > covered) break;
      covered = std::max(covered, end);
    }
    if (covered < ph.bytes)
      return Fail(why,
                  "a physical allocation (cuMemCreate) has bytes no accessible mapping shows, so they cannot be read");
  }
  return true;
}

bool Session::Snapshot(SnapshotWriter& out, std::string* why) {
  if (!CanMove(why)) return false;
  // Drain: every context's work completes here, so nothing in flight is lost or done twice; then
  // a mark per context, against which each event's time is taken.
  std::map<uint64_t, void*> marks;  // context -> its mark event
  bool ok = true;
  for (auto& [id, o] : handles_) {
    if (o.kind != Kind::kCtx) continue;
    void* mark = nullptr;
    CUresult r = b_->SetCurrent(o.backend);
    if (r == CUDA_SUCCESS) r = b_->CtxSynchronize();
    if (r == CUDA_SUCCESS) r = b_->EventCreate(CU_EVENT_DEFAULT, &mark);
    if (r == CUDA_SUCCESS) marks[id] = mark;
    if (r == CUDA_SUCCESS) r = b_->EventRecord(mark, nullptr);
    if (r == CUDA_SUCCESS) r = b_->EventSynchronize(mark);
    if (r != CUDA_SUCCESS) {
      ok = Fail(why, "its context " + std::to_string(id) + " has an error pending (" + std::to_string(r) + ")");
      break;
    }
  }
  if (ok) ok = SnapshotBody(out, marks, why);
  for (auto& [ctx, mark] : marks) {
    if (Obj* c = Find(ctx, Kind::kCtx); c != nullptr && b_->SetCurrent(c->backend) == CUDA_SUCCESS)
      (void)b_->EventDestroy(mark);
  }
  if (Obj* cur = Find(cur_ctx_, Kind::kCtx); cur != nullptr) (void)b_->SetCurrent(cur->backend);
  return ok;
}

bool Session::SnapshotBody(SnapshotWriter& out, const std::map<uint64_t, void*>& marks, std::string* why) {
  const std::string broken = "the stream to the target broke";
  std::vector<uint8_t> meta;
  HeaderRec hr{};
  std::memcpy(hr.magic, kMagic, sizeof kMagic);
  hr.version = kVersion;
  hr.devices = static_cast<uint32_t>(p_.placements.size());
  std::snprintf(hr.backend, sizeof hr.backend, "%s", b_->name());
  hr.next_handle = next_handle_;
  hr.next_physical = next_physical_;
  hr.cur_ctx = cur_ctx_;
  hr.cur_dev = cur_dev_;
  hr.realtime_ns = RealtimeNs();
  Append(&meta, hr);
  if (!WriteRecord(out, kRecHeader, meta, 0)) return Fail(why, broken);
  // Contexts first (everything else names one), primary contexts before created ones.
  for (int primary = 1; primary >= 0; --primary) {
    for (auto& [id, o] : handles_) {
      if (o.kind != Kind::kCtx || o.primary != (primary == 1)) continue;
      meta.clear();
      const auto lim = ctx_limits_.find(id);
      const uint32_t n = lim == ctx_limits_.end() ? 0 : static_cast<uint32_t>(lim->second.size());
      Append(&meta, ContextRec{id, o.dev, o.flags, o.primary ? 1u : 0u, n});
      if (n != 0) {
        for (const auto& [limit, value] : lim->second) Append(&meta, LimitRec{limit, 0, value});
      }
      if (!WriteRecord(out, kRecContext, meta, 0)) return Fail(why, broken);
    }
  }
  if (!SnapshotMemory(out, why) || !SnapshotModules(out, why) || !SnapshotArrays(out, why)) return false;
  for (auto& [id, o] : handles_) {
    if (o.kind == Kind::kStream) {
      meta.clear();
      std::vector<StreamAttrRec> attrs;
      for (const auto& [key, value] : stream_attrs_) {
        if (key.first != id) continue;
        StreamAttrRec a{key.second, 0, {}};
        std::memcpy(a.value, value.data(), std::min(value.size(), sizeof a.value));
        attrs.push_back(a);
      }
      Append(&meta, StreamRec{id, o.owner, o.flags, o.priority, static_cast<uint32_t>(attrs.size()), 0});
      for (const StreamAttrRec& a : attrs) Append(&meta, a);
      if (!WriteRecord(out, kRecStream, meta, 0)) return Fail(why, broken);
    } else if (o.kind == Kind::kEvent) {
      EventRec e{id, o.owner, o.flags, CUDA_ERROR_INVALID_CONTEXT, 0};
      if (auto moved = moved_events_.find(id); moved != moved_events_.end()) {
        // Moved here before and not recorded since: its time is relative to the mark of this move.
        float since = 0;
        auto mark = marks.find(o.owner);
        const CUresult r =
            mark == marks.end() ? CUDA_ERROR_INVALID_CONTEXT : b_->EventElapsedTime(moved_base_, mark->second, &since);
        e.timing = moved->second.timing != CUDA_SUCCESS ? moved->second.timing : r;
        e.ms_before = moved->second.ms_before + moved_gap_ms_ + since;
      } else if (auto mark = marks.find(o.owner); mark != marks.end()) {
        float ms = 0;
        e.timing = b_->EventElapsedTime(o.backend, mark->second, &ms);
        e.ms_before = ms;
      }
      meta.clear();
      Append(&meta, e);
      if (!WriteRecord(out, kRecEvent, meta, 0)) return Fail(why, broken);
    }
  }
  for (uint32_t d = 0; d < scratch_.size(); ++d) {
    if (scratch_[d] == 0) continue;
    meta.clear();
    Append(&meta, ScratchRec{d, 0, scratch_[d]});
    if (!WriteRecord(out, kRecScratch, meta, 0)) return Fail(why, broken);
  }
  meta.clear();
  return WriteRecord(out, kRecEnd, meta, 0) || Fail(why, broken);
}

namespace {

// Device memory [addr, addr+bytes) into `enc`, a chunk at a time: from the memory itself where the
// backend's is the host's (sim), else through `buf`.
bool WriteContents(Backend& b, ChunkEncoder& enc, uint64_t addr, uint64_t bytes, std::vector<uint8_t>* buf,
                   std::string* why) {
  if (const uint8_t* host = bytes != 0 ? b.HostView(addr, bytes) : nullptr; host != nullptr) {
    for (uint64_t off = 0; off < bytes; off += kChunk) {
      if (!enc.Write(host + off, static_cast<uint32_t>(std::min(kChunk, bytes - off))))
        return Fail(why, "the stream to the target broke");
    }
    return true;
  }
  buf->resize(std::min(bytes, kChunk));
  for (uint64_t off = 0; off < bytes; off += kChunk) {
    const uint64_t n = std::min(kChunk, bytes - off);
    if (const CUresult r = b.MemcpyDtoH(buf->data(), addr + off, n, nullptr, false); r != CUDA_SUCCESS)
      return Fail(why, "reading device memory failed (" + std::to_string(r) + ")");
    if (!enc.Write(buf->data(), static_cast<uint32_t>(n))) return Fail(why, "the stream to the target broke");
  }
  return true;
}

}  // namespace

bool Session::SnapshotMemory(SnapshotWriter& out, std::string* why) {
  const std::string broken = "the stream to the target broke";
  std::vector<uint8_t> meta, buf;
  ChunkEncoder enc(out);
  for (const auto& [addr, a] : allocs_) {
    if (!a.counted || a.vmm) continue;  // module variables go with their module; VMM with its mapping
    meta.clear();
    Append(&meta, AllocRec{addr, a.bytes, a.dev, 1});
    if (!WriteRecord(out, kRecAlloc, meta, a.bytes) || !WriteContents(*b_, enc, addr, a.bytes, &buf, why))
      return why->empty() ? Fail(why, broken) : false;
  }
  for (const auto& [addr, r] : reservations_) {
    meta.clear();
    Append(&meta, ReservationRec{addr, r.bytes});
    if (!WriteRecord(out, kRecReservation, meta, 0)) return Fail(why, broken);
  }
  for (auto& [pid, ph] : physicals_) {
    uint64_t handle = 0;
    if (!ph.released) {
      for (auto& [id, o] : handles_) {
        if (o.kind == Kind::kMemHandle && o.owner == pid) handle = id;
      }
    }
    meta.clear();
    Append(&meta, PhysicalRec{pid, handle, ph.bytes, ph.dev, ph.released ? 1u : 0u});
    if (!WriteRecord(out, kRecPhysical, meta, 0)) return Fail(why, broken);
  }
  for (const auto& [addr, m] : mappings_) {
    meta.clear();
    Append(&meta,
           MappingRec{addr, m.bytes, m.physical, m.offset, m.accessible ? 1u : 0u, m.access_dev, m.access_flags, 0});
    const uint64_t contents = m.accessible ? m.bytes : 0;
    if (!WriteRecord(out, kRecMapping, meta, contents)) return Fail(why, broken);
    if (contents != 0 && !WriteContents(*b_, enc, addr, contents, &buf, why)) return false;
  }
  return true;
}

bool Session::SnapshotModules(SnapshotWriter& out, std::string* why) {
  const std::string broken = "the stream to the target broke";
  std::vector<uint8_t> meta, buf;
  ChunkEncoder enc(out);
  for (auto& [id, o] : handles_) {
    if (o.kind != Kind::kModule) continue;
    const std::vector<uint8_t>* img = images_.Find(o.hash_lo, o.hash_hi, o.image_bytes);
    if (img == nullptr)
      return Fail(why, "the image of module " + std::to_string(id) + " (" + ModuleImages::Hex(o.hash_lo, o.hash_hi) +
                           ") is no longer in the module cache");
    std::vector<Backend::ModuleGlobal> globals;
    if (const CUresult r = b_->ModuleGlobals(o.backend, &globals); r != CUDA_SUCCESS)
      return Fail(why, std::string("the ") + b_->name() + " backend cannot list a module's variables (" +
                           std::to_string(r) + ")");
    meta.clear();
    Append(&meta, ModuleRec{id, o.owner, o.hash_lo, o.hash_hi, img->size()});
    AppendBytes(&meta, img->data(), img->size());
    if (!WriteRecord(out, kRecModule, meta, 0)) return Fail(why, broken);
    for (const Backend::ModuleGlobal& g : globals) {
      meta.clear();
      Append(&meta, GlobalRec{id, g.addr, g.bytes, static_cast<uint32_t>(g.name.size()), 0});
      AppendBytes(&meta, g.name.data(), g.name.size());
      if (!WriteRecord(out, kRecGlobal, meta, g.bytes)) return Fail(why, broken);
      if (!WriteContents(*b_, enc, g.addr, g.bytes, &buf, why)) return false;
    }
  }
  for (auto& [id, o] : handles_) {
    if (o.kind != Kind::kFunction) continue;
    meta.clear();
    const auto attrs = func_attrs_.find(id);
    const uint32_t n = attrs == func_attrs_.end() ? 0 : static_cast<uint32_t>(attrs->second.size());
    Append(&meta, FunctionRec{id, o.owner, static_cast<uint32_t>(o.name.size()), n});
    AppendBytes(&meta, o.name.data(), o.name.size());
    if (n != 0) {
      for (const auto& [attr, value] : attrs->second) Append(&meta, AttrRec{attr, value});
    }
    if (!WriteRecord(out, kRecFunction, meta, 0)) return Fail(why, broken);
  }
  // The table entries cuModuleGetGlobal made (the program may copy to and from those ranges).
  for (const auto& [addr, a] : allocs_) {
    if (a.counted || a.vmm || a.window) continue;
    meta.clear();
    Append(&meta, AllocRec{addr, a.bytes, a.dev, 0});
    if (!WriteRecord(out, kRecAlloc, meta, 0)) return Fail(why, broken);
  }
  return true;
}

// ---- Restore ----

bool Session::Restore(SnapshotReader& in, std::string* why) {
  if (handles_.size() != 0 || !allocs_.empty() || !reservations_.empty() || physicals_.size() != 0 ||
      arrays_.size() != 0 || mipmaps_.size() != 0 || texobjs_.size() != 0)
    return Fail(why, "the session restored into is not empty");
  std::vector<uint8_t> meta;
  for (;;) {
    RecordHead h{};
    if (!in.Read(&h, sizeof h)) return Fail(why, "the snapshot ended before its end record");
    if (h.flags != 0 || h.meta > kMaxMeta) return Fail(why, "a record's head is malformed");
    if (!restore_header_ && h.kind != kRecHeader && !(h.kind == kRecManifest && !restore_prepared_))
      return Fail(why, "the snapshot does not start with its header");
    meta.resize(h.meta);
    if (!in.Read(meta.data(), meta.size())) return Fail(why, "the snapshot ended inside a record");
    if (h.kind == kRecManifest && !restore_header_ && !restore_prepared_ && h.contents == 0) {
      // Sent when the move was asked for: prepared while the program still runs at the source,
      // then the rest of the snapshot comes at the call where it moves.
      restore_prepared_ = true;
      if (!PrepareManifest(meta, why)) return false;
      if (!in.Prepared()) return Fail(why, "the source went away while its move was prepared");
      continue;
    }
    if (h.kind == kRecEnd) {
      if (!meta.empty()) return Fail(why, "the end record is malformed");
      break;
    }
    if (!RestoreRecord(h.kind, meta, h.contents, in, why)) return false;
  }
  ReleasePrepared(0, UINT64_MAX);  // prepared for allocations the program freed since the manifest
  // Arrays the program destroyed live on for their texture and surface objects (made again above
  // while the arrays were live), as at the source.
  for (const auto& [id, mipmap] : restore_destroyed_) {
    if (mipmap) {
      if (MipmapRec* m = mipmaps_.Find(id); m != nullptr) m->destroyed = true;
      MaybeFreeMipmap(id);
    } else {
      if (ArrayRec* a = arrays_.Find(id); a != nullptr) a->destroyed = true;
      MaybeFreeArray(id);
    }
  }
  // A released physical allocation lives for its mappings (they followed it in the snapshot).
  for (auto& [pid, ph] : physicals_) {
    if (!ph.released) continue;
    if (ph.mappings == 0 || b_->MemRelease(ph.backend) != CUDA_SUCCESS)
      return Fail(why, "a released physical allocation is not mapped");
  }
  // The session as it was: its current context, the handle counter beyond every restored handle.
  next_handle_ = std::max(next_handle_, restore_next_handle_);
  cur_ctx_ = restore_cur_ctx_;
  cur_dev_ = restore_cur_dev_;
  if (cur_ctx_ != 0) {
    Obj* cur = Find(cur_ctx_, Kind::kCtx);
    if (cur == nullptr || cur->dev != cur_dev_) return Fail(why, "the current context is not one of the session's");
    if (b_->SetCurrent(cur->backend) != CUDA_SUCCESS) return Fail(why, "making the current context current failed");
  }
  // A mark for the events that moved (cuEventElapsedTime against ones recorded from now on).
  if (!moved_events_.empty() && cur_ctx_ != 0) {
    if (b_->EventCreate(CU_EVENT_DEFAULT, &moved_base_) != CUDA_SUCCESS ||
        b_->EventRecord(moved_base_, nullptr) != CUDA_SUCCESS)
      return Fail(why, "recording the move's mark event failed");
  }
  return true;
}

bool Session::UseContextOf(uint64_t ctx, std::string* why) {
  Obj* c = Find(ctx, Kind::kCtx);
  if (c == nullptr) return Fail(why, "a record names a context the snapshot has not given");
  if (b_->SetCurrent(c->backend) != CUDA_SUCCESS) return Fail(why, "making a context current failed");
  cur_dev_ = c->dev;
  return true;
}

bool Session::RestoreRecord(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                            std::string* why) {
  Cursor cur(body);
  // Device memory follows only the records that carry it, and exactly as much as they say.
  const bool takes_contents =
      kind == kRecAlloc || kind == kRecMapping || kind == kRecGlobal || kind == kRecArray || kind == kRecMipmap;
  if (contents != 0 && !takes_contents) return Fail(why, "a record carries memory its kind has none of");
  switch (kind) {
    case kRecHeader: {
      HeaderRec hr{};
      if (restore_header_ || !cur.Get(&hr) || !cur.Done() || std::memcmp(hr.magic, kMagic, sizeof kMagic) != 0)
        return Fail(why, "the snapshot's header is malformed");
      if (hr.version != kVersion)
        return Fail(why,
                    "the snapshot's version " + std::to_string(hr.version) + " is not " + std::to_string(kVersion));
      char mine[sizeof hr.backend] = {};
      std::snprintf(mine, sizeof mine, "%s", b_->name());
      if (std::memcmp(hr.backend, mine, sizeof mine) != 0) {
        hr.backend[sizeof hr.backend - 1] = '\0';
        return Fail(why, "the snapshot is of a " + LogSafe(hr.backend) + " session, and this backend is " + b_->name());
      }
      if (hr.devices != p_.placements.size())
        return Fail(why, "the snapshot's session has " + std::to_string(hr.devices) + " devices, this one " +
                             std::to_string(p_.placements.size()));
      if (hr.next_handle > (uint64_t{1} << 62) || hr.next_handle % 0x10 != 0 || hr.next_physical == 0 ||
          hr.next_physical > (uint64_t{1} << 62) || hr.cur_dev >= hr.devices || hr.pad != 0)
        return Fail(why, "the snapshot's header is malformed");
      restore_header_ = true;
      restore_next_handle_ = hr.next_handle;
      next_physical_ = hr.next_physical;
      restore_cur_ctx_ = hr.cur_ctx;
      restore_cur_dev_ = hr.cur_dev;
      // The move's gap by the two hosts' clocks: none when the source's is ahead (or the stamp is
      // no time at all: hostile input, and no subtraction may overflow).
      const int64_t now_ns = RealtimeNs();
      moved_gap_ms_ =
          hr.realtime_ns > 0 && hr.realtime_ns < now_ns ? static_cast<double>(now_ns - hr.realtime_ns) / 1e6 : 0;
      return true;
    }
    case kRecContext: {
      ContextRec c{};
      if (!cur.Get(&c) || c.dev >= p_.placements.size() || c.limits > 64 || c.primary > 1 ||
          (c.primary == 1 ? c.flags != 0 : (c.flags & ~uint32_t{CU_CTX_FLAGS_MASK}) != 0))
        return Fail(why, "a context record is malformed");
      void* ctx = nullptr;
      const CUresult r = c.primary != 0 ? b_->PrimaryCtxRetain(c.dev, &ctx) : b_->CtxCreate(c.dev, c.flags, &ctx);
      if (r != CUDA_SUCCESS) return Fail(why, "creating a context failed (" + std::to_string(r) + ")");
      Obj o{Kind::kCtx, ctx, c.dev, 0, {}};
      o.flags = c.flags;
      o.primary = c.primary != 0;
      if (c.id % 0x10 != 0 || c.id >= restore_next_handle_ || HandlesFull() || !handles_.Add(c.id, std::move(o)))
        return Fail(why, "a context's handle is malformed or taken");
      if (c.primary != 0) primary_ids_[ctx] = c.id;
      if (b_->SetCurrent(ctx) != CUDA_SUCCESS) return Fail(why, "making a context current failed");
      for (uint32_t i = 0; i < c.limits; ++i) {
        LimitRec l{};
        if (!cur.Get(&l) || l.pad != 0) return Fail(why, "a context record is malformed");
        if (b_->CtxSetLimit(l.limit, l.value) != CUDA_SUCCESS) return Fail(why, "setting a context limit failed");
        ctx_limits_[c.id][l.limit] = l.value;
      }
      return cur.Done() || Fail(why, "a context record is malformed");
    }
    case kRecAlloc: return RestoreAlloc(body, contents, in, why);
    case kRecReservation:
    case kRecPhysical:
    case kRecMapping: return RestoreVmm(kind, body, contents, in, why);
    case kRecModule:
    case kRecGlobal:
    case kRecFunction: return RestoreModule(kind, body, contents, in, why);
    case kRecStream:
    case kRecEvent:
    case kRecScratch: return RestoreQueue(kind, body, why);
    case kRecMipmap:
    case kRecArray:
    case kRecTexObject: return RestoreArrays(kind, body, contents, in, why);
    default: return Fail(why, "the snapshot has a record of unknown kind " + std::to_string(kind));
  }
}

namespace {

// Commits [host, host+bytes) of fresh memory (zero-filled pages, MADV_POPULATE_WRITE). Best effort:
// a kernel without it (Linux < 5.14) faults the pages in on their first write instead.
void CommitPages(uint8_t* host, uint64_t bytes) {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto first = reinterpret_cast<uintptr_t>(host) & ~(page - 1);
  (void)madvise(reinterpret_cast<void*>(first), reinterpret_cast<uintptr_t>(host + bytes) - first, kMadvPopulateWrite);
}

// `bytes` of device memory from `in` to [addr, addr+bytes): into the memory itself where the
// backend's is the host's (sim), else through a buffer. `committed`: memory the manifest prepared
// (PrepareManifest), nothing to commit.
bool ReadContents(Backend& b, SnapshotReader& in, uint64_t addr, uint64_t bytes, std::string* why,
                  bool committed = false) {
  if (uint8_t* host = bytes != 0 ? b.HostView(addr, bytes) : nullptr; host != nullptr) {
    // Fresh memory is committed before the socket copies into it, not by page faults inside
    // recv()'s copy (1 GiB in 0.6-1.1 s so, 0.75-1.9 s without, on a 2-core VM), and by a thread of
    // its own, a chunk or more ahead of the socket: committing (zeroing) costs about what the copy
    // does, and the two then overlap. Each chunk is committed once, by whichever of the two claims
    // it first, so the socket never waits for it.
    const uint64_t chunks = (bytes + kChunk - 1) / kChunk;
    std::atomic<uint64_t> next{committed ? chunks : 0};  // the first chunk nobody has claimed to commit
    auto commit = [&](uint64_t i) { CommitPages(host + i * kChunk, std::min(kChunk, bytes - i * kChunk)); };
    struct Ahead {
      std::atomic<uint64_t>* next;
      uint64_t chunks;
      std::thread t;
      ~Ahead() {  // every way out: nothing is left to commit, and the thread is gone
        next->store(chunks);
        if (t.joinable()) t.join();
      }
    } ahead{&next, chunks, {}};
    if (!committed && chunks >= kAheadChunks) {
      ahead.t = std::thread([&] {
        for (uint64_t i; (i = next.fetch_add(1)) < chunks;) commit(i);
      });
    }
    std::vector<uint8_t> scratch;
    for (uint64_t i = 0; i < chunks; ++i) {
      uint64_t mine = i;
      if (next.compare_exchange_strong(mine, i + 1)) commit(i);  // not claimed yet: this one, now
      const uint64_t off = i * kChunk;
      if (!ReadChunk(in, host + off, static_cast<uint32_t>(std::min(kChunk, bytes - off)), &scratch, why)) return false;
    }
    return true;
  }
  std::vector<uint8_t> buf(std::min(bytes, kChunk)), scratch;
  for (uint64_t off = 0; off < bytes; off += kChunk) {
    const uint64_t n = std::min(kChunk, bytes - off);
    if (!ReadChunk(in, buf.data(), static_cast<uint32_t>(n), &scratch, why)) return false;
    if (const CUresult r = b.MemcpyHtoD(addr + off, buf.data(), n, nullptr); r != CUDA_SUCCESS)
      return Fail(why, "writing device memory failed (" + std::to_string(r) + ")");
  }
  return true;
}

// Whether [addr, addr+bytes) overlaps an entry of `m` (start -> bytes).
template <typename Map, typename Bytes>
bool Overlaps(const Map& m, uint64_t addr, uint64_t bytes, Bytes bytes_of) {
  auto after = m.lower_bound(addr);
  if (after != m.end() && after->first < addr + bytes) return true;
  return after != m.begin() && std::prev(after)->first + bytes_of(std::prev(after)->second) > addr;
}

}  // namespace

bool Session::RestoreAlloc(std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in, std::string* why) {
  Cursor cur(body);
  AllocRec a{};
  if (!cur.Get(&a) || !cur.Done() || a.dev >= p_.placements.size() || a.bytes == 0 || a.addr + a.bytes < a.addr ||
      contents != (a.counted == 1 ? a.bytes : 0))
    return Fail(why, "an allocation record is malformed");
  if (Overlaps(allocs_, a.addr, a.bytes, [](const Alloc& x) { return x.bytes; }))
    return Fail(why, "an allocation overlaps another");
  if (a.counted == 0) {
    // A module variable's table entry: inside a variable this restore placed.
    auto g = restore_globals_.upper_bound(a.addr);
    if (g == restore_globals_.begin() || (--g, a.addr - g->first >= g->second) ||
        a.bytes > g->second - (a.addr - g->first))
      return Fail(why, "a module variable's entry is not one of the restored variables");
    allocs_[a.addr] = {a.bytes, a.dev, false};
    return true;
  }
  if (a.counted != 1) return Fail(why, "an allocation record is malformed");
  Obj* ctx = nullptr;
  for (auto& [id, o] : handles_) {
    if (o.kind == Kind::kCtx && o.dev == a.dev && (ctx == nullptr || o.primary)) ctx = &o;
  }
  if (ctx == nullptr || b_->SetCurrent(ctx->backend) != CUDA_SUCCESS)
    return Fail(why, "an allocation's device has no context");
  uint64_t charged = 0;
  if (!Charge(a.dev, a.bytes, kAllocGranularity, "Restore", "migration", &charged))
    return Fail(why, "its memory exceeds this vGPU's quota");
  // Prepared by the manifest (allocated and committed while the program still ran at the source):
  // taken as it is. Else allocated now, once any prepared range in its way is gone.
  const auto p = prepared_.find(a.addr);
  const bool ready = p != prepared_.end() && p->second.first == a.bytes && p->second.second == a.dev;
  if (ready) {
    prepared_.erase(p);
  } else {
    ReleasePrepared(a.addr, a.bytes);
    if (const CUresult r = b_->MemAllocAt(a.bytes, a.addr); r != CUDA_SUCCESS) {
      Uncharge(a.dev, charged);
      return Fail(why, "allocating at " + Hex(a.addr) + " failed (" + std::to_string(r) + ")");
    }
  }
  allocs_[a.addr] = {a.bytes, a.dev, true, charged};
  return ReadContents(*b_, in, a.addr, a.bytes, why, ready);
}

bool Session::RestoreVmm(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                         std::string* why) {
  Cursor cur(body);
  if (kind == kRecReservation) {
    ReservationRec r{};
    uint64_t total = 0;
    if (!cur.Get(&r) || !cur.Done() || r.bytes == 0 || r.bytes % kVmmGranularity != 0 ||
        !CheckedAdd(reserved_bytes_, r.bytes, &total) || total > kMaxReservedBytes ||
        Overlaps(reservations_, r.addr, r.bytes, [](const Reservation& x) { return x.bytes; }))
      return Fail(why, "a reservation record is malformed");
    uint64_t got = 0;
    ReleasePrepared(r.addr, r.bytes);
    if (b_->MemAddressReserve(r.bytes, 0, r.addr, &got) != CUDA_SUCCESS || got != r.addr) {
      if (got != 0) (void)b_->MemAddressFree(got, r.bytes);
      return Fail(why, "the address range " + Hex(r.addr) + " cannot be reserved here");
    }
    reservations_[r.addr] = Reservation{r.bytes};
    reserved_bytes_ = total;
    return true;
  }
  if (kind == kRecPhysical) {
    PhysicalRec p{};
    if (!cur.Get(&p) || !cur.Done() || p.dev >= p_.placements.size() || p.bytes == 0 ||
        p.bytes % kVmmGranularity != 0 || p.id == 0 || p.id >= next_physical_ || p.released > 1 ||
        (p.released == 0) == (p.handle == 0) || physicals_.Find(p.id) != nullptr || HandlesFull())
      return Fail(why, "a physical allocation record is malformed");
    uint64_t charged = 0;
    if (!Charge(p.dev, p.bytes, kVmmGranularity, "Restore", "migration", &charged))
      return Fail(why, "its memory exceeds this vGPU's quota");
    void* handle = nullptr;
    if (b_->MemCreate(p.dev, p.bytes, &handle) != CUDA_SUCCESS) {
      Uncharge(p.dev, charged);
      return Fail(why, "creating a physical allocation failed");
    }
    Physical ph{handle, p.bytes, p.dev};
    ph.released = p.released != 0;
    physicals_.Add(p.id, ph);
    if (p.handle != 0) {
      Obj o{Kind::kMemHandle, handle, p.dev, p.id, {}};
      o.bytes = p.bytes;
      if (p.handle % 0x10 != 0 || p.handle >= restore_next_handle_ || !handles_.Add(p.handle, std::move(o)))
        return Fail(why, "a physical allocation's handle is malformed or taken");
    }
    return true;
  }
  MappingRec m{};
  if (!cur.Get(&m) || !cur.Done() || m.accessible > 1 || m.access_dev >= p_.placements.size() ||
      m.access_flags > CU_MEM_ACCESS_FLAGS_PROT_READWRITE || (m.addr | m.bytes | m.offset) % kVmmGranularity != 0 ||
      m.bytes == 0 || m.pad != 0 || contents != (m.accessible != 0 ? m.bytes : 0))
    return Fail(why, "a mapping record is malformed");
  Physical* ph = physicals_.Find(m.physical);
  auto res = ReservationOf(m.addr, m.bytes);
  if (ph == nullptr || res == reservations_.end() || m.offset > ph->bytes || m.bytes > ph->bytes - m.offset ||
      Overlaps(mappings_, m.addr, m.bytes, [](const Mapping& x) { return x.bytes; }))
    return Fail(why, "a mapping is not inside its reservation and physical allocation");
  if (b_->MemMap(m.addr, m.bytes, m.offset, ph->backend) != CUDA_SUCCESS) return Fail(why, "mapping failed");
  Mapping mapping{m.bytes, m.physical};
  mapping.offset = m.offset;
  mappings_[m.addr] = mapping;
  ++res->second.mappings;
  ++ph->mappings;
  if (m.accessible != 0) {
    if (b_->MemSetAccess(m.addr, m.bytes, m.access_dev, m.access_flags) != CUDA_SUCCESS)
      return Fail(why, "granting access to a mapping failed");
    Mapping& got = mappings_.at(m.addr);
    got.accessible = m.access_flags != CU_MEM_ACCESS_FLAGS_PROT_NONE;
    got.access_dev = m.access_dev;
    got.access_flags = m.access_flags;
    Alloc a{m.bytes, ph->dev, false};
    a.vmm = true;
    allocs_[m.addr] = a;
    if (!ReadContents(*b_, in, m.addr, m.bytes, why)) return false;
  }
  return true;
}

bool Session::RestoreModule(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                            std::string* why) {
  Cursor cur(body);
  if (kind == kRecModule) {
    ModuleRec m{};
    std::span<const uint8_t> image;
    if (!cur.Get(&m) || m.image_bytes == 0 || m.image_bytes > fatbin::kMaxDecompressedBytes ||
        !cur.Bytes(m.image_bytes, &image) || !cur.Done())
      return Fail(why, "a module record is malformed");
    const XXH128_hash_t got = XXH3_128bits(image.data(), image.size());
    if (got.low64 != m.hash_lo || got.high64 != m.hash_hi) return Fail(why, "a module's image does not match its hash");
    if (!UseContextOf(m.ctx, why)) return false;
    void* mod = nullptr;
    if (HandlesFull() || b_->ModuleLoad(image, &mod) != CUDA_SUCCESS) return Fail(why, "loading a module failed");
    Obj o{Kind::kModule, mod, cur_dev_, m.ctx, {}};
    o.hash_lo = m.hash_lo;
    o.hash_hi = m.hash_hi;
    o.image_bytes = m.image_bytes;
    if (m.id % 0x10 != 0 || m.id >= restore_next_handle_ || !handles_.Add(m.id, std::move(o)))
      return Fail(why, "a module's handle is malformed or taken");
    images_.Cache(ModuleImages::Hex(m.hash_lo, m.hash_hi), std::vector<uint8_t>(image.begin(), image.end()));
    return true;
  }
  if (kind == kRecGlobal) {
    GlobalRec g{};
    Backend::ModuleGlobal place;
    if (!cur.Get(&g) || g.pad != 0 || !cur.Name(g.name_len, &place.name) || !cur.Done() || g.addr + g.bytes < g.addr ||
        contents != g.bytes)
      return Fail(why, "a module variable record is malformed");
    Obj* mod = Find(g.module, Kind::kModule);
    if (mod == nullptr) return Fail(why, "a module variable names no module of the snapshot");
    place.addr = g.addr;
    place.bytes = g.bytes;
    ReleasePrepared(g.addr, g.bytes);
    if (!UseContextOf(mod->owner, why)) return false;
    if (const CUresult r = b_->ModulePlaceGlobal(mod->backend, place); r != CUDA_SUCCESS)
      return Fail(
          why, "placing module variable " + place.name + " at " + Hex(g.addr) + " failed (" + std::to_string(r) + ")");
    restore_globals_[g.addr] = g.bytes;
    return ReadContents(*b_, in, g.addr, g.bytes, why);
  }
  FunctionRec f{};
  std::string name;
  if (!cur.Get(&f) || !cur.Name(f.name_len, &name) || f.attrs > 64) return Fail(why, "a function record is malformed");
  Obj* mod = Find(f.module, Kind::kModule);
  if (mod == nullptr) return Fail(why, "a function names no module of the snapshot");
  if (!UseContextOf(mod->owner, why)) return false;
  void* fn = nullptr;
  KernelLayout layout;
  if (HandlesFull() || b_->ModuleGetFunction(mod->backend, name.c_str(), &fn, &layout) != CUDA_SUCCESS ||
      layout.params.size() > kMaxKernelParams)
    return Fail(why, "function " + name + " is not in its module");
  Obj o{Kind::kFunction, fn, mod->dev, f.module, layout};
  o.name = name;
  if (f.id % 0x10 != 0 || f.id >= restore_next_handle_ || function_ids_.count(fn) != 0 ||
      !handles_.Add(f.id, std::move(o)))
    return Fail(why, "a function's handle is malformed or taken");
  function_ids_[fn] = f.id;
  module_functions_[f.module].push_back(f.id);
  for (uint32_t i = 0; i < f.attrs; ++i) {
    AttrRec a{};
    if (!cur.Get(&a)) return Fail(why, "a function record is malformed");
    if (b_->FuncSetAttribute(fn, a.attr, a.value) != CUDA_SUCCESS)
      return Fail(why, "setting a function attribute failed");
    func_attrs_[f.id][a.attr] = a.value;
  }
  return cur.Done() || Fail(why, "a function record is malformed");
}

bool Session::RestoreQueue(uint32_t kind, std::span<const uint8_t> body, std::string* why) {
  Cursor cur(body);
  if (kind == kRecScratch) {
    ScratchRec s{};
    uint64_t charged = 0;
    if (!cur.Get(&s) || !cur.Done() || s.dev >= p_.placements.size() || s.pad != 0)
      return Fail(why, "a scratch record is malformed");
    if (!Charge(s.dev, s.bytes, kAllocGranularity, "Restore", "migration", &charged))
      return Fail(why, "its launch scratch exceeds this vGPU's quota");
    scratch_[s.dev] += charged;
    return true;
  }
  if (kind == kRecStream) {
    StreamRec s{};
    if (!cur.Get(&s) || s.attrs > 2 || s.pad != 0 || (s.flags & ~uint32_t{CU_STREAM_NON_BLOCKING}) != 0)
      return Fail(why, "a stream record is malformed");
    if (!UseContextOf(s.ctx, why)) return false;
    void* stream = nullptr;
    if (HandlesFull() || b_->StreamCreate(s.flags, s.priority, &stream) != CUDA_SUCCESS)
      return Fail(why, "creating a stream failed");
    Obj o{Kind::kStream, stream, cur_dev_, s.ctx, {}};
    o.flags = s.flags;
    o.priority = s.priority;
    if (s.id % 0x10 != 0 || s.id >= restore_next_handle_ || !handles_.Add(s.id, std::move(o)))
      return Fail(why, "a stream's handle is malformed or taken");
    for (uint32_t i = 0; i < s.attrs; ++i) {
      StreamAttrRec a{};
      if (!cur.Get(&a) || a.pad != 0) return Fail(why, "a stream record is malformed");
      if ((a.attr != CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW &&
           a.attr != CU_STREAM_ATTRIBUTE_SYNCHRONIZATION_POLICY) ||
          b_->StreamAttribute(stream, a.attr, true, a.value) != CUDA_SUCCESS)
        return Fail(why, "setting a stream attribute failed");
      stream_attrs_[{s.id, a.attr}].assign(a.value, a.value + sizeof a.value);
    }
    return cur.Done() || Fail(why, "a stream record is malformed");
  }
  EventRec e{};
  constexpr uint32_t kEventFlags = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING;  // not INTERPROCESS: IPC stays
  if (!cur.Get(&e) || !cur.Done() || !(e.ms_before >= 0 && e.ms_before < 1e15) || (e.flags & ~kEventFlags) != 0)
    return Fail(why, "an event record is malformed");
  if (!UseContextOf(e.ctx, why)) return false;
  void* event = nullptr;
  // Recorded at once: the source drained before the snapshot, so every event there was complete.
  if (HandlesFull() || b_->EventCreate(e.flags, &event) != CUDA_SUCCESS ||
      b_->EventRecord(event, nullptr) != CUDA_SUCCESS)
    return Fail(why, "creating an event failed");
  Obj o{Kind::kEvent, event, cur_dev_, e.ctx, {}};
  o.flags = e.flags;
  if (e.id % 0x10 != 0 || e.id >= restore_next_handle_ || !handles_.Add(e.id, std::move(o)))
    return Fail(why, "an event's handle is malformed or taken");
  moved_events_[e.id] = {e.ms_before, static_cast<CUresult>(e.timing)};
  return true;
}

// Times on one line: an event that moved happened `ms_before + gap` before the mark recorded at
// the restore; an event recorded here, the mark's elapsed time to it after it.
CUresult Session::MovedElapsedTime(uint64_t start, uint64_t end, float* ms) {
  double t[2] = {0, 0};
  const uint64_t ids[2] = {start, end};
  for (int i = 0; i < 2; ++i) {
    if (auto m = moved_events_.find(ids[i]); m != moved_events_.end()) {
      if (m->second.timing != CUDA_SUCCESS) return m->second.timing;
      t[i] = -(m->second.ms_before + moved_gap_ms_);
      continue;
    }
    if (moved_base_ == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    float since = 0;
    if (const CUresult r = b_->EventElapsedTime(moved_base_, Find(ids[i], Kind::kEvent)->backend, &since);
        r != CUDA_SUCCESS)
      return r;
    t[i] = since;
  }
  *ms = static_cast<float>(t[1] - t[0]);
  return CUDA_SUCCESS;
}

}  // namespace orion::host::detail

// ---- CUDA arrays, mipmapped arrays, texture and surface objects ----

namespace orion::host::detail {
namespace {

// Level `l` of the mipmapped array `q` describes.
ArrayRec LevelOf(const MipmapCreateReq& q, uint32_t l) {
  const ArrayCreateReq& a = q.array;
  return LevelGeometry(a.format, a.channels, a.flags, a.width, a.height, a.depth, l);
}

// An array's bytes go as runs of whole rows, each at most one snapshot chunk (a row is at most
// 2 MiB: 2^17 texels of 16 bytes), in the same order on both sides: fn(z, y, rows) for each.
template <typename Fn>
bool ForRuns(const ArrayRec& g, Fn fn) {
  const uint64_t per = std::max<uint64_t>(1, kChunk / std::max<uint64_t>(g.row_bytes, 1));
  for (uint64_t z = 0; z < g.slices; ++z) {
    for (uint64_t y = 0; y < g.rows; y += per) {
      if (!fn(z, y, std::min(per, g.rows - y))) return false;
    }
  }
  return true;
}

// The bytes of backend array `array` (of geometry `g`) into `enc`, or from `in`, through `buf`.
bool WriteArray(Backend& b, ChunkEncoder& enc, void* array, const ArrayRec& g, std::vector<uint8_t>* buf,
                std::string* why) {
  return ForRuns(g, [&](uint64_t z, uint64_t y, uint64_t rows) {
    buf->resize(rows * g.row_bytes);
    const Backend::CopySide dst{kSideWindow, 0, buf->data(), nullptr, g.row_bytes, 0, 0, 0};
    const Backend::CopySide src{kSideArray, 0, nullptr, array, 0, 0, y, z};
    if (b.MemcpyArray(dst, src, g.row_bytes, rows, nullptr) != CUDA_SUCCESS || b.CtxSynchronize() != CUDA_SUCCESS)
      return Fail(why, "reading a CUDA array failed");
    return enc.Write(buf->data(), static_cast<uint32_t>(buf->size())) || Fail(why, "the stream to the target broke");
  });
}
bool ReadArray(Backend& b, SnapshotReader& in, void* array, const ArrayRec& g, std::string* why) {
  std::vector<uint8_t> buf, scratch;
  return ForRuns(g, [&](uint64_t z, uint64_t y, uint64_t rows) {
    buf.resize(rows * g.row_bytes);
    if (!ReadChunk(in, buf.data(), static_cast<uint32_t>(buf.size()), &scratch, why)) return false;
    const Backend::CopySide dst{kSideArray, 0, nullptr, array, 0, 0, y, z};
    const Backend::CopySide src{kSideWindow, 0, buf.data(), nullptr, g.row_bytes, 0, 0, 0};
    if (b.MemcpyArray(dst, src, g.row_bytes, rows, nullptr) != CUDA_SUCCESS || b.CtxSynchronize() != CUDA_SUCCESS)
      return Fail(why, "writing a CUDA array failed");
    return true;
  });
}

template <typename Table>
std::vector<uint64_t> SortedIds(Table& t) {
  std::vector<uint64_t> ids;
  for (auto& [id, rec] : t) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

bool Session::SnapshotArrays(SnapshotWriter& out, std::string* why) {
  const std::string broken = "the stream to the target broke";
  std::vector<uint8_t> meta, buf;
  ChunkEncoder enc(out);
  for (const uint64_t id : SortedIds(mipmaps_)) {
    const MipmapRec& m = mipmaps_.Known(id);
    MipmapObjRec r{id, m.dev, m.destroyed ? 1u : 0u, {}};
    r.desc.array = ArrayCreateReq{m.width, m.height, m.depth, m.format, m.channels, m.flags, 0};
    r.desc.levels = m.levels;
    uint64_t bytes = 0;
    for (uint32_t l = 0; l < m.levels; ++l) bytes += ArrayBytes(LevelOf(r.desc, l));
    meta.clear();
    Append(&meta, r);
    for (const uint64_t level : m.level_ids) Append(&meta, level);
    if (!WriteRecord(out, kRecMipmap, meta, bytes)) return Fail(why, broken);
    for (uint32_t l = 0; l < m.levels; ++l) {
      void* level = nullptr;
      if (b_->MipmappedArrayGetLevel(m.backend, l, &level) != CUDA_SUCCESS)
        return Fail(why, "reading a mipmapped array's level failed");
      if (!WriteArray(*b_, enc, level, LevelOf(r.desc, l), &buf, why)) return false;
    }
  }
  for (const uint64_t id : SortedIds(arrays_)) {
    const ArrayRec& a = arrays_.Known(id);
    if (a.mipmap != 0) continue;  // a level: with its mipmapped array
    const ArrayObjRec r{id, a.dev, a.destroyed ? 1u : 0u,
                        ArrayCreateReq{a.width, a.height, a.depth, a.format, a.channels, a.flags, 0}};
    meta.clear();
    Append(&meta, r);
    if (!WriteRecord(out, kRecArray, meta, ArrayBytes(a)) || !WriteArray(*b_, enc, a.backend, a, &buf, why))
      return why->empty() ? Fail(why, broken) : false;
  }
  for (auto& [key, t] : texobjs_) {
    meta.clear();
    Append(&meta, TexObjRec{key.first, t.dev, key.second ? 1u : 0u, t.req});
    if (!WriteRecord(out, kRecTexObject, meta, 0)) return Fail(why, broken);
  }
  return true;
}

bool Session::UseDevice(uint32_t dev, std::string* why) {
  Obj* ctx = nullptr;
  for (auto& [id, o] : handles_) {
    if (o.kind == Kind::kCtx && o.dev == dev && (ctx == nullptr || o.primary)) ctx = &o;
  }
  if (ctx == nullptr || b_->SetCurrent(ctx->backend) != CUDA_SUCCESS)
    return Fail(why, "a record's device has no context");
  cur_dev_ = dev;
  return true;
}

bool Session::RestoreArrays(uint32_t kind, std::span<const uint8_t> body, uint64_t contents, SnapshotReader& in,
                            std::string* why) {
  Cursor cur(body);
  // A handle the snapshot gives: one the source could have made, and no object's here yet.
  auto fresh = [&](uint64_t id) {
    return id != 0 && id % 0x10 == 0 && id < restore_next_handle_ && handles_.Find(id) == nullptr &&
           arrays_.Find(id) == nullptr && mipmaps_.Find(id) == nullptr;
  };
  if (kind == kRecTexObject) {
    TexObjRec t{};
    if (!cur.Get(&t) || !cur.Done() || t.surface != t.req.surface || t.object == 0 || t.object >= (uint64_t{1} << 48))
      return Fail(why, "a texture object record is malformed");
    if (!UseDevice(t.dev, why)) return false;
    uint64_t object = t.object;
    if (const CUresult r = CreateTexObject(t.req, &object); r != CUDA_SUCCESS || object != t.object)
      return Fail(why, "making a texture or surface object again failed (" + std::to_string(r) + ")");
    return true;
  }
  if (kind == kRecArray) {
    ArrayObjRec a{};
    if (!cur.Get(&a) || !cur.Done() || a.destroyed > 1 || !fresh(a.id))
      return Fail(why, "an array record is malformed or its handle taken");
    if (!UseDevice(a.dev, why)) return false;
    uint64_t id = 0;
    if (const CUresult r = CreateArray(a.desc, a.id, &id); r != CUDA_SUCCESS)
      return Fail(why, "making a CUDA array again failed (" + std::to_string(r) + ")");
    const ArrayRec& made = arrays_.Known(id);
    if (contents != ArrayBytes(made)) return Fail(why, "an array record's bytes are not its size");
    if (a.destroyed != 0) restore_destroyed_.emplace_back(id, false);
    return ReadArray(*b_, in, made.backend, made, why);
  }
  MipmapObjRec m{};
  constexpr uint32_t kMaxLevels = 64;  // CreateMipmap checks the levels against the extents
  if (!cur.Get(&m) || m.destroyed > 1 || m.desc.levels == 0 || m.desc.levels > kMaxLevels || !fresh(m.id))
    return Fail(why, "a mipmapped array record is malformed or its handle taken");
  std::vector<uint64_t> levels(m.desc.levels);
  for (uint64_t& l : levels) {
    if (!cur.Get(&l)) return Fail(why, "a mipmapped array record is malformed");
  }
  if (!cur.Done()) return Fail(why, "a mipmapped array record is malformed");
  if (!UseDevice(m.dev, why)) return false;
  uint64_t id = 0;
  if (const CUresult r = CreateMipmap(m.desc, m.id, &id); r != CUDA_SUCCESS)
    return Fail(why, "making a mipmapped array again failed (" + std::to_string(r) + ")");
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < m.desc.levels; ++l) bytes += ArrayBytes(LevelOf(m.desc, l));
  if (contents != bytes) return Fail(why, "a mipmapped array record's bytes are not its size");
  void* backend = mipmaps_.Known(id).backend;
  for (uint32_t l = 0; l < m.desc.levels; ++l) {
    void* level = nullptr;
    if (b_->MipmappedArrayGetLevel(backend, l, &level) != CUDA_SUCCESS)
      return Fail(why, "a mipmapped array's level is missing");
    if (!ReadArray(*b_, in, level, LevelOf(m.desc, l), why)) return false;
  }
  for (uint32_t l = 0; l < m.desc.levels; ++l) {
    uint64_t got = 0;
    if (levels[l] == 0) continue;
    if (!fresh(levels[l]) || MipmapLevel(id, l, levels[l], &got) != CUDA_SUCCESS || got != levels[l])
      return Fail(why, "a mipmapped array's level handle is malformed or taken");
  }
  if (m.destroyed != 0) restore_destroyed_.emplace_back(id, true);
  return true;
}

}  // namespace orion::host::detail

// ---- The manifest: memory prepared before the move ----

namespace orion::host::detail {

bool Session::SnapshotManifest(SnapshotWriter& out, std::string* why) {
  if (!CanMove(why)) return false;
  std::vector<uint8_t> meta;
  for (const auto& [addr, a] : allocs_) {
    if (a.counted && !a.vmm) Append(&meta, ManifestEntry{addr, a.bytes, a.dev, 0});
  }
  return WriteRecord(out, kRecManifest, meta, 0) || Fail(why, "the stream to the target broke");
}

bool Session::PrepareManifest(std::span<const uint8_t> body, std::string* why) {
  if (body.size() % sizeof(ManifestEntry) != 0) return Fail(why, "the manifest is malformed");
  std::vector<uint64_t> held(p_.placements.size(), 0);
  for (size_t at = 0; at < body.size(); at += sizeof(ManifestEntry)) {
    ManifestEntry e{};
    std::memcpy(&e, body.data() + at, sizeof e);
    uint64_t end = 0;
    // Bounded by the quota of its device: prepared memory is charged only once the restore takes it.
    if (e.dev >= p_.placements.size() || e.pad != 0 || e.bytes == 0 || !CheckedAdd(e.addr, e.bytes, &end) ||
        !CheckedAdd(held[e.dev], e.bytes, &held[e.dev]) || held[e.dev] > p_.placements[e.dev].quota_bytes ||
        Overlaps(prepared_, e.addr, e.bytes, [](const std::pair<uint64_t, uint32_t>& x) { return x.first; }))
      return Fail(why, "the manifest is malformed or exceeds this vGPU's quota");
    if (const CUresult r = b_->MemAllocAt(e.bytes, e.addr); r != CUDA_SUCCESS)
      return Fail(why, "preparing memory at " + Hex(e.addr) + " failed (" + std::to_string(r) + ")");
    prepared_[e.addr] = {e.bytes, e.dev};
    // Committed now, not while the program waits (the sim's memory is the host's; best effort).
    if (uint8_t* host = b_->HostView(e.addr, e.bytes); host != nullptr) CommitPages(host, e.bytes);
  }
  return true;
}

void Session::ReleasePrepared(uint64_t addr, uint64_t bytes) {
  for (auto it = prepared_.begin(); it != prepared_.end();) {
    const bool overlaps = it->first < addr + std::min(bytes, UINT64_MAX - addr) && addr < it->first + it->second.first;
    if (!overlaps) {
      ++it;
      continue;
    }
    (void)b_->MemFree(it->first);
    it = prepared_.erase(it);
  }
}

}  // namespace orion::host::detail
