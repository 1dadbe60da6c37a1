// orion/host/fatbin.cpp — fatbin / cubin / PTX parsing for the sim backend. See fatbin.h.
//
// Every input byte is hostile. Rules followed throughout: fields are read with memcpy through
// Load()/Sub(), which check bounds without overflowing (off <= size && len <= size - off); every
// allocation is bounded by the input size or by kMaxDecompressedBytes; loops advance by at least
// one record per iteration; errors name the structure and the offending value.
//
// Format facts marked [recipes] come from /work/shared/recipes.md ("CUDA 13 toolkit"); facts marked
// [exp] were checked with nvcc/ptxas/fatbinary 13.0 (V13.0.88) on this machine, see the notes at the
// sections below.
#include "orion/fatbin/fatbin.h"

#include <lz4.h>
#include <zstd.h>

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <utility>

namespace orion::fatbin {

const Kernel* Module::FindKernel(std::string_view name) const {
  for (const Kernel& k : kernels)
    if (k.name == name) return &k;
  return nullptr;
}

const Global* Module::FindGlobal(std::string_view name) const {
  for (const Global& g : globals)
    if (g.name == name) return &g;
  return nullptr;
}

namespace {

static_assert(std::endian::native == std::endian::little, "image fields are read as little-endian");

using Bytes = std::span<const uint8_t>;

// ---- small helpers ------------------------------------------------------------------------------

// Error-message building (GCC 12 has no std::format).
void Append(std::string& s, const char* v) { s.append(v); }
void Append(std::string& s, const std::string& v) { s.append(v); }
template <std::integral T>
void Append(std::string& s, T v) {
  s.append(std::to_string(v));
}
template <typename... A>
std::string Cat(const A&... a) {
  std::string s;
  (Append(s, a), ...);
  return s;
}
std::string Hex(uint64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s;
  do {
    s.insert(s.begin(), kDigits[v & 0xf]);
    v >>= 4;
  } while (v != 0);
  return "0x" + s;
}
// Quotes at most 64 bytes of untrusted text for an error message, escaping non-printables.
std::string Quote(std::string_view v) {
  std::string s = "'";
  for (size_t i = 0; i < v.size() && i < 64; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      s.push_back(static_cast<char>(c));
    } else {
      s.append("\\x");
      s.push_back("0123456789abcdef"[c >> 4]);
      s.push_back("0123456789abcdef"[c & 0xf]);
    }
  }
  if (v.size() > 64) s.append("...");
  return s + "'";
}

#define FB_CONCAT_INNER(a, b) a##b
#define FB_CONCAT(a, b) FB_CONCAT_INNER(a, b)
#define FB_ASSIGN_OR_RETURN(lhs, expr)                                                        \
  auto FB_CONCAT(fb_result_, __LINE__) = (expr);                                              \
  if (!FB_CONCAT(fb_result_, __LINE__).ok()) return FB_CONCAT(fb_result_, __LINE__).status(); \
  lhs = std::move(*FB_CONCAT(fb_result_, __LINE__))
#define FB_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::orion::Status fb_status_ = (expr);     \
    if (!fb_status_.ok()) return fb_status_; \
  } while (0)

// Fixed-width little-endian read; false if [off, off + sizeof(T)) is not inside `b`.
template <typename T>
bool Load(Bytes b, uint64_t off, T& out) {
  if (off > b.size() || b.size() - off < sizeof(T)) return false;
  std::memcpy(&out, b.data() + off, sizeof(T));
  return true;
}
// Read from a buffer whose length the caller has already checked; yields 0 (never UB) if not.
template <typename T>
T At(Bytes b, uint64_t off) {
  T v{};
  (void)Load(b, off, v);
  return v;
}
// Sub-span [off, off + len) of `b`; false if it is not entirely inside.
bool Sub(Bytes b, uint64_t off, uint64_t len, Bytes& out) {
  if (off > b.size() || len > b.size() - off) return false;
  out = b.subspan(static_cast<size_t>(off), static_cast<size_t>(len));
  return true;
}
// Index of the first NUL in `b`, or b.size() (memchr must not see the null data() of an empty span).
size_t FindNul(Bytes b) {
  const void* nul = b.empty() ? nullptr : std::memchr(b.data(), 0, b.size());
  return nul ? static_cast<size_t>(static_cast<const uint8_t*>(nul) - b.data()) : b.size();
}
// a + b, false on uint64 overflow.
bool AddOk(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_add_overflow(a, b, &out); }
bool MulOk(uint64_t a, uint64_t b, uint64_t& out) { return !__builtin_mul_overflow(a, b, &out); }

// ---- fatbin container ---------------------------------------------------------------------------
// [recipes] header: u32 magic 0xBA55ED50, u16 version 1, u16 header_size 16, u64 payload_size.
// Entry header, 64 bytes (80 for PTX, 120 for LTO-IR [exp]; hdr_size says which):
//   0 u16 kind (1 PTX, 2 ELF; 8 LTO-IR [exp], skipped), 2 u16, 4 u32 hdr_size, 8 u64 size,
//   16 u32 compressed_size, 20 u32, 24 u16 minor, 26 u16 major, 28 u32 arch, 32 u32 name_off,
//   36 u32 name_len, 40 u64 flags, 48 u64, 56 u64 uncompressed_size.
// Flags [exp] (nvcc -fatbin with --compress-mode={default,size,speed,balance,none} and
// -Xfatbin=-compress-all): 0x11 on every entry (64-bit | Linux host), 0x8000 = zstd (modes
// default/size/balance; nvcc 13 by default compresses only PTX), 0x2000 = LZ4 raw block, no frame
// (mode speed), 0x100000 on sm_90a (arch-specific) cubins, 0x10000 on LTO-IR. A compressed entry
// holds compressed_size bytes of data followed by padding up to `size`; uncompressed_size is the
// decompressed length. Uncompressed entries have compressed_size = uncompressed_size = 0.
constexpr uint32_t kFatbinMagic = 0xBA55ED50;
constexpr uint32_t kWrapperMagic = 0x466243B1;  // __fatBinC_Wrapper_t [recipes]
constexpr uint64_t kFatbinHeaderBytes = 16;
constexpr uint64_t kEntryHeaderBytes = 64;
constexpr uint16_t kKindPtx = 1;
constexpr uint16_t kKindElf = 2;
constexpr uint64_t kFlagLz4 = 0x2000;
constexpr uint64_t kFlagZstd = 0x8000;

