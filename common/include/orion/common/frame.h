// orion/common/frame.h — the wire format shared by the guest runtime and oriond.
//
// Every message is a frame: a 32-byte FrameHeader followed by `payload_len` bytes, padded to 8.
// Ops and their numbers come from ops.def. Wire structs use fixed-width types only, explicit
// reserved fields instead of padding, and are little-endian (both ends are x86-64 or AArch64 LE;
// static_assert below). Spec: docs/spec/frames.md.
//
//   FrameHeader h = MakeRequest(Op::kMemAlloc, seq, sizeof(MemAllocReq));
//
// This header has no OS calls and no logging: it is included by both ends and by fuzzers.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace orion {

static_assert(std::endian::native == std::endian::little, "Orion's wire format is little-endian");

inline constexpr uint32_t kFrameMagic = 0x4D52464Fu;  // "OFRM" in memory
// 2: Hello/Welcome carry the controller allocation; 3: FunctionRep says which launches fail;
// 4: Hello/Welcome carry the process tree's vGPU share (ORION_SHARE); Hello the compute ratio
// and policy (ORION_RATIO, ORION_RATIO_POLICY); 5: HostGetDevicePointer carries the client's
// address of the bytes (a pinned host pointer is its own device pointer); 6: over TCP oriond sends
// Keepalive frames while a request executes.
inline constexpr uint16_t kProtocolVersion = 6;
inline constexpr uint32_t kMaxPayload = 64 * 1024;  // bulk bytes travel in the data window

enum class Op : uint16_t {
#define ORION_OP(name, number, ...) k##name = number,
#include "orion/common/ops.def"
};

enum class ReplyKind : uint8_t { kSync, kAsync };

// Name of an op for logs ("MemAlloc"), or nullptr for an unknown number.
const char* OpName(uint16_t op) noexcept;
// Whether `op` is in ops.def.
bool OpKnown(uint16_t op) noexcept;
// Whether the client waits for a reply to `op` (unknown ops: false).
bool OpWantsReply(uint16_t op) noexcept;

// Frame flags.
inline constexpr uint32_t kFlagWantsReply = 1u << 0;  // set by the client on every kSync op, and on
                                                      // kAsync ops it wants to wait for (e.g. Memcpy2D into the window)
inline constexpr uint32_t kFlagOutputPending = 1u << 1;  // reply: oriond holds device printf text for the
                                                         // client; it fetches it with TakeOutput
inline constexpr uint64_t kMaxPendingOutput = 1u << 20;  // bytes held per session (cudaLimitPrintfFifoSize default)
// TakeOutput reply: this header, then stdout_bytes of device printf text, then notice_bytes of
// notices for the client's log (lines, e.g. "kernel K was not executed: ..."), each part at most
// what fits in kMaxPayload.
struct OutputRep {
  uint32_t stdout_bytes;
  uint32_t notice_bytes;
};
inline constexpr uint64_t kMaxPendingNotices = 64u << 10;

struct FrameHeader {
  uint32_t magic;        // kFrameMagic
  uint16_t version;      // kProtocolVersion
  uint16_t op;           // Op
  uint32_t seq;          // client-chosen, echoed in the reply
  uint32_t payload_len;  // bytes after the header, <= kMaxPayload (not counting padding)
  int32_t status;        // reply: the op's CUresult, verbatim
  int32_t deferred;      // reply: first error of an earlier async op since the last reply (0: none)
  uint32_t flags;        // kFlag*
  uint32_t reserved;     // 0
};
static_assert(sizeof(FrameHeader) == 32);
static_assert(offsetof(FrameHeader, op) == 6 && offsetof(FrameHeader, seq) == 8);
static_assert(offsetof(FrameHeader, status) == 16 && offsetof(FrameHeader, flags) == 24);
static_assert(std::has_unique_object_representations_v<FrameHeader>);

// A frame header of this protocol: op, seq and payload length set, everything else 0.
constexpr FrameHeader MakeFrameHeader(uint16_t op, uint32_t seq, uint32_t payload_len) noexcept {
  FrameHeader h{};
  h.magic = kFrameMagic;
  h.version = kProtocolVersion;
  h.op = op;
  h.seq = seq;
  h.payload_len = payload_len;
  return h;
}
// The header of the reply to `request`: its op and seq, with `status` (a CUresult, verbatim).
constexpr FrameHeader ReplyHeader(const FrameHeader& request, int32_t status, uint32_t payload_len) noexcept {
  FrameHeader h = MakeFrameHeader(request.op, request.seq, payload_len);
  h.status = status;
  return h;
}

// Bytes a frame with `payload_len` occupies in a ring: header + payload, rounded up to 8.
constexpr uint32_t FrameSpan(uint32_t payload_len) noexcept {
  return (static_cast<uint32_t>(sizeof(FrameHeader)) + payload_len + 7u) & ~7u;
}

// Private CUresult-space status codes used only on the wire (never returned to applications).
inline constexpr int32_t kStatusNeedBytes = 1001;  // ModuleLoad: send the image with BlobPut (no
                                                   // CUresult has this value; inside the enum's range)
inline constexpr int32_t kStatusMoved = 1002;      // the session moved: MovedRep says where (issue #24)

