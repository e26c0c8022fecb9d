// Losses that arrive together make one generation (job_params::regroup_window, issue 41): a
// 10 % loss of a 2,000-member job waits the window, then aborts every survivor once with its
// place in the next generation, and training goes on. Without the window each loss opens its
// own generation, and a burst of them used up max_failed_recoveries without a step.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "actors/coordinator/job_logic.hpp"
#include "tests/actors/coordinator/logic_test_support.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

using test_support::all_of;
using test_support::small_config;

bool has_event(const actions& a, const std::string& name) {
  for (const auto& e : all_of<emit_event>(a))
    if (events::kind(e.event) == name) return true;
  return false;
}

// A data-parallel job of `world` ranks with one micro-batch each, driven by hand: every
// member joins, reconfigures and votes when told.
class dp_job {
 public:
  dp_job(int world, std::chrono::milliseconds regroup_window) : now_(logic_time{} + 1000s) {
    auto cfg = small_config(world);
    cfg.batch = world;
    cfg.micro_batch = 1;
    cfg.checkpoint_every = 0;  // commits only: no checkpoint collection to drive
    auto planned = strategies::plan_layout(world, cfg);
    EXPECT_TRUE(strategies::has_plan(planned)) << strategies::reason_of(planned);
    job_params p;
    p.cfg = cfg;
    p.plan = strategies::plan_of(planned);
    p.members = world;
    p.bounds.min_ranks = 1;
    p.bounds.max_ranks = world;
    p.heartbeat_timeout = 2000ms;
    p.regroup_window = regroup_window;
    logic_.emplace(p, now_);
  }

  job_logic& logic() { return *logic_; }
  logic_time now() const { return now_; }
  void advance(std::chrono::milliseconds d) { now_ += d; }

  void form() {
    actions placed;
    for (int32_t m = 0; m < logic_->world(); ++m) {
      hello h;
      h.member = m;
      h.pid = 1000 + m;
      h.host = "test";
      welcome w;
      auto a = logic_->on_member_joined(h, now_, w);
      ASSERT_TRUE(w.error.empty()) << w.error;
      placed.insert(placed.end(), a.begin(), a.end());
    }
    reconfigure_all(all_of<send_reconfigure>(placed));
    ASSERT_EQ(logic_->state(), job_state::training);
  }

  // Each member answers its reconfigure; the last answer starts (or resumes) training.
  actions reconfigure_all(const std::vector<send_reconfigure>& told) {
    actions out;
    for (const auto& r : told) {
      reconfigured done;
      done.generation = r.msg.generation;
      done.member = r.member;
      done.rank = r.msg.rank;
      auto a = logic_->on_reconfigured(done, now_);
      out.insert(out.end(), a.begin(), a.end());
    }
    return out;
  }

  // Every rank of the current generation votes for `step`; the commits that follow.
  std::vector<send_commit> step(int64_t step) {
    actions out;
    for (int32_t r = 0; r < logic_->world(); ++r) {
      step_done v;
      v.generation = logic_->generation();
      v.step = step;
      v.rank = r;
      v.loss_sum = 4.0;
      v.tokens = 1;
      v.compute_s = 0.1;
      auto a = logic_->on_vote(v, now_);
      out.insert(out.end(), a.begin(), a.end());
    }
    return all_of<send_commit>(out);
  }

  actions lose(int32_t member) {
    return logic_->on_member_lost(member, loss_cause::connection, "its connection closed", now_);
  }

 private:
  logic_time now_;
  std::optional<job_logic> logic_;
};

// The reconfigures the aborts carry (abort_generation::then), one per abort, each to its own
// member and for the abort's generation.
std::vector<send_reconfigure> carried(const std::vector<send_abort>& aborts) {
  std::vector<send_reconfigure> out;
  for (const auto& x : aborts) {
    EXPECT_EQ(x.msg.then.size(), 1u) << "member " << x.member;
    if (x.msg.then.size() != 1) continue;
    EXPECT_EQ(x.msg.then.front().member, x.member);
    EXPECT_EQ(x.msg.then.front().generation, x.msg.generation);
    out.push_back(send_reconfigure{x.member, x.msg.then.front()});
  }
  return out;
}

