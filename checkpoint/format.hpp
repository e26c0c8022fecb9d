#pragma once
// The on-disk layout of a checkpoint: directory and file names, the fixed shard header,
// and the cereal-encoded shard body. Internal to checkpoint/; writer and reader share it
// so the two sides cannot drift apart.

#include <array>
#include <bit>
#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/hash.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::ckpt::format {

// ---- names -------------------------------------------------------------------------------

// The run directory's own names (checkpoints/, LATEST, damaged/, the locks) are in
// runtime/sys/run_paths.hpp; these are the names inside a checkpoint.
inline constexpr std::string_view manifest_name = "manifest.json";
inline constexpr std::string_view manifest_kind = "troupe-checkpoint-manifest";

/// "step-00000010": zero padded so that names sort by step for humans and `ls`.
std::string step_dir_name(int64_t step);

/// The step encoded in a step directory name; nullopt for any other name.
std::optional<int64_t> parse_step_dir_name(std::string_view name);

/// RUN_DIR/checkpoints/step-NNNNNNNN
inline std::filesystem::path step_dir(const std::string& run_dir, int64_t step) {
  return run_paths::checkpoints(run_dir) / step_dir_name(step);
}

/// "shard-00003.bin"
std::string shard_file_name(int rank);

// ---- shard header -----------------------------------------------------------------------

/// Eight bytes no other file type starts with; the NUL makes it fail as text.
inline constexpr std::array<char, 8> magic = {'T', 'R', 'P', 'C', 'K', 'P', 'T', '\0'};
/// The header is fixed size so that it can be patched in place once the body is hashed.
inline constexpr size_t header_bytes = 64;
/// Written in the writer's native byte order; reading it back as little endian tells
/// which order the (native-order) cereal body was written in.
inline constexpr uint32_t byte_order_tag = 0x01020304;
/// Seed of the header's own hash, so a header can never verify as a body or vice versa.
inline constexpr uint64_t header_hash_seed = 0x5452504844520001ULL;

/// The fixed 64-byte header of a shard file. All integers are stored little endian:
///
///   0 magic[8]  8 format_version u32  12 byte_order u32  16 header_bytes u32  20 flags u32
///  24 rank i32  28 world i32  32 step i64  40 body_bytes u64  48 body_hash u64
///  56 header_hash u64 (trp64 of bytes 0..55)
struct shard_header {
  std::array<char, 8> magic_bytes = magic;
  uint32_t format_version = static_cast<uint32_t>(ckpt::shard_format_version);
  uint32_t byte_order = 0;  ///< as read back little endian; byte_order_tag if the writer was LE
  uint32_t header_size = static_cast<uint32_t>(header_bytes);
  uint32_t flags = 0;  ///< reserved for later formats (compression, chunked bodies)
  int32_t rank = 0;
  int32_t world = 0;
  int64_t step = 0;
  uint64_t body_bytes = 0;
  uint64_t body_hash = 0;
  uint64_t header_hash = 0;    ///< as stored; see computed_hash for what it should be
  uint64_t computed_hash = 0;  ///< trp64 of the 56 bytes before it, filled by decode
};

/// Serializes `h` (its header_hash is computed here, not taken from `h`).
std::array<unsigned char, header_bytes> encode_header(const shard_header& h);

/// Parses 64 raw bytes. Does not judge them; the reader checks each field in the order
/// that gives the most useful message.
shard_header decode_header(const unsigned char* bytes);

// ---- shard body -------------------------------------------------------------------------

/// The names of the flat arrays in a shard body. A body is a list of named arrays so that
/// later formats can add optimizer state without moving the existing ones.
inline constexpr std::string_view params_name = "params";
inline constexpr std::string_view exp_avg_name = "exp_avg";
inline constexpr std::string_view exp_avg_sq_name = "exp_avg_sq";

/// One named float array of a body.
struct named_array {
  std::string name;
  std::vector<float> values;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(name, values);
  }
};

/// A decoded shard body: the scalars repeated from the header (so a body is
/// self-describing) plus the rank's arrays.
struct shard_body {
  int32_t rank = 0;
  int32_t world = 0;
  int64_t step = 0;
  int64_t adam_t = 0;
  uint64_t seed = 0;
  uint64_t rng_state = 0;
  uint64_t global_numel = 0;
  uint64_t offset = 0;
  uint64_t count = 0;
  std::vector<named_array> arrays;

  template <class Archive>
  void serialize(Archive& ar) {
    ar(rank, world, step, adam_t, seed, rng_state, global_numel, offset, count, arrays);
  }
};

/// Writes the body of `s` to `ar` in exactly the form shard_body::serialize reads,
/// without first copying the arrays into a shard_body.
template <class Archive>
void save_body(Archive& ar, const shard_state& s) {
  ar(static_cast<int32_t>(s.rank), static_cast<int32_t>(s.world), s.step, s.adam_t, s.seed,
     s.rng_state, static_cast<uint64_t>(s.global_numel), static_cast<uint64_t>(s.range.offset),
     static_cast<uint64_t>(s.range.count));
  // The same wire form cereal uses for std::vector<named_array>: a size tag, then items.
  ar(cereal::make_size_tag(static_cast<cereal::size_type>(3)));
  ar(std::string(params_name), s.params);
  ar(std::string(exp_avg_name), s.exp_avg);
  ar(std::string(exp_avg_sq_name), s.exp_avg_sq);
}

}  // namespace troupe::ckpt::format
