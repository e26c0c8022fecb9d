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
#include "checkpoint/manifest.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

bool is_real_directory(const fs::path& p) {
  struct stat st {};
  return ::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool is_regular_file(const fs::path& p, uint64_t* size = nullptr) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return true;
}

// Removes what `policy` does not keep, among the committed checkpoints older than both LATEST
// and `newest_verified` (the newest checkpoint known intact; nothing is removed without one).
std::vector<int64_t> prune_by_policy(const std::string& run_dir, const retention_policy& policy,
                                     int64_t latest, std::optional<int64_t> newest_verified) {
  if (policy.keep_last == 0 || !newest_verified) return {};
  const std::vector<int64_t> committed = list_committed(run_dir);
  std::set<int64_t> keep(
      committed.end() - static_cast<std::ptrdiff_t>(std::min(policy.keep_last, committed.size())),
      committed.end());
  if (policy.keep_every > 0) {
    for (int64_t s : committed)
      if (s % policy.keep_every == 0) keep.insert(s);
  }
  keep.insert(latest);  // whatever else happens, the checkpoint a restore would use stays
  keep.insert(*newest_verified);
  std::vector<int64_t> removed;
  for (int64_t s : committed) {
    // Newer than LATEST: a commit may be under way; newer than the newest verified one: not
    // known to replace anything. Never touched.
    if (keep.contains(s) || s > latest || s > *newest_verified) continue;
    const fs::path dir = format::step_dir(run_dir, s);
    if (!is_real_directory(dir)) continue;  // list_committed saw a directory; it changed
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
  if (!removed.empty()) io::fsync_dir(run_paths::checkpoints(run_dir));
  return removed;
}

std::vector<chunk_key> references_of(const manifest& m) {
  std::vector<chunk_key> keys;
  for (const saved_piece& p : m.pieces) keys.insert(keys.end(), p.chunks.begin(), p.chunks.end());
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

// The newest committed step at or below `latest` known intact: newest first, one `memory`
// holds (a job's own commits: no reading), or else one that reads back whole now (an offline
// collection's first look). Damaged ones on the way are left where they are (`troupe ckpt
// scrub` quarantines them).
std::optional<int64_t> newest_verified(const std::string& run_dir,
                                       const std::vector<int64_t>& committed, int64_t latest,
                                       gc_memory& memory) {
  for (auto it = committed.rbegin(); it != committed.rend(); ++it) {
    if (*it > latest) continue;
    if (!memory.verified.contains(*it)) {
      if (!verify_checkpoint(run_dir, *it).empty()) continue;
      memory.verified.insert(*it);
    }
    return *it;
  }
  return std::nullopt;
}

// Adds the chunks of every readable quarantined checkpoint to `referenced`: what was moved
// aside is kept whole, for whoever wants to salvage it.
void keep_quarantined(const std::string& run_dir, gc_memory& memory,
                      std::set<chunk_key>& referenced) {
  std::map<std::string, std::vector<chunk_key>> now;
  for (const quarantined_checkpoint& q : list_quarantined(run_dir)) {
    auto known = memory.quarantined.find(q.path);
    if (known == memory.quarantined.end()) {
      std::vector<chunk_key> keys;
      try {
        const fs::path path = fs::path(q.path) / format::manifest_name;
        const auto raw = io::read_file(path);
        keys = references_of(manifest_json::from_json(
            std::string_view(reinterpret_cast<const char*>(raw.data()), raw.size()), path));
      } catch (const checkpoint_error&) {  // unreadable: it references nothing we can know
      }
      known = memory.quarantined.emplace(q.path, std::move(keys)).first;
    }
    referenced.insert(known->second.begin(), known->second.end());
    now.insert(*known);
  }
  memory.quarantined = std::move(now);
}

// Where the chunks a collection removes go: up to `keep` files to the recycled folder (renamed,
// so nothing is freed or allocated again), the others deleted. Only regular files are counted,
// moved or deleted there; anything else is reported and left.
class chunk_disposal {
 public:
  chunk_disposal(const std::string& run_dir, size_t keep, gc_result& out)
      : run_dir_(run_dir), folder_(chunk_file::recycled_root(run_dir)), keep_(keep) {
    struct stat st {};
    if (::lstat(folder_.c_str(), &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
      // A link there would carry the recycled files elsewhere; it is moved aside before the
      // first file is recycled, and nothing is listed through it.
      out.foreign.push_back(folder_.string() + " is not a directory");
      return;
    }
    made_folder_ = true;
    std::error_code ec;
    std::vector<fs::path> held;
    for (const fs::directory_entry& f : fs::directory_iterator(folder_, ec)) {
      uint64_t bytes = 0;
      if (is_regular_file(f.path(), &bytes))
        held.emplace_back(f.path());
      else
        out.foreign.push_back(f.path().string() + " is not a regular file");
    }
    // More than may be kept (a smaller limit, an offline collection): the excess goes now.
    for (size_t i = keep_; i < held.size(); ++i) {
      uint64_t bytes = 0;
      if (is_regular_file(held[i], &bytes) && ::unlink(held[i].c_str()) == 0) freed_ += bytes;
    }
    held_ = std::min(held.size(), keep_);
  }

  // Removes the chunk `key` at `path` from the store (nothing when it is not there).
  void remove(const fs::path& path, const chunk_key& key, uint64_t bytes, gc_result& out) {
    if (held_ < keep_) {
      if (!made_folder_) {
        for (const std::string& moved : make_real_directory(run_dir_, folder_, false))
          out.foreign.push_back(folder_.string() + " was not a directory; moved it to " + moved);
        made_folder_ = true;
      }
      if (::rename(path.c_str(), (folder_ / key.hex()).c_str()) == 0) {
        ++held_;
        ++out.chunks_recycled;
        ++out.chunks_removed;
        return;
      }
      if (errno == ENOENT) return;
      if (errno != EISDIR && errno != ENOTEMPTY && errno != EEXIST)
        io::fail_errno(path, "moving an unreferenced chunk to the recycled files", errno);
      // Something else sits under that name among the recycled files: delete the chunk.
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
  std::string run_dir_;
  fs::path folder_;
  size_t keep_;
  size_t held_ = 0;
  uint64_t freed_ = 0;
  bool made_folder_ = false;
};

// Removes every chunk file outside `referenced`, and temporary files older than temp_grace.
// Only regular files in real folders are touched; anything else is reported and left.
void sweep_chunk_folders(const std::string& run_dir, const std::set<chunk_key>& referenced,
                         std::chrono::seconds temp_grace, chunk_disposal& disposal,
                         gc_result& out) {
  const fs::path root = chunk_file::root(run_dir);
  if (!is_real_directory(root)) {
    std::error_code ec;
    if (fs::symlink_status(root, ec).type() != fs::file_type::not_found)
      out.foreign.push_back(root.string() + " is not a directory");
    return;
  }
  const auto now = fs::file_time_type::clock::now();
  std::error_code ec;
  for (const fs::directory_entry& folder : fs::directory_iterator(root, ec)) {
    if (!is_real_directory(folder.path())) {
      out.foreign.push_back(folder.path().string() + " is not a directory");
      continue;
    }
    std::error_code inner;
    for (const fs::directory_entry& f : fs::directory_iterator(folder.path(), inner)) {
      uint64_t bytes = 0;
      if (!is_regular_file(f.path(), &bytes)) {
        out.foreign.push_back(f.path().string() + " is not a regular file");
        continue;
      }
      const std::string name = f.path().filename().string();
      if (const auto key = chunk_key::from_hex(name)) {
        if (referenced.contains(*key)) {
          ++out.chunks_kept;
          continue;
        }
        disposal.remove(f.path(), *key, bytes, out);
      } else if (name.find(".tmp.") != std::string::npos) {
        std::error_code time_ec;
        const auto written = f.last_write_time(time_ec);
        if (time_ec || now - written < temp_grace) continue;
        if (::unlink(f.path().c_str()) == 0) ++out.temp_files_removed;
      } else {
        out.foreign.push_back(f.path().string() + " is not a chunk");
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
    uint64_t bytes = 0;
    if (is_regular_file(path, &bytes)) {
      disposal.remove(path, key, bytes, out);
    } else {
      struct stat st {};
      if (::lstat(path.c_str(), &st) == 0)
        out.foreign.push_back(path.string() + " is not a regular file");
    }
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
  // Every committed manifest's references, before retention removes any of them. One that
  // cannot be read is a damaged checkpoint: it goes to the quarantine, and nothing is deleted
  // this time (what it referenced is unknown).
  const std::vector<int64_t> before = list_committed(run_dir);
  std::string unreadable;
  for (int64_t step : before) {
    if (memory.references.contains(step)) continue;
    try {
      memory.remember(read_manifest(run_dir, step));
    } catch (const checkpoint_error& e) {
      if (!is_damage(e.kind())) throw;
      const std::string where = quarantine_checkpoint(run_dir, step, "unreadable-manifest");
      unreadable +=
          (unreadable.empty() ? "" : "; ") + std::string(e.what()) + " (moved to " + where + ")";
    }
  }
  if (!unreadable.empty())
    io::fail(error_kind::corrupt, run_paths::checkpoints(run_dir),
             "garbage collection met unreadable manifests and deleted nothing: " + unreadable +
                 ". Those checkpoints are quarantined (troupe ckpt ls lists them); the next "
                 "collection goes on without them.");
  const std::optional<int64_t> verified = newest_verified(run_dir, before, *latest_step, memory);
  out.removed_steps = prune_by_policy(run_dir, policy, *latest_step, verified);

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
  keep_quarantined(run_dir, memory, referenced);
  const bool sweep = memory.sweep_every == 0 || memory.collections % memory.sweep_every == 0;
  ++memory.collections;
  chunk_disposal disposal(run_dir, memory.recycle_up_to, out);
  if (sweep)
    sweep_chunk_folders(run_dir, referenced, temp_grace, disposal, out);
  else
    remove_released_chunks(run_dir, released, referenced, disposal, out);
  out.bytes_freed += disposal.freed();
  return out;
}

std::optional<run_lock> run_lock::try_acquire(const std::string& run_dir) {
  io::make_dirs_durable(run_paths::checkpoints(run_dir));
  const fs::path path = run_paths::run_lock(run_dir);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd < 0) io::fail_errno(path, "creating the lock file", errno);
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return std::nullopt;
  }
  return run_lock(fd);
}

namespace {
int open_chunk_lock(const std::string& run_dir) {
  io::make_dirs_durable(run_paths::checkpoints(run_dir));
  const fs::path path = run_paths::chunk_store_lock(run_dir);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
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
    io::fail_errno(run_paths::chunk_store_lock(run_dir), "locking", err);
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
  const fs::path root = run_paths::checkpoints(run_dir);
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
    out.push_back({e.path(), e.what(), e.kind()});
    return out;
  }
  if (m.format_version < 2) {
    try {
      (void)load_full_state(run_dir, m);
    } catch (const checkpoint_error& e) {
      out.push_back({e.path(), e.what(), e.kind()});
    }
    return out;
  }
  // Each distinct chunk once, with the tensors that hold it named in the message (a packed
  // chunk holds dozens: the first few, and how many more).
  struct use {
    chunk_extent extent{0, SIZE_MAX};  // what every piece that holds it allows
    std::set<std::string> holders;
  };
  std::map<chunk_key, use> chunks;
  for (const saved_piece& p : m.pieces) {
    for (size_t i = 0; i < p.chunks.size(); ++i) {
      const chunk_extent e = extent_of(p, i, m.chunk_floats);
      auto& entry = chunks[p.chunks[i]];
      entry.extent.min_floats = std::max(entry.extent.min_floats, e.min_floats);
      entry.extent.max_floats = std::min(entry.extent.max_floats, e.max_floats);
      entry.holders.insert(m.array_name(p.array) + " of " + p.tensor);
    }
  }
  const auto named = [](const std::set<std::string>& holders) {
    constexpr size_t shown = 3;
    std::string text;
    size_t n = 0;
    for (const std::string& h : holders) {
      if (n++ == shown) break;
      text += (text.empty() ? "" : ", ") + h;
    }
    if (holders.size() > shown)
      text += " and " + std::to_string(holders.size() - shown) + " more tensors";
    return text;
  };
  for (const auto& [key, info] : chunks) {
    try {
      (void)chunk_file::read_range(
          run_dir, key, info.extent.min_floats, info.extent.max_floats,
          "holds " + named(info.holders) + " of step " + std::to_string(step));
    } catch (const checkpoint_error& e) {
      out.push_back({e.path(), e.what(), e.kind()});
    }
  }
  return out;
}

}  // namespace troupe::ckpt