struct Entry {
  uint64_t offset = 0;  // of the entry header, from the start of the image (for messages)
  uint16_t kind = 0;
  uint32_t arch = 0;
  uint64_t flags = 0;
  uint32_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  Bytes payload;  // the `size` bytes after the entry header
};

// Returns the payload of the container at the start of `image`: [header_size, +payload_size).
Result<Bytes> FatbinPayload(Bytes image) {
  if (image.size() < kFatbinHeaderBytes)
    return OutOfRange(Cat("fatbin header truncated: ", image.size(), " of ", kFatbinHeaderBytes, " bytes"));
  const auto version = At<uint16_t>(image, 4);
  const auto header_size = At<uint16_t>(image, 6);
  const auto payload_size = At<uint64_t>(image, 8);
  if (version != 1) return InvalidArgument(Cat("unsupported fatbin version ", version));
  if (header_size < kFatbinHeaderBytes)
    return InvalidArgument(Cat("fatbin header_size ", header_size, " < ", kFatbinHeaderBytes));
  Bytes payload;
  if (!Sub(image, header_size, payload_size, payload))
    return OutOfRange(Cat("fatbin claims header_size ", header_size, " + payload_size ", payload_size,
                          " bytes but the image has ", image.size()));
  return payload;
}

// Walks the entries of one container, calling f(const Entry&) for each.
template <typename F>
Status ForEachEntry(Bytes image, F&& f) {
  FB_ASSIGN_OR_RETURN(const Bytes payload, FatbinPayload(image));
  const uint64_t base = static_cast<uint64_t>(payload.data() - image.data());
  for (uint64_t pos = 0; pos < payload.size();) {
    const uint64_t at = base + pos;
    Bytes h;
    if (!Sub(payload, pos, kEntryHeaderBytes, h))
      return OutOfRange(Cat("fatbin entry header at offset ", at, " truncated: ", payload.size() - pos, " of ",
                            kEntryHeaderBytes, " bytes left"));
    const auto hdr_size = At<uint32_t>(h, 4);
    const auto size = At<uint64_t>(h, 8);
    if (hdr_size < kEntryHeaderBytes)
      return InvalidArgument(Cat("fatbin entry at offset ", at, ": hdr_size ", hdr_size, " < ", kEntryHeaderBytes));
    Entry e;
    if (!Sub(payload, pos + hdr_size, size, e.payload))  // pos + hdr_size cannot overflow
      return OutOfRange(Cat("fatbin entry at offset ", at, ": hdr_size ", hdr_size, " + size ", size,
                            " runs past the container end (", payload.size() - pos, " bytes left)"));
    e.offset = at;
    e.kind = At<uint16_t>(h, 0);
    e.compressed_size = At<uint32_t>(h, 16);
    e.arch = At<uint32_t>(h, 28);
    e.flags = At<uint64_t>(h, 40);
    e.uncompressed_size = At<uint64_t>(h, 56);
    FB_RETURN_IF_ERROR(f(e));
    pos += hdr_size + size;  // both bounded by payload.size() above
  }
  return Status::Ok();
}

// The entry's contents: its payload, or the decompressed payload.
Result<std::vector<uint8_t>> EntryData(const Entry& e) {
  const bool lz4 = (e.flags & kFlagLz4) != 0;
  const bool zstd = (e.flags & kFlagZstd) != 0;
  const std::string where = Cat("fatbin entry at offset ", e.offset);
  if (!lz4 && !zstd) return std::vector<uint8_t>(e.payload.begin(), e.payload.end());
  if (lz4 && zstd) return InvalidArgument(where + ": flags " + Hex(e.flags) + " set both LZ4 and zstd");
  if (e.compressed_size == 0 || e.compressed_size > e.payload.size())
    return OutOfRange(Cat(where, ": compressed_size ", e.compressed_size, " not in [1, size ", e.payload.size(), "]"));
  if (e.uncompressed_size == 0) return DataLoss(where + ": compressed entry with uncompressed_size 0");
  if (e.uncompressed_size > kMaxDecompressedBytes)
    return ResourceExhausted(
        Cat(where, ": uncompressed_size ", e.uncompressed_size, " exceeds the ", kMaxDecompressedBytes, "-byte limit"));
  const Bytes src = e.payload.first(e.compressed_size);  // the rest is padding [recipes]
  std::vector<uint8_t> out;
  if (lz4) {
    // Raw LZ4 block [exp]: the payload starts with a token byte, no frame magic.
    if (src.size() > static_cast<size_t>(std::numeric_limits<int>::max()))
      return ResourceExhausted(where + ": LZ4 compressed_size too large");
    out.resize(static_cast<size_t>(e.uncompressed_size));
    const int n = LZ4_decompress_safe(reinterpret_cast<const char*>(src.data()), reinterpret_cast<char*>(out.data()),
                                      static_cast<int>(src.size()), static_cast<int>(out.size()));
    if (n < 0) return DataLoss(where + ": corrupt LZ4 data");
    if (static_cast<uint64_t>(n) != e.uncompressed_size)
      return DataLoss(Cat(where, ": LZ4 data decompressed to ", n, " bytes, header says ", e.uncompressed_size));
  } else {
    // zstd frame(s) [recipes][exp]: payload starts with 28 b5 2f fd.
    // Check the first frame's declared size before allocating (a later frame can only add).
    const unsigned long long declared = ZSTD_getFrameContentSize(src.data(), src.size());
    if (declared == ZSTD_CONTENTSIZE_ERROR) return DataLoss(where + ": corrupt zstd frame header");
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN && declared > e.uncompressed_size)
      return DataLoss(Cat(where, ": zstd frame holds ", declared, " bytes, header says ", e.uncompressed_size));
    out.resize(static_cast<size_t>(e.uncompressed_size));
    const size_t n = ZSTD_decompress(out.data(), out.size(), src.data(), src.size());
    if (ZSTD_isError(n)) return DataLoss(where + ": corrupt zstd data: " + ZSTD_getErrorName(n));
    if (n != e.uncompressed_size)
      return DataLoss(Cat(where, ": zstd data decompressed to ", n, " bytes, header says ", e.uncompressed_size));
  }
  return out;
}

// Is arch `a` a better pick than `b` for prefer_sm: the highest <= prefer, else the lowest.
bool BetterArch(uint32_t a, uint32_t b, uint32_t prefer) {
  const bool a_fits = a <= prefer;
  const bool b_fits = b <= prefer;
  if (a_fits != b_fits) return a_fits;
  return a_fits ? a > b : a < b;
}

