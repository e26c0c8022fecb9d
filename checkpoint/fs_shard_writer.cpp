// The filesystem shard_writer and snapshot capture.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/shard_writer.hpp"
#include "runtime/balanced_split.hpp"
#include "runtime/sys/printable.hpp"
#include "runtime/sys/shared_work.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

void lay_out(const state_map& map, std::span<const std::span<const float>> buffers,
             snapshot& into) {
  if (buffers.size() != map.arrays.size())
    throw std::logic_error("capture: the state has " + std::to_string(buffers.size()) +
                           " buffers, the map " + std::to_string(map.arrays.size()));
  // First pass: what this rank writes, so the buffer is sized once.
  into.pieces.clear();
  size_t total = 0;
  for (size_t a = 0; a < map.arrays.size(); ++a) {
    for (const placed_piece& p : map.arrays[a]) {
      if (!p.saved) continue;
      const balanced_run mine = balanced_part(p.where.numel(), static_cast<size_t>(p.replicas),
                                              static_cast<size_t>(p.replica_index));
      if (p.local_offset + p.where.numel() > buffers[a].size())
        throw std::logic_error("capture: piece " + p.tensor + " runs past its local buffer");
      for (const box& b : sub_boxes(p.where, mine.offset, mine.count)) {
        into.pieces.push_back({static_cast<int>(a), p.tensor, b, total});
        total += b.numel();
      }
    }
  }
  if (into.data.size() < total) into.data.resize(total);  // first touch happens once
  into.used = total;
}

void capture(const state_map& map, std::span<const std::span<const float>> buffers,
             snapshot& into) {
  lay_out(map, buffers, into);
  // Second pass: the copies (the stall of an asynchronous checkpoint).
  size_t k = 0;
  for (size_t a = 0; a < map.arrays.size(); ++a) {
    for (const placed_piece& p : map.arrays[a]) {
      if (!p.saved) continue;
      const balanced_run mine = balanced_part(p.where.numel(), static_cast<size_t>(p.replicas),
                                              static_cast<size_t>(p.replica_index));
      const float* src = buffers[a].data() + p.local_offset + mine.offset;
      for (const box& b : sub_boxes(p.where, mine.offset, mine.count)) {
        const snapshot_piece& s = into.pieces[k++];
        std::memcpy(into.data.data() + s.data_offset, src, b.numel() * sizeof(float));
        src += b.numel();
      }
    }
  }
}

namespace {

class fs_shard_writer final : public shard_writer {
 public:
  fs_shard_writer(std::string run_dir, size_t chunk_bytes, chunk_observer observer,
                  fs_writer_options options)
      : run_dir_(std::move(run_dir)),
        observer_(std::move(observer)),
        options_(options),
        chunk_floats_(std::max<size_t>(1, chunk_bytes / sizeof(float))) {}

  [[nodiscard]] size_t chunk_floats() const override { return chunk_floats_; }

  void prepare(const snapshot& layout) override {
    size_t packed = 0;
    for (const snapshot_piece& p : layout.pieces)
      if (p.where.numel() < chunk_floats_ / 4) packed += p.where.numel();
    if (pack_.capacity() >= packed) return;
    pack_.resize(packed);  // touched now, kept by clear() for every write
    pack_.clear();
  }

