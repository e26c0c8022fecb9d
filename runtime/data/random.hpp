#pragma once
// Counter-based random numbers: every value is a pure function of its coordinates, so
// sampling and initialisation never depend on call order, world size or rank.

#include <cmath>
#include <cstdint>
#include <numbers>

namespace troupe {

/// splitmix64 finaliser: a bijective 64-bit mix with good avalanche, used as a hash.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// Hash of an ordered tuple of 64-bit words; chaining keeps (a, b) and (b, a) apart.
inline uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c, uint64_t d = 0) {
  uint64_t h = splitmix64(a);
  h = splitmix64(h ^ b);
  h = splitmix64(h ^ c);
  return splitmix64(h ^ d);
}

/// Uniform double in [0, 1) from the top 53 bits of a hash.
inline double to_unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

/// Standard normal from the Box-Muller transform of two hashes of (seed, stream, index).
inline double normal_at(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = to_unit(hash_words(seed, stream, index, 1));
  const double u2 = to_unit(hash_words(seed, stream, index, 2));
  // 1 - u1 lies in (0, 1], so the logarithm is finite.
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace troupe