TEST(JobRegroup, TenPercentOfTwoThousandMembersLostTogetherMakeOneGeneration) {
  constexpr int world = 2000, lost = 200, kept = world - lost;
  dp_job job(world, 20ms);
  job.form();
  for (int64_t s = 1; s <= 3; ++s) ASSERT_EQ(job.step(s).size(), size_t{world});
  const uint64_t before = job.logic().generation();

  std::set<int32_t> victims;
  for (int i = 0; i < lost; ++i) victims.insert(job.logic().member_of_rank(i * (world / lost)));
  ASSERT_EQ(victims.size(), size_t{lost});
  int scheduled = 0;
  for (int32_t v : victims) {
    const auto a = job.lose(v);
    EXPECT_TRUE(has_event(a, "rank_lost")) << "member " << v;
    EXPECT_TRUE(all_of<send_abort>(a).empty()) << "an abort before the window closed";
    EXPECT_TRUE(all_of<finish_job>(a).empty());
    const auto regroups = all_of<schedule_regroup>(a);
    if (scheduled == 0) {
      ASSERT_EQ(regroups.size(), 1u) << "the first loss schedules the regroup";
      EXPECT_EQ(regroups.front().after, 20ms);
    }
    scheduled += static_cast<int>(regroups.size());
  }
  EXPECT_EQ(scheduled, 1) << "one regroup for the whole burst";
  EXPECT_EQ(job.logic().generation(), before) << "no generation before the window closed";

  job.advance(20ms);
  const auto a = job.logic().on_regroup(job.now());
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  EXPECT_EQ(job.logic().generation(), before + 1);
  EXPECT_EQ(job.logic().state(), job_state::recovering);
  const auto aborts = all_of<send_abort>(a);
  ASSERT_EQ(aborts.size(), size_t{kept}) << "one abort per live member";
  std::set<int32_t> aborted, ranks;
  for (const auto& x : aborts) {
    aborted.insert(x.member);
    EXPECT_EQ(x.msg.generation, before + 1);
    EXPECT_FALSE(x.msg.final);
    EXPECT_EQ(victims.count(x.member), 0u) << "a lost member was aborted";
  }
  EXPECT_EQ(aborted.size(), size_t{kept});
  const auto places = carried(aborts);
  ASSERT_EQ(places.size(), size_t{kept}) << "each abort carries its member's place";
  for (const auto& r : places) {
    ranks.insert(r.msg.rank);
    EXPECT_EQ(r.msg.world, kept);
    EXPECT_EQ(r.msg.start_step, 3);
  }
  EXPECT_EQ(ranks.size(), size_t{kept});
  EXPECT_EQ(*ranks.begin(), 0);
  EXPECT_EQ(*ranks.rbegin(), kept - 1);
  EXPECT_TRUE(all_of<send_abort>(job.logic().on_regroup(job.now())).empty())
      << "a second regroup with nothing pending does nothing";

  job.advance(50ms);
  const auto resumed = job.reconfigure_all(places);
  EXPECT_TRUE(has_event(resumed, "generation"));
  ASSERT_EQ(job.logic().state(), job_state::training);
  EXPECT_EQ(job.logic().world(), kept);
  EXPECT_EQ(job.step(4).size(), size_t{kept});
  EXPECT_EQ(job.logic().committed(), 4);
}

// What the same burst did before the window: a generation per loss, and the job gave up.
TEST(JobRegroup, TenPercentOfTwoThousandMembersLostOneByOneFailTheJobWithoutAWindow) {
  constexpr int world = 2000, lost = 200;
  dp_job job(world, -1ms);
  job.form();
  ASSERT_EQ(job.step(1).size(), size_t{world});
  std::vector<int32_t> victims;
  for (int i = 0; i < lost; ++i) victims.push_back(job.logic().member_of_rank(i * (world / lost)));
  std::vector<finish_job> finished;
  int losses = 0;
  for (int32_t v : victims) {
    ++losses;
    finished = all_of<finish_job>(job.lose(v));
    if (!finished.empty()) break;
  }
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(losses, 6);
  EXPECT_NE(finished.front().message.find("gave up after 5 recoveries"), std::string::npos)
      << finished.front().message;
}

TEST(JobRegroup, WithoutAWindowALossAbortsAtOnce) {
  dp_job job(8, -1ms);
  job.form();
  job.step(1);
  const uint64_t before = job.logic().generation();
  const auto a = job.lose(job.logic().member_of_rank(3));
  EXPECT_TRUE(all_of<schedule_regroup>(a).empty());
  EXPECT_EQ(all_of<send_abort>(a).size(), 7u);
  EXPECT_EQ(job.logic().generation(), before + 1);
  EXPECT_EQ(job.logic().state(), job_state::recovering);
}

// Each loss handled at once opens a generation that commits nothing: the sixth in a row is
// one more than max_failed_recoveries (5) allows.
TEST(JobRegroup, SixLossesOneByOneExhaustTheRecoveriesWithoutAWindow) {
  for (int losses : {5, 6}) {
    SCOPED_TRACE(std::to_string(losses) + " losses");
    dp_job job(16, -1ms);
    job.form();
    job.step(1);
    actions last;
    for (int32_t m = 0; m < losses; ++m) last = job.lose(m);
    const auto finished = all_of<finish_job>(last);
    if (losses == 5) {
      EXPECT_TRUE(finished.empty()) << "five recoveries are allowed";
      EXPECT_EQ(job.logic().state(), job_state::recovering);
      continue;
    }
    ASSERT_EQ(finished.size(), 1u);
    EXPECT_NE(finished.front().message.find("gave up after 5 recoveries"), std::string::npos)
        << finished.front().message;
    EXPECT_EQ(job.logic().state(), job_state::failed);
  }
}

TEST(JobRegroup, SixLossesTogetherMakeOneGenerationWithAWindow) {
  dp_job job(16, 20ms);
  job.form();
  job.step(1);
  const uint64_t before = job.logic().generation();
  for (int32_t m = 0; m < 6; ++m) {
    const auto a = job.lose(m);
    EXPECT_TRUE(all_of<finish_job>(a).empty());
    EXPECT_TRUE(all_of<send_abort>(a).empty());
  }
  job.advance(20ms);
  const auto a = job.logic().on_regroup(job.now());
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  EXPECT_EQ(job.logic().generation(), before + 1);
  const auto aborts = all_of<send_abort>(a);
  ASSERT_EQ(aborts.size(), 10u);
  EXPECT_NE(aborts.front().msg.reason.find("and 5 more members lost with it"), std::string::npos)
      << aborts.front().msg.reason;
  job.reconfigure_all(carried(aborts));
  ASSERT_EQ(job.logic().state(), job_state::training);
  EXPECT_EQ(job.step(2).size(), 10u);
}

}  // namespace
}  // namespace troupe::actors
