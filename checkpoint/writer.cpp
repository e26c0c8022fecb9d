// The write side of a checkpoint: a rank's durable shard, the coordinator's commit.

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <ostream>
#include <set>
#include <streambuf>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "checkpoint/manifest.hpp"
#include "runtime/sys/fault_point.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

/// A stream buffer that hashes and writes what cereal produces, so the body reaches the
/// disk in one pass and is never held in memory twice.
class hashing_file_sink : public std::streambuf {
 public:
  hashing_file_sink(int fd, fs::path path) : fd_(fd), path_(std::move(path)), buffer_(1 << 20) {
    setp(buffer_.data(), buffer_.data() + buffer_.size());
  }

  /// Writes out what is buffered; rethrows the first failure seen on the way.
  void finish() {
    drain();
    if (error_) std::rethrow_exception(error_);
  }
  /// Rethrows a failure recorded inside the stream buffer, if any.
  void rethrow_if_failed() const {
    if (error_) std::rethrow_exception(error_);
  }
  [[nodiscard]] uint64_t bytes() const noexcept { return bytes_; }
  [[nodiscard]] uint64_t digest() const noexcept { return hash_.digest(); }

 protected:
  int_type overflow(int_type ch) override {
    if (!drain()) return traits_type::eof();
    if (!traits_type::eq_int_type(ch, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(ch);
      pbump(1);
    }
    return traits_type::not_eof(ch);
  }

  std::streamsize xsputn(const char* s, std::streamsize n) override {
    if (n <= 0) return 0;  // an empty array may hand over a null pointer
    const auto size = static_cast<size_t>(n);
    if (size <= static_cast<size_t>(epptr() - pptr())) {
      std::memcpy(pptr(), s, size);
      pbump(static_cast<int>(n));
      return n;
    }
    if (!drain()) return 0;
    if (size < buffer_.size()) {
      std::memcpy(pptr(), s, size);
      pbump(static_cast<int>(n));
      return n;
    }
    // Large arrays bypass the buffer: no copy, one write.
    return emit(s, size) ? n : 0;
  }

  int sync() override { return drain() ? 0 : -1; }

 private:
  // Failures are recorded, not thrown through the stream machinery, which may swallow
  // them; finish() or rethrow_if_failed() surfaces them with the real cause (e.g. ENOSPC).
  bool emit(const char* data, size_t size) {
    if (error_) return false;
    try {
      hash_.update(data, size);
      io::write_all(fd_, data, size, path_);
      bytes_ += size;
      return true;
    } catch (...) {
      error_ = std::current_exception();
      return false;
    }
  }
  bool drain() {
    const auto pending = static_cast<size_t>(pptr() - pbase());
    setp(buffer_.data(), buffer_.data() + buffer_.size());
    return pending == 0 ? !error_ : emit(buffer_.data(), pending);
  }

  int fd_;
  fs::path path_;
  std::vector<char> buffer_;
  hasher64 hash_;
  uint64_t bytes_ = 0;
  std::exception_ptr error_;
};

void pwrite_all(int fd, const unsigned char* data, size_t size, off_t at, const fs::path& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, size, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      io::fail_errno(path, "write", errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
    at += n;
  }
}

[[noreturn]] void bad_state(const shard_state& s, const std::string& what) {
  throw checkpoint_error(error_kind::invalid_argument, "",
                         "checkpoint: write_shard(rank " + std::to_string(s.rank) + ", step " +
                             std::to_string(s.step) + "): " + what +
                             ". This is a bug in the caller; nothing was written.");
}

void validate_state(const shard_state& s) {
  if (s.world < 1) bad_state(s, "world is " + std::to_string(s.world) + ", not >= 1");
  if (s.rank < 0 || s.rank >= s.world) bad_state(s, "rank is outside [0, world)");
  if (s.step < 0) bad_state(s, "step is negative");
  if (s.range.offset > s.global_numel || s.range.count > s.global_numel - s.range.offset) {
    bad_state(s, "range [" + std::to_string(s.range.offset) + ", +" +
                     std::to_string(s.range.count) + ") runs past global_numel " +
                     std::to_string(s.global_numel));
  }
  const auto check = [&](const std::vector<float>& v, const char* name) {
    if (v.size() != s.range.count) {
      bad_state(s, std::string(name) + " holds " + std::to_string(v.size()) +
                       " floats but range.count is " + std::to_string(s.range.count) +
                       " (pass only the owned slice)");
    }
  };
  check(s.params, "params");
  check(s.exp_avg, "exp_avg");
  check(s.exp_avg_sq, "exp_avg_sq");
}

[[noreturn]] void already_committed(const fs::path& dir, int64_t step) {
  io::fail(error_kind::already_committed, dir / format::manifest_name,
           "step " + std::to_string(step) +
               " is already committed; refusing to overwrite it. A retried step must not "
               "checkpoint again under the same step number.");
}

/// Reads just the header of a written shard, to catch entries that do not describe the
/// file they name before they are committed (a coordinator mixing up reports).
void check_reported_shard(const fs::path& dir, const manifest& m, const shard_entry& e) {
  const fs::path path = dir / e.file;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) {
    io::fail(error_kind::missing, path,
             "the shard of rank " + std::to_string(e.rank) + " is not on disk, so step " +
                 std::to_string(m.step) +
                 " cannot be committed; the previous checkpoint stays LATEST. Have that "
                 "rank write its shard again.");
  }
  if (size != e.bytes) {
    io::fail(error_kind::truncated, path,
             "is " + std::to_string(size) + " bytes but its rank reported " +
                 std::to_string(e.bytes) + "; not committing. Have that rank write it again.");
  }
  io::unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) io::fail_errno(path, "opening", errno);
  unsigned char raw[format::header_bytes];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::pread(fd.get(), raw + got, sizeof raw - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) io::fail_errno(path, "reading the header", n < 0 ? errno : EIO);
    got += static_cast<size_t>(n);
  }
  const format::shard_header h = format::decode_header(raw);
  if (h.magic_bytes != format::magic || h.header_hash != h.computed_hash || h.rank != e.rank ||
      h.world != m.world || h.step != m.step || hash_to_hex(h.body_hash) != e.hash) {
    io::fail(error_kind::mismatch, path,
             "does not match the entry reported for rank " + std::to_string(e.rank) +
                 " (rank, world, step or hash differ); not committing. Have that rank write "
                 "its shard again.");
  }
}

}  // namespace