// ---- ELF ----------------------------------------------------------------------------------------
// ELF64 little-endian, e_machine EM_CUDA (190). Section layout of a CUDA 13 cubin [exp]:
// per kernel `.text.<name>` (its symbol is STT_FUNC with st_other bit 0x10, STO_CUDA_ENTRY; a
// non-kernel __device__ function has st_other 0, checked with -rdc=true), `.nv.info.<name>` (type
// SHT_CUDA_INFO 0x70000000, sh_info = the .text section's index), `.nv.constant0.<name>` (the
// parameter bank); variables in `.nv.global` (NOBITS), `.nv.global.init`, `.nv.constant3`.
// e_flags: with EI_ABIVERSION >= 8 (all CUDA 13 cubins [exp]: sm_75 0x6004b04, sm_90 0x6005a04,
// sm_100 0x6006402) the SM is bits 8..15; older cubins (ABI 7) keep it in bits 0..7.
constexpr uint16_t kEmCuda = 190;
constexpr uint32_t kShtNull = 0;
constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtNobits = 8;
constexpr uint32_t kShtSymtabShndx = 18;
constexpr uint32_t kShtCudaInfo = 0x70000000;
// In relocatable (-rdc=true) cubins .nv.global is 0x70000007 and .nv.shared.<k> 0x7000000a: like
// SHT_NOBITS they occupy no file space (their ranges overlap the next section) [exp].
constexpr uint32_t kShtCudaGlobal = 0x70000007;
constexpr uint32_t kShtCudaShared = 0x7000000a;
constexpr uint16_t kShnLoreserve = 0xff00;
constexpr uint16_t kShnXindex = 0xffff;
constexpr uint16_t kPnXnum = 0xffff;
constexpr uint8_t kSttObject = 1;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kSttCudaObject = 13;  // variables in relocatable cubins [exp]
constexpr uint8_t kStoCudaEntry = 0x10;
constexpr uint64_t kEhdrBytes = 64;
constexpr uint64_t kShdrBytes = 64;
constexpr uint64_t kPhdrBytes = 56;
constexpr uint64_t kSymBytes = 24;
// Sanity cap on the section count (extended numbering lets sh[0].sh_size claim up to 2^64).
constexpr uint64_t kMaxSections = uint64_t{1} << 22;

struct Shdr {
  uint32_t name = 0, type = 0, link = 0, info = 0;
  uint64_t offset = 0, size = 0, entsize = 0;
};

bool HasFileData(uint32_t type) {
  return type != kShtNull && type != kShtNobits && type != kShtCudaGlobal && type != kShtCudaShared;
}

Shdr ReadShdr(Bytes h) {  // h is kShdrBytes long
  Shdr s;
  s.name = At<uint32_t>(h, 0);
  s.type = At<uint32_t>(h, 4);
  s.offset = At<uint64_t>(h, 24);
  s.size = At<uint64_t>(h, 32);
  s.link = At<uint32_t>(h, 40);
  s.info = At<uint32_t>(h, 44);
  s.entsize = At<uint64_t>(h, 56);
  return s;
}

struct Elf {
  Bytes image;
  std::vector<Shdr> sections;  // filled only when asked for
  uint32_t shstrndx = 0;
  uint32_t flags = 0;
  uint8_t abi_version = 0;
  uint64_t extent = 0;  // max end of headers, tables, sections and segments
};

// Validates the ELF header, the section and program header tables and every section and segment
// extent against `image`. Fills elf.sections when `keep_sections`.
Result<Elf> ReadElf(Bytes image, bool keep_sections) {
  Elf elf;
  elf.image = image;
  if (image.size() < kEhdrBytes)
    return OutOfRange(Cat("ELF header truncated: ", image.size(), " of ", kEhdrBytes, " bytes"));
  if (image[4] != 2) return InvalidArgument(Cat("ELF class ", image[4], " unsupported (need 64-bit)"));
  if (image[5] != 1) return InvalidArgument(Cat("ELF data encoding ", image[5], " unsupported (need little-endian)"));
  const auto machine = At<uint16_t>(image, 0x12);
  if (machine != kEmCuda) return InvalidArgument(Cat("ELF e_machine ", machine, " is not EM_CUDA (", kEmCuda, ")"));
  elf.abi_version = image[8];
  const auto phoff = At<uint64_t>(image, 0x20);
  const auto shoff = At<uint64_t>(image, 0x28);
  elf.flags = At<uint32_t>(image, 0x30);
  const auto phentsize = At<uint16_t>(image, 0x36);
  const auto e_phnum = At<uint16_t>(image, 0x38);
  const auto shentsize = At<uint16_t>(image, 0x3a);
  const auto e_shnum = At<uint16_t>(image, 0x3c);
  const auto e_shstrndx = At<uint16_t>(image, 0x3e);
  elf.extent = kEhdrBytes;

  // Section header table; entry 0 carries the extended counts.
  if (shoff == 0) return InvalidArgument("ELF has no section header table (e_shoff 0)");
  if (shentsize < kShdrBytes) return InvalidArgument(Cat("ELF e_shentsize ", shentsize, " < ", kShdrBytes));
  Bytes h;
  if (!Sub(image, shoff, kShdrBytes, h))
    return OutOfRange(
        Cat("ELF section header table at offset ", shoff, " is past the end of the ", image.size(), "-byte image"));
  const Shdr sh0 = ReadShdr(h);
  const uint64_t shnum = e_shnum != 0 ? e_shnum : sh0.size;
  elf.shstrndx = e_shstrndx == kShnXindex ? sh0.link : e_shstrndx;
  const uint64_t phnum = e_phnum == kPnXnum ? sh0.info : e_phnum;
  if (shnum == 0 || shnum > kMaxSections)
    return InvalidArgument(Cat("ELF section count ", shnum, " not in [1, ", kMaxSections, "]"));
  if (shnum > (image.size() - shoff) / shentsize)
    return OutOfRange(Cat("ELF section header table (", shnum, " x ", shentsize, " bytes at offset ", shoff,
                          ") runs past the end of the ", image.size(), "-byte image"));
  elf.extent = std::max(elf.extent, shoff + shnum * shentsize);
  if (elf.shstrndx >= shnum) return InvalidArgument(Cat("ELF e_shstrndx ", elf.shstrndx, " >= section count ", shnum));
  if (keep_sections) elf.sections.reserve(static_cast<size_t>(shnum));
  for (uint64_t i = 0; i < shnum; ++i) {
    (void)Sub(image, shoff + i * shentsize, kShdrBytes, h);  // inside the table checked above
    const Shdr s = ReadShdr(h);
    if (HasFileData(s.type)) {
      uint64_t end;
      if (!AddOk(s.offset, s.size, end) || end > image.size())
        return OutOfRange(Cat("ELF section ", i, ": offset ", s.offset, " + size ", s.size,
                              " runs past the end of the ", image.size(), "-byte image"));
      elf.extent = std::max(elf.extent, end);
    }
    if (keep_sections) elf.sections.push_back(s);
  }

  // Program header table (optional; a relocatable cubin has none).
  if (phnum != 0) {
    if (phnum > kMaxSections) return InvalidArgument(Cat("ELF program header count ", phnum, " > ", kMaxSections));
    if (phentsize < kPhdrBytes) return InvalidArgument(Cat("ELF e_phentsize ", phentsize, " < ", kPhdrBytes));
    if (phoff > image.size() || phnum > (image.size() - phoff) / phentsize)
      return OutOfRange(Cat("ELF program header table (", phnum, " x ", phentsize, " bytes at offset ", phoff,
                            ") runs past the end of the ", image.size(), "-byte image"));
    elf.extent = std::max(elf.extent, phoff + phnum * phentsize);
    for (uint64_t i = 0; i < phnum; ++i) {
      (void)Sub(image, phoff + i * phentsize, kPhdrBytes, h);
      const auto offset = At<uint64_t>(h, 8);
      const auto filesz = At<uint64_t>(h, 32);
      uint64_t end;
      if (!AddOk(offset, filesz, end) || end > image.size())
        return OutOfRange(Cat("ELF segment ", i, ": offset ", offset, " + filesz ", filesz,
                              " runs past the end of the ", image.size(), "-byte image"));
      if (filesz != 0) elf.extent = std::max(elf.extent, end);
    }
  }
  return elf;
}

