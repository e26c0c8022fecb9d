#pragma once
// Fixed-width little-endian integers in byte buffers: the one encoding every checkpoint file
// header and replica message uses, whatever the machine's own byte order.

#include <cstddef>
#include <cstdint>

namespace troupe::ckpt::le {

/// Writes the low `bytes` bytes of `v` to `out`, least significant first.
inline void put(unsigned char* out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i, v >>= 8) out[i] = static_cast<unsigned char>(v & 0xFF);
}

/// Reads `bytes` bytes written by put.
inline uint64_t get(const unsigned char* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = bytes; i > 0; --i) v = (v << 8) | in[i - 1];
  return v;
}

}  // namespace troupe::ckpt::le
