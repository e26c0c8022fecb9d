// The read side of a checkpoint: every shard verified byte for byte, then assembled into
// the full flat state or re-sliced for a rank of a new world.

#include <algorithm>
#include <istream>
#include <streambuf>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/manifest.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr const char* restore_hint =
    " Restore from an earlier committed checkpoint (another step-* directory with a "
    "manifest.json) or from a replica.";

/// Read-only stream buffer over bytes already in memory, for cereal's input archive.
class memory_source : public std::streambuf {
 public:
  memory_source(const unsigned char* data, size_t size) {
    char* begin = const_cast<char*>(reinterpret_cast<const char*>(data));  // never written
    setg(begin, begin, begin + size);
  }
  [[nodiscard]] size_t remaining() const noexcept { return static_cast<size_t>(egptr() - gptr()); }
};

std::string describe(int rank, int world, int64_t step) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(world) + ", step " +
         std::to_string(step);
}

/// Reads the shard of entry `e`, checking in the order that gives the most useful message:
/// size, magic, version, byte order, header checksum, identity, body hash, body fields.
format::shard_body read_verified_shard(const fs::path& dir, const manifest& m,
                                       const shard_entry& e) {
  const fs::path path = dir / e.file;
  const std::vector<unsigned char> data = io::read_file(path);
  if (data.size() != e.bytes) {
    io::fail(error_kind::truncated, path,
             "is " + std::to_string(data.size()) + " bytes but the manifest records " +
                 std::to_string(e.bytes) +
                 (data.size() < e.bytes ? " (truncated: an interrupted copy or a full disk)."
                                        : " (bytes were appended to it).") +
                 restore_hint);
  }
  const format::shard_header h = format::decode_header(data.data());
  if (h.magic_bytes != format::magic) {
    io::fail(error_kind::bad_magic, path,
             "does not start with the TRPCKPT magic: it is not a troupe checkpoint shard, or "
             "its first bytes are damaged." +
                 std::string(restore_hint));
  }
  if (h.format_version > static_cast<uint32_t>(shard_format_version)) {
    io::fail(error_kind::unsupported_version, path,
             "has format_version " + std::to_string(h.format_version) +
                 " but this build reads up to " + std::to_string(shard_format_version) +
                 ". It was written by a newer troupe (or the header is damaged); restore with "
                 "the troupe that wrote it.");
  }
  if (h.format_version < 1) {
    io::fail(error_kind::corrupt, path,
             "has format_version 0; the header is damaged." + std::string(restore_hint));
  }
  if (h.byte_order != format::byte_order_tag) {
    if (h.byte_order == __builtin_bswap32(format::byte_order_tag)) {
      io::fail(error_kind::wrong_endianness, path,
               "was written on a machine of the other byte order; this build reads only "
               "shards of its own byte order. Restore on a machine like the one that wrote "
               "it.");
    }
    io::fail(error_kind::corrupt, path,
             "has a damaged byte-order field in its header." + std::string(restore_hint));
  }
  if (h.header_hash != h.computed_hash || h.header_size != format::header_bytes ||
      h.body_bytes != data.size() - format::header_bytes) {
    io::fail(
        error_kind::corrupt, path,
        "has a damaged header (its checksum or sizes do not match)." + std::string(restore_hint));
  }
  if (h.rank != e.rank || h.world != m.world || h.step != m.step) {
    io::fail(error_kind::mismatch, path,
             "holds " + describe(h.rank, h.world, h.step) + " but the manifest expects " +
                 describe(e.rank, m.world, m.step) +
                 ": files were moved or mixed between checkpoints." + restore_hint);
  }
  const unsigned char* body = data.data() + format::header_bytes;
  const uint64_t computed = hash64(body, h.body_bytes);
  const std::string computed_hex = hash_to_hex(computed);
  if (computed != h.body_hash || computed_hex != e.hash) {
    io::fail(error_kind::corrupt, path,
             "is damaged: its body hashes to " + computed_hex + " but the manifest records " +
                 e.hash + " (bit rot, a torn write or an edit)." + restore_hint);
  }

  format::shard_body b;
  memory_source source(body, h.body_bytes);
  try {
    std::istream in(&source);
    cereal::BinaryInputArchive archive(in);
    archive(b);
  } catch (const std::exception& ex) {  // cereal::Exception or bad_alloc from a bad size
    io::fail(error_kind::corrupt, path,
             std::string("passes its hash but its body does not decode (") + ex.what() +
                 "): it was written by an incompatible build." + restore_hint);
  }
  if (source.remaining() != 0) {
    io::fail(error_kind::corrupt, path,
             "has " + std::to_string(source.remaining()) +
                 " unexpected bytes after its body: written by an incompatible build." +
                 restore_hint);
  }
  if (b.rank != e.rank || b.world != m.world || b.step != m.step || b.seed != m.seed ||
      b.global_numel != m.global_numel || b.offset != e.range.offset || b.count != e.range.count) {
    io::fail(error_kind::mismatch, path,
             "holds " + describe(b.rank, b.world, b.step) + ", elements [" +
                 std::to_string(b.offset) + ", +" + std::to_string(b.count) + ") of " +
                 std::to_string(b.global_numel) + " but the manifest expects " +
                 describe(e.rank, m.world, m.step) + ", elements [" +
                 std::to_string(e.range.offset) + ", +" + std::to_string(e.range.count) + ") of " +
                 std::to_string(m.global_numel) + " (or another seed)." + restore_hint);
  }
  for (const std::string_view name :
       {format::params_name, format::exp_avg_name, format::exp_avg_sq_name}) {
    const auto it = std::find_if(b.arrays.begin(), b.arrays.end(),
                                 [&](const format::named_array& a) { return a.name == name; });
    if (it == b.arrays.end() || it->values.size() != e.range.count) {
      io::fail(error_kind::corrupt, path,
               "lacks a complete \"" + std::string(name) + "\" array." + restore_hint);
    }
  }
  return b;
}