  shard_report write(const snapshot& s) override {
    const auto started = std::chrono::steady_clock::now();
    // No garbage collection while this write looks for and adds chunks.
    const chunk_store_lock guard = chunk_store_lock::shared(run_dir_);
    shard_report r;
    r.rank = s.rank;
    r.step = s.step;
    r.adam_t = s.adam_t;
    std::vector<staged_chunk> staged;  // written under temporary names, not yet durable
    staged_keys_.clear();
    list_recycled(s.rank, s.world, r);
    try {
      // Boxes of at least a quarter chunk get chunks of their own, so unchanged ones are
      // shared across checkpoints; smaller ones are packed together, so a rank writes a few
      // files rather than hundreds (each file costs CPU that training would have used).
      const size_t pack_below = chunk_floats_ / 4;    // prepare() sizes pack_ by the same rule
      std::vector<std::pair<size_t, size_t>> packed;  // (index in r.pieces, start in pack_)
      std::vector<std::span<const float>> chunks;     // every chunk's floats, in order
      std::vector<size_t> first_chunk;                // per piece, its first in `chunks`
      pack_.clear();
      for (const snapshot_piece& p : s.pieces) {
        const size_t n = p.where.numel();
        const float* data = s.data.data() + p.data_offset;
        first_chunk.push_back(chunks.size());
        if (n < pack_below) {
          packed.emplace_back(r.pieces.size(), pack_.size());
          pack_.insert(pack_.end(), data, data + n);
        } else {
          for (size_t first = 0; first < n; first += chunk_floats_)
            chunks.emplace_back(data + first, std::min(chunk_floats_, n - first));
        }
        r.pieces.push_back({s.rank, p.array, p.tensor, p.where, {}, 0});
      }
      const size_t first_packed = chunks.size();  // pack_ is complete: its data stays put
      for (size_t first = 0; first < pack_.size(); first += chunk_floats_)
        chunks.emplace_back(pack_.data() + first, std::min(chunk_floats_, pack_.size() - first));

      // Each chunk is hashed, looked up and, when new, written by one job. For a large
      // snapshot that someone waits for, helpers share the jobs: a first checkpoint creates
      // hundreds of files, which costs more CPU than the disk needs time (172 MiB staged in
      // half the time on two threads).
      std::vector<chunk_key> keys(chunks.size());
      {
        const bool large = s.used * sizeof(float) >= options_.share_from_bytes;
        sys::shared_work jobs(large ? sys::helpers_for_this_thread(options_.max_helpers) : 0);
        for (size_t i = 0; i < chunks.size(); ++i)
          jobs.add(
              [this, &chunks, &keys, &r, &staged, i] { keys[i] = stage(chunks[i], r, staged); });
        jobs.finish();
      }
      if (observer_)
        for (size_t i = 0; i < chunks.size(); ++i) observer_(r.rank, r.step, keys[i], chunks[i]);
      for (size_t i = 0; i < r.pieces.size(); ++i) {
        saved_piece& out = r.pieces[i];
        const size_t n = out.where.numel();
        if (n < pack_below) continue;
        const auto first = keys.begin() + static_cast<std::ptrdiff_t>(first_chunk[i]);
        out.chunks.assign(
            first, first + static_cast<std::ptrdiff_t>((n + chunk_floats_ - 1) / chunk_floats_));
      }
      for (const auto& [index, start] : packed) {
        saved_piece& out = r.pieces[index];
        const size_t n = out.where.numel();
        out.offset = start % chunk_floats_;
        for (size_t c = start / chunk_floats_; c <= (start + n - 1) / chunk_floats_; ++c)
          out.chunks.push_back(keys[first_packed + c]);
      }
      // One flush of the file system for every staged chunk, instead of one fsync each
      // (a rank stages hundreds of small ones); only then are they named. A second flush
      // makes the new names (and any new folder) durable, instead of an fsync per folder.
      if (!staged.empty()) {
        const fs::path root = chunk_file::root(run_dir_);
        io::sync_file_system(root, "flushing the staged chunks");
        for (const staged_chunk& c : staged) name_chunk(c, r);
        io::sync_file_system(root, "flushing the chunks' names");
        if (options_.verify_after_write)
          for (const staged_chunk& c : staged) read_back(c);
        for (const staged_chunk& c : staged) chunk_file::known_good::add(run_dir_, c.key);
        staged.clear();
      }
    } catch (...) {
      for (const staged_chunk& c : staged) ::unlink(c.temp.c_str());
      throw;
    }
    r.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return r;
  }

 private:
  // A chunk written under a temporary name, to be named once the flush made it durable.
  struct staged_chunk {
    fs::path temp, path;
    chunk_key key;
    std::span<const unsigned char> payload;
  };

