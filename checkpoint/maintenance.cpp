// Retention, garbage collection of chunks, and verification of committed checkpoints.

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

std::vector<int64_t> prune_by_policy(const std::string& run_dir, const retention_policy& policy,
                                     int64_t latest) {
  if (policy.keep_last == 0) return {};  // keep everything
  const std::vector<int64_t> committed = list_committed(run_dir);
  std::set<int64_t> keep(
      committed.end() - static_cast<std::ptrdiff_t>(std::min(policy.keep_last, committed.size())),
      committed.end());
  if (policy.keep_every > 0) {
    for (int64_t s : committed)
      if (s % policy.keep_every == 0) keep.insert(s);
  }
  keep.insert(latest);  // whatever else happens, the checkpoint a restore would use stays
  std::vector<int64_t> removed;
  for (int64_t s : committed) {
    // Newer than LATEST: a commit may be under way; never touched.
    if (keep.contains(s) || s > latest) continue;
    const fs::path dir = format::step_dir(run_dir, s);
    const fs::path manifest_path = dir / format::manifest_name;
    if (::unlink(manifest_path.c_str()) == 0) {
      io::fsync_dir(dir);
    } else if (errno != ENOENT) {
      io::fail_errno(manifest_path, "removing", errno);
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
    if (ec) io::fail_errno(dir, "removing", ec.value());
    removed.push_back(s);
  }
  if (!removed.empty()) io::fsync_dir(format::checkpoints_dir(run_dir));
  return removed;
}

}  // namespace

