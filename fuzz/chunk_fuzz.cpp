// libFuzzer target: the bytes are a chunk file (48-byte header + payload), handed to
// chunk_file::decode. It may throw ckpt::checkpoint_error and nothing else, and must never
// read past the buffer (AddressSanitizer sees the exact input size).
//
// decode is called with the key the header names (bytes 32..47) and with the key of the
// payload itself, for a small expected size taken from the first byte and for the size the
// payload fits, so that the header checks, the hash check and the success path all run. The
// payload is also wrapped in a freshly made header, which must decode to exactly its floats.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/chunk_file.hpp"

namespace {

using namespace troupe::ckpt;

uint64_t get_le(const uint8_t* in) {
  uint64_t v = 0;
  for (size_t i = 8; i > 0; --i) v = (v << 8) | in[i - 1];
  return v;
}

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "chunk_fuzz: %s\n", what);
  std::abort();
}

/// decode, which on success must return exactly the payload's `floats` floats.
void decode(const uint8_t* data, size_t size, const chunk_key& key, size_t floats,
            bool must_succeed) {
  std::vector<float> out;
  try {
    out = chunk_file::decode(data, size, key, floats, "fuzz/chunk", "fuzz input");
  } catch (const checkpoint_error& e) {
    if (!must_succeed) return;
    std::fprintf(stderr, "%s\n", e.what());
    finding("a well-formed chunk was rejected");
  }
  if (out.size() != floats) finding("decode returned a different number of floats");
  if (size != chunk_file::header_bytes + floats * sizeof(float)) {
    finding("decode accepted a chunk whose size does not match its floats");
  }
  if (floats > 0 &&
      std::memcmp(out.data(), data + chunk_file::header_bytes, floats * sizeof(float)) != 0) {
    finding("decode returned other floats than the payload");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const size_t header = chunk_file::header_bytes;
  const chunk_key named =
      size >= header ? chunk_key{get_le(data + 32), get_le(data + 40)} : chunk_key{};
  const size_t small_floats = size > 0 ? data[0] % 32 : 0;
  const size_t fit_floats = size >= header ? (size - header) / sizeof(float) : 0;

  decode(data, size, named, small_floats, false);
  decode(data, size, named, fit_floats, false);
  if (size >= header) {
    const chunk_key actual = key_of(data + header, size - header);
    decode(data, size, actual, fit_floats, false);
    decode(data, size, actual, small_floats, false);
  }

  // The input as the payload of a well-formed chunk (whole floats only).
  const size_t floats = size / sizeof(float);
  const chunk_key key = key_of(data, floats * sizeof(float));
  std::vector<unsigned char> file = chunk_file::header_for(key, floats * sizeof(float));
  file.insert(file.end(), data, data + floats * sizeof(float));
  decode(file.data(), file.size(), key, floats, true);

  // One field at a time, changed to a value from the input's last bytes: always refused.
  struct field {
    size_t at, width;
  };
  static constexpr field fields[] = {{0, 8},  {8, 4},  {12, 2}, {14, 2},
                                     {16, 8}, {24, 8}, {32, 8}, {40, 8}};
  uint64_t seed = 0;
  for (size_t i = 0; i < 8 && i < size; ++i) seed = (seed << 8) | data[size - 1 - i];
  for (const field& f : fields) {
    std::vector<unsigned char> changed = file;
    uint64_t old = 0, now = seed;
    for (size_t i = 0; i < f.width; ++i) old |= uint64_t{changed[f.at + i]} << (8 * i);
    if (f.width < 8) now &= (uint64_t{1} << (8 * f.width)) - 1;
    if (now == old) now ^= 1;
    for (size_t i = 0; i < f.width; ++i)
      changed[f.at + i] = static_cast<unsigned char>(now >> (8 * i));
    try {
      (void)chunk_file::decode(changed.data(), changed.size(), key, floats, "fuzz/chunk",
                               "fuzz input, one header field changed");
    } catch (const checkpoint_error&) {
      continue;
    }
    std::fprintf(stderr, "header field at byte %zu changed from %llu to %llu\n", f.at,
                 static_cast<unsigned long long>(old), static_cast<unsigned long long>(now));
    finding("a chunk header with a changed field was accepted");
  }
  return 0;
}