// ---- Payloads -------------------------------------------------------------------------------
// Naming: <Op>Req is the request payload, <Op>Rep the reply payload. Handles (contexts, modules,
// functions, streams, events) are 64-bit ids from the server's per-session tables; 0 means "none"
// (for streams: the context's default stream). Device pointers are the server's real values.
// Window offsets are byte offsets into the channel's data window.

#define ORION_WIRE_STRUCT(T, size)                                                              \
  static_assert(sizeof(T) == (size), #T " size is part of the wire format");                    \
  static_assert(std::is_trivially_copyable_v<T> && std::has_unique_object_representations_v<T>, \
                #T " must have no padding")

inline constexpr uint32_t kMaxDevices = 16;
inline constexpr uint32_t kMaxDeviceAttributes = 160;  // CU_DEVICE_ATTRIBUTE_MAX is < 160 in CUDA 13
inline constexpr uint32_t kNameLen = 256;

// Transports a client can use (HelloReq::transports).
inline constexpr uint16_t kTransportShm = 1u << 0;  // shared memory / ivshmem
inline constexpr uint16_t kTransportTcp = 1u << 1;
inline constexpr uint16_t kTransportRdma = 1u << 2;
// HelloReq::transports, with kTransportShm: the client can use the sync slot (ivshmem/ring.h), if
// the Welcome says the worker serves it (WelcomeRep::features & kWelcomeSyncSlot).
inline constexpr uint16_t kTransportSyncSlot = 1u << 8;

struct HelloReq {
  uint16_t protocol_version;  // kProtocolVersion
  uint16_t transports;        // kTransport* the client can use
  uint32_t vgpu_count;        // ORION_VGPU
  uint64_t gmem_mib;          // ORION_GMEM (0: the server's default per vGPU)
  uint32_t pid;               // informational only (PIDs differ across namespaces and VMs)
  uint8_t ratio;              // ORION_RATIO: percent of a GPU's compute per vGPU, 1..100; 0: best effort
  uint8_t policy;             // ORION_RATIO_POLICY: 0 share (a minimum), 1 cap (a ceiling)
  uint16_t kind;              // kHelloClient, or (live migration, issue #24) kHelloMigrateIn / kHelloResume
  char process_name[64];      // NUL-padded, informational
  char key[32];               // network transports: the shared client key (ORION_KEY), NUL-padded
  char allocation_id[40];     // the controller's allocation the client holds ("" = oriond admits it)
  char hostname[64];          // informational: the client's host name (orion-smi lists by it)
  // The vGPU share this process joins (ORION_SHARE, inherited from the process that first took the
  // vGPUs): kShareTokenLen lowercase hex digits, NUL-padded; "" = take vGPUs of its own.
  char share[40];
};
ORION_WIRE_STRUCT(HelloReq, 264);

// HelloReq::kind. A program's session starts with kHelloClient. Live migration (issue #24,
// docs/design/migration.md): the oriond serving a session opens a connection to the target oriond
// with kHelloMigrateIn (the hello describes the session: vGPUs, memory per vGPU, compute ratio; the
// session's snapshot follows the target's ready reply); the program's client, told kStatusMoved,
// connects to the target with kHelloResume and the token the reply carried in `share`.
inline constexpr uint16_t kHelloClient = 0;
inline constexpr uint16_t kHelloMigrateIn = 1;
inline constexpr uint16_t kHelloResume = 2;

// The reply that moves a client (status kStatusMoved, to a frame the source did not execute): send
// that frame again to `address` after a kHelloResume with `token`. When `address` cannot be reached
// or refuses, a kHelloResume with `back_token` to the oriond the client was connected to resumes
// the session there instead (the source keeps it until the target confirms the client, about 30 s).
// NUL-terminated strings; `back_token` may be empty (no way back).
struct MovedRep {
  char address[64];     // host:port of the target oriond
  char token[40];       // kShareTokenLen lowercase hex digits: the resume token, valid once and briefly
  char back_token[40];  // the same at the source, for the way back
};
ORION_WIRE_STRUCT(MovedRep, 144);

// A share token: a random UUID's 32 lowercase hex digits (122 random bits). Whoever knows it joins
// the share.
inline constexpr size_t kShareTokenLen = 32;

// Whether `s` (NUL-terminated within `cap` bytes) is "" or a well-formed share token.
inline bool ValidShareToken(const char* s, size_t cap) {
  const size_t n = strnlen(s, cap);
  if (n == 0) return true;
  if (n != kShareTokenLen) return false;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

struct DeviceInfo {
  char name[kNameLen];  // NUL-terminated
  uint8_t uuid[16];
  uint64_t total_mem;                        // bytes: the vGPU's quota
  int32_t attributes[kMaxDeviceAttributes];  // indexed by CUdevice_attribute; 0 where unknown
  uint32_t pgpu;                             // physical GPU index on the server
  uint32_t vgpu;                             // vGPU index on that GPU
  char pci_bus_id[16];                       // "0000:3b:00.0"
  uint32_t luid_low;                         // unused on Linux, 0
  uint32_t reserved;
};
ORION_WIRE_STRUCT(DeviceInfo, 256 + 16 + 8 + 4 * kMaxDeviceAttributes + 8 + 16 + 8);

// WelcomeRep::features: the worker polls the channel's sync slot, and the client may use it.
inline constexpr uint16_t kWelcomeSyncSlot = 1u << 0;

struct WelcomeRep {
  uint32_t session_id;
  uint32_t device_count;   // <= kMaxDevices; followed by device_count DeviceInfo
  int32_t driver_version;  // the server driver's cuDriverGetVersion
  uint32_t backend;        // 0 sim, 1 cuda
  uint64_t channel_bytes;  // network transports: the channel size both ends lay out (0 on shm)
  uint16_t transport;      // the kTransport* oriond chose
  uint16_t features;       // kWelcome* bits
  uint32_t reserved1;
  char server_name[48];    // "oriond (sim)"
  char allocation_id[40];  // the controller's allocation serving this session ("" standalone)
  // The share this session's vGPUs belong to ("" when they are not shared by a process tree: a VM's,
  // a job's or a client-held allocation). The client hands it to the processes it starts.
  char share[40];
};
ORION_WIRE_STRUCT(WelcomeRep, 160);

// WindowData (network transports): followed by `bytes` bytes for window[offset, offset + bytes).
struct WindowDataHdr {
  uint64_t offset;
  uint64_t bytes;
};
ORION_WIRE_STRUCT(WindowDataHdr, 16);

// RdmaConnect (network, after a Welcome whose transport is kTransportRdma): the client sends its
// end of the RC queue pair on the TCP socket, oriond answers with its own (reply payload, same
// struct). From then on frames travel as RDMA SENDs and window ranges as RDMA WRITEs into the peer's
// registered window copy at the same offset (docs/spec/frames.md, "RDMA"). Everything in it is
// untrusted by the side that receives it.
struct RdmaConnectInfo {
  uint8_t gid[16];        // the port GID (RoCE: the IPv4-mapped address of the TCP connection's end)
  uint32_t qpn;           // RC queue pair number
  uint32_t psn;           // first packet sequence number (24 bits)
  uint64_t window_addr;   // the registered window copy (remote address for RDMA WRITE)
  uint64_t window_bytes;  // must equal the channel layout's window size on both ends
  uint32_t window_rkey;
  uint32_t done_rkey;  // client: the word oriond writes the last executed seq into; 0 from oriond
  uint64_t done_addr;
  uint32_t recv_slots;  // receive buffers kept posted
  uint32_t slot_bytes;  // bytes per receive buffer: the largest SEND the peer may post
  uint32_t mtu;         // path MTU in bytes (256..4096)
  uint32_t reserved;
};
ORION_WIRE_STRUCT(RdmaConnectInfo, 72);

// ---- Limits on sizes a client chooses --------------------------------------------------------
// Every size in a request is hostile input: each product or sum of guest values is computed with
// the checked helpers below (never plain `*`/`+`), against these limits, in the frame decoder
// (FrameWindowRanges) and in oriond's session alike. A request beyond them gets
// CUDA_ERROR_INVALID_VALUE; nothing of it executes.
inline constexpr uint64_t kMax2DHeight = uint64_t{1} << 24;  // rows of a 2D copy or memset
// Per-session limits on what a client can make a worker hold (issue #11, "bounded everything"):
inline constexpr size_t kMaxSessionHandles = size_t{1} << 18;        // contexts, modules, functions, streams, events
inline constexpr uint64_t kMaxHeldImageBytes = uint64_t{512} << 20;  // uploaded module images not yet loaded
inline constexpr uint64_t kMax2DPitch = uint64_t{1} << 40;           // bytes between rows, and bytes per row
// What one device allocation costs against a vGPU's quota at least: its size rounded up to this.
// The CUDA programming guide promises allocations aligned to at least 256 bytes; GPUs since sm_50
// report textureAlignment 512 and space small cudaMalloc's 512 bytes apart (large allocations come
// in 2 MiB pages, but small ones are sub-allocated from them, so 2 MiB per allocation would
// overcharge). Without it, 70,000 one-byte allocations would hold 35 MB against a 70 KB charge.
inline constexpr uint64_t kAllocGranularity = 512;

// Virtual memory management: the granularity of reservations, physical allocations and mappings
// (cuMemGetAllocationGranularity answers it, minimum and recommended: 2 MiB as on NVIDIA GPUs).
inline constexpr uint64_t kVmmGranularity = uint64_t{2} << 20;
// Address space one session may hold reserved at once (reservations cost no device memory, but the
// sim backend backs them with host address space): 16 TiB.
inline constexpr uint64_t kMaxReservedBytes = uint64_t{16} << 40;

// a * b and a + b into *out; false (and *out untouched) when the result does not fit in 64 bits.
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) noexcept {
  uint64_t v;
  if (__builtin_mul_overflow(a, b, &v)) return false;
  *out = v;
  return true;
}
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) noexcept {
  uint64_t v;
  if (__builtin_add_overflow(a, b, &v)) return false;
  *out = v;
  return true;
}
// The bytes a 2D access of `height` rows of `row_bytes`, `pitch` bytes apart, spans from its first
// byte: (height - 1) * pitch + row_bytes. False when height or row_bytes is 0, when a value is past
// its limit, when rows would overlap (pitch < row_bytes with height > 1), or on overflow.
bool Span2D(uint64_t height, uint64_t pitch, uint64_t row_bytes, uint64_t* span) noexcept;

// The data-window ranges a request frame reads (the client sends their bytes after the frame on
// network transports) and writes (oriond sends them back as WindowData before the reply). A pure
// function of the frame, used by both ends; ranges are not yet checked against the window.
struct WindowRange {
  uint64_t offset;
  uint64_t bytes;
};
struct WindowRanges {
  WindowRange reads[1];
  WindowRange writes[1];
  uint32_t nreads = 0;
  uint32_t nwrites = 0;
};
// False when the payload is too short for the op (a malformed frame).
bool FrameWindowRanges(uint16_t op, const uint8_t* payload, uint32_t payload_len, WindowRanges* out) noexcept;
// Whether `w` lies inside a data window of `window_bytes` bytes (ChannelLayout::window_bytes): the
// one check every transport makes of a frame's ranges (a read outside ends the session; a write
// outside belongs to a refused request and is not sent).
constexpr bool InWindow(const WindowRange& w, uint64_t window_bytes) noexcept {
  return w.offset <= window_bytes && w.bytes <= window_bytes - w.offset;
}

struct CtxCreateReq {
  uint32_t device;
  uint32_t flags;
};
ORION_WIRE_STRUCT(CtxCreateReq, 8);
struct HandleRep {
  uint64_t handle;
};  // CtxCreate, PrimaryCtxRetain, StreamCreate, ...
ORION_WIRE_STRUCT(HandleRep, 8);
struct HandleReq {
  uint64_t handle;
};  // CtxDestroy, CtxSetCurrent, StreamSynchronize, ...
ORION_WIRE_STRUCT(HandleReq, 8);
struct DeviceReq {
  uint32_t device;
  uint32_t flags;
};  // PrimaryCtxRetain/Release/Reset
ORION_WIRE_STRUCT(DeviceReq, 8);
struct LimitReq {
  uint32_t limit;
  uint32_t reserved;
  uint64_t value;
};
ORION_WIRE_STRUCT(LimitReq, 16);
struct U64Rep {
  uint64_t value;
};
ORION_WIRE_STRUCT(U64Rep, 8);

struct MemAllocReq {
  uint64_t bytes;
};
ORION_WIRE_STRUCT(MemAllocReq, 8);
struct MemFreeReq {
  uint64_t dptr;
};
ORION_WIRE_STRUCT(MemFreeReq, 8);
struct MemGetInfoRep {
  uint64_t free;
  uint64_t total;
};
ORION_WIRE_STRUCT(MemGetInfoRep, 16);
// DeviceMemoryInfo (request: DeviceReq with flags 0): the session's account on one vGPU, in bytes.
// quota = ORION_GMEM (what the client sees as total); allocated = the session's live allocations
// charged to the quota; context_overhead = what the session's context is charged from its start
// (cuda backend: the driver's per-context reserve; 0 on sim). allocated + context_overhead <= quota.
struct DeviceMemoryRep {
  uint64_t quota;
  uint64_t allocated;
  uint64_t context_overhead;
};
ORION_WIRE_STRUCT(DeviceMemoryRep, 24);

// DeviceUtilization: the vGPU's tenant's use of its physical GPU's compute, as the compute-share
// scheduler measures it (host/include/orion/host/compute_share.h): NVML's utilization rates.
// CUDA_ERROR_NOT_SUPPORTED where nothing measures it (the cuda backend does not schedule yet).
struct DeviceUtilizationRep {
  uint32_t gpu_permille;  // its kernels' device time / wall time, over NVML's sample period
  uint32_t ratio;         // its compute ratio, percent (0: best effort)
  uint64_t busy_ns;       // device time its kernels used since the tenant began
  uint64_t throttled_ns;  // time its work waited for the device (its share, or a cap)
};
ORION_WIRE_STRUCT(DeviceUtilizationRep, 24);

// Virtual memory management (cuMemAddressReserve/Free, cuMemCreate/Release, cuMemMap/Unmap,
// cuMemSetAccess; CUDA driver API reference, "Virtual Memory Management"). Addresses and sizes are
// in bytes and multiples of kVmmGranularity; `handle` is a physical allocation's session handle.
struct MemReserveReq {
  uint64_t bytes;
  uint64_t alignment;
  uint64_t fixed_addr;
};  // -> U64Rep address
ORION_WIRE_STRUCT(MemReserveReq, 24);
struct MemRangeReq {
  uint64_t addr;
  uint64_t bytes;
};  // MemAddressFree, MemUnmap
ORION_WIRE_STRUCT(MemRangeReq, 16);
struct MemCreateReq {
  uint64_t bytes;
  uint32_t device;
  uint32_t flags;
};  // -> HandleRep
ORION_WIRE_STRUCT(MemCreateReq, 16);
struct MemMapReq {
  uint64_t addr;
  uint64_t bytes;
  uint64_t offset;
  uint64_t handle;
};
ORION_WIRE_STRUCT(MemMapReq, 32);
// `flags`: CUmemAccess_flags for `device` (an index into the session's devices).
struct MemSetAccessReq {
  uint64_t addr;
  uint64_t bytes;
  uint32_t device;
  uint32_t flags;
};
ORION_WIRE_STRUCT(MemSetAccessReq, 24);

// CUDA IPC between sessions of one oriond (host/include/orion/host/ipc_ticket.h): a handle is 64
// opaque bytes (CU_IPC_HANDLE_SIZE). IpcGetMemHandle{MemFreeReq dptr} and IpcGetEventHandle
// {HandleReq event} answer IpcHandleRep; IpcOpenMemHandle answers IpcOpenRep, IpcOpenEventHandle
// HandleRep; IpcCloseMemHandle takes MemFreeReq.
struct IpcHandleRep {
  uint8_t handle[64];
};
ORION_WIRE_STRUCT(IpcHandleRep, 64);
struct IpcOpenReq {
  uint8_t handle[64];
  uint32_t flags;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(IpcOpenReq, 72);
struct IpcOpenRep {
  uint64_t dptr;
  uint64_t bytes;
};
ORION_WIRE_STRUCT(IpcOpenRep, 16);
// Per-session bounds: exported allocations and events (each holds a ticket fd in the worker) and
// imported ones.
inline constexpr size_t kMaxIpcExports = 4096;
inline constexpr size_t kMaxIpcImports = 4096;

// MemcpyHtoD: window[window_offset, +bytes) -> device dst. MemcpyDtoH(Async): device src ->
// window[window_offset, +bytes). MemcpyDtoD: src -> dst. `stream` 0 = default stream.
struct MemcpyReq {
  uint64_t dst;  // device pointer, or window offset (DtoH)
  uint64_t src;  // device pointer, or window offset (HtoD)
  uint64_t bytes;
  uint64_t stream;
};
ORION_WIRE_STRUCT(MemcpyReq, 32);

// A side of a 2D copy: a device pointer or a window offset.
inline constexpr uint32_t kSideDevice = 0;
inline constexpr uint32_t kSideWindow = 1;
struct Memcpy2DReq {
  uint64_t src;  // device pointer or window offset, already advanced to the first byte
  uint64_t src_pitch;
  uint64_t dst;
  uint64_t dst_pitch;
  uint64_t width_bytes;
  uint64_t height;
  uint64_t stream;
  uint32_t src_side;  // kSide*
  uint32_t dst_side;
};
ORION_WIRE_STRUCT(Memcpy2DReq, 64);

// Memset of `count` elements of `elem_size` (1, 2 or 4) bytes to `value`, rows of `width` elements
// `pitch` bytes apart (height 1 and pitch 0 for a plain memset).
struct MemsetReq {
  uint64_t dst;
  uint64_t width;   // elements per row
  uint64_t height;  // rows
  uint64_t pitch;   // bytes between rows (height > 1)
  uint64_t stream;
  uint32_t value;
  uint32_t elem_size;
};
ORION_WIRE_STRUCT(MemsetReq, 48);

struct WindowRangeReq {
  uint64_t window_offset;
  uint64_t bytes;
  uint64_t host_address;  // where the client's process sees these bytes (0: unknown); the server
                          // gives them this device address when it can (unified addressing)
};
ORION_WIRE_STRUCT(WindowRangeReq, 24);

// ModuleLoad: the image with this content hash (XXH3-128 of `image_bytes` bytes). If the server has
// no such image, the reply status is kStatusNeedBytes; the client sends BlobPut chunks and retries.
struct ModuleLoadReq {
  uint64_t hash_lo;
  uint64_t hash_hi;
  uint64_t image_bytes;
};
ORION_WIRE_STRUCT(ModuleLoadReq, 24);
struct ModuleLoadRep {
  uint64_t module;
  uint32_t kernel_count;
  uint32_t global_count;
};
ORION_WIRE_STRUCT(ModuleLoadRep, 16);

struct BlobPutReq {
  uint64_t hash_lo;
  uint64_t hash_hi;
  uint64_t image_bytes;    // total size of the image
  uint64_t offset;         // where this chunk goes in the image
  uint64_t window_offset;  // where the chunk is in the window
  uint64_t bytes;          // chunk length
};
ORION_WIRE_STRUCT(BlobPutReq, 48);

// ModuleGetFunction / ModuleGetGlobal: followed by the NUL-terminated name (at most kNameLen*4).
struct ModuleSymbolReq {
  uint64_t module;
  uint32_t name_len;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(ModuleSymbolReq, 16);

inline constexpr uint32_t kMaxKernelParams = 1024;  // CUDA: 32764 bytes of params, 4-byte minimum
struct ParamInfo {
  uint32_t offset;
  uint32_t size;
};
ORION_WIRE_STRUCT(ParamInfo, 8);
// Followed by param_count ParamInfo, in ordinal order.
// Why a function's launches fail before they are sent (FunctionRep::launch_error != 0).
enum class LaunchRefusal : uint32_t {
  kNone = 0,
  kSassOnly = 1,        // the module has no PTX: only SASS, which the sim backend does not execute
  kPtxOtherArch = 2,    // its PTX is not what a GPU of this arch would run (a GPU runs its SASS)
  kPtxVersion = 3,      // its PTX ISA is newer than the driver
  kPtxUnsupported = 4,  // its PTX uses what the sim's executor does not implement
};
struct FunctionRep {
  uint64_t function;
  uint32_t param_count;
  uint32_t param_bytes;  // the parameter buffer's size
  // Not 0: every launch of this function fails at once with this CUresult (the sim backend cannot
  // execute it: CUDA_ERROR_NO_BINARY_FOR_GPU, _UNSUPPORTED_PTX_VERSION or _NOT_SUPPORTED), why.
  int32_t launch_error;
  LaunchRefusal launch_refusal;
};
ORION_WIRE_STRUCT(FunctionRep, 24);
// The name of a CUresult FunctionRep::launch_error (or a refused LaunchKernel) may carry, for logs;
// nullptr for any other value (a malformed reply).
inline const char* LaunchErrorName(int32_t r) noexcept {
  switch (r) {
    case 209: return "CUDA_ERROR_NO_BINARY_FOR_GPU (209)";  // CUresult values (cuda.h)
    case 801: return "CUDA_ERROR_NOT_SUPPORTED (801)";
    case 222: return "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)";
    case 701: return "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (701)";  // more shared/local memory than the device has
    default: return nullptr;
  }
}
struct GlobalRep {
  uint64_t dptr;
  uint64_t bytes;
};
ORION_WIRE_STRUCT(GlobalRep, 16);

// ModuleFunctionName: how many functions (kernels) the module has and, when index < count, the
// index-th one's name (the order is the server's and stable for the module's life; cuModuleEnumerate-
// Functions). Index kModuleFunctionCountOnly asks for the count alone. The reply is a
// ModuleFunctionNameRep followed by name_len bytes: the NUL-terminated name (name_len 0 for no name).
inline constexpr uint32_t kModuleFunctionCountOnly = 0xFFFFFFFFu;
struct ModuleFunctionNameReq {
  uint64_t module;
  uint32_t index;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(ModuleFunctionNameReq, 16);
struct ModuleFunctionNameRep {
  uint32_t count;
  uint32_t name_len;
};
ORION_WIRE_STRUCT(ModuleFunctionNameRep, 8);

struct FuncAttributeReq {
  uint64_t function;
  int32_t attribute;
  int32_t value;
};
ORION_WIRE_STRUCT(FuncAttributeReq, 16);
struct I32Rep {
  int32_t value;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(I32Rep, 8);

// LaunchKernel: followed by param_bytes bytes: the kernel's parameter buffer, each parameter at
// the offset the function's layout gives (as with CU_LAUNCH_PARAM_BUFFER_POINTER).
struct LaunchReq {
  uint64_t function;
  uint64_t stream;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_mem_bytes;
  uint32_t param_bytes;
};
ORION_WIRE_STRUCT(LaunchReq, 48);

struct OccupancyReq {
  uint64_t function;
  uint32_t block_size;
  uint32_t flags;
  uint64_t dynamic_smem;
};
ORION_WIRE_STRUCT(OccupancyReq, 24);

// LaunchKernelEx: a LaunchReq with the cluster dimensions (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION),
// followed by the parameter buffer.
struct LaunchExReq {
  LaunchReq base;
  uint32_t cluster[3];
  uint32_t flags;  // kLaunchCooperative; other bits must be 0
};
// LaunchExReq.flags: all blocks co-resident, grid-wide sync allowed (cuLaunchCooperativeKernel,
// CU_LAUNCH_ATTRIBUTE_COOPERATIVE). Too many blocks: CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE.
inline constexpr uint32_t kLaunchCooperative = 1u << 0;
// The CUresult NVIDIA's driver answers for a grid or block beyond the device's limits: 9, not in
// cuda.h, which cudart 13 maps (it alone) to cudaErrorInvalidConfiguration, "invalid configuration
// argument" (checked by returning each candidate code to cudart 13.0; scripts/gpu-e2e.sh compares
// with the real driver). The client refuses such a launch at the call; oriond refuses it again.
inline constexpr int32_t kCudaErrorInvalidConfiguration = 9;
ORION_WIRE_STRUCT(LaunchExReq, 64);

// OccupancyMaxClusters (cuOccupancyMaxActiveClusters) -> I32Rep.
struct OccupancyClustersReq {
  uint64_t function;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t cluster[3];
  uint32_t shared_mem_bytes;
};
ORION_WIRE_STRUCT(OccupancyClustersReq, 48);

// OccupancyAvailableSmem (cuOccupancyAvailableDynamicSMemPerBlock) -> U64Rep.
struct OccupancySmemReq {
  uint64_t function;
  int32_t num_blocks;
  int32_t block_size;
};
ORION_WIRE_STRUCT(OccupancySmemReq, 16);

struct StreamCreateReq {
  uint32_t flags;
  int32_t priority;
};
ORION_WIRE_STRUCT(StreamCreateReq, 8);
struct StreamWaitEventReq {
  uint64_t stream;
  uint64_t event;
  uint32_t flags;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(StreamWaitEventReq, 24);
// StreamAttribute: cuStreamGetAttribute (set 0) or cuStreamSetAttribute (set 1) of one
// CUstreamAttrID: CU_STREAM_ATTRIBUTE_ACCESS_POLICY_WINDOW or _SYNCHRONIZATION_POLICY (the others
// are refused). `value` is the CUstreamAttrValue (a CUlaunchAttributeValue, 64 bytes): what to set,
// or ignored for a get. The reply (StreamAttrRep) is the attribute's value after the call.
struct StreamAttrReq {
  uint64_t stream;
  uint32_t attr;
  uint32_t set;
  uint8_t value[64];
};
ORION_WIRE_STRUCT(StreamAttrReq, 80);
struct StreamAttrRep {
  uint8_t value[64];
};
ORION_WIRE_STRUCT(StreamAttrRep, 64);
// TensorMapEncodeTiled: cuTensorMapEncodeTiled's parameters (CUDA driver API reference,
// "Tensor Map Object Management"), checked by oriond against its requirements; array entries past
// `rank` (globalStrides: past rank - 1) are 0. `global_address` must lie in the session's device
// memory. The reply (TensorMapRep) is the 128-byte CUtensorMap: the real driver's on the cuda
// backend; on sim, Orion's own layout (the executor runs no TMA: a kernel using it is refused).
struct TensorMapEncodeReq {
  uint32_t data_type;  // CUtensorMapDataType
  uint32_t rank;       // 1..5
  uint64_t global_address;
  uint64_t global_dim[5];
  uint64_t global_strides[4];  // bytes
  uint32_t box_dim[5];
  uint32_t element_strides[5];
  uint32_t interleave;    // CUtensorMapInterleave
  uint32_t swizzle;       // CUtensorMapSwizzle
  uint32_t l2_promotion;  // CUtensorMapL2promotion
  uint32_t oob_fill;      // CUtensorMapFloatOOBfill
};
ORION_WIRE_STRUCT(TensorMapEncodeReq, 144);
struct TensorMapRep {
  uint64_t opaque[16];  // CU_TENSOR_MAP_NUM_QWORDS
};
ORION_WIRE_STRUCT(TensorMapRep, 128);
// cuTensorMapEncodeIm2col: the tiled parameters less the box (`base.box_dim` all 0), and the pixel
// box's corners ({D, H, W} offsets, rank - 2 of them) with the channels and pixels it loads.
struct TensorMapIm2colReq {
  TensorMapEncodeReq base;
  int32_t lower_corner[3];
  int32_t upper_corner[3];
  uint32_t channels_per_pixel;  // 1..256
  uint32_t pixels_per_column;   // 1..1024
};
ORION_WIRE_STRUCT(TensorMapIm2colReq, 176);
// cuTensorMapReplaceAddress: a map the client holds (one oriond encoded) and its new global address.
struct TensorMapReplaceReq {
  uint64_t map[16];
  uint64_t global_address;
};
ORION_WIRE_STRUCT(TensorMapReplaceReq, 136);
struct EventCreateReq {
  uint32_t flags;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(EventCreateReq, 8);
struct EventRecordReq {
  uint64_t event;
  uint64_t stream;
};
ORION_WIRE_STRUCT(EventRecordReq, 16);
struct EventElapsedReq {
  uint64_t start;
  uint64_t end;
};
ORION_WIRE_STRUCT(EventElapsedReq, 16);
struct F32Rep {
  float ms;
  uint32_t reserved;
};
static_assert(sizeof(F32Rep) == 8);

// CUDA arrays (cuArrayCreate, cuArray3DCreate; CUDA_ARRAY3D_DESCRIPTOR): ArrayCreate -> HandleRep,
// ArrayDestroy: HandleReq. Extents in elements (texels); height 0: a 1D array, depth 0: 2D (the CUDA
// convention). Counted in the session's quota as width * height * depth * texel bytes.
struct ArrayCreateReq {
  uint64_t width;
  uint64_t height;
  uint64_t depth;
  uint32_t format;    // CUarray_format: CU_AD_FORMAT_{UNSIGNED,SIGNED}_INT{8,16,32}, HALF, FLOAT
  uint32_t channels;  // 1, 2 or 4
  uint32_t flags;     // 0 or CUDA_ARRAY3D_SURFACE_LDST (layered, cubemap, gather: refused)
  uint32_t reserved;  // 0
};
ORION_WIRE_STRUCT(ArrayCreateReq, 40);
// Bytes of one channel of a CUarray_format Orion serves (values from cuda.h: UNSIGNED_INT8 0x01,
// 16 0x02, 32 0x03, SIGNED_INT8 0x08, 16 0x09, 32 0x0a, HALF 0x10, FLOAT 0x20); 0 for any other
// (planar, block-compressed, packed UNORM/SNORM/SRGB formats).
inline constexpr uint64_t ArrayFormatBytes(uint32_t format) noexcept {
  switch (format) {
    case 0x01:
    case 0x08: return 1;
    case 0x02:
    case 0x09:
    case 0x10: return 2;
    case 0x03:
    case 0x0a:
    case 0x20: return 4;
    default: return 0;
  }
}

// MemcpyArray: a 2D box (one slice) between any two of device memory, the data window and a CUDA
// array. Device / window side: the address or window offset of the box's first byte and the row
// pitch; array side: the array handle, pitch 0, and the box's origin (x in bytes, y row, z slice).
// kFlagWantsReply when the window is the destination and the client must read it.
inline constexpr uint32_t kSideArray = 2;
struct ArrayCopyReq {
  uint64_t src;
  uint64_t src_pitch;
  uint64_t dst;
  uint64_t dst_pitch;
  uint64_t src_x, src_y, src_z;
  uint64_t dst_x, dst_y, dst_z;
  uint64_t width_bytes;
  uint64_t height;
  uint64_t stream;
  uint32_t src_side;  // kSideDevice, kSideWindow, kSideArray
  uint32_t dst_side;
};
ORION_WIRE_STRUCT(ArrayCopyReq, 112);

// TexObjectCreate (cuTexObjectCreate, cuSurfObjectCreate) -> U64Rep: the object's value, which the
// client passes to kernels as it is. TexObjectDestroy: TexObjectReq's `object` field alone is read
// (ObjectReq). Resource: CU_RESOURCE_TYPE_ARRAY (res = array handle) or, textures only, LINEAR
// (res = device pointer, width = bytes / texel) or PITCH2D (res, width, height in texels, pitch).
struct TexObjectReq {
  uint64_t res;
  uint64_t width;
  uint64_t height;
  uint64_t pitch;
  uint32_t res_type;         // CUresourcetype
  uint32_t format;           // linear / pitch2D: CUarray_format
  uint32_t channels;         // linear / pitch2D: 1, 2 or 4
  uint32_t surface;          // 1: a surface object (cuSurfObjectCreate), array resources only
  uint32_t address_mode[3];  // CUaddress_mode
  uint32_t filter_mode;      // CUfilter_mode
  uint32_t flags;            // CU_TRSF_READ_AS_INTEGER | CU_TRSF_NORMALIZED_COORDINATES (others refused)
  uint32_t reserved;
  uint32_t border_color[4];  // the floats' bits (CUDA_TEXTURE_DESC::borderColor)
  // Mipmapped arrays (res_type CU_RESOURCE_TYPE_MIPMAPPED_ARRAY, res = the mipmapped array's handle).
  uint32_t mipmap_filter;   // CUfilter_mode between levels
  uint32_t max_anisotropy;  // 0..16
  uint32_t mipmap_bias;     // float bits: CUDA_TEXTURE_DESC::mipmapLevelBias
  uint32_t min_level;       // float bits: minMipmapLevelClamp
  uint32_t max_level;       // float bits: maxMipmapLevelClamp
  uint32_t reserved2;
};
ORION_WIRE_STRUCT(TexObjectReq, 112);
// MipmappedArrayCreate -> HandleRep: `levels` levels of `array` (each dimension halved per level,
// never below 1); MipmappedArrayGetLevel -> HandleRep: the array handle of one level (owned by the
// mipmapped array: it cannot be destroyed by itself); MipmappedArrayDestroy: HandleReq.
struct MipmapCreateReq {
  ArrayCreateReq array;
  uint32_t levels;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(MipmapCreateReq, 48);
struct MipmapLevelReq {
  uint64_t mipmap;
  uint32_t level;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(MipmapLevelReq, 16);
struct ObjectReq {
  uint64_t object;
  uint32_t surface;
  uint32_t reserved;
};
ORION_WIRE_STRUCT(ObjectReq, 16);

// Batch (a graph launch in one frame): entries, each a BatchEntry and then `len` bytes of the
// entry's own payload, the next entry starting 8-byte aligned. Only the asynchronous ops that need
// no window bytes and send no reply may be batched (OpBatchable); a Memcpy2D entry must copy device
// to device. oriond executes the entries in order, as if they had come one frame each: an entry's
// error is deferred like any asynchronous frame's, and the next entries still run. A malformed
// entry (truncated, an op not batchable) is a protocol violation.
struct BatchEntry {
  uint16_t op;
  uint16_t reserved;  // 0
  uint32_t len;
};
ORION_WIRE_STRUCT(BatchEntry, 8);
inline constexpr bool OpBatchable(uint16_t op) noexcept {
  switch (static_cast<Op>(op)) {
    case Op::kLaunchKernel:
    case Op::kLaunchKernelEx:
    case Op::kMemcpyDtoD:
    case Op::kMemcpy2D:
    case Op::kMemset:
    case Op::kEventRecord:
    case Op::kStreamWaitEvent: return true;
    default: return false;
  }
}

// ---------------------------------------------------------------------------------------------
// The checkpoint for hostile input (oriond): every request frame, on every transport, and every
// Batch entry passes CheckRequestShape before the session dispatches it; the request struct is
// then read once with DecodeReq, whose type comes from ops.def (never restated by the handler).
// Window ranges are checked in one place too (FrameWindowRanges above, for all transports).

enum class OpShape : uint8_t { kEmpty, kFixed, kHead, kOwn };  // ops.def, "shape"

// The request struct of `op` (ops.def), void for ops without one.
template <Op op>
struct OpRequest;
#define ORION_OP(name, number, reply, req, shape)     \
  template <>                                         \
  struct OpRequest<Op::k##name> {                     \
    using type = req;                                 \
    static constexpr OpShape kShape = OpShape::shape; \
  };
#include "orion/common/ops.def"
template <Op op>
using OpRequestT = typename OpRequest<op>::type;
// sizeof(T), 0 for void: the length of a request struct as ops.def names it.
template <typename T>
constexpr uint32_t RequestBytes() {
  if constexpr (std::is_void_v<T>) {
    return 0;
  } else {
    return sizeof(T);
  }
}

// Whether a payload of `len` bytes has the shape ops.def gives `op` (unknown ops: false). On
// false, *why says what was wrong ("a payload of 12 bytes, expected exactly 16"): for oriond, a
// protocol violation that ends the session.
bool CheckRequestShape(uint16_t op, uint32_t len, std::string* why);

// The request of a frame that passed CheckRequestShape, copied out once (a guest may change the
// shared bytes under us). Its type is ops.def's for `op`.
template <Op op>
OpRequestT<op> DecodeReq(const uint8_t* payload) noexcept {
  static_assert(OpRequest<op>::kShape == OpShape::kFixed || OpRequest<op>::kShape == OpShape::kHead,
                "only kFixed and kHead requests have a struct to decode");
  OpRequestT<op> q;
  std::memcpy(&q, payload, sizeof q);
  return q;
}

#undef ORION_WIRE_STRUCT

}  // namespace orion
