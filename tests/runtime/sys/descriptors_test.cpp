// The descriptor budget: the limit raised once at start, the reserve a listener keeps free, and
// close-on-exec for descriptors that libraries make without it.
#include "runtime/sys/descriptors.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace troupe::sys {
namespace {

// Restores the process's descriptor limit when a test ends, however it ends.
class limit_guard {
 public:
  limit_guard() { ::getrlimit(RLIMIT_NOFILE, &saved_); }
  ~limit_guard() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  limit_guard(const limit_guard&) = delete;
  limit_guard& operator=(const limit_guard&) = delete;
  [[nodiscard]] const rlimit& saved() const { return saved_; }

 private:
  rlimit saved_{};
};

bool set_soft(rlim_t soft) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return false;
  r.rlim_cur = soft;
  return ::setrlimit(RLIMIT_NOFILE, &r) == 0;
}

TEST(descriptors, the_soft_limit_is_raised_to_the_hard_limit_bounded_by_2_to_the_20) {
  limit_guard guard;
  if (guard.saved().rlim_max != RLIM_INFINITY && guard.saved().rlim_max < 512)
    GTEST_SKIP() << "hard limit too low to test";
  ASSERT_TRUE(set_soft(256));
  const long now = raise_descriptor_limit();
  const rlim_t hard = guard.saved().rlim_max;
  const long expected =
      hard == RLIM_INFINITY ? (1L << 20) : static_cast<long>(std::min<rlim_t>(hard, 1u << 20));
  EXPECT_EQ(now, expected);
  rlimit r{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  EXPECT_EQ(static_cast<long>(r.rlim_cur), expected);
}

TEST(descriptors, raising_never_lowers_a_limit_already_above_the_ceiling) {
  limit_guard guard;
  rlimit r{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  const rlim_t before = r.rlim_cur;
  raise_descriptor_limit();
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &r), 0);
  EXPECT_GE(r.rlim_cur, before);
}

TEST(descriptors, the_limits_are_read_as_they_are_set) {
  limit_guard guard;
  ASSERT_TRUE(set_soft(64));
  const auto limits = read_descriptor_limits();
  EXPECT_EQ(limits.soft, 64);
  const rlim_t hard = guard.saved().rlim_max;
  EXPECT_EQ(limits.hard,
            hard == RLIM_INFINITY || hard > (rlim_t{1} << 20) ? 1L << 20 : static_cast<long>(hard));
}

TEST(descriptors, the_reserve_is_a_quarter_of_the_limit_at_most_256) {
  limit_guard guard;
  ASSERT_TRUE(set_soft(128));
  EXPECT_EQ(descriptor_reserve(), 32);
  if (guard.saved().rlim_max == RLIM_INFINITY || guard.saved().rlim_max >= 4096) {
    ASSERT_TRUE(set_soft(4096));
    EXPECT_EQ(descriptor_reserve(), 256);
  }
}

TEST(descriptors, a_descriptor_in_the_top_reserve_is_refused) {
  limit_guard guard;
  ASSERT_TRUE(set_soft(128));  // reserve 32: 96 and up are kept free
  EXPECT_FALSE(in_descriptor_reserve(3));
  EXPECT_FALSE(in_descriptor_reserve(95));
  EXPECT_TRUE(in_descriptor_reserve(96));
  EXPECT_TRUE(in_descriptor_reserve(127));
  // With the process's own descriptors filled up to the edge, the next one is refused.
  std::vector<int> filler;
  int fd = -1;
  while ((fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) {
    filler.push_back(fd);
    if (fd >= 96) break;
  }
  ASSERT_GE(fd, 96);
  EXPECT_TRUE(in_descriptor_reserve(fd));
  for (int f : filler) ::close(f);
}

TEST(descriptors, close_on_exec_is_set_and_kept) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);  // a plain pipe: inheritable, like a library's descriptors
  EXPECT_FALSE(::fcntl(fds[0], F_GETFD) & FD_CLOEXEC);
  set_close_on_exec(fds[0]);
  set_close_on_exec(fds[0]);  // idempotent
  EXPECT_TRUE(::fcntl(fds[0], F_GETFD) & FD_CLOEXEC);
  EXPECT_FALSE(::fcntl(fds[1], F_GETFD) & FD_CLOEXEC);
  ::close(fds[0]);
  ::close(fds[1]);
}

}  // namespace
}  // namespace troupe::sys