namespace {

std::vector<chunk_key> references_of(const manifest& m) {
  std::vector<chunk_key> keys;
  for (const saved_piece& p : m.pieces) keys.insert(keys.end(), p.chunks.begin(), p.chunks.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// Where the chunks a collection removes go: up to `keep` files to the recycled folder (renamed,
// so nothing is freed or allocated again), the others deleted.
class chunk_disposal {
 public:
  chunk_disposal(const std::string& run_dir, size_t keep)
      : folder_(chunk_file::recycled_root(run_dir)), keep_(keep) {
    std::error_code ec;
    std::vector<fs::path> held;
    for (const fs::directory_entry& f : fs::directory_iterator(folder_, ec))
      held.push_back(f.path());
    // More than may be kept (a smaller limit, an offline collection): the excess goes now.
    for (size_t i = keep_; i < held.size(); ++i) {
      std::error_code size_ec;
      const uint64_t bytes = fs::file_size(held[i], size_ec);
      if (::unlink(held[i].c_str()) == 0) freed_ += size_ec ? 0 : bytes;
    }
    held_ = std::min(held.size(), keep_);
  }

  // Removes the chunk `key` at `path` from the store (nothing when it is not there).
  void remove(const fs::path& path, const chunk_key& key, uint64_t bytes, gc_result& out) {
    if (held_ < keep_) {
      if (!made_folder_) {
        io::make_dirs(folder_);
        made_folder_ = true;
      }
      if (::rename(path.c_str(), (folder_ / key.hex()).c_str()) == 0) {
        ++held_;
        ++out.chunks_recycled;
        ++out.chunks_removed;
        return;
      }
      if (errno == ENOENT) return;
      io::fail_errno(path, "moving an unreferenced chunk to the recycled files", errno);
    }
    if (::unlink(path.c_str()) != 0) {
      if (errno == ENOENT) return;
      io::fail_errno(path, "removing an unreferenced chunk", errno);
    }
    ++out.chunks_removed;
    out.bytes_freed += bytes;
  }

  [[nodiscard]] uint64_t freed() const { return freed_; }

 private:
  fs::path folder_;
  size_t keep_;
  size_t held_ = 0;
  uint64_t freed_ = 0;
  bool made_folder_ = false;
};

// Removes every chunk file outside `referenced`, and temporary files older than temp_grace.
void sweep_chunk_folders(const std::string& run_dir, const std::set<chunk_key>& referenced,
                         std::chrono::seconds temp_grace, chunk_disposal& disposal,
                         gc_result& out) {
  const fs::path root = chunk_file::root(run_dir);
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& folder : fs::directory_iterator(root, ec)) {
    if (!folder.is_directory(ec)) continue;
    for (const fs::directory_entry& f : fs::directory_iterator(folder.path(), ec)) {
      const std::string name = f.path().filename().string();
      const auto key = chunk_key::from_hex(name);
      std::error_code size_ec;
      const uint64_t bytes = f.file_size(size_ec);
      if (key) {
        if (referenced.contains(*key)) {
          ++out.chunks_kept;
          continue;
        }
        disposal.remove(f.path(), *key, size_ec ? 0 : bytes, out);
      } else if (name.find(".tmp.") != std::string::npos) {
        std::error_code time_ec;
        const auto written = f.last_write_time(time_ec);
        if (time_ec || now - written < temp_grace) continue;
        if (::unlink(f.path().c_str()) == 0) ++out.temp_files_removed;
      }
    }
    // No fsync of the folder: a deletion lost in a crash only leaves garbage for the next
    // collection (the manifests that referenced it were removed durably first).
  }
  if (ec) io::fail_errno(root, "listing", ec.value());
}

// The chunks of the removed checkpoints that no kept one references, by name.
void remove_released_chunks(const std::string& run_dir, const std::set<chunk_key>& released,
                            const std::set<chunk_key>& referenced, chunk_disposal& disposal,
                            gc_result& out) {
  out.chunks_kept = referenced.size();
  for (const chunk_key& key : released) {
    if (referenced.contains(key)) continue;
    const fs::path path = chunk_file::path_of(run_dir, key);
    struct stat st {};
    const bool sized = ::stat(path.c_str(), &st) == 0;
    disposal.remove(path, key, sized ? static_cast<uint64_t>(st.st_size) : 0, out);
  }
}

}  // namespace

void gc_memory::remember(const manifest& m) { references[m.step] = references_of(m); }

gc_result collect_garbage(const std::string& run_dir, const retention_policy& policy,
                          std::chrono::seconds temp_grace) {
  gc_memory fresh;
  return collect_garbage(run_dir, policy, temp_grace, fresh);
}

gc_result collect_garbage(const std::string& run_dir, const retention_policy& policy,
                          std::chrono::seconds temp_grace, gc_memory& memory) {
  gc_result out;
  // LATEST must name a readable checkpoint before anything is judged unreferenced; one this
  // process already read or committed was.
  const std::optional<int64_t> latest_step = read_latest_step(run_dir);
  if (!latest_step) return out;
  if (!memory.references.contains(*latest_step)) {
    const std::optional<manifest> latest = latest_committed(run_dir);
    if (!latest) return out;
    memory.remember(*latest);
  }
  // Every committed manifest's references, before retention removes any of them.
  const std::vector<int64_t> before = list_committed(run_dir);
  for (int64_t step : before) {
    if (!memory.references.contains(step))
      memory.remember(read_manifest(run_dir, step));  // throws: then nothing is deleted
  }
  out.removed_steps = prune_by_policy(run_dir, policy, *latest_step);

  std::set<chunk_key> referenced;
  std::set<chunk_key> released;
  const std::vector<int64_t> after = list_committed(run_dir);
  for (int64_t step : before) {
    const std::vector<chunk_key>& keys = memory.references.at(step);
    const bool kept = std::binary_search(after.begin(), after.end(), step);
    (kept ? referenced : released).insert(keys.begin(), keys.end());
  }
  for (auto it = memory.references.begin(); it != memory.references.end();) {
    it = std::binary_search(after.begin(), after.end(), it->first) ? std::next(it)
                                                                   : memory.references.erase(it);
  }
  const bool sweep = memory.sweep_every == 0 || memory.collections % memory.sweep_every == 0;
  ++memory.collections;
  chunk_disposal disposal(run_dir, memory.recycle_up_to);
  if (sweep)
    sweep_chunk_folders(run_dir, referenced, temp_grace, disposal, out);
  else
    remove_released_chunks(run_dir, released, referenced, disposal, out);
  out.bytes_freed += disposal.freed();
  return out;
}

std::optional<run_lock> run_lock::try_acquire(const std::string& run_dir) {
  const fs::path dir = format::checkpoints_dir(run_dir);
  io::make_dirs_durable(dir);
  const fs::path path = dir / ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) io::fail_errno(path, "creating the lock file", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  return run_lock(fd);
}

namespace {
int open_chunk_lock(const std::string& run_dir) {
  const fs::path dir = format::checkpoints_dir(run_dir);
  io::make_dirs_durable(dir);
  const fs::path path = dir / ".chunks.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) io::fail_errno(path, "creating the lock file", errno);
  return fd;
}
}  // namespace

chunk_store_lock chunk_store_lock::shared(const std::string& run_dir) {
  const int fd = open_chunk_lock(run_dir);
  while (::flock(fd, LOCK_SH) != 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd);
    io::fail_errno(format::checkpoints_dir(run_dir) / ".chunks.lock", "locking", err);
  }
  return chunk_store_lock(fd);
}

