// A coordinator that leads a job whose members still run (coordinator takeover,
// job_logic::take_over): agents and members rejoin with what they hold; the new generation
// starts from the newest step any member applied, a member behind it gets the state from a
// peer, and a takeover that cannot gather --min-ranks members ends the job naming why.

#include <gtest/gtest.h>

#include "actors/coordinator/job_logic.hpp"
#include "strategies/planner.hpp"
#include "tests/actors/coordinator/logic_test_support.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

using test_support::all_of;

class takeover_harness {
 public:
  explicit takeover_harness(int min_ranks = 1) : now_(logic_time{} + 1000s) {
    const train_config cfg = test_support::small_config(2);
    auto planned = strategies::plan_layout(cfg.world, cfg);
    plan_ = strategies::plan_of(planned);
    job_params p;
    p.cfg = cfg;
    p.plan = plan_;
    p.members = 2;
    p.nodes = 1;
    p.bounds.min_ranks = min_ranks;
    p.bounds.max_ranks = 2;
    p.heartbeat_timeout = 2000ms;
    p.start_step = 9;
    p.checkpoint_step = 5;
    logic_.emplace(p, now_);
    job_logic::takeover t;
    t.generation = 3;
    t.committed_step = 9;
    t.checkpoint_step = 5;
    t.epoch = 7;
    t.wait = 10s;
    logic_->take_over(t, now_);
  }

  job_logic& logic() { return *logic_; }

  launch_plan agent_rejoins() {
    agent_hello h;
    h.host = "test";
    h.pid = 500;
    h.rejoin = true;
    h.node = 0;
    h.members = {0, 1};
    h.pids = {1000, 1001};
    h.restarts_left = 2;
    launch_plan answer;
    logic_->on_agent_joined(h, answer);
    return answer;
  }

  actions member_rejoins(int32_t member, int64_t held_step, welcome& answer) {
    hello h;
    h.member = member;
    h.pid = 1000 + member;
    h.host = "test";
    h.rejoin = true;
    h.epoch_seen = 5;
    h.newest_generation = 3;
    h.held_generation = 3;
    h.held_rank = member;
    h.held_step = held_step;
    h.held_plan_json = strategies::to_json(plan_);
    return logic_->on_member_joined(h, now_, answer);
  }

  actions report(int32_t member, uint64_t generation, int64_t held_step) {
    state_report r;
    r.generation = generation;
    r.member = member;
    r.held_generation = 3;
    r.held_rank = member;
    r.held_step = held_step;
    return logic_->on_state_report(r, now_);
  }

  void advance(std::chrono::milliseconds d) { now_ += d; }
  logic_time now() const { return now_; }

 private:
  logic_time now_;
  strategies::layout_plan plan_;
  std::optional<job_logic> logic_;
};

TEST(takeover, a_rejoining_agent_keeps_its_node_and_starts_nothing) {
  takeover_harness h;
  const launch_plan answer = h.agent_rejoins();
  EXPECT_TRUE(answer.error.empty()) << answer.error;
  EXPECT_EQ(answer.node, 0);
  EXPECT_TRUE(answer.members.empty());
  EXPECT_EQ(answer.max_restarts, 2);  // the agent's own count goes on
}

TEST(takeover, a_step_one_member_applied_is_completed_on_the_other_from_a_peer) {
  takeover_harness h;
  h.agent_rejoins();
  welcome w0, w1;
  auto first = h.member_rejoins(0, 10, w0);  // it applied step 10
  EXPECT_TRUE(w0.error.empty()) << w0.error;
  EXPECT_TRUE(all_of<send_abort>(first).empty()) << "member 1 is still expected";
  auto second = h.member_rejoins(1, 9, w1);  // its commit of step 10 never came
  EXPECT_TRUE(w1.error.empty()) << w1.error;
  const auto aborts = all_of<send_abort>(second);
  ASSERT_EQ(aborts.size(), 2u);
  const uint64_t g = aborts.front().msg.generation;
  EXPECT_EQ(g, 4u) << "the generation after the newest one the members named";
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  h.report(0, g, 10);
  const auto planned = h.report(1, g, 9);
  const auto reconfigures = all_of<send_reconfigure>(planned);
  ASSERT_EQ(reconfigures.size(), 2u);
  for (const auto& r : reconfigures) {
    EXPECT_EQ(r.msg.generation, g);
    EXPECT_EQ(r.msg.start_step, 10) << "step 10 was applied by a member: it is committed";
    const state_source want = r.member == 0 ? state_source::self : state_source::peer;
    EXPECT_EQ(r.msg.source, want) << "member " << r.member;
  }
  EXPECT_EQ(h.logic().committed(), 10);
}

TEST(takeover, every_rank_back_opens_the_generation_before_the_agents_are) {
  takeover_harness h;
  welcome w;
  EXPECT_TRUE(all_of<send_abort>(h.member_rejoins(0, 9, w)).empty());
  EXPECT_EQ(all_of<send_abort>(h.member_rejoins(1, 9, w)).size(), 2u)
      << "both ranks of the last generation are back; the agent only matters for restarts";
  const launch_plan late = h.agent_rejoins();
  EXPECT_TRUE(late.error.empty()) << "an agent back after the takeover is still taken on";
}

TEST(takeover, a_step_no_member_applied_is_redone) {
  takeover_harness h;
  h.agent_rejoins();
  welcome w;
  h.member_rejoins(0, 9, w);
  const auto aborts = all_of<send_abort>(h.member_rejoins(1, 9, w));
  ASSERT_EQ(aborts.size(), 2u);
  const uint64_t g = aborts.front().msg.generation;
  h.report(0, g, 9);
  const auto reconfigures = all_of<send_reconfigure>(h.report(1, g, 9));
  ASSERT_EQ(reconfigures.size(), 2u);
  for (const auto& r : reconfigures) {
    EXPECT_EQ(r.msg.start_step, 9);
    EXPECT_EQ(r.msg.source, state_source::self);
  }
}

TEST(takeover, at_the_deadline_the_job_goes_on_with_the_members_that_rejoined) {
  takeover_harness h;
  h.agent_rejoins();
  welcome w;
  h.member_rejoins(0, 9, w);
  h.advance(5s);
  EXPECT_TRUE(all_of<send_abort>(h.logic().on_tick(h.now())).empty());
  h.advance(6s);
  const auto aborts = all_of<send_abort>(h.logic().on_tick(h.now()));
  ASSERT_EQ(aborts.size(), 1u);
  EXPECT_EQ(aborts.front().member, 0);
}

TEST(takeover, too_few_members_back_ends_the_job_saying_so) {
  takeover_harness h(2);
  h.agent_rejoins();
  welcome w;
  h.member_rejoins(0, 9, w);
  h.advance(11s);
  const auto ends = all_of<finish_job>(h.logic().on_tick(h.now()));
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends.front().exit_code, 1);
  EXPECT_NE(ends.front().message.find("took over"), std::string::npos) << ends.front().message;
  EXPECT_NE(ends.front().message.find("--min-ranks"), std::string::npos) << ends.front().message;
}

TEST(takeover, a_member_whose_process_ended_is_not_waited_for) {
  takeover_harness h;
  h.agent_rejoins();
  welcome w;
  h.member_rejoins(0, 9, w);
  const auto aborts =
      all_of<send_abort>(h.logic().on_worker_exited(worker_exited{1, 1001, 0, 9}, h.now()));
  ASSERT_EQ(aborts.size(), 1u) << "the takeover goes on at once without member 1";
}

}  // namespace
}  // namespace troupe::actors
