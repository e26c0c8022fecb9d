// TROUPE_LOG_LEVEL sets the initial threshold; a separate binary, because the environment is
// read only once per process.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "monitoring/log.hpp"

namespace troupe::monitoring {
namespace {

TEST(log_env, threshold_comes_from_troupe_log_level) {
  ASSERT_EQ(::setenv("TROUPE_LOG_LEVEL", "error", 1), 0);
  EXPECT_EQ(log_threshold(), level::error);
  EXPECT_FALSE(log_enabled(level::warn));
}

}  // namespace
}  // namespace troupe::monitoring
