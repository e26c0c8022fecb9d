#pragma once
// POSIX file operations with the durability a commit protocol needs (fsync of files and
// of the directories that name them, atomic rename) and errors that say what to do.

#include <cstddef>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace troupe::ckpt::io {

/// Throws checkpoint_error of `kind` about `path`: "checkpoint: PATH: WHAT".
[[noreturn]] void fail(error_kind kind, const std::filesystem::path& path, const std::string& what);

/// Throws an io checkpoint_error for the failed `operation` on `path`, describing errno
/// `err` and hinting at the usual fixes (space, permissions).
[[noreturn]] void fail_errno(const std::filesystem::path& path, std::string_view operation,
                             int err);

/// An owned file descriptor, closed on destruction.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& other) noexcept : fd_(other.release()) {}
  unique_fd& operator=(unique_fd&& other) noexcept;
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd();

  [[nodiscard]] int get() const noexcept { return fd_; }
  int release() noexcept {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

/// Writes all of `data` at the current position, retrying short writes and EINTR.
void write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);

/// fsync of a directory, so that a rename or create inside it survives a power loss.
void fsync_dir(const std::filesystem::path& dir);

/// Creates `dir` and any missing parents, fsyncing each parent whose entries changed.
void make_dirs_durable(const std::filesystem::path& dir);

/// Creates `dir` and any missing parents without fsyncing them: for callers that make the
/// whole file system durable afterwards with sync_file_system.
void make_dirs(const std::filesystem::path& dir);

/// Starts the write-back of `fd`'s dirty pages without waiting for it, so the disk works
/// while the caller prepares the next file; durability still needs a later sync. Failures
/// are ignored here: the later sync reports them.
void start_write_back(int fd) noexcept;

/// syncfs(2) of the file system holding `any_path`: every file's data and every directory
/// entry on it durable in one call, instead of an fsync per file and per directory.
void sync_file_system(const std::filesystem::path& any_path, std::string_view what);

/// A temporary sibling of `final_path`, unique to this process and call, so concurrent
/// writers (e.g. a zombie rank and its replacement) never write into each other's file.
std::filesystem::path temp_path_for(const std::filesystem::path& final_path);

/// Opens a fresh temporary file for writing (O_EXCL); the caller renames it into place.
unique_fd create_temp(const std::filesystem::path& temp_path);

/// fsync + close `fd`, rename `temp_path` to `final_path`, fsync the directory. On
/// failure the temporary file is removed and an io error thrown. `before_rename`, when given,
/// runs right before the rename (after the slow fsync) and may throw to stop it.
void publish(unique_fd fd, const std::filesystem::path& temp_path,
             const std::filesystem::path& final_path,
             const std::function<void()>& before_rename = {});

/// Replaces `final_path` with `content` atomically and durably (temp, fsync, rename,
/// directory fsync): a reader sees the old content or the new, never a mixture.
void write_file_atomically(const std::filesystem::path& final_path, std::string_view content,
                           const std::function<void()>& before_rename = {});

/// The whole file. Throws missing if it does not exist, io on other failures.
std::vector<unsigned char> read_file(const std::filesystem::path& path);

}  // namespace troupe::ckpt::io
