// POSIX file operations with the durability a commit protocol needs.

#include "checkpoint/durable_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "runtime/sys/printable.hpp"

namespace troupe::ckpt::io {

namespace fs = std::filesystem;

void fail(error_kind kind, const fs::path& path, const std::string& what) {
  // A path found in a run directory may hold any bytes but '/' and NUL.
  throw checkpoint_error(kind, path.string(),
                         "checkpoint: " + sys::printable(path.string()) + ": " + what);
}

void fail_errno(const fs::path& path, std::string_view operation, int err) {
  std::string hint;
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      hint = " Free space on that file system (or prune old checkpoints) and retry.";
      break;
    case EACCES:
    case EPERM:
    case EROFS:
      hint = " Check that the run directory is writable by this user.";
      break;
    case ENOENT:
      hint = " Check that the run directory exists and was not removed while training.";
      break;
    default:
      hint = " Check the file system (dmesg) and retry.";
  }
  fail(error_kind::io, path,
       std::string(operation) + " failed: " + std::strerror(err) + "." + hint);
}

unique_fd& unique_fd::operator=(unique_fd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

unique_fd::~unique_fd() {
  if (fd_ >= 0) ::close(fd_);
}

void write_all(int fd, const void* data, size_t size, const fs::path& path) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "write", errno);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

namespace {

void fsync_fd(int fd, const fs::path& path) {
  while (::fsync(fd) != 0) {
    if (errno != EINTR) fail_errno(path, "fsync", errno);
  }
}

}  // namespace

void fsync_dir(const fs::path& dir) {
  const fs::path target = dir.empty() ? fs::path(".") : dir;
  unique_fd fd(::open(target.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) fail_errno(target, "opening the directory to fsync it", errno);
  fsync_fd(fd.get(), target);
}

void make_dirs_durable(const fs::path& dir) {
  if (dir.empty()) return;
  std::error_code ec;
  if (fs::is_directory(dir, ec)) return;
  make_dirs_durable(dir.parent_path());
  if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    fail_errno(dir, "creating the directory", errno);
  }
  // EEXIST: another rank won the race, which is fine as long as it is a directory.
  if (!fs::is_directory(dir, ec)) {
    fail(error_kind::io, dir, "exists but is not a directory. Move it away and retry.");
  }
  fsync_dir(dir.parent_path());
}

void make_dirs(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail_errno(dir, "creating the directory", ec.value());
}

void start_write_back(int fd) noexcept { (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE); }

void sync_file_system(const fs::path& any_path, std::string_view what) {
  unique_fd fd(::open(any_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0 || ::syncfs(fd.get()) != 0) fail_errno(any_path, what, errno);
}

fs::path temp_path_for(const fs::path& final_path) {
  static std::atomic<unsigned> counter{0};
  fs::path p = final_path;
  p += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  return p;
}

unique_fd create_temp(const fs::path& temp_path) {
  unique_fd fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (fd.get() < 0) fail_errno(temp_path, "creating", errno);
  return fd;
}

void publish(unique_fd fd, const fs::path& temp_path, const fs::path& final_path,
             const std::function<void()>& before_rename) {
  try {
    fsync_fd(fd.get(), temp_path);
    // close() can report a deferred write error (NFS); it must not be ignored.
    if (::close(fd.release()) != 0) fail_errno(temp_path, "close", errno);
    if (before_rename) before_rename();
    if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
      fail_errno(final_path, "renaming the finished temporary file into place", errno);
    }
  } catch (...) {
    ::unlink(temp_path.c_str());
    throw;
  }
  fsync_dir(final_path.parent_path());
}

void write_file_atomically(const fs::path& final_path, std::string_view content,
                           const std::function<void()>& before_rename) {
  const fs::path temp = temp_path_for(final_path);
  unique_fd fd = create_temp(temp);
  try {
    write_all(fd.get(), content.data(), content.size(), temp);
  } catch (...) {
    ::unlink(temp.c_str());
    throw;
  }
  publish(std::move(fd), temp, final_path, before_rename);
}

std::vector<unsigned char> read_file(const fs::path& path) {
  // Never through a link, and a FIFO cannot block the open.
  unique_fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) {
      fail(error_kind::missing, path,
           "does not exist. The checkpoint is incomplete (deleted, or copied without this "
           "file); restore the file or restore from an earlier checkpoint.");
    }
    if (errno == ELOOP) {
      fail(error_kind::corrupt, path,
           "is a symbolic link; troupe does not follow links inside a run directory. Put the "
           "file itself there, or run `troupe ckpt scrub` on the run directory.");
    }
    fail_errno(path, "opening", errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail_errno(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) {
    fail(error_kind::corrupt, path, "is not a regular file. Move it away and retry.");
  }
  std::vector<unsigned char> data(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = ::read(fd.get(), data.data() + got, data.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail_errno(path, "read", errno);
    }
    if (n == 0) break;  // shrank while we read; the size checks of the caller report it
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return data;
}

}  // namespace troupe::ckpt::io