Bytes SectionData(const Elf& elf, const Shdr& s) {
  Bytes out;
  if (HasFileData(s.type)) (void)Sub(elf.image, s.offset, s.size, out);  // checked in ReadElf
  return out;
}

// NUL-terminated string at `off` in section `sec`.
Result<std::string_view> ElfString(const Elf& elf, uint64_t sec, uint64_t off, const char* what) {
  if (sec >= elf.sections.size())
    return InvalidArgument(Cat("ELF string table index ", sec, " for ", what, " out of range"));
  const Bytes d = SectionData(elf, elf.sections[sec]);
  if (off >= d.size())
    return OutOfRange(
        Cat("ELF ", what, " name offset ", off, " outside string table section ", sec, " (", d.size(), " bytes)"));
  const Bytes rest = d.subspan(static_cast<size_t>(off));
  const size_t len = FindNul(rest);
  if (len == rest.size())
    return InvalidArgument(Cat("ELF ", what, " name at offset ", off, " of section ", sec, " is not NUL-terminated"));
  return std::string_view(reinterpret_cast<const char*>(rest.data()), len);
}

// .nv.info records [recipes][exp]: u8 format, u8 attribute, u16 value-or-length. EIFMT_SVAL (4)
// is followed by `length` bytes; NVAL (1), BVAL (2) and HVAL (3) are 4 bytes in all [exp: an NVAL
// record 01 3e 00 00 in a __cluster_dims__ kernel].
constexpr uint8_t kEifmtSval = 4;
constexpr uint8_t kEifmtHval = 3;
constexpr uint8_t kEiattrKparamInfo = 0x17;      // u32 index, u16 ordinal, u16 offset, u32 bits;
                                                 // size = (bits >> 18) & 0x3fff [recipes]
constexpr uint8_t kEiattrCbankParamSize = 0x19;  // HVAL: total parameter bytes [recipes]
// [exp] ptxas 13 writes this instead of 0x17 when the parameter buffer is large (seen for 16383-,
// 20000- and 32000-byte structs, not for 4096): u32 index, u16 ordinal, u16 offset, u16 size,
// u16 flags (sm_100 / sm_120 set 0x0500 on pointer parameters, as they set 0x500 in 0x17 bits).
constexpr uint8_t kEiattrKparamInfoV2 = 0x45;

Status ParseKernelInfo(Bytes info, Kernel& k) {
  const std::string where = ".nv.info of kernel " + Quote(k.name);
  std::optional<uint32_t> cbank;
  std::vector<KernelParam> params;
  for (uint64_t pos = 0; pos < info.size();) {
    if (info.size() - pos < 4) return OutOfRange(Cat(where, ": record at offset ", pos, " truncated"));
    const uint8_t fmt = info[pos];
    const uint8_t attr = info[pos + 1];
    const auto value = At<uint16_t>(info, pos + 2);
    if (fmt == kEifmtSval) {
      Bytes v;
      if (!Sub(info, pos + 4, value, v))
        return OutOfRange(Cat(where, ": record at offset ", pos, " (attribute ", Hex(attr), ") length ", value,
                              " runs past the section end"));
      if (attr == kEiattrKparamInfo || attr == kEiattrKparamInfoV2) {
        if (v.size() < 12)
          return InvalidArgument(
              Cat(where, ": parameter record at offset ", pos, " has ", v.size(), " bytes, need 12"));
        const auto bits = At<uint32_t>(v, 8);
        params.push_back({At<uint16_t>(v, 4), At<uint16_t>(v, 6),
                          attr == kEiattrKparamInfo ? (bits >> 18) & 0x3fff : bits & 0xffff});
      }
      pos += 4 + uint64_t{value};
    } else if (fmt >= 1 && fmt <= 3) {
      if (attr == kEiattrCbankParamSize && fmt == kEifmtHval) cbank = value;
      pos += 4;
    } else {
      return InvalidArgument(Cat(where, ": record at offset ", pos, " has unknown format ", fmt));
    }
  }
  std::sort(params.begin(), params.end(),
            [](const KernelParam& a, const KernelParam& b) { return a.ordinal < b.ordinal; });
  uint64_t end = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const KernelParam& p = params[i];
    if (p.ordinal != i) {  // sorted: either ordinal i is missing or the previous one repeats
      if (i > 0 && p.ordinal == params[i - 1].ordinal)
        return InvalidArgument(Cat(where, ": duplicate parameter ordinal ", p.ordinal));
      return InvalidArgument(Cat(where, ": parameter ordinal ", i, " missing"));
    }
    end = std::max(end, uint64_t{p.offset} + p.size);
  }
  if (cbank && end > *cbank)
    return InvalidArgument(Cat(where, ": parameters end at byte ", end, " beyond EIATTR_CBANK_PARAM_SIZE ", *cbank));
  if (!cbank && end > std::numeric_limits<uint32_t>::max())
    return InvalidArgument(Cat(where, ": parameters end at byte ", end));
  k.params = std::move(params);
  k.param_bytes = cbank ? *cbank : static_cast<uint32_t>(end);
  return Status::Ok();
}

