#include "runtime/sys/small_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace troupe::sys {

std::optional<std::string> read_small_file(const std::string& path, std::string& why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno != ENOENT) why = path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  struct stat st {};
  std::string out;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    why = path + ": not a regular file";
    ::close(fd);
    return std::nullopt;
  }
  char buf[4097];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (out.size() > 4096) break;
  }
  ::close(fd);
  return out;
}

}  // namespace troupe::sys
