// Chunk names, headers and verified decoding.

#include "checkpoint/chunk_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/little_endian.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

constexpr std::array<char, 8> chunk_magic = {'T', 'R', 'P', 'C', 'H', 'N', 'K', '\0'};

}  // namespace

std::string chunk_key::hex() const {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[static_cast<size_t>(15 - i)] = digits[(high >> (4 * i)) & 0xF];
    out[static_cast<size_t>(31 - i)] = digits[(low >> (4 * i)) & 0xF];
  }
  return out;
}

std::optional<chunk_key> chunk_key::from_hex(std::string_view text) {
  if (text.size() != 32) return std::nullopt;
  chunk_key k;
  for (size_t i = 0; i < 32; ++i) {
    const char c = text[i];
    uint64_t d = 0;
    if (c >= '0' && c <= '9') {
      d = static_cast<uint64_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<uint64_t>(c - 'a') + 10;
    } else {
      return std::nullopt;
    }
    uint64_t& half = i < 16 ? k.high : k.low;
    half = (half << 4) | d;
  }
  return k;
}

chunk_key key_of(const void* data, size_t bytes) {
  const XXH128_hash_t h = XXH3_128bits(data, bytes);
  return {h.high64, h.low64};
}

namespace chunk_file {

fs::path root(const std::string& run_dir) { return run_paths::chunks(run_dir); }

fs::path recycled_root(const std::string& run_dir) { return run_paths::recycled_chunks(run_dir); }

fs::path path_of(const std::string& run_dir, const chunk_key& key) {
  const std::string name = key.hex();
  return root(run_dir) / name.substr(0, 2) / name;
}

uint16_t native_byte_order() {
  static_assert(std::endian::native == std::endian::little ||
                std::endian::native == std::endian::big);
  return std::endian::native == std::endian::little ? little_endian_tag : big_endian_tag;
}

std::vector<unsigned char> header_for(const chunk_key& key, uint64_t raw_bytes,
                                      uint16_t byte_order) {
  std::vector<unsigned char> h(header_bytes, 0);
  std::memcpy(h.data(), chunk_magic.data(), chunk_magic.size());
  le::put(h.data() + 8, format, 4);
  le::put(h.data() + 12, raw_encoding, 2);
  le::put(h.data() + 14, byte_order, 2);
  le::put(h.data() + 16, raw_bytes, 8);
  le::put(h.data() + 24, raw_bytes, 8);
  le::put(h.data() + 32, key.high, 8);
  le::put(h.data() + 40, key.low, 8);
  return h;
}

std::vector<float> decode(const unsigned char* data, size_t size, const chunk_key& key,
                          size_t expected_floats, const fs::path& path,
                          const std::string& context) {
  return decode_range(data, size, key, expected_floats, expected_floats, path, context);
}

namespace {

std::string hint_for(const std::string& context) {
  return " (" + context +
         "). Run `troupe ckpt verify` on the run directory; --resume falls back to an earlier "
         "committed checkpoint.";
}

/// Checks a chunk's 48-byte header against what the manifest expects of chunk `key` and
/// against the file's `size`; returns the payload's length in bytes.
uint64_t check_header(const unsigned char* data, size_t size, const chunk_key& key,
                      size_t min_floats, size_t max_floats, const fs::path& path,
                      const std::string& context) {
  const std::string hint = hint_for(context);
  if (size < header_bytes) {
    io::fail(error_kind::truncated, path,
             "is " + std::to_string(size) + " bytes, shorter than a chunk header" + hint);
  }
  if (std::memcmp(data, chunk_magic.data(), chunk_magic.size()) != 0) {
    io::fail(error_kind::bad_magic, path, "does not start with the TRPCHNK magic" + hint);
  }
  const uint64_t version = le::get(data + 8, 4);
  if (version != 1 && version != format) {
    io::fail(version > format ? error_kind::unsupported_version : error_kind::corrupt, path,
             "has chunk format " + std::to_string(version) + "; this build reads formats 1 and " +
                 std::to_string(format) + hint);
  }
  // Format 1: a u32 encoding and, from the only machines that wrote it, little-endian floats.
  const uint64_t encoding = version == 1 ? le::get(data + 12, 4) : le::get(data + 12, 2);
  const uint64_t order = version == 1 ? little_endian_tag : le::get(data + 14, 2);
  if (order != little_endian_tag && order != big_endian_tag) {
    io::fail(error_kind::corrupt, path,
             "names an unknown payload byte order " + std::to_string(order) +
                 " (1 = little endian, 2 = big endian)" + hint);
  }
  if (order != native_byte_order()) {
    const auto name = [](uint64_t o) { return o == little_endian_tag ? "little" : "big"; };
    io::fail(error_kind::wrong_endianness, path,
             std::string("holds its floats in ") + name(order) +
                 "-endian byte order, and this machine is " + name(native_byte_order()) +
                 "-endian; troupe does not convert chunks (each is named by the hash of its "
                 "bytes). Restore this checkpoint on a " +
                 name(order) + "-endian machine (" + context + ").");
  }
  const uint64_t raw_bytes = le::get(data + 16, 8);
  const uint64_t stored_bytes = le::get(data + 24, 8);
  const chunk_key named{le::get(data + 32, 8), le::get(data + 40, 8)};
  if (encoding != raw_encoding) {
    io::fail(error_kind::corrupt, path,
             "names an unknown encoding " + std::to_string(encoding) + hint);
  }
  if (named != key) {
    io::fail(error_kind::mismatch, path,
             "holds chunk " + named.hex() + " but is stored under the name " + key.hex() + hint);
  }
  const uint64_t min_bytes = static_cast<uint64_t>(min_floats) * sizeof(float);
  const uint64_t max_bytes = static_cast<uint64_t>(max_floats) * sizeof(float);
  if (raw_bytes < min_bytes || raw_bytes > max_bytes || raw_bytes % sizeof(float) != 0 ||
      stored_bytes != raw_bytes) {
    io::fail(error_kind::corrupt, path,
             "promises " + std::to_string(raw_bytes) + " bytes where the manifest needs " +
                 (min_bytes == max_bytes
                      ? std::to_string(min_bytes)
                      : std::to_string(min_bytes) + " to " + std::to_string(max_bytes)) +
                 hint);
  }
  if (size - header_bytes != stored_bytes) {
    io::fail(error_kind::truncated, path,
             "holds " + std::to_string(size - header_bytes) + " payload bytes, its header says " +
                 std::to_string(stored_bytes) +
                 (size - header_bytes < stored_bytes ? " (truncated)" : " (bytes appended)") +
                 hint);
  }
  return stored_bytes;
}

void check_payload(const void* payload, uint64_t bytes, const chunk_key& key, const fs::path& path,
                   const std::string& context) {
  if (key_of(payload, bytes) != key) {
    io::fail(error_kind::corrupt, path,
             "is damaged: its bytes no longer hash to its name (bit rot, a torn copy or an "
             "edit)" +
                 hint_for(context));
  }
}

}  // namespace

std::vector<float> decode_range(const unsigned char* data, size_t size, const chunk_key& key,
                                size_t min_floats, size_t max_floats, const fs::path& path,
                                const std::string& context) {
  const uint64_t bytes = check_header(data, size, key, min_floats, max_floats, path, context);
  check_payload(data + header_bytes, bytes, key, path, context);
  std::vector<float> out(bytes / sizeof(float));
  if (bytes > 0) std::memcpy(out.data(), data + header_bytes, bytes);
  return out;
}

void read_range_into(const std::string& run_dir, const chunk_key& key, size_t min_floats,
                     size_t max_floats, const std::string& context, std::vector<float>& out) {
  const fs::path path = path_of(run_dir, key);
  // No link is followed, and a FIFO planted under a chunk's name cannot block the open.
  io::unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) io::fail(error_kind::missing, path, "is missing" + hint_for(context));
    if (errno == ELOOP)
      io::fail(error_kind::corrupt, path, "is a symbolic link, not a chunk" + hint_for(context));
    io::fail_errno(path, "opening", errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io::fail_errno(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) io::fail(error_kind::corrupt, path, "is not a regular file");
  const auto size = static_cast<size_t>(st.st_size);
  unsigned char header[header_bytes] = {};
  const auto pread_all = [&](void* to, size_t bytes, off_t at) {
    auto* p = static_cast<unsigned char*>(to);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd.get(), p, bytes, at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) io::fail_errno(path, "read", errno);
      if (n == 0)
        io::fail(error_kind::truncated, path, "shrank while being read" + hint_for(context));
      p += n;
      at += n;
      bytes -= static_cast<size_t>(n);
    }
  };
  try {
    pread_all(header, std::min(size, header_bytes), 0);
    const uint64_t bytes = check_header(header, size, key, min_floats, max_floats, path, context);
    // Straight into the caller's buffer, whose memory is reused from chunk to chunk.
    out.resize(bytes / sizeof(float));
    pread_all(out.data(), bytes, static_cast<off_t>(header_bytes));
    check_payload(out.data(), bytes, key, path, context);
  } catch (...) {
    // Written by this process once, damaged since: a later checkpoint with the same content
    // must write it again, not name the damaged file.
    known_good::forget(run_dir, key);
    throw;
  }
  known_good::add(run_dir, key);
}

