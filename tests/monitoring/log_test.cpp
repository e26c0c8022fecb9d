// The logger's line format, level parsing and threshold.
#include "monitoring/log.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <regex>

namespace troupe::monitoring {
namespace {

TEST(log, prefix_carries_only_the_fields_that_are_set) {
  log_context coordinator{.role = "coordinator", .rank = -1, .generation = 1, .step = 12};
  EXPECT_EQ(format_log_line(level::info, coordinator, "training"),
            "[troupe coordinator gen=1 step=12] training\n");

  log_context worker{.role = "worker", .rank = 3, .generation = 0, .step = -1};
  EXPECT_EQ(format_log_line(level::warn, worker, "slow peer"),
            "[troupe worker rank=3] warn: slow peer\n");

  EXPECT_EQ(format_log_line(level::error, {}, "boom\n"), "[troupe] error: boom\n");
  EXPECT_EQ(
      format_log_line(level::debug, {.role = "agent", .rank = 0, .generation = 4, .step = 0}, "x"),
      "[troupe agent rank=0 gen=4 step=0] debug: x\n");
}

TEST(log, a_line_carries_no_control_character_and_only_valid_utf8) {
  EXPECT_EQ(format_log_line(level::warn, {}, "gone: \xff\x1b[2J\nnext"),
            "[troupe] warn: gone: \\xff\\x1b[2J\\x0anext\n");
}

TEST(log, levels_parse_case_insensitively) {
  EXPECT_EQ(parse_level("DEBUG"), level::debug);
  EXPECT_EQ(parse_level("info"), level::info);
  EXPECT_EQ(parse_level("Warn"), level::warn);
  EXPECT_EQ(parse_level("warning"), level::warn);
  EXPECT_EQ(parse_level("error"), level::error);
  EXPECT_EQ(parse_level("loud"), std::nullopt);
  EXPECT_EQ(level_name(level::warn), "warn");
}

TEST(log, threshold_filters_lower_levels) {
  const level before = log_threshold();
  set_log_threshold(level::warn);
  EXPECT_FALSE(log_enabled(level::debug));
  EXPECT_FALSE(log_enabled(level::info));
  EXPECT_TRUE(log_enabled(level::warn));
  EXPECT_TRUE(log_enabled(level::error));

  ::testing::internal::CaptureStderr();
  log(level::info, {.role = "worker"}, "hidden");
  log(level::error, {.role = "worker"}, "shown");
  const std::string captured = ::testing::internal::GetCapturedStderr();
  // A UTC timestamp with milliseconds, then the line.
  EXPECT_TRUE(std::regex_match(captured, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z )"
                                                    R"(\[troupe worker\] error: shown\n)")))
      << captured;
  set_log_threshold(before);
}

TEST(log, timestamps_are_utc_iso8601_with_milliseconds) {
  using namespace std::chrono;
  // 2026-12-06 13:25:01.042 UTC
  const sys_time<milliseconds> at =
      sys_days{year{2026} / 12 / 6} + hours{13} + minutes{25} + seconds{1} + milliseconds{42};
  EXPECT_EQ(utc_timestamp(at), "2026-12-06T13:25:01.042Z");
}

}  // namespace
}  // namespace troupe::monitoring
