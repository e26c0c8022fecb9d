#pragma once
// trp64: the fast 64-bit content hash that every checkpoint byte is verified against.
//
// Four independent lanes each absorb one 8-byte little-endian word per 32-byte stripe, so
// the multiplies of the lanes overlap in the pipeline (several GB/s on one core). Every
// lane step is a bijection of the lane state for a fixed word and a bijection of the
// word for a fixed state, and the final merge is a bijection of each lane when the others
// are fixed; so a change confined to any one 8-byte word of an input is always detected,
// not merely with high probability. This is a checksum against bit rot, torn writes and
// truncation, not a cryptographic hash: it does not resist someone forging collisions.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace troupe::ckpt {

/// Name of the algorithm below, recorded in manifests so that a later format may change it.
inline constexpr std::string_view hash_algorithm_name = "trp64";

/// Incremental trp64: feeding the same bytes in any split gives the same digest as one call.
class hasher64 {
 public:
  /// `seed` lets two uses of the hash (e.g. header and body) be independent.
  explicit hasher64(uint64_t seed = 0) noexcept
      : lanes_{seed + k1_, seed ^ k2_, seed + k3_, seed ^ k4_} {}

  /// Absorbs `data`; may be called any number of times.
  void update(const void* data, size_t size) noexcept {
    if (size == 0) return;  // data may be null then, which memcpy must not see
    const auto* p = static_cast<const unsigned char*>(data);
    total_ += size;
    if (pending_ > 0) {  // complete a stripe left over from the previous call first
      const size_t take = size < stripe_ - pending_ ? size : stripe_ - pending_;
      std::memcpy(buffer_ + pending_, p, take);
      pending_ += take;
      p += take;
      size -= take;
      if (pending_ < stripe_) return;
      absorb_stripe(buffer_);
      pending_ = 0;
    }
    while (size >= stripe_) {
      absorb_stripe(p);
      p += stripe_;
      size -= stripe_;
    }
    std::memcpy(buffer_, p, size);
    pending_ = size;
  }

  /// Convenience overload for byte spans.
  void update(std::span<const std::byte> bytes) noexcept { update(bytes.data(), bytes.size()); }

  /// The digest of everything absorbed so far; the hasher may keep absorbing afterwards.
  [[nodiscard]] uint64_t digest() const noexcept {
    uint64_t lanes[4] = {lanes_[0], lanes_[1], lanes_[2], lanes_[3]};
    // Leftover whole words go to lanes in order; a partial word is zero padded. The total
    // length is merged below, so padding cannot make two different lengths collide.
    size_t lane = 0;
    size_t at = 0;
    for (; at + 8 <= pending_; at += 8, ++lane) {
      lanes[lane] = round(lanes[lane], load(buffer_ + at));
    }
    if (at < pending_) {
      unsigned char last[8] = {};
      std::memcpy(last, buffer_ + at, pending_ - at);
      lanes[lane] = round(lanes[lane], load(last));
    }
    uint64_t h = std::rotl(lanes[0], 1) + std::rotl(lanes[1], 7) + std::rotl(lanes[2], 12) +
                 std::rotl(lanes[3], 18);
    h += static_cast<uint64_t>(total_) * k5_;
    return finalize(h);
  }

 private:
  static constexpr size_t stripe_ = 32;
  static constexpr uint64_t k1_ = 0x9E3779B97F4A7C15ULL;  // odd: multiplication is invertible
  static constexpr uint64_t k2_ = 0xC2B2AE3D27D4EB4FULL;
  static constexpr uint64_t k3_ = 0x165667B19E3779F9ULL;
  static constexpr uint64_t k4_ = 0xD6E8FEB86659FD93ULL;
  static constexpr uint64_t k5_ = 0xFF51AFD7ED558CCDULL;

  static uint64_t load(const unsigned char* p) noexcept {
    uint64_t w;
    std::memcpy(&w, p, 8);
    if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
    return w;
  }
  static uint64_t round(uint64_t acc, uint64_t word) noexcept {
    acc ^= word * k2_;
    acc = std::rotl(acc, 29);
    return acc * k1_;
  }
  // Each of these steps is invertible, so distinct merged states give distinct digests.
  static uint64_t finalize(uint64_t h) noexcept {
    h ^= h >> 31;
    h *= k3_;
    h ^= h >> 29;
    h *= k4_;
    h ^= h >> 32;
    return h;
  }
  void absorb_stripe(const unsigned char* p) noexcept {
    lanes_[0] = round(lanes_[0], load(p));
    lanes_[1] = round(lanes_[1], load(p + 8));
    lanes_[2] = round(lanes_[2], load(p + 16));
    lanes_[3] = round(lanes_[3], load(p + 24));
  }

  uint64_t lanes_[4];
  unsigned char buffer_[stripe_] = {};
  size_t pending_ = 0;
  uint64_t total_ = 0;
};

/// One-shot trp64 of a buffer.
[[nodiscard]] inline uint64_t hash64(const void* data, size_t size, uint64_t seed = 0) noexcept {
  hasher64 h(seed);
  h.update(data, size);
  return h.digest();
}

/// One-shot trp64 of a byte span.
[[nodiscard]] inline uint64_t hash64(std::span<const std::byte> bytes, uint64_t seed = 0) noexcept {
  return hash64(bytes.data(), bytes.size(), seed);
}

/// The 16-digit lowercase hex form used in manifests.
[[nodiscard]] inline std::string hash_to_hex(uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4) out[static_cast<size_t>(i)] = digits[h & 0xF];
  return out;
}

/// Parses what hash_to_hex wrote; nullopt for anything else (wrong length, non-hex).
[[nodiscard]] inline std::optional<uint64_t> hash_from_hex(std::string_view hex) noexcept {
  if (hex.size() != 16) return std::nullopt;
  uint64_t h = 0;
  for (char c : hex) {
    uint64_t v;
    if (c >= '0' && c <= '9') {
      v = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v = static_cast<uint64_t>(c - 'a') + 10;
    } else {
      return std::nullopt;
    }
    h = (h << 4) | v;
  }
  return h;
}

}  // namespace troupe::ckpt