Result<Module> ParseCubin(Bytes image) {
  FB_ASSIGN_OR_RETURN(const Elf elf, ReadElf(image, /*keep_sections=*/true));
  const auto& secs = elf.sections;
  Module m;
  m.sm_arch = elf.abi_version >= 8 ? (elf.flags >> 8) & 0xff : elf.flags & 0xff;

  uint64_t symtab = 0;
  for (uint64_t i = 0; i < secs.size() && symtab == 0; ++i)
    if (secs[i].type == kShtSymtab) symtab = i;
  if (symtab == 0) return InvalidArgument("cubin has no SHT_SYMTAB section");
  const Shdr& st = secs[symtab];
  if (st.entsize < kSymBytes) return InvalidArgument(Cat("ELF .symtab sh_entsize ", st.entsize, " < ", kSymBytes));
  const Bytes syms = SectionData(elf, st);
  const uint64_t nsyms = syms.size() / st.entsize;
  Bytes shndx_table;  // SHT_SYMTAB_SHNDX for symbols with st_shndx == SHN_XINDEX
  for (const Shdr& s : secs)
    if (s.type == kShtSymtabShndx && s.link == symtab) shndx_table = SectionData(elf, s);

  // Kernel info sections by the .text section they describe (sh_info), and by name as a fallback.
  std::vector<uint32_t> info_of(secs.size(), 0);
  std::unordered_map<std::string_view, uint32_t> info_by_name;
  for (uint32_t i = 1; i < secs.size(); ++i) {
    if (secs[i].type != kShtCudaInfo) continue;
    if (secs[i].info != 0 && secs[i].info < secs.size() && info_of[secs[i].info] == 0) info_of[secs[i].info] = i;
    FB_ASSIGN_OR_RETURN(const std::string_view n, ElfString(elf, elf.shstrndx, secs[i].name, "section"));
    if (n.starts_with(".nv.info.")) info_by_name.emplace(n.substr(9), i);
  }
  std::vector<bool> info_used(secs.size(), false);  // one kernel per info section: keeps work linear

  for (uint64_t i = 1; i < nsyms; ++i) {
    Bytes s;
    (void)Sub(syms, i * st.entsize, kSymBytes, s);  // i < nsyms = size / entsize
    const uint8_t type = s[4] & 0xf;
    const uint8_t other = s[5];
    uint64_t shndx = At<uint16_t>(s, 6);
    const bool is_kernel = type == kSttFunc && (other & kStoCudaEntry) != 0;
    if (!is_kernel && type != kSttObject && type != kSttCudaObject) continue;
    if (shndx == kShnXindex) {
      uint32_t x;
      if (!Load(shndx_table, i * 4, x))
        return InvalidArgument(Cat("ELF symbol ", i, " uses SHN_XINDEX without an SHT_SYMTAB_SHNDX entry"));
      shndx = x;
    } else if (shndx == 0 || shndx >= kShnLoreserve) {
      continue;  // undefined or special (SHN_ABS, SHN_COMMON): not a definition in this image
    }
    if (shndx >= secs.size())
      return InvalidArgument(Cat("ELF symbol ", i, ": section index ", shndx, " >= section count ", secs.size()));
    FB_ASSIGN_OR_RETURN(const std::string_view name, ElfString(elf, st.link, At<uint32_t>(s, 0), "symbol"));
    if (is_kernel) {
      Kernel k;
      k.name = std::string(name);
      uint32_t info = info_of[shndx];
      if (info == 0) {
        auto it = info_by_name.find(name);
        if (it != info_by_name.end()) info = it->second;
      }
      if (info != 0) {  // a kernel without .nv.info has no parameters
        if (info_used[info])
          return InvalidArgument(Cat("ELF section ", info, " describes more than one kernel (", Quote(name), ")"));
        info_used[info] = true;
        FB_RETURN_IF_ERROR(ParseKernelInfo(SectionData(elf, secs[info]), k));
      }
      m.kernels.push_back(std::move(k));
    } else {
      FB_ASSIGN_OR_RETURN(const std::string_view sec, ElfString(elf, elf.shstrndx, secs[shndx].name, "section"));
      if (sec.starts_with(".nv.global") || sec.starts_with(".nv.constant")) {
        Global g{std::string(name), At<uint64_t>(s, 16), {}};
        // Initial bytes live in the defining section (e.g. .nv.global.init) at st_value; a
        // variable in a no-data section (.nv.global) starts zeroed.
        if (HasFileData(secs[shndx].type)) {
          const Bytes data = SectionData(elf, secs[shndx]);
          const uint64_t value = At<uint64_t>(s, 8);
          if (value > data.size() || g.size > data.size() - value)
            return InvalidArgument(Cat("ELF variable ", Quote(name), " lies outside its section"));
          g.init.assign(data.begin() + static_cast<std::ptrdiff_t>(value),
                        data.begin() + static_cast<std::ptrdiff_t>(value + g.size));
        }
        m.globals.push_back(std::move(g));
      }
    }
  }
  return m;
}