shard_entry write_shard(const std::string& run_dir, const shard_state& s) {
  validate_state(s);
  const fs::path dir = format::step_dir(run_dir, s.step);
  io::make_dirs_durable(dir);
  std::error_code ec;
  if (fs::exists(dir / format::manifest_name, ec)) already_committed(dir, s.step);

  const fs::path final_path = dir / format::shard_file_name(s.rank);
  const fs::path temp = io::temp_path_for(final_path);
  io::unique_fd fd = io::create_temp(temp);
  format::shard_header header;
  try {
    // Room for the header, which is only known once the body has been hashed.
    const unsigned char zeros[format::header_bytes] = {};
    io::write_all(fd.get(), zeros, sizeof zeros, temp);
    hashing_file_sink sink(fd.get(), temp);
    {
      std::ostream out(&sink);
      try {
        cereal::BinaryOutputArchive archive(out);
        format::save_body(archive, s);
      } catch (const cereal::Exception&) {
        sink.rethrow_if_failed();  // the real cause, if the disk refused
        throw;
      }
    }
    sink.finish();
    header.rank = s.rank;
    header.world = s.world;
    header.step = s.step;
    header.body_bytes = sink.bytes();
    header.body_hash = sink.digest();
    const auto raw = format::encode_header(header);
    pwrite_all(fd.get(), raw.data(), raw.size(), 0, temp);
  } catch (const cereal::Exception& e) {
    ::unlink(temp.c_str());
    io::fail(error_kind::io, temp, std::string("serializing the shard failed: ") + e.what());
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  io::publish(std::move(fd), temp, final_path);

  shard_entry entry;
  entry.rank = s.rank;
  entry.file = final_path.filename().string();
  entry.bytes = format::header_bytes + header.body_bytes;
  entry.hash = hash_to_hex(header.body_hash);
  entry.range = s.range;
  return entry;
}

void commit_manifest(const std::string& run_dir, const manifest& m,
                     const std::function<void()>& before_write) {
  const fs::path dir = format::step_dir(run_dir, m.step);
  const fs::path manifest_path = dir / format::manifest_name;
  manifest_json::validate(m, manifest_path, error_kind::invalid_argument);
  std::error_code ec;
  if (m.format_version >= 2) {
    // Ranks reported their chunks durable; check each is there before naming it.
    std::set<chunk_key> seen;
    for (const saved_piece& p : m.pieces) {
      for (const chunk_key& k : p.chunks) {
        if (!seen.insert(k).second) continue;
        const fs::path chunk = chunk_file::path_of(run_dir, k);
        if (fs::symlink_status(chunk, ec).type() != fs::file_type::regular) {
          io::fail(error_kind::missing, chunk,
                   "is not on disk though rank " + std::to_string(p.rank) + " reported it for " +
                       p.tensor + "; step " + std::to_string(m.step) +
                       " is not committed and the previous checkpoint stays LATEST.");
        }
      }
    }
    // A link or a file planted under the step's name is moved aside: the manifest goes
    // into a directory of the run's own.
    (void)make_real_directory(run_dir, dir, true);
  } else if (fs::symlink_status(dir, ec).type() != fs::file_type::directory) {
    io::fail(error_kind::missing, dir,
             "no shard of step " + std::to_string(m.step) +
                 " was written here, so it cannot be committed; the previous checkpoint stays "
                 "LATEST.");
  }
  for (const shard_entry& e : m.shards) check_reported_shard(dir, m, e);
  // An injection point: crash-consistency tests hold the commit here (chaos/hooks.hpp) and
  // kill the coordinator inside this window on purpose.
  if (m.format_version >= 2) sys::hit(sys::fault_point::checkpoint_before_manifest, m.step);

  const std::string text = manifest_json::to_json(m);
  fs::file_type found = fs::symlink_status(manifest_path, ec).type();
  if (found != fs::file_type::not_found && found != fs::file_type::regular) {
    (void)move_aside(run_dir, manifest_path, "not-a-manifest");  // a link, a directory, ...
    found = fs::file_type::not_found;
  }
  if (found == fs::file_type::regular) {
    // A retry after a crash between the manifest and LATEST: same content is fine.
    const auto existing = io::read_file(manifest_path);
    if (std::string_view(reinterpret_cast<const char*>(existing.data()), existing.size()) != text) {
      already_committed(dir, m.step);
    }
  } else {
    io::write_file_atomically(manifest_path, text, before_write);
  }
  // The commit point: once this rename is durable, the step is the checkpoint to restore.
  point_latest_at(run_dir, m.step, before_write);
}

}  // namespace troupe::ckpt