  // Hashes one chunk and, unless a known-good copy is stored or this snapshot already holds
  // it, writes it under a temporary name (listed in `staged`). Runs on any of the write's
  // threads.
  chunk_key stage(std::span<const float> floats, shard_report& r,
                  std::vector<staged_chunk>& staged) {
    const std::span<const unsigned char> payload(
        reinterpret_cast<const unsigned char*>(floats.data()), floats.size_bytes());
    const chunk_key key = key_of(payload.data(), payload.size());
    const fs::path path = chunk_file::path_of(run_dir_, key);
    const fs::path dir = path.parent_path();
    {
      const std::lock_guard lock(mutex_);
      if (!staged_keys_.insert(key).second) {  // the same content twice in this snapshot
        r.bytes_deduplicated += chunk_file::header_bytes + payload.size();
        ++r.chunks_deduplicated;
        return key;
      }
    }
    // The folder first: a link there would carry the checks and the write below elsewhere.
    if (!dir_checked(dir)) {
      const std::vector<std::string> moved = make_real_directory(run_dir_, dir, false);
      const std::lock_guard lock(mutex_);
      for (const std::string& m : moved)
        r.notes.push_back(sys::printable(dir.string()) + " was not a directory; moved it to " +
                          sys::printable(m));
      known_dirs_.insert(dir);
    }
    if (const std::optional<uint64_t> stored = stored_good(key, path, payload, r)) {
      const std::lock_guard lock(mutex_);
      r.bytes_deduplicated += *stored;
      ++r.chunks_deduplicated;
      return key;
    }
    const fs::path temp = io::temp_path_for(path);
    {
      const std::lock_guard lock(mutex_);
      staged.push_back({temp, path, key, payload});
      r.bytes_written += chunk_file::header_bytes + payload.size();
      ++r.chunks_written;
    }
    uint64_t old_size = 0;
    io::unique_fd fd = take_recycled(temp, old_size, r);
    if (fd.get() < 0) fd = io::create_temp(temp);
    const std::vector<unsigned char> header = chunk_file::header_for(key, payload.size());
    io::write_all(fd.get(), header.data(), header.size(), temp);
    io::write_all(fd.get(), payload.data(), payload.size(), temp);
    const uint64_t size = header.size() + payload.size();
    if (old_size > size && ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
      io::fail_errno(temp, "truncating a recycled chunk file", errno);
    io::start_write_back(fd.get());  // the disk works while the next chunk is hashed
    if (::close(fd.release()) != 0) io::fail_errno(temp, "close", errno);
    return key;
  }

  bool dir_checked(const fs::path& dir) {
    const std::lock_guard lock(mutex_);
    return known_dirs_.contains(dir);
  }

  // The size of the stored copy of `key` when it may be deduplicated against: one this
  // process knows good (still a regular file), or one read back now that holds exactly
  // `payload`. A damaged copy, or anything else under the name, is moved aside (the caller
  // then writes the chunk); nullopt when nothing good is stored.
  std::optional<uint64_t> stored_good(const chunk_key& key, const fs::path& path,
                                      std::span<const unsigned char> payload, shard_report& r) {
    using state = chunk_file::stored_chunk::state;
    if (chunk_file::known_good::contains(run_dir_, key)) {
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
          static_cast<uint64_t>(st.st_size) == chunk_file::header_bytes + payload.size())
        return static_cast<uint64_t>(st.st_size);
      chunk_file::known_good::forget(run_dir_, key);  // collected since, or replaced
    }
    const chunk_file::stored_chunk found = chunk_file::check_stored(run_dir_, key, payload);
    if (found.what == state::good) {
      chunk_file::known_good::add(run_dir_, key);
      return found.bytes;
    }
    if (found.what == state::damaged) {
      // Another rank may have moved it already (and written a good copy, which this one
      // then moves aside and writes again: the last rename leaves a good chunk either way).
      std::string where;
      try {
        where = move_aside(run_dir_, path, "damaged-chunk");
      } catch (const checkpoint_error& e) {
        struct stat st {};
        if (::lstat(path.c_str(), &st) != 0 && errno == ENOENT) return std::nullopt;
        throw;
      }
      const std::lock_guard lock(mutex_);
      ++r.chunks_repaired;
      r.notes.push_back("chunk " + key.hex() + " was damaged (" + found.why + "); moved it to " +
                        sys::printable(where) + " and wrote it again");
    }
    return std::nullopt;
  }

  // Names a durable staged chunk. Something planted under the name since it was checked is
  // moved aside once; the chunk then takes its place.
  void name_chunk(const staged_chunk& c, shard_report& r) {
    if (::rename(c.temp.c_str(), c.path.c_str()) == 0) return;
    const int err = errno;
    if (err != EISDIR && err != ENOTEMPTY && err != EEXIST && err != ENOTDIR)
      io::fail_errno(c.path, "renaming the finished chunk into place", err);
    const std::string where = move_aside(run_dir_, c.path, "in-the-way");
    r.notes.push_back(sys::printable(c.path.string()) + " was in the way of a chunk; moved it to " +
                      sys::printable(where));
    if (::rename(c.temp.c_str(), c.path.c_str()) != 0)
      io::fail_errno(c.path, "renaming the finished chunk into place", errno);
  }

  // --verify-checkpoints after-write: the chunk as the disk now returns it must be the chunk
  // written. One that is not is moved aside, and the write fails.
  void read_back(const staged_chunk& c) {
    const chunk_file::stored_chunk found =
        chunk_file::check_stored(run_dir_, c.key, c.payload, /*drop_cache=*/true);
    if (found.what == chunk_file::stored_chunk::state::good) return;
    std::string where = "(could not be moved aside)";
    try {
      where = move_aside(run_dir_, c.path, "failed-read-back");
    } catch (const checkpoint_error&) {
    }
    io::fail(error_kind::corrupt, c.path,
             "reads back differently from what was just written (" +
                 (found.what == chunk_file::stored_chunk::state::absent ? std::string("it is gone")
                                                                        : found.why) +
                 "); moved it to " + where +
                 ". The disk or file system returned other bytes than it was given; this "
                 "checkpoint is not committed, and the previous one stays.");
  }

