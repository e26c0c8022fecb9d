// Names and the fixed shard header of the on-disk format.

#include "checkpoint/format.hpp"

#include <charconv>
#include <cstdio>

#include "checkpoint/little_endian.hpp"

namespace troupe::ckpt::format {

namespace {

constexpr std::string_view step_prefix = "step-";

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
  le::put(out.data() + 8, h.format_version, 4);
  // The one field stored in native order: it records the order of the cereal body.
  const uint32_t native_tag = byte_order_tag;
  std::memcpy(out.data() + 12, &native_tag, 4);
  le::put(out.data() + 16, h.header_size, 4);
  le::put(out.data() + 20, h.flags, 4);
  le::put(out.data() + 24, static_cast<uint32_t>(h.rank), 4);
  le::put(out.data() + 28, static_cast<uint32_t>(h.world), 4);
  le::put(out.data() + 32, static_cast<uint64_t>(h.step), 8);
  le::put(out.data() + 40, h.body_bytes, 8);
  le::put(out.data() + 48, h.body_hash, 8);
  le::put(out.data() + 56, hash64(out.data(), 56, header_hash_seed), 8);
  return out;
}

shard_header decode_header(const unsigned char* bytes) {
  shard_header h;
  std::memcpy(h.magic_bytes.data(), bytes, 8);
  h.format_version = static_cast<uint32_t>(le::get(bytes + 8, 4));
  h.byte_order = static_cast<uint32_t>(le::get(bytes + 12, 4));
  h.header_size = static_cast<uint32_t>(le::get(bytes + 16, 4));
  h.flags = static_cast<uint32_t>(le::get(bytes + 20, 4));
  h.rank = static_cast<int32_t>(static_cast<uint32_t>(le::get(bytes + 24, 4)));
  h.world = static_cast<int32_t>(static_cast<uint32_t>(le::get(bytes + 28, 4)));
  h.step = static_cast<int64_t>(le::get(bytes + 32, 8));
  h.body_bytes = le::get(bytes + 40, 8);
  h.body_hash = le::get(bytes + 48, 8);
  h.header_hash = le::get(bytes + 56, 8);
  h.computed_hash = hash64(bytes, 56, header_hash_seed);
  return h;
}

}  // namespace troupe::ckpt::format