std::vector<float> read(const std::string& run_dir, const chunk_key& key, size_t expected_floats,
                        const std::string& context) {
  return read_range(run_dir, key, expected_floats, expected_floats, context);
}

std::vector<float> read_range(const std::string& run_dir, const chunk_key& key, size_t min_floats,
                              size_t max_floats, const std::string& context) {
  std::vector<float> out;
  read_range_into(run_dir, key, min_floats, max_floats, context, out);
  return out;
}

stored_chunk check_stored(const std::string& run_dir, const chunk_key& key,
                          std::span<const unsigned char> payload, bool drop_cache) {
  using state = stored_chunk::state;
  const fs::path path = path_of(run_dir, key);
  const auto damaged = [](std::string why) { return stored_chunk{state::damaged, std::move(why)}; };
  io::unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) return {};
    if (errno == ELOOP) return damaged("a symbolic link lies under the chunk's name");
    if (errno == EIO) return damaged("reading it fails with an I/O error");
    io::fail_errno(path, "opening a stored chunk to check it", errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io::fail_errno(path, "stat", errno);
  if (!S_ISREG(st.st_mode))
    return damaged("it is not a regular file (a directory, FIFO or device)");
  const uint64_t expected = header_bytes + payload.size();
  if (static_cast<uint64_t>(st.st_size) != expected)
    return damaged("it is " + std::to_string(st.st_size) + " bytes, not the " +
                   std::to_string(expected) + " the chunk takes");
  if (drop_cache) {
    // The pages a write just made are clean after the flush; dropping them makes the reads
    // below come from the disk.
    (void)::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  }
  // Compared a block at a time: no buffer the size of a chunk to fault in per check.
  thread_local std::vector<unsigned char> block(size_t{1} << 16);
  const auto read_at = [&](size_t bytes, off_t at) -> bool {
    size_t got = 0;
    while (got < bytes) {
      const ssize_t n =
          ::pread(fd.get(), block.data() + got, bytes - got, at + static_cast<off_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      got += static_cast<size_t>(n);
    }
    return true;
  };
  if (!read_at(header_bytes, 0)) return damaged("its header cannot be read");
  const std::vector<unsigned char> want = header_for(key, payload.size());
  if (std::memcmp(block.data(), want.data(), header_bytes) != 0) {
    // A format 1 header of the same chunk is as good (written before format 2).
    try {
      (void)check_header(block.data(), static_cast<size_t>(st.st_size), key,
                         payload.size() / sizeof(float), payload.size() / sizeof(float), path,
                         "a stored copy of the chunk being written");
    } catch (const checkpoint_error& e) {
      return damaged(std::string("its header is wrong: ") + e.what());
    }
  }
  for (size_t done = 0; done < payload.size();) {
    const size_t n = std::min(block.size(), payload.size() - done);
    if (!read_at(n, static_cast<off_t>(header_bytes + done)))
      return damaged("it cannot be read to its end");
    if (std::memcmp(block.data(), payload.data() + done, n) != 0)
      return damaged("its bytes differ from the chunk's content (bit rot, a torn copy or an edit)");
    done += n;
  }
  return {state::good, {}, expected};
}

namespace known_good {
namespace {
// The stored file as it was when it was known good. One written over since (a byte flipped
// in place, a copy put there) has another change time or inode, and is checked again.
struct file_identity {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0, ctime_ns = 0;
  bool operator==(const file_identity&) const = default;
};
std::optional<file_identity> identity_of(const std::string& run_dir, const chunk_key& key) {
  struct stat st {};
  if (::lstat(path_of(run_dir, key).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  const auto ns = [](const timespec& t) {
    return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
  };
  return file_identity{st.st_dev, st.st_ino, st.st_size, ns(st.st_mtim), ns(st.st_ctim)};
}
struct registry {
  std::mutex mutex;
  std::map<std::string, std::map<chunk_key, file_identity>, std::less<>> by_run;
};
registry& the_registry() {
  static registry r;
  return r;
}
}  // namespace

bool contains(const std::string& run_dir, const chunk_key& key) {
  const std::optional<file_identity> now = identity_of(run_dir, key);
  registry& r = the_registry();
  const std::lock_guard lock(r.mutex);
  const auto run = r.by_run.find(run_dir);
  if (run == r.by_run.end()) return false;
  const auto it = run->second.find(key);
  if (it == run->second.end()) return false;
  if (now && *now == it->second) return true;
  run->second.erase(it);  // gone, or written over since: checked again before it is trusted
  return false;
}

void add(const std::string& run_dir, const chunk_key& key) {
  const std::optional<file_identity> now = identity_of(run_dir, key);
  if (!now) return;
  registry& r = the_registry();
  const std::lock_guard lock(r.mutex);
  r.by_run[run_dir][key] = *now;
}

void forget(const std::string& run_dir, const chunk_key& key) {
  registry& r = the_registry();
  const std::lock_guard lock(r.mutex);
  if (const auto it = r.by_run.find(run_dir); it != r.by_run.end()) it->second.erase(key);
}

void forget_all(const std::string& run_dir) {
  registry& r = the_registry();
  const std::lock_guard lock(r.mutex);
  r.by_run.erase(run_dir);
}
}  // namespace known_good

}  // namespace chunk_file
}  // namespace troupe::ckpt