std::optional<chunk_store_lock> chunk_store_lock::try_exclusive(const std::string& run_dir) {
  const int fd = open_chunk_lock(run_dir);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  return chunk_store_lock(fd);
}

chunk_store_lock::~chunk_store_lock() {
  if (fd_ >= 0) ::close(fd_);
}

run_lock::~run_lock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the flock
}

std::vector<std::string> remove_stale_temp_files(const std::string& run_dir, const run_lock& held) {
  (void)held;  // only a job holding the run's lock may call this: no writer is alive
  const auto is_temp = [](const fs::path& p) {
    const std::string name = p.filename().string();
    return name.find(".tmp.") != std::string::npos || name.ends_with(".tmp");
  };
  std::vector<std::string> removed;
  const auto remove = [&](const fs::directory_entry& f) {
    std::error_code ec;
    if (f.is_regular_file(ec) && is_temp(f.path()) && ::unlink(f.path().c_str()) == 0)
      removed.push_back(f.path().string());
  };
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(run_dir, ec)) remove(f);
  const fs::path root = format::checkpoints_dir(run_dir);
  for (auto it = fs::recursive_directory_iterator(
           root, fs::directory_options::skip_permission_denied, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    remove(*it);
  return removed;
}

std::vector<problem> verify_checkpoint(const std::string& run_dir, int64_t step) {
  std::vector<problem> out;
  manifest m;
  try {
    m = read_manifest(run_dir, step);
  } catch (const checkpoint_error& e) {
    out.push_back({e.path(), e.what()});
    return out;
  }
  if (m.format_version < 2) {
    try {
      (void)load_full_state(run_dir, m);
    } catch (const checkpoint_error& e) {
      out.push_back({e.path(), e.what()});
    }
    return out;
  }
  // Each distinct chunk once, with every tensor that holds it named in the message.
  struct use {
    chunk_extent extent{0, SIZE_MAX};  // what every piece that holds it allows
    std::string holders;
  };
  std::map<chunk_key, use> chunks;
  for (const saved_piece& p : m.pieces) {
    for (size_t i = 0; i < p.chunks.size(); ++i) {
      const chunk_extent e = extent_of(p, i, m.chunk_floats);
      auto& entry = chunks[p.chunks[i]];
      entry.extent.min_floats = std::max(entry.extent.min_floats, e.min_floats);
      entry.extent.max_floats = std::min(entry.extent.max_floats, e.max_floats);
      const std::string holder =
          std::string(array_names[static_cast<size_t>(p.array)]) + " of " + p.tensor;
      if (entry.holders.find(holder) == std::string::npos)
        entry.holders += (entry.holders.empty() ? "" : ", ") + holder;
    }
  }
  for (const auto& [key, info] : chunks) {
    try {
      (void)chunk_file::read_range(run_dir, key, info.extent.min_floats, info.extent.max_floats,
                                   "holds " + info.holders + " of step " + std::to_string(step));
    } catch (const checkpoint_error& e) {
      out.push_back({e.path(), e.what()});
    }
  }
  return out;
}

}  // namespace troupe::ckpt