// ---- PTX ----------------------------------------------------------------------------------------
// A streaming tokenizer (no token vector: memory stays O(1) beyond the results) and a parser for
// module-scope `.entry` parameter lists and `.global` / `.const` variable declarations. Parameter
// layout follows the PTX ABI: each .param is aligned to its .align, else to its element size
// (vector: element size x count); param_bytes is the end of the last parameter, which matches
// EIATTR_CBANK_PARAM_SIZE in the cubins ptxas makes from the same PTX [exp].
enum class Tok : uint8_t { kEnd, kDirective, kIdent, kNumber, kString, kPunct };
struct Token {
  Tok kind = Tok::kEnd;
  std::string_view text;
  bool Is(std::string_view s) const { return kind != Tok::kEnd && kind != Tok::kString && text == s; }
};

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}
  Token Next() {
    SkipSpaceAndComments();
    if (i_ >= s_.size()) return {};
    const size_t start = i_;
    const char c = s_[i_];
    Tok kind;
    if (c == '.' && i_ + 1 < s_.size() && IsWord(s_[i_ + 1])) {
      kind = Tok::kDirective;
      ++i_;
      while (i_ < s_.size() && IsWord(s_[i_])) ++i_;
    } else if (IsDigit(c)) {
      kind = Tok::kNumber;  // 123, 0x1f, 0f3F800000, 1.5 (suffixes included)
      while (i_ < s_.size() && (IsWord(s_[i_]) || s_[i_] == '.')) ++i_;
    } else if (IsWord(c) || c == '$' || c == '%') {
      kind = Tok::kIdent;
      while (i_ < s_.size() && (IsWord(s_[i_]) || s_[i_] == '$' || s_[i_] == '%')) ++i_;
    } else if (c == '"') {
      kind = Tok::kString;
      for (++i_; i_ < s_.size() && s_[i_] != '"'; ++i_)
        if (s_[i_] == '\\') ++i_;
      i_ = std::min(i_ + 1, s_.size());
    } else {
      kind = Tok::kPunct;
      ++i_;
    }
    return {kind, s_.substr(start, i_ - start)};
  }
  Token Peek() {
    const size_t saved = i_;
    Token t = Next();
    i_ = saved;
    return t;
  }
  size_t line() const {
    return static_cast<size_t>(std::count(s_.begin(), s_.begin() + static_cast<std::ptrdiff_t>(i_), '\n')) + 1;
  }

 private:
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsWord(char c) { return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
  void SkipSpaceAndComments() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        ++i_;
      } else if (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '/') {
        const size_t nl = s_.find('\n', i_);
        i_ = nl == std::string_view::npos ? s_.size() : nl + 1;
      } else if (c == '/' && i_ + 1 < s_.size() && s_[i_ + 1] == '*') {
        const size_t end = s_.find("*/", i_ + 2);
        i_ = end == std::string_view::npos ? s_.size() : end + 2;
      } else {
        return;
      }
    }
  }
  std::string_view s_;
  size_t i_ = 0;
};

