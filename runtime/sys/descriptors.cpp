#include "runtime/sys/descriptors.hpp"

#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>

namespace troupe::sys {

namespace {

long soft_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 1L << 20;
  return static_cast<long>(r.rlim_cur);
}

}  // namespace

descriptor_limits read_descriptor_limits() {
  constexpr long ceiling = 1L << 20;
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return {ceiling, ceiling};
  const auto clamp = [](rlim_t v) {
    return v == RLIM_INFINITY || v > static_cast<rlim_t>(ceiling) ? ceiling : static_cast<long>(v);
  };
  return {clamp(r.rlim_cur), clamp(r.rlim_max)};
}

long raise_descriptor_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return soft_limit();
  constexpr rlim_t ceiling = rlim_t{1} << 20;
  const rlim_t target = std::min(r.rlim_max, ceiling);
  if (r.rlim_cur != RLIM_INFINITY && r.rlim_cur < target) {
    r.rlim_cur = target;
    ::setrlimit(RLIMIT_NOFILE, &r);  // best effort: the old limit stays on failure
  }
  return soft_limit();
}

long descriptor_reserve() { return std::min<long>(256, soft_limit() / 4); }

bool in_descriptor_reserve(int fd) {
  const long limit = soft_limit();
  return fd >= limit - std::min<long>(256, limit / 4);
}

void set_close_on_exec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0 && !(flags & FD_CLOEXEC)) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

}  // namespace troupe::sys
