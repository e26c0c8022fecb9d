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
#include <set>
#include <stdexcept>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/shard_writer.hpp"
#include "runtime/balanced_split.hpp"
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
    std::vector<std::pair<fs::path, fs::path>> staged;  // temp -> final, not yet durable
    staged_keys_.clear();
    list_recycled(s.rank, s.world);
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
        for (const auto& [temp, path] : staged) {
          if (::rename(temp.c_str(), path.c_str()) != 0)
            io::fail_errno(path, "renaming the finished chunk into place", errno);
        }
        staged.clear();
        io::sync_file_system(root, "flushing the chunks' names");
      }
    } catch (...) {
      for (const auto& [temp, path] : staged) ::unlink(temp.c_str());
      throw;
    }
    r.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return r;
  }

 private:
  // Hashes one chunk and, unless the store or this snapshot already holds it, writes it under
  // a temporary name (listed in `staged`). Runs on any of the write's threads.
  chunk_key stage(std::span<const float> floats, shard_report& r,
                  std::vector<std::pair<fs::path, fs::path>>& staged) {
    const void* data = floats.data();
    const size_t bytes = floats.size_bytes();
    const chunk_key key = key_of(data, bytes);
    const fs::path path = chunk_file::path_of(run_dir_, key);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      const std::lock_guard lock(mutex_);
      r.bytes_deduplicated += static_cast<uint64_t>(st.st_size);
      ++r.chunks_deduplicated;
      return key;
    }
    const fs::path temp = io::temp_path_for(path);
    const fs::path dir = path.parent_path();
    bool new_dir = false;
    {
      const std::lock_guard lock(mutex_);
      if (!staged_keys_.insert(key).second) {  // the same content twice in this snapshot
        r.bytes_deduplicated += chunk_file::header_bytes + bytes;
        ++r.chunks_deduplicated;
        return key;
      }
      staged.emplace_back(temp, path);
      r.bytes_written += chunk_file::header_bytes + bytes;
      ++r.chunks_written;
      new_dir = !known_dirs_.contains(dir);
    }
    if (new_dir) {
      io::make_dirs(dir);  // two threads may both create it; durable with the final flush
      const std::lock_guard lock(mutex_);
      known_dirs_.insert(dir);
    }
    uint64_t old_size = 0;
    io::unique_fd fd = take_recycled(temp, old_size);
    if (fd.get() < 0) fd = io::create_temp(temp);
    const std::vector<unsigned char> header = chunk_file::header_for(key, bytes);
    io::write_all(fd.get(), header.data(), header.size(), temp);
    io::write_all(fd.get(), data, bytes, temp);
    const uint64_t size = header.size() + bytes;
    if (old_size > size && ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
      io::fail_errno(temp, "truncating a recycled chunk file", errno);
    io::start_write_back(fd.get());  // the disk works while the next chunk is hashed
    if (::close(fd.release()) != 0) io::fail_errno(temp, "close", errno);
    return key;
  }

  // The recycled files a collection left (their names), in the order this rank tries them:
  // ranks start at different points, so they seldom race for the same file.
  void list_recycled(int rank, int world) {
    recycled_.clear();
    next_recycled_.store(0);
    std::error_code ec;
    for (const fs::directory_entry& f : fs::directory_iterator(recycled_root_, ec))
      recycled_.push_back(f.path().filename().string());
    if (recycled_.empty() || world <= 1) return;
    std::sort(recycled_.begin(), recycled_.end());
    const size_t start = recycled_.size() * static_cast<size_t>(rank) / static_cast<size_t>(world);
    std::rotate(recycled_.begin(), recycled_.begin() + static_cast<std::ptrdiff_t>(start),
                recycled_.end());
  }

  // A recycled file renamed to `temp` and opened for writing from its start (its old size in
  // `old_size`), or an invalid fd when none is left. Overwriting it reuses its page-cache
  // pages and disk blocks: no allocation now, and nothing for a later collection to free.
  io::unique_fd take_recycled(const fs::path& temp, uint64_t& old_size) {
    for (size_t i = next_recycled_.fetch_add(1); i < recycled_.size();
         i = next_recycled_.fetch_add(1)) {
      const fs::path from = recycled_root_ / recycled_[i];
      if (::rename(from.c_str(), temp.c_str()) != 0) continue;  // another rank took it
      io::unique_fd fd(::open(temp.c_str(), O_WRONLY | O_CLOEXEC));
      struct stat st {};
      if (fd.get() < 0 || ::fstat(fd.get(), &st) != 0) {
        ::unlink(temp.c_str());
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
  std::mutex mutex_;                 // guards the two sets and the report while jobs run
  std::set<chunk_key> staged_keys_;  // chunks this write has staged so far
  std::set<fs::path> known_dirs_;
};

}  // namespace

std::unique_ptr<shard_writer> make_fs_shard_writer(const std::string& run_dir, size_t chunk_bytes,
                                                   chunk_observer observer,
                                                   fs_writer_options options) {
  return std::make_unique<fs_shard_writer>(run_dir, chunk_bytes, std::move(observer), options);
}

}  // namespace troupe::ckpt