// PTX integer literal: decimal, 0x hex, 0 octal, 0b binary, optional U suffix.
std::optional<uint64_t> ParseUint(std::string_view t) {
  if (!t.empty() && (t.back() == 'U' || t.back() == 'u')) t.remove_suffix(1);
  if (t.empty()) return std::nullopt;
  unsigned base = 10;
  if (t.size() > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X')) {
    base = 16;
    t.remove_prefix(2);
  } else if (t.size() > 2 && t[0] == '0' && (t[1] == 'b' || t[1] == 'B')) {
    base = 2;
    t.remove_prefix(2);
  } else if (t.size() > 1 && t[0] == '0') {
    base = 8;
    t.remove_prefix(1);
  }
  uint64_t v = 0;
  for (const char c : t) {
    unsigned d;
    if (c >= '0' && c <= '9')
      d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f')
      d = static_cast<unsigned>(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      d = static_cast<unsigned>(c - 'A' + 10);
    else
      return std::nullopt;
    if (d >= base || !MulOk(v, base, v) || !AddOk(v, d, v)) return std::nullopt;
  }
  return v;
}

// Size of a PTX fundamental type directive; 0 if it is not one.
uint32_t ScalarSize(std::string_view d) {
  static constexpr std::pair<std::string_view, uint32_t> kTypes[] = {
      {".b8", 1},  {".u8", 1},    {".s8", 1},     {".pred", 1},       {".b16", 2},    {".u16", 2},
      {".s16", 2}, {".f16", 2},   {".bf16", 2},   {".b32", 4},        {".u32", 4},    {".s32", 4},
      {".f32", 4}, {".f16x2", 4}, {".bf16x2", 4}, {".b64", 8},        {".u64", 8},    {".s64", 8},
      {".f64", 8}, {".b128", 16}, {".texref", 8}, {".samplerref", 8}, {".surfref", 8}};
  for (const auto& [name, size] : kTypes)
    if (d == name) return size;
  return 0;
}

// Sanity caps: a parameter buffer (CUDA allows 32764 bytes) and one variable's size.
constexpr uint64_t kMaxPtxParamBytes = uint64_t{1} << 20;
constexpr uint64_t kMaxPtxVarBytes = uint64_t{1} << 40;

class PtxParser {
 public:
  explicit PtxParser(std::string_view text) : lx_(text) {}

  Result<Module> Parse() {
    Module m;
    m.from_ptx = true;
    int braces = 0, parens = 0;
    bool is_extern = false;  // `.extern` seen in the current module-scope statement
    for (Token t = lx_.Next(); t.kind != Tok::kEnd; t = lx_.Next()) {
      if (t.kind == Tok::kPunct) {
        const char c = t.text[0];
        if (c == '{') ++braces;
        if (c == '}' && braces > 0) --braces;
        if (c == '(') ++parens;
        if (c == ')' && parens > 0) --parens;
        if (braces == 0 && parens == 0 && (c == ';' || c == '}')) is_extern = false;
        continue;
      }
      if (braces != 0 || parens != 0 || t.kind != Tok::kDirective) continue;
      if (t.text == ".extern") {
        is_extern = true;
      } else if (t.text == ".entry" && !is_extern) {
        FB_ASSIGN_OR_RETURN(Kernel k, ParseEntry());
        m.kernels.push_back(std::move(k));
      } else if ((t.text == ".global" || t.text == ".const") && !is_extern) {
        FB_RETURN_IF_ERROR(ParseVariables(m.globals));
      }
    }
    return m;
  }

 private:
  static std::string Describe(const Token& t) { return t.kind == Tok::kEnd ? "end of text" : Quote(t.text); }
  Status Error(std::string what) { return InvalidArgument(Cat("PTX line ", lx_.line(), ": ", what)); }

  // Attributes and type of a declaration up to (and including) its name.
  struct Decl {
    uint64_t align = 0;  // explicit .align, 0 if none
    uint64_t elem = 0;   // element size
    uint64_t vec = 1;
    bool opaque = false;  // .texref / .samplerref / .surfref
    std::string_view name;
  };
  Result<Decl> ParseDecl(const char* what) {
    Decl d;
    for (;;) {
      const Token t = lx_.Next();
      if (t.kind == Tok::kIdent) {
        d.name = t.text;
        break;
      }
      if (t.kind != Tok::kDirective) return Error(Cat("expected ", what, " name, got ", Describe(t)));
      if (t.Is(".align")) {
        const Token n = lx_.Next();
        const auto a = ParseUint(n.text);
        if (n.kind != Tok::kNumber || !a || *a == 0 || !std::has_single_bit(*a) || *a > 4096)
          return Error(Cat("bad .align ", Describe(n)));
        d.align = *a;
      } else if (t.Is(".attribute")) {  // .attribute(.managed)
        if (!lx_.Next().Is("(")) return Error("expected '(' after .attribute");
        Token a;
        do a = lx_.Next();
        while (a.kind != Tok::kEnd && !a.Is(")"));
      } else if (t.Is(".v2") || t.Is(".v4") || t.Is(".v8")) {
        d.vec = static_cast<uint64_t>(t.text[2] - '0');
      } else if (t.Is(".ptr") || t.Is(".global") || t.Is(".const") || t.Is(".local") || t.Is(".shared") ||
                 t.Is(".generic")) {
        // pointer attributes of a kernel parameter: `.param .u64 .ptr .global .align 8 p`
      } else if (const uint32_t size = ScalarSize(t.text); size != 0) {
        d.elem = size;
        d.opaque = t.Is(".texref") || t.Is(".samplerref") || t.Is(".surfref");
      } else {
        return Error(Cat("unsupported ", what, " type ", Quote(t.text)));
      }
    }
    if (d.elem == 0) return Error(Cat(what, " ", Quote(d.name), " has no type"));
    return d;
  }

  // `[N]...` after a name: the element count (product); `unsized` set for `[]`.
  Result<uint64_t> ParseDims(bool& unsized) {
    uint64_t count = 1;
    unsized = false;
    while (lx_.Peek().Is("[")) {
      lx_.Next();
      Token t = lx_.Next();
      if (t.Is("]")) {
        unsized = true;
        continue;
      }
      const auto n = ParseUint(t.text);
      if (t.kind != Tok::kNumber || !n) return Error(Cat("bad array size ", Describe(t)));
      if (!MulOk(count, *n, count)) return Error("array size overflows");
      if (!lx_.Next().Is("]")) return Error("expected ']'");
    }
    return count;
  }

  // After `.entry`: name and optional parameter list.
  Result<Kernel> ParseEntry() {
    Kernel k;
    const Token name = lx_.Next();
    if (name.kind != Tok::kIdent) return Error(Cat("expected .entry name, got ", Describe(name)));
    k.name = std::string(name.text);
    if (!lx_.Peek().Is("(")) return k;
    lx_.Next();
    if (lx_.Peek().Is(")")) {
      lx_.Next();
      return k;
    }
    uint64_t end = 0;
    for (uint32_t ordinal = 0;; ++ordinal) {
      if (!lx_.Next().Is(".param")) return Error(Cat("expected .param in .entry ", Quote(k.name)));
      FB_ASSIGN_OR_RETURN(const Decl d, ParseDecl("parameter"));
      bool unsized;
      FB_ASSIGN_OR_RETURN(const uint64_t count, ParseDims(unsized));
      if (unsized) return Error(Cat("unsized parameter ", Quote(d.name)));
      const uint64_t align = d.align != 0 ? d.align : d.elem * d.vec;
      uint64_t size;
      if (!MulOk(d.elem * d.vec, count, size) || size > kMaxPtxParamBytes)
        return Error(Cat("parameter ", Quote(d.name), " too large"));
      const uint64_t offset = (end + align - 1) / align * align;  // end, align <= 2^20
      end = offset + size;
      if (end > kMaxPtxParamBytes)
        return Error(Cat("parameters of ", Quote(k.name), " exceed ", kMaxPtxParamBytes, " bytes"));
      k.params.push_back({ordinal, static_cast<uint32_t>(offset), static_cast<uint32_t>(size)});
      const Token sep = lx_.Next();
      if (sep.Is(")")) break;
      if (!sep.Is(",")) return Error(Cat("expected ',' or ')' in .entry ", Quote(k.name), ", got ", Describe(sep)));
    }
    k.param_bytes = static_cast<uint32_t>(end);
    return k;
  }

  // After module-scope `.global` / `.const`: one or more declarators up to ';'.
  Status ParseVariables(std::vector<Global>& out) {
    FB_ASSIGN_OR_RETURN(Decl d, ParseDecl("variable"));
    for (;;) {
      bool unsized;
      FB_ASSIGN_OR_RETURN(uint64_t count, ParseDims(unsized));
      Token t = lx_.Next();
      if (t.Is("=")) {  // skip the initializer; for `x[] = {...}` count its leaf items
        uint64_t items = 0;
        int depth = 0;
        bool item_start = true;
        for (t = lx_.Next(); t.kind != Tok::kEnd; t = lx_.Next()) {
          if (depth == 0 && (t.Is(",") || t.Is(";"))) break;
          if (t.Is("{"))
            ++depth;
          else if (t.Is("}"))
            --depth;
          else if (t.Is(","))
            item_start = true;
          else if (item_start) {
            ++items;
            item_start = false;
          }
          if (t.Is("{")) item_start = true;
        }
        if (unsized) {
          if (!MulOk(count, items, count)) return Error("array size overflows");
          unsized = false;
        }
      }
      if (unsized) return Error(Cat("unsized variable ", Quote(d.name), " without initializer"));
      uint64_t size;
      if (!MulOk(d.elem * d.vec, count, size) || size > kMaxPtxVarBytes)
        return Error(Cat("variable ", Quote(d.name), " too large"));
      if (!d.opaque) out.push_back({std::string(d.name), size, {}});  // PTX initialisers are not decoded: zeroed
      if (t.Is(";")) return Status::Ok();
      if (!t.Is(",")) return Error(Cat("expected ',' or ';' after variable ", Quote(d.name), ", got ", Describe(t)));
      t = lx_.Next();
      if (t.kind != Tok::kIdent) return Error(Cat("expected variable name, got ", Describe(t)));
      d.name = t.text;
    }
  }

  Lexer lx_;
};

Result<Module> ParsePtx(std::string_view text) { return PtxParser(text).Parse(); }

// Length (without the NUL) of NUL-terminated PTX text at the start of `b`; nullopt if `b` does not
// hold printable text with a `.version` directive ending in a NUL.
std::optional<uint64_t> PtxLength(Bytes b) {
  const size_t len = FindNul(b);
  if (len == b.size()) return std::nullopt;
  for (size_t i = 0; i < len; ++i) {
    const uint8_t c = b[i];
    if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') return std::nullopt;
  }
  const std::string_view text(reinterpret_cast<const char*>(b.data()), len);
  if (text.find(".version") == std::string_view::npos) return std::nullopt;
  return len;
}

std::string FirstBytes(Bytes b) {
  std::string s;
  for (size_t i = 0; i < b.size() && i < 8; ++i) s += (i ? " " : "") + Hex(b[i]).substr(2);
  return s.empty() ? "none" : s;
}

Status Unrecognised(Bytes b, uint64_t size) {
  return InvalidArgument(Cat("unrecognised image (", size, " bytes, starting ", FirstBytes(b),
                             "): not a fatbin (magic 0xba55ed50), an ELF cubin or NUL-terminated "
                             "PTX with a .version directive"));
}

bool IsElf(Bytes b) { return b.size() >= 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F'; }

Result<Module> ParseFatbin(Bytes image, uint32_t prefer_sm) {
  std::optional<Entry> elf, ptx;
  auto pick = [&](const Entry& e) {
    if (e.kind != kKindElf && e.kind != kKindPtx) return Status::Ok();  // LTO-IR etc.
    std::optional<Entry>& best = e.kind == kKindElf ? elf : ptx;
    if (!best || BetterArch(e.arch, best->arch, prefer_sm)) best = e;  // ties: first wins
    return Status::Ok();
  };
  FB_RETURN_IF_ERROR(ForEachEntry(image, pick));
  const std::optional<Entry>& chosen = elf ? elf : ptx;
  if (!chosen) return NotFound("fatbin has no cubin (kind 2) or PTX (kind 1) entry");
  FB_ASSIGN_OR_RETURN(const std::vector<uint8_t> data, EntryData(*chosen));
  const std::string where = Cat("fatbin entry at offset ", chosen->offset, " (sm_", chosen->arch, "): ");
  if (elf) {
    if (!IsElf(data)) return InvalidArgument(where + "cubin entry does not start with an ELF magic");
    auto m = ParseCubin(data);
    if (!m.ok()) return Status(m.status().code(), where + m.status().message());
    m->sm_arch = chosen->arch;
    return m;
  }
  // PTX payloads are padded with NULs [exp]; the text ends at the first one.
  auto m = ParsePtx(std::string_view(reinterpret_cast<const char*>(data.data()), FindNul(data)));
  if (!m.ok()) return Status(m.status().code(), where + m.status().message());
  return m;
}

}  // namespace

Result<Module> ParseImage(std::span<const uint8_t> image, uint32_t prefer_sm) {
  uint32_t magic = 0;
  if (Load(image, 0, magic)) {
    if (magic == kFatbinMagic) return ParseFatbin(image, prefer_sm);
    if (magic == kWrapperMagic)
      return InvalidArgument(
          "image is a __fatBinC_Wrapper_t (magic 0x466243b1); pass the fatbin "
          "its data field points to");
  }
  if (IsElf(image)) return ParseCubin(image);
  if (const auto len = PtxLength(image))
    return ParsePtx(std::string_view(reinterpret_cast<const char*>(image.data()), *len));
  return Unrecognised(image, image.size());
}

namespace {
// A fatbin's PTX entry: the highest arch <= prefer_sm, else the lowest.
Result<Entry> FindPtxEntry(Bytes image, uint32_t prefer_sm) {
  std::optional<Entry> ptx;
  auto pick = [&](const Entry& e) {
    if (e.kind == kKindPtx && (!ptx || BetterArch(e.arch, ptx->arch, prefer_sm))) ptx = e;
    return Status::Ok();
  };
  FB_RETURN_IF_ERROR(ForEachEntry(image, pick));
  if (!ptx) return NotFound("the fatbin has no PTX entry (SASS only)");
  return *ptx;
}
}  // namespace

Result<uint32_t> PtxArch(std::span<const uint8_t> image, uint32_t prefer_sm) {
  uint32_t magic = 0;
  if (Load(image, 0, magic) && magic == kFatbinMagic) {
    FB_ASSIGN_OR_RETURN(const Entry ptx, FindPtxEntry(image, prefer_sm));
    return ptx.arch;
  }
  if (IsElf(image)) return NotFound("the image is a cubin (SASS only, no PTX)");
  if (PtxLength(image)) return uint32_t{0};
  return Unrecognised(image, image.size());
}

Result<PtxEntry> ExtractPtx(std::span<const uint8_t> image, uint32_t prefer_sm) {
  uint32_t magic = 0;
  if (Load(image, 0, magic) && magic == kFatbinMagic) {
    FB_ASSIGN_OR_RETURN(const Entry ptx, FindPtxEntry(image, prefer_sm));
    FB_ASSIGN_OR_RETURN(const std::vector<uint8_t> data, EntryData(ptx));
    return PtxEntry{std::string(reinterpret_cast<const char*>(data.data()), FindNul(data)), ptx.arch};
  }
  if (IsElf(image)) return NotFound("the image is a cubin (SASS only, no PTX)");
  if (const auto len = PtxLength(image))
    return PtxEntry{std::string(reinterpret_cast<const char*>(image.data()), *len), 0};
  return Unrecognised(image, image.size());
}

Result<uint64_t> ImageSize(const uint8_t* p, uint64_t max) {
  if (p == nullptr) return InvalidArgument("ImageSize: null image pointer");
  // Nothing below reads beyond what it has checked against `max`.
  const Bytes b(p, static_cast<size_t>(max));
  uint32_t magic = 0;
  if (Load(b, 0, magic)) {
    if (magic == kFatbinMagic) {
      FB_ASSIGN_OR_RETURN(const Bytes payload, FatbinPayload(b));
      return static_cast<uint64_t>(payload.data() - p) + payload.size();
    }
    if (magic == kWrapperMagic)
      return InvalidArgument("image is a __fatBinC_Wrapper_t (magic 0x466243b1); size its data");
  }
  if (IsElf(b)) {
    FB_ASSIGN_OR_RETURN(const Elf elf, ReadElf(b, /*keep_sections=*/false));
    return elf.extent;
  }
  if (const auto len = PtxLength(b)) return *len + 1;
  return Unrecognised(b, max);
}

}  // namespace orion::fatbin
