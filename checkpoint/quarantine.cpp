// Damage found in a run directory is moved out of the way, never deleted and never followed.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/format.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::ckpt {

namespace fs = std::filesystem;

namespace {

// lstat's verdict on a path: nothing there, a real directory, or something else.
enum class found : uint8_t { nothing, directory, other };

found what_is(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return found::nothing;
    io::fail_errno(path, "lstat", errno);
  }
  return S_ISDIR(st.st_mode) ? found::directory : found::other;
}

// A file name of only [A-Za-z0-9._-]: reasons become parts of names.
std::string slug(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, 48)) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.';
    out += plain ? c : '-';
  }
  return out.empty() ? "damaged" : out;
}

// Moves a non-directory found where a folder belongs. The folders that hold what is moved
// aside cannot take it into themselves: those are renamed beside where they were.
std::string out_of_the_way(const std::string& run_dir, const fs::path& folder) {
  if (folder != run_paths::damaged(run_dir) && folder != run_paths::damaged_objects(run_dir))
    return move_aside(run_dir, folder, "not-a-directory");
  for (int n = 0; n < 1000; ++n) {
    const fs::path to = folder.string() + ".not-a-directory." + std::to_string(::getpid()) + "." +
                        std::to_string(n);
    if (::renameat2(AT_FDCWD, folder.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0)
      return to.string();
    if (errno != EEXIST) io::fail_errno(folder, "moving it out of the way", errno);
  }
  io::fail(error_kind::io, folder, "found no free name to move it aside");
}

}  // namespace

bool is_damage(error_kind kind) {
  switch (kind) {
    case error_kind::missing:
    case error_kind::truncated:
    case error_kind::corrupt:
    case error_kind::bad_magic:
    case error_kind::mismatch:
      return true;
    default:
      return false;
  }
}

std::string damage_reason(error_kind kind) {
  switch (kind) {
    case error_kind::missing:
      return "missing-file";
    case error_kind::truncated:
      return "truncated";
    case error_kind::bad_magic:
      return "not-a-checkpoint-file";
    case error_kind::mismatch:
      return "mismatch";
    default:
      return "corrupt";
  }
}

bool any_damage(const std::vector<problem>& problems) {
  return std::any_of(problems.begin(), problems.end(),
                     [](const problem& p) { return is_damage(p.kind); });
}

std::string move_aside(const std::string& run_dir, const fs::path& path, std::string_view reason) {
  static std::atomic<unsigned> counter{0};
  const fs::path folder = run_paths::damaged_objects(run_dir);
  (void)make_real_directory(run_dir, folder, false);
  const std::string stem =
      slug(path.filename().string()) + "." + slug(reason) + "." + std::to_string(::getpid()) + ".";
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const fs::path to = folder / (stem + std::to_string(counter.fetch_add(1)));
    // RENAME_NOREPLACE: two processes moving things aside never overwrite each other's.
    if (::renameat2(AT_FDCWD, path.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0)
      return to.string();
    if (errno == EEXIST) continue;
    io::fail_errno(path, "moving it out of the way to " + to.string(), errno);
  }
  io::fail(error_kind::io, path, "found no free name to move it aside under " + folder.string());
}

std::vector<std::string> make_real_directory(const std::string& run_dir, const fs::path& dir,
                                             bool durable) {
  const fs::path root = run_paths::checkpoints(run_dir);
  const fs::path relative = dir.lexically_relative(root);
  if (relative.empty() || *relative.begin() == "..")
    io::fail(error_kind::invalid_argument, dir, "is not inside " + root.string());
  std::vector<std::string> moved;
  fs::path at = root;
  std::vector<fs::path> steps = {root};
  for (const fs::path& part : relative)
    if (part != ".") steps.push_back(at /= part);
  for (const fs::path& folder : steps) {
    found f = what_is(folder);
    if (f == found::other) {
      if (folder == root)
        io::fail(error_kind::io, folder,
                 "is not a directory (a symbolic link or a file); troupe does not follow links "
                 "inside a run directory. Put the checkpoints directory itself there.");
      moved.push_back(out_of_the_way(run_dir, folder));
      f = found::nothing;
    }
    if (f == found::directory) continue;
    if (::mkdir(folder.c_str(), 0755) != 0) {
      if (errno != EEXIST) io::fail_errno(folder, "creating the directory", errno);
      if (what_is(folder) != found::directory)  // another writer raced in with something else
        io::fail(error_kind::io, folder, "appeared as something other than a directory");
    } else if (durable) {
      io::fsync_dir(folder.parent_path());
    }
  }
  return moved;
}

std::string quarantine_checkpoint(const std::string& run_dir, int64_t step,
                                  std::string_view reason) {
  const fs::path from = format::step_dir(run_dir, step);
  const fs::path folder = run_paths::damaged(run_dir);
  (void)make_real_directory(run_dir, folder, true);
  const std::string base = format::step_dir_name(step) + "-" + slug(reason);
  for (int n = 1; n < 10000; ++n) {
    const fs::path to = folder / (n == 1 ? base : base + "-" + std::to_string(n));
    if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
      io::fsync_dir(folder);
      io::fsync_dir(run_paths::checkpoints(run_dir));
      return to.string();
    }
    if (errno == EEXIST) continue;
    io::fail_errno(from, "moving the damaged checkpoint to " + to.string(), errno);
  }
  io::fail(error_kind::io, from, "found no free name in " + folder.string());
}

std::vector<quarantined_checkpoint> list_quarantined(const std::string& run_dir) {
  std::vector<quarantined_checkpoint> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(run_paths::damaged(run_dir), ec)) {
    const std::string name = e.path().filename().string();
    // step-NNNNNNNN-REASON: the step directory's name, then what was wrong.
    const size_t dash = name.find('-', 5);
    if (!name.starts_with("step-") || dash == std::string::npos) continue;
    const auto step = format::parse_step_dir_name(name.substr(0, dash));
    if (!step) continue;
    out.push_back({*step, name.substr(dash + 1), e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.step != b.step ? a.step < b.step : a.path < b.path;
  });
  return out;
}

void point_latest_at(const std::string& run_dir, std::optional<int64_t> step,
                     const std::function<void()>& before_rename) {
  const fs::path latest = run_paths::latest(run_dir);
  if (what_is(latest) == found::directory) (void)move_aside(run_dir, latest, "not-a-file");
  if (step) {
    io::write_file_atomically(latest, format::step_dir_name(*step) + "\n", before_rename);
    return;
  }
  if (::unlink(latest.c_str()) != 0 && errno != ENOENT) io::fail_errno(latest, "removing", errno);
  io::fsync_dir(latest.parent_path());
}

}  // namespace troupe::ckpt
