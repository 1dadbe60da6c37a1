// guest/src/md2.h — MD2 (RFC 1319) and HMAC-MD2 (RFC 2104), needed only because cudart 13's
// integrity-check table expects an HMAC-MD2 digest (docs/spec/export-tables.md). Not for security.
#pragma once
#include <cstddef>
#include <cstdint>

namespace orion::guest {
void Md2Digest(const uint8_t* msg, size_t len, uint8_t out[16]) noexcept;
void HmacMd2(const uint8_t key[16], const uint8_t* msg, size_t len, uint8_t out[16]) noexcept;
}  // namespace orion::guest
