#pragma once
// Content-addressed chunks: the unit a checkpoint stores. A chunk is named by the 128-bit
// XXH3 hash of its float bytes, so equal content is stored once however many checkpoints,
// ranks or tensors hold it, and every read can be checked against its own name.
//
//   RUN_DIR/checkpoints/chunks/3f/3f2a...e1   (32 hex digits; the first two name the folder)
//
// A chunk file is a 48-byte header followed by the payload. The header's integers are little
// endian on every machine; the payload's floats are in the writer's byte order, which the
// header records (format 2):
//   0 magic "TRPCHNK\0"  8 format u32 (2)  12 encoding u16 (0 = raw float32)
//  14 payload byte order u16 (1 = little endian, 2 = big endian)
//  16 raw_bytes u64  24 stored_bytes u64  32 key high u64  40 key low u64
// Format 1 had a u32 encoding at 12 and no byte order; only little-endian machines wrote it,
// so it reads as little endian. A reader refuses a payload in the other byte order (a chunk's
// name is the hash of its bytes as stored, so converting would orphan every name).

#include <compare>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::ckpt {

/// The XXH3-128 of a chunk's raw bytes, which is also its name.
struct chunk_key {
  uint64_t high = 0;
  uint64_t low = 0;
  [[nodiscard]] std::string hex() const;
  static std::optional<chunk_key> from_hex(std::string_view text);
  friend auto operator<=>(const chunk_key&, const chunk_key&) = default;
};

/// Name of the chunk hash, recorded in version 2 manifests.
inline constexpr std::string_view chunk_hash_name = "xxh3-128";

chunk_key key_of(const void* data, size_t bytes);

namespace chunk_file {

inline constexpr size_t header_bytes = 48;
inline constexpr uint32_t format = 2;
inline constexpr uint32_t raw_encoding = 0;
/// The byte order tags of a format 2 header.
inline constexpr uint16_t little_endian_tag = 1;
inline constexpr uint16_t big_endian_tag = 2;
/// This machine's tag.
uint16_t native_byte_order();

/// RUN_DIR/checkpoints/chunks
std::filesystem::path root(const std::string& run_dir);
/// Where the chunk `key` lives.
std::filesystem::path path_of(const std::string& run_dir, const chunk_key& key);
/// RUN_DIR/checkpoints/recycled-chunks: files of collected chunks, kept so that a writer
/// overwrites them instead of allocating new ones (no chunk: a collection named each after
/// the key it held; none is referenced, and each is overwritten before it is named again).
std::filesystem::path recycled_root(const std::string& run_dir);

/// The header of a raw chunk of `raw_bytes` named `key`, in this machine's byte order (or
/// `byte_order`, for tests of a reader that meets the other one).
std::vector<unsigned char> header_for(const chunk_key& key, uint64_t raw_bytes,
                                      uint16_t byte_order = native_byte_order());

/// Decodes and verifies a chunk file's bytes: header fields, the size it promises, and the
/// payload's hash against `key`; the result holds exactly `expected_floats` floats. Throws
/// checkpoint_error (missing / truncated / corrupt / bad_magic / unsupported_version) naming
/// `path` and `context` (which tensor of which checkpoint needs it). Never reads past `size`.
std::vector<float> decode(const unsigned char* data, size_t size, const chunk_key& key,
                          size_t expected_floats, const std::filesystem::path& path,
                          const std::string& context);

/// decode for a chunk whose length is known only within [min_floats, max_floats] (the last
/// chunk of a packed run, which other pieces fill up).
std::vector<float> decode_range(const unsigned char* data, size_t size, const chunk_key& key,
                                size_t min_floats, size_t max_floats,
                                const std::filesystem::path& path, const std::string& context);

/// Reads and decodes the chunk `key` of `run_dir` (see decode).
std::vector<float> read(const std::string& run_dir, const chunk_key& key, size_t expected_floats,
                        const std::string& context);
/// read_range into `out`, reusing its memory (no fresh pages per chunk).
void read_range_into(const std::string& run_dir, const chunk_key& key, size_t min_floats,
                     size_t max_floats, const std::string& context, std::vector<float>& out);
/// Reads and decodes a chunk of `min_floats` to `max_floats` floats (see decode_range).
std::vector<float> read_range(const std::string& run_dir, const chunk_key& key, size_t min_floats,
                              size_t max_floats, const std::string& context);

/// What lies under a chunk's name, as a writer about to deduplicate against it finds it.
struct stored_chunk {
  enum class state : uint8_t { absent, good, damaged };
  state what = state::absent;
  std::string why;     ///< damaged: what is wrong with it
  uint64_t bytes = 0;  ///< good: the file's size
};

/// Checks what `run_dir` holds under the name of chunk `key` against `payload`, the bytes that
/// chunk is: good only for a regular file whose header names `key`, this machine's byte
/// order and the payload's size, followed by exactly those bytes. A link, a directory, a
/// device or a FIFO is damaged, never followed or opened for long. `drop_cache` first
/// evicts the file's cached pages, so that the bytes compared come from the disk (read-back
/// after a write). Throws checkpoint_error (io) only when the OS refuses the read for a
/// reason that says nothing about the file (EIO included: that is damage, reported so).
stored_chunk check_stored(const std::string& run_dir, const chunk_key& key,
                          std::span<const unsigned char> payload, bool drop_cache = false);

/// The chunks this process knows to be intact in a run directory: written by it, or read back
/// and checked against their names (a restore, a writer's first use), each with its file as it
/// was then (inode, size, modification and change times). A writer deduplicates against these
/// without reading them again while the file is unchanged, and against nothing else
/// unchecked: a file's existence is no proof of its content, and one written over since is
/// checked again. Thread-safe; process-wide.
namespace known_good {
bool contains(const std::string& run_dir, const chunk_key& key);
void add(const std::string& run_dir, const chunk_key& key);
void forget(const std::string& run_dir, const chunk_key& key);
/// Forgets every chunk of `run_dir`: what another process may have changed since is checked
/// again before it is trusted (and tests start as a fresh process would).
void forget_all(const std::string& run_dir);
}  // namespace known_good

}  // namespace chunk_file
}  // namespace troupe::ckpt
