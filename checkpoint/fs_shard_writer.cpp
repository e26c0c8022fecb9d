// The filesystem shard_writer and snapshot capture.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <set>
#include <stdexcept>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/shard_writer.hpp"
#include "runtime/balanced_split.hpp"

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
  fs_shard_writer(std::string run_dir, size_t chunk_bytes, chunk_observer observer)
      : run_dir_(std::move(run_dir)),
        observer_(std::move(observer)),
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
      pack_.clear();
      for (const snapshot_piece& p : s.pieces) {
        saved_piece out{s.rank, p.array, p.tensor, p.where, {}, 0};
        const size_t n = p.where.numel();
        const float* data = s.data.data() + p.data_offset;
        if (n < pack_below) {
          packed.emplace_back(r.pieces.size(), pack_.size());
          pack_.insert(pack_.end(), data, data + n);
        } else {
          for (size_t first = 0; first < n; first += chunk_floats_) {
            const size_t count = std::min(chunk_floats_, n - first);
            out.chunks.push_back(stage(data + first, count * sizeof(float), r, staged));
          }
        }
        r.pieces.push_back(std::move(out));
      }
      std::vector<chunk_key> pack_keys;
      for (size_t first = 0; first < pack_.size(); first += chunk_floats_) {
        const size_t count = std::min(chunk_floats_, pack_.size() - first);
        pack_keys.push_back(stage(pack_.data() + first, count * sizeof(float), r, staged));
      }
      for (const auto& [index, start] : packed) {
        saved_piece& out = r.pieces[index];
        const size_t n = out.where.numel();
        out.offset = start % chunk_floats_;
        for (size_t c = start / chunk_floats_; c <= (start + n - 1) / chunk_floats_; ++c)
          out.chunks.push_back(pack_keys[c]);
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
  chunk_key stage(const float* data, size_t bytes, shard_report& r,
                  std::vector<std::pair<fs::path, fs::path>>& staged) {
    const chunk_key key = key_of(data, bytes);
    if (observer_) observer_(r.rank, r.step, key, {data, bytes / sizeof(float)});
    const fs::path path = chunk_file::path_of(run_dir_, key);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      r.bytes_deduplicated += static_cast<uint64_t>(st.st_size);
      ++r.chunks_deduplicated;
      return key;
    }
    if (staged_keys_.contains(key)) {  // the same content twice in this snapshot
      r.bytes_deduplicated += chunk_file::header_bytes + bytes;
      ++r.chunks_deduplicated;
      return key;
    }
    const fs::path dir = path.parent_path();
    if (!known_dirs_.contains(dir)) {
      io::make_dirs(dir);  // durable with the write's final flush
      known_dirs_.insert(dir);
    }
    const fs::path temp = io::temp_path_for(path);
    uint64_t old_size = 0;
    io::unique_fd fd = take_recycled(temp, old_size);
    if (fd.get() < 0) fd = io::create_temp(temp);
    staged.emplace_back(temp, path);
    staged_keys_.insert(key);
    const std::vector<unsigned char> header = chunk_file::header_for(key, bytes);
    io::write_all(fd.get(), header.data(), header.size(), temp);
    io::write_all(fd.get(), data, bytes, temp);
    const uint64_t size = header.size() + bytes;
    if (old_size > size && ::ftruncate(fd.get(), static_cast<off_t>(size)) != 0)
      io::fail_errno(temp, "truncating a recycled chunk file", errno);
    io::start_write_back(fd.get());  // the disk works while the next chunk is hashed
    if (::close(fd.release()) != 0) io::fail_errno(temp, "close", errno);
    r.bytes_written += header.size() + bytes;
    ++r.chunks_written;
    return key;
  }

  // The recycled files a collection left (their names), in the order this rank tries them:
  // ranks start at different points, so they seldom race for the same file.
  void list_recycled(int rank, int world) {
    recycled_.clear();
    next_recycled_ = 0;
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
    while (next_recycled_ < recycled_.size()) {
      const fs::path from = recycled_root_ / recycled_[next_recycled_++];
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
  size_t next_recycled_ = 0;
  chunk_observer observer_;
  size_t chunk_floats_;
  std::vector<float> pack_;          // small boxes laid end to end; kept for the next snapshot
  std::set<chunk_key> staged_keys_;  // chunks this write has staged so far
  std::set<fs::path> known_dirs_;
};

}  // namespace

std::unique_ptr<shard_writer> make_fs_shard_writer(const std::string& run_dir, size_t chunk_bytes,
                                                   chunk_observer observer) {
  return std::make_unique<fs_shard_writer>(run_dir, chunk_bytes, std::move(observer));
}

}  // namespace troupe::ckpt
