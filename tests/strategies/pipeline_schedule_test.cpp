// Pipeline schedules: every program is a correct pipeline, 1F1B bounds live activations
// by p - s, the simulated bubble matches (p-1)/(m+p-1), and the trace is valid JSON.

#include "strategies/pipeline_schedule.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace troupe::strategies {
namespace {

TEST(PipelineScheduleTest, EveryScheduleIsACorrectPipeline) {
  for (auto kind : {pipe_schedule_kind::gpipe, pipe_schedule_kind::one_f_one_b})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m) {
        auto s = make_schedule(kind, p, m);
        ASSERT_EQ(s.size(), static_cast<size_t>(p));
        EXPECT_EQ(check_schedule(s), "") << "p=" << p << " m=" << m;
      }
}

TEST(PipelineScheduleTest, CheckerCatchesBrokenPrograms) {
  auto s = make_schedule(pipe_schedule_kind::gpipe, 2, 2);
  auto swapped = s;
  std::swap(swapped[1][0], swapped[1][3]);  // B before F on stage 1
  EXPECT_NE(check_schedule(swapped), "");
  auto missing = s;
  missing[0].pop_back();
  EXPECT_NE(check_schedule(missing), "");
  // Stage 0 waits for B0 from stage 1 before stage 1 can get F1 from it: a cycle.
  std::vector<std::vector<pipe_op>> cyclic = {{{pipe_pass::forward, 0},
                                               {pipe_pass::backward, 0},
                                               {pipe_pass::forward, 1},
                                               {pipe_pass::backward, 1}},
                                              {{pipe_pass::forward, 1},
                                               {pipe_pass::forward, 0},
                                               {pipe_pass::backward, 0},
                                               {pipe_pass::backward, 1}}};
  EXPECT_NE(check_schedule(cyclic).find("deadlock"), std::string::npos);
}

TEST(PipelineScheduleTest, OneFOneBBoundsLiveActivations) {
  const int p = 4, m = 12;
  auto gpipe = peak_live_activations(make_schedule(pipe_schedule_kind::gpipe, p, m));
  auto ofob = peak_live_activations(make_schedule(pipe_schedule_kind::one_f_one_b, p, m));
  for (int s = 0; s < p; ++s) {
    EXPECT_EQ(gpipe[static_cast<size_t>(s)], m);
    EXPECT_EQ(ofob[static_cast<size_t>(s)], p - s);
  }
}

TEST(PipelineScheduleTest, SimulatedBubbleMatchesTheFormula) {
  for (auto kind : {pipe_schedule_kind::gpipe, pipe_schedule_kind::one_f_one_b})
    for (int p : {2, 3, 4})
      for (int m : {1, 4, 8, 16}) {
        auto timeline = simulate_schedule(make_schedule(kind, p, m), 1.0, 2.0);
        EXPECT_NEAR(bubble_fraction(timeline, p), ideal_bubble(p, m), 1e-9)
            << "p=" << p << " m=" << m;
      }
  EXPECT_DOUBLE_EQ(ideal_bubble(1, 5), 0.0);
  EXPECT_DOUBLE_EQ(ideal_bubble(4, 8), 3.0 / 11.0);
}

TEST(PipelineScheduleTest, TraceIsChromeJson) {
  auto timeline =
      simulate_schedule(make_schedule(pipe_schedule_kind::one_f_one_b, 2, 3), 0.001, 0.002);
  auto doc = nlohmann::json::parse(chrome_trace_json(timeline));
  ASSERT_TRUE(doc["traceEvents"].is_array());
  int complete = 0;
  for (const auto& e : doc["traceEvents"])
    if (e["ph"] == "X") ++complete;
  EXPECT_EQ(complete, 2 * 2 * 3);
  EXPECT_THROW(parse_schedule_kind("zigzag"), std::invalid_argument);
  EXPECT_EQ(parse_schedule_kind("1f1b"), pipe_schedule_kind::one_f_one_b);
}

}  // namespace
}  // namespace troupe::strategies