const std::vector<float>& array_of(const format::shard_body& b, std::string_view name) {
  for (const format::named_array& a : b.arrays) {
    if (a.name == name) return a.values;
  }
  throw std::logic_error("read_verified_shard checked that every array is present");
}

/// Copies the elements of `b` (holding global range `from`) that fall in `into` (global
/// range of the destination vectors) and returns how many it copied.
size_t copy_overlap(const format::shard_body& b, shard_range from, shard_range into,
                    std::vector<float>& params, std::vector<float>& exp_avg,
                    std::vector<float>& exp_avg_sq) {
  const size_t lo = std::max(from.offset, into.offset);
  const size_t hi = std::min(from.offset + from.count, into.offset + into.count);
  if (lo >= hi) return 0;
  const auto copy = [&](std::string_view name, std::vector<float>& out) {
    const std::vector<float>& src = array_of(b, name);
    std::copy(src.begin() + static_cast<std::ptrdiff_t>(lo - from.offset),
              src.begin() + static_cast<std::ptrdiff_t>(hi - from.offset),
              out.begin() + static_cast<std::ptrdiff_t>(lo - into.offset));
  };
  copy(format::params_name, params);
  copy(format::exp_avg_name, exp_avg);
  copy(format::exp_avg_sq_name, exp_avg_sq);
  return hi - lo;
}

fs::path manifest_path_of(const std::string& run_dir, const manifest& m) {
  return format::step_dir(run_dir, m.step) / format::manifest_name;
}

/// All shards must agree on the optimizer's step count; a mix means a torn checkpoint.
void check_same_adam_t(const fs::path& dir, const shard_entry& e, int64_t expected, int64_t found) {
  if (expected != found) {
    io::fail(error_kind::mismatch, dir / e.file,
             "has adam_t " + std::to_string(found) + " but another shard of the same step has " +
                 std::to_string(expected) + ": the shards come from different runs." +
                 restore_hint);
  }
}

}  // namespace

full_state load_full_state_v2(const std::string& run_dir, const manifest& m);  // restore.cpp

full_state load_full_state(const std::string& run_dir, const manifest& m) {
  if (m.format_version == 2) return load_full_state_v2(run_dir, m);
  // Its arrays are not AdamW's and its tensors not all floats: restore_into reads it.
  if (m.format_version == workload_format_version)
    io::fail(error_kind::invalid_argument, manifest_path_of(run_dir, m),
             "is a format 3 checkpoint, which restore_into reads; full_state holds format 1 and "
             "2 only");
  manifest_json::validate(m, manifest_path_of(run_dir, m), error_kind::invalid_argument);
  const fs::path dir = format::step_dir(run_dir, m.step);
  full_state out;
  out.step = m.step;
  out.seed = m.seed;
  out.params.resize(m.global_numel);
  out.exp_avg.resize(m.global_numel);
  out.exp_avg_sq.resize(m.global_numel);
  out.rank_rng_states.resize(static_cast<size_t>(m.world));
  const shard_range everything{0, m.global_numel};
  bool first = true;
  for (const shard_entry& e : m.shards) {
    const format::shard_body b = read_verified_shard(dir, m, e);
    if (first) out.adam_t = b.adam_t;
    check_same_adam_t(dir, e, out.adam_t, b.adam_t);
    first = false;
    out.rank_rng_states[static_cast<size_t>(e.rank)] = b.rng_state;
    copy_overlap(b, e.range, everything, out.params, out.exp_avg, out.exp_avg_sq);
  }
  out.rng_state = out.rank_rng_states.front();
  return out;
}

}  // namespace troupe::ckpt
