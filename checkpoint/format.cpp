// Names and the fixed shard header of the on-disk format.

#include "checkpoint/format.hpp"

#include <charconv>
#include <cstdio>

namespace troupe::ckpt::format {

namespace {

constexpr std::string_view step_prefix = "step-";

void put_le(unsigned char* out, uint64_t v, size_t bytes) {
  for (size_t i = 0; i < bytes; ++i, v >>= 8) out[i] = static_cast<unsigned char>(v & 0xFF);
}

uint64_t get_le(const unsigned char* in, size_t bytes) {
  uint64_t v = 0;
  for (size_t i = bytes; i > 0; --i) v = (v << 8) | in[i - 1];
  return v;
}

}  // namespace

std::string step_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  if (!name.starts_with(step_prefix)) return std::nullopt;
  const std::string_view digits = name.substr(step_prefix.size());
  if (digits.size() < 8) return std::nullopt;
  int64_t step = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (ec != std::errc() || end != digits.data() + digits.size() || step < 0) return std::nullopt;
  // Only the canonical spelling, so that "step-000000010" cannot alias step 10.
  if (step_dir_name(step) != name) return std::nullopt;
  return step;
}

std::string shard_file_name(int rank) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05d.bin", rank);
  return buf;
}

std::array<unsigned char, header_bytes> encode_header(const shard_header& h) {
  std::array<unsigned char, header_bytes> out{};
  std::memcpy(out.data(), h.magic_bytes.data(), 8);
  put_le(out.data() + 8, h.format_version, 4);
  // The one field stored in native order: it records the order of the cereal body.
  const uint32_t native_tag = byte_order_tag;
  std::memcpy(out.data() + 12, &native_tag, 4);
  put_le(out.data() + 16, h.header_size, 4);
  put_le(out.data() + 20, h.flags, 4);
  put_le(out.data() + 24, static_cast<uint32_t>(h.rank), 4);
  put_le(out.data() + 28, static_cast<uint32_t>(h.world), 4);
  put_le(out.data() + 32, static_cast<uint64_t>(h.step), 8);
  put_le(out.data() + 40, h.body_bytes, 8);
  put_le(out.data() + 48, h.body_hash, 8);
  put_le(out.data() + 56, hash64(out.data(), 56, header_hash_seed), 8);
  return out;
}

shard_header decode_header(const unsigned char* bytes) {
  shard_header h;
  std::memcpy(h.magic_bytes.data(), bytes, 8);
  h.format_version = static_cast<uint32_t>(get_le(bytes + 8, 4));
  h.byte_order = static_cast<uint32_t>(get_le(bytes + 12, 4));
  h.header_size = static_cast<uint32_t>(get_le(bytes + 16, 4));
  h.flags = static_cast<uint32_t>(get_le(bytes + 20, 4));
  h.rank = static_cast<int32_t>(static_cast<uint32_t>(get_le(bytes + 24, 4)));
  h.world = static_cast<int32_t>(static_cast<uint32_t>(get_le(bytes + 28, 4)));
  h.step = static_cast<int64_t>(get_le(bytes + 32, 8));
  h.body_bytes = get_le(bytes + 40, 8);
  h.body_hash = get_le(bytes + 48, 8);
  h.header_hash = get_le(bytes + 56, 8);
  h.computed_hash = hash64(bytes, 56, header_hash_seed);
  return h;
}

}  // namespace troupe::ckpt::format