  // The recycled files a collection left (their names), in the order this rank tries them:
  // ranks start at different points, so they seldom race for the same file. Only regular
  // files are taken; anything else there is skipped and reported once.
  void list_recycled(int rank, int world, shard_report& r) {
    recycled_.clear();
    next_recycled_.store(0);
    struct stat root_st {};
    if (::lstat(recycled_root_.c_str(), &root_st) != 0) return;  // no collection yet
    if (!S_ISDIR(root_st.st_mode)) {
      report_foreign(recycled_root_, "is not a directory; recycling nothing", r);
      return;
    }
    std::error_code ec;
    for (const fs::directory_entry& f : fs::directory_iterator(recycled_root_, ec)) {
      std::error_code type_ec;
      const fs::file_type type = f.symlink_status(type_ec).type();
      // Gone between the listing and the look: another rank of this host took it meanwhile.
      if (type == fs::file_type::not_found) continue;
      if (type != fs::file_type::regular) {
        report_foreign(f.path(), "is not a regular file; skipped", r);
        continue;
      }
      recycled_.push_back(f.path().filename().string());
    }
    if (recycled_.empty() || world <= 1) return;
    std::sort(recycled_.begin(), recycled_.end());
    const size_t start = recycled_.size() * static_cast<size_t>(rank) / static_cast<size_t>(world);
    std::rotate(recycled_.begin(), recycled_.begin() + static_cast<std::ptrdiff_t>(start),
                recycled_.end());
  }

  void report_foreign(const fs::path& path, const std::string& what, shard_report& r) {
    const std::lock_guard lock(mutex_);
    if (reported_.insert(path.string()).second)
      r.notes.push_back(sys::printable(path.string()) + " " + what);
  }

  // A recycled file renamed to `temp` and opened for writing from its start (its old size in
  // `old_size`), or an invalid fd when none is left. Overwriting it reuses its page-cache
  // pages and disk blocks: no allocation now, and nothing for a later collection to free.
  // Only a plain file of this process's user, with no other name and no larger than a
  // chunk, is taken: the bytes written go into nothing else.
  io::unique_fd take_recycled(const fs::path& temp, uint64_t& old_size, shard_report& r) {
    const uint64_t largest = chunk_file::header_bytes + chunk_floats_ * sizeof(float);
    const auto fits = [&](const struct stat& st) {
      return S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == ::geteuid() &&
             static_cast<uint64_t>(st.st_size) <= largest;
    };
    for (size_t i = next_recycled_.fetch_add(1); i < recycled_.size();
         i = next_recycled_.fetch_add(1)) {
      const fs::path from = recycled_root_ / recycled_[i];
      struct stat before {};
      if (::lstat(from.c_str(), &before) != 0) continue;  // another rank took it
      if (!fits(before)) {
        report_foreign(from, "is not a recycled chunk file (link, size or owner); skipped", r);
        continue;
      }
      if (::rename(from.c_str(), temp.c_str()) != 0) continue;
      io::unique_fd fd(::open(temp.c_str(), O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
      struct stat st {};
      const bool same = fd.get() >= 0 && ::fstat(fd.get(), &st) == 0 && fits(st) &&
                        st.st_ino == before.st_ino && st.st_dev == before.st_dev;
      if (!same) {  // swapped between the check and the rename: not ours to write into
        fd = io::unique_fd(-1);
        try {
          report_foreign(from,
                         "changed while being recycled; moved it to " +
                             sys::printable(move_aside(run_dir_, temp, "foreign-recycled")),
                         r);
        } catch (const checkpoint_error&) {
        }
        continue;
      }
      old_size = static_cast<uint64_t>(st.st_size);
      return fd;
    }
    return io::unique_fd(-1);
  }

  std::string run_dir_;
  fs::path recycled_root_ = chunk_file::recycled_root(run_dir_);
  std::vector<std::string> recycled_;
  std::atomic<size_t> next_recycled_ = 0;  // the write's threads take files in turn
  chunk_observer observer_;
  fs_writer_options options_;
  size_t chunk_floats_;
  std::vector<float> pack_;          // small boxes laid end to end; kept for the next snapshot
  std::mutex mutex_;                 // guards the sets and the report while jobs run
  std::set<chunk_key> staged_keys_;  // chunks this write has handled so far
  std::set<fs::path> known_dirs_;    // chunk folders checked to be real directories
  std::set<std::string> reported_;   // foreign entries already reported
};

}  // namespace

std::unique_ptr<shard_writer> make_fs_shard_writer(const std::string& run_dir, size_t chunk_bytes,
                                                   chunk_observer observer,
                                                   fs_writer_options options) {
  return std::make_unique<fs_shard_writer>(run_dir, chunk_bytes, std::move(observer), options);
}

}  // namespace troupe::ckpt
