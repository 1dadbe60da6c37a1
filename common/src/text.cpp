#include "orion/common/text.h"

#include <algorithm>
#include <cstdlib>
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace orion {
namespace {

// Length of the valid UTF-8 sequence at s[i], or 0 when the bytes there are not one.
size_t Utf8Len(std::string_view s, size_t i, uint32_t* cp) noexcept {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n;
  uint32_t c;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
    c = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    c = b0 & 0x0Fu;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    c = b0 & 0x07u;
  } else {
    return 0;  // continuation byte, C0/C1 (overlong 2-byte), F5..FF
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0u) != 0x80u) return 0;
    c = (c << 6) | (b & 0x3Fu);
  }
  if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF)) return 0;
  *cp = c;
  return n;
}

void Hex(std::string* out, uint8_t b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kDigits[b >> 4]);
  out->push_back(kDigits[b & 0xF]);
}

}  // namespace

std::string LogSafe(std::string_view s, size_t max_bytes) {
  const size_t take = s.size() < max_bytes ? s.size() : max_bytes;
  std::string out;
  out.reserve(take + 16);
  for (size_t i = 0; i < take;) {
    uint32_t cp = 0;
    const size_t n = Utf8Len(s, i, &cp);
    if (n == 0 || i + n > take) {  // invalid, or cut by the cap
      Hex(&out, static_cast<uint8_t>(s[i]));
      ++i;
      continue;
    }
    if (cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F)) {
      for (size_t k = 0; k < n; ++k) Hex(&out, static_cast<uint8_t>(s[i + k]));
    } else if (cp == '\\') {
      out.append("\\\\");
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  if (take < s.size()) out.append("...(+" + std::to_string(s.size() - take) + " bytes)");
  return out;
}

std::string ValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    const size_t n = Utf8Len(s, i, &cp);
    if (n == 0) {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool IsUuid(std::string_view s) noexcept {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) {
      return false;
    }
  }
  return true;
}

std::string RandomUuid() {
  unsigned char b[16];
  for (size_t got = 0; got < sizeof b;) {
    const ssize_t n = getrandom(b + got, sizeof b - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(), "getrandom");
    }
    got += static_cast<size_t>(n);
  }
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // variant 10
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(36);
  for (size_t i = 0; i < sizeof b; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[b[i] >> 4];
    s += kHex[b[i] & 15];
  }
  return s;
}

void EnsureShareToken() noexcept {
  const char* have = std::getenv("ORION_SHARE");
  if (have != nullptr && *have != '\0') return;
  try {
    std::string t = RandomUuid();
    t.erase(std::remove(t.begin(), t.end(), '-'), t.end());
    setenv("ORION_SHARE", t.c_str(), 1);
  } catch (const std::exception&) {  // no random source: no share, each process its own vGPUs
  }
}

}  // namespace orion
