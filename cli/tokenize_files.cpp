// The files of `troupe tokenize`: POSIX calls, and what the user is told when one fails.

#include "cli/tokenize_files.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>

#include "cli/tokenize_common.hpp"

namespace troupe::cli::tokenize {

namespace fs = std::filesystem;

input_file::input_file(const std::string& path, const std::string& what, bool may_be_empty)
    : path_(path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int e = errno;
    throw bad_input(what + " " + path +
                    (e == ENOENT ? " does not exist; give the path of an existing file"
                                 : " cannot be read: " + errno_text(e)));
  }
  if (!S_ISREG(st.st_mode))
    throw bad_input(what + " " + path + " is not a regular file" +
                    (S_ISDIR(st.st_mode) ? " but a directory" : "") + "; give a " + what + " file");
  if (st.st_size == 0 && !may_be_empty)
    throw bad_input(what + " " + path + " is empty; give a file with text in it");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0)
    throw bad_input(what + " " + path + " cannot be opened: " + errno_text(errno) +
                    "; check its permissions");
  size_ = static_cast<uint64_t>(st.st_size);
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

input_file::~input_file() {
  if (fd_ >= 0) ::close(fd_);
}

void input_file::read_at(uint64_t offset, char* into, size_t n) const {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd_, into + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw tool_failure("cannot read " + path_ + " at byte " + std::to_string(offset + done) +
                         ": " + (r < 0 ? errno_text(errno) : "the file became shorter"));
    done += static_cast<size_t>(r);
  }
}

output_file::output_file(std::string path)
    : path_(std::move(path)), temp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw tool_failure("cannot write " + temp_ + ": " + errno_text(errno));
}

output_file::~output_file() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_.c_str());
}

void output_file::write(std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd_, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw tool_failure("cannot write " + temp_ + ": " + errno_text(n < 0 ? errno : EIO));
    bytes.remove_prefix(static_cast<size_t>(n));
    written_ += static_cast<uint64_t>(n);
  }
}

void output_file::finish() {
  if (::fsync(fd_) != 0) throw tool_failure("cannot write " + temp_ + ": " + errno_text(errno));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) throw tool_failure("cannot write " + temp_ + ": " + errno_text(errno));
}

void output_file::commit() {
  if (fd_ >= 0) finish();
  if (::rename(temp_.c_str(), path_.c_str()) != 0)
    throw tool_failure("cannot rename " + temp_ + " to " + path_ + ": " + errno_text(errno));
  committed_ = true;
}

void remove_if_there(const std::string& path) {
  if (::unlink(path.c_str()) != 0 && errno != ENOENT)
    throw tool_failure("cannot remove " + path + ": " + errno_text(errno));
}

void prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (!fs::is_directory(dir))
    throw bad_input("output directory " + dir + " cannot be made" +
                    (ec ? ": " + ec.message() : std::string(" (a file of that name is there)")) +
                    "; give a directory you can write");
  const std::string probe = (fs::path(dir) / (".tokenize.probe." + std::to_string(::getpid())));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    throw bad_input("output directory " + dir + " is not writable (" + errno_text(errno) +
                    "); give a directory you can write");
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace troupe::cli::tokenize
