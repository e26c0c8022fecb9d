// The job supervisor's state machine as a pure function of events and time: forming, votes
// and commits, failures in every state (including during a recovery), re-planning, where
// each rank's state comes from, heartbeats, growth and spares. No actors, no sockets, no
// sleeping: the clock is an argument.

#include "actors/coordinator/job_logic.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "runtime/comm/communicator.hpp"
#include "runtime/trainer.hpp"
#include "tests/actors/coordinator/logic_test_support.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

using test_support::all_of;
using test_support::small_config;

std::vector<std::string> event_names(const actions& a) {
  std::vector<std::string> out;
  for (const auto& e : all_of<emit_event>(a)) out.push_back(events::kind(e.event));
  return out;
}

bool has_event(const actions& a, const std::string& name) {
  auto names = event_names(a);
  return std::find(names.begin(), names.end(), name) != names.end();
}

strategies::layout_plan plan_for(const train_config& cfg, int world) {
  auto planned = strategies::plan_layout(world, cfg);
  EXPECT_TRUE(strategies::has_plan(planned)) << strategies::reason_of(planned);
  return strategies::plan_of(planned);
}

// Whether the job under test plans a loss in training without state reports (the plan goes
// out with the aborts); every test runs both ways (JobLogicTest's parameter).
bool plan_with_abort_mode = true;

// A job driven through its events, with a clock the test moves.
class logic_harness {
 public:
  logic_harness(train_config cfg, int spares = 0, int max_ranks = 0, int min_ranks = 1,
                std::string straggler_policy = "warn",
                const std::function<void(job_params&)>& tweak = {})
      : cfg_(std::move(cfg)), now_(logic_time{} + 1000s) {
    job_params p;
    p.cfg = cfg_;
    p.straggler_policy = std::move(straggler_policy);
    p.plan = plan_for(cfg_, cfg_.world);
    p.members = cfg_.world + spares;
    p.bounds.min_ranks = min_ranks;
    p.bounds.max_ranks = max_ranks > 0 ? max_ranks : cfg_.world;
    p.heartbeat_timeout = 2000ms;
    p.plan_with_abort = plan_with_abort_mode;
    if (tweak) tweak(p);
    logic_.emplace(p, now_);
  }

  job_logic& logic() { return *logic_; }
  logic_time now() const { return now_; }
  /// What the members joining from now on say of their transport and host (hello).
  std::string transport;
  void advance(std::chrono::milliseconds d) { now_ += d; }

  actions join(int32_t member, welcome* answer = nullptr, int32_t node = 0) {
    welcome w;
    hello h;
    h.member = member;
    h.node = node;
    h.pid = 1000 + member;
    h.host = "test";
    h.transport = transport;
    auto a = logic_->on_member_joined(h, now_, w);
    if (answer) *answer = w;
    remember(a);
    return a;
  }

  // A rank's vote arrives now; a recovery it opens (a grow, a rebalance) is remembered.
  actions vote(const step_done& v) {
    auto a = logic_->on_vote(v, now_);
    remember(a);
    return a;
  }

  // A member is lost now; what its recovery sends is remembered.
  actions lose(int32_t member, loss_cause cause, const std::string& why) {
    auto a = logic_->on_member_lost(member, cause, why, now_);
    remember(a);
    return a;
  }

  // An agent reports a worker's exit now; what follows from it is remembered.
  actions exited(const worker_exited& w) {
    auto a = logic_->on_worker_exited(w, now_);
    remember(a);
    return a;
  }

  // The logic's clock fires (deadlines), its reconfigures remembered like any others.
  actions tick() {
    auto a = logic_->on_tick(now_);
    remember(a);
    return a;
  }

  // Everyone reconfigured: answers each reconfigure sent so far.
  actions settle_reconfigure() {
    actions out;
    auto pending = reconfigures_;
    reconfigures_.clear();
    for (const auto& r : pending) {
      reconfigured done;
      done.generation = r.msg.generation;
      done.member = r.member;
      done.rank = r.msg.rank;
      auto a = logic_->on_reconfigured(done, now_);
      remember(a);
      out.insert(out.end(), a.begin(), a.end());
    }
    return out;
  }

  actions form() {
    actions out;
    for (int m = 0; m < logic_->world() + spares_hint(); ++m) {
      auto a = join(m);
      out.insert(out.end(), a.begin(), a.end());
    }
    auto a = settle_reconfigure();
    out.insert(out.end(), a.begin(), a.end());
    return out;
  }

  // Every placed rank votes for `step`.
  actions step(int64_t step) {
    actions out;
    for (int r = 0; r < logic_->world(); ++r) {
      step_done v;
      v.generation = logic_->generation();
      v.step = step;
      v.rank = r;
      v.loss_sum = 4.0;
      v.tokens = 2;
      v.compute_s = 0.1;
      auto a = logic_->on_vote(v, now_);
      remember(a);
      out.insert(out.end(), a.begin(), a.end());
    }
    return out;
  }

  // Every live member reports what its engine holds now. When the plan went out with the
  // aborts, the members report nothing: the reconfigures the aborts carried come back as
  // this round's, and reports sent anyway (a duplicate, a late one) change nothing.
  actions report_all(int64_t held_step) {
    actions out;
    if (!carried_.empty()) {
      for (const auto& m : logic_->members()) {
        if (!m.live) continue;
        state_report r;
        r.generation = logic_->generation();
        r.member = m.id;
        r.held_step = held_step;
        const auto ignored = logic_->on_state_report(r, now_);
        EXPECT_TRUE(all_of<send_reconfigure>(ignored).empty() &&
                    all_of<send_abort>(ignored).empty())
            << "a report after the plan went out with the aborts re-planned";
      }
      out.insert(out.end(), carried_.begin(), carried_.end());
      carried_.clear();
      return out;
    }
    for (const auto& m : logic_->members()) {
      if (!m.live) continue;
      state_report r;
      r.generation = logic_->generation();
      r.member = m.id;
      if (m.rank >= 0 || m.held_rank >= 0) {
        r.held_generation = logic_->generation() - 1;
        r.held_rank = held_rank_of(m.id);
        r.held_step = r.held_rank >= 0 ? held_step : -1;
      }
      auto a = logic_->on_state_report(r, now_);
      remember(a);
      out.insert(out.end(), a.begin(), a.end());
    }
    return out;
  }

  const std::vector<send_reconfigure>& reconfigures() const { return reconfigures_; }
  void set_spares(int s) { spares_ = s; }
  // The rank each member had in the last generation that placed it.
  int32_t held_rank_of(int32_t member) const {
    auto it = placed_.find(member);
    return it == placed_.end() ? -1 : it->second;
  }

 private:
  int spares_hint() const { return spares_; }
  void remember(const actions& a) {
    for (const auto& r : all_of<send_reconfigure>(a)) {
      reconfigures_.push_back(r);
      placed_[r.member] = r.msg.rank;
    }
    const auto aborts = all_of<send_abort>(a);
    if (!aborts.empty()) {
      // A new generation: what the members were told for an older one is void.
      carried_.clear();
      std::erase_if(reconfigures_, [&](const send_reconfigure& r) {
        return r.msg.generation < aborts.front().msg.generation;
      });
    }
    for (const auto& x : aborts) {
      if (x.msg.then.empty()) continue;
      EXPECT_EQ(x.msg.then.size(), 1u);
      EXPECT_EQ(x.msg.then.front().generation, x.msg.generation);
      EXPECT_EQ(x.msg.then.front().member, x.member);
      const send_reconfigure r{x.member, x.msg.then.front()};
      carried_.push_back(r);
      reconfigures_.push_back(r);
      placed_[r.member] = r.msg.rank;
    }
  }

  train_config cfg_;
  logic_time now_;
  std::optional<job_logic> logic_;
  std::vector<send_reconfigure> reconfigures_;
  std::map<int32_t, int32_t> placed_;
  std::vector<send_reconfigure> carried_;  // carried by the last aborts, not yet reported for
  int spares_ = 0;
};

// Runs each test with the plan sent with the aborts (where the logic may) and with the report
// round only.
class JobLogicTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { plan_with_abort_mode = GetParam(); }
};

TEST_P(JobLogicTest, FormsTheFirstGenerationWhenEveryMemberJoined) {
  logic_harness h(small_config(2));
  EXPECT_EQ(h.logic().state(), job_state::forming);
  EXPECT_TRUE(all_of<send_reconfigure>(h.join(0)).empty());
  auto a = h.join(1);
  auto rc = all_of<send_reconfigure>(a);
  ASSERT_EQ(rc.size(), 2u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.generation, 1u);
    EXPECT_EQ(r.msg.source, state_source::init);
    EXPECT_EQ(r.msg.start_step, 0);
    EXPECT_EQ(r.msg.world, 2);
  }
  EXPECT_NE(rc[0].msg.rank, rc[1].msg.rank);
  auto done = h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_TRUE(has_event(done, "training_started"));
  EXPECT_TRUE(has_event(done, "generation"));
}

TEST_P(JobLogicTest, RefusesDuplicatesAndOtherProtocols) {
  logic_harness h(small_config(2));
  welcome w;
  h.join(0, &w);
  EXPECT_TRUE(w.error.empty());
  h.join(0, &w);
  EXPECT_NE(w.error.find("already joined"), std::string::npos);
  hello old;
  old.protocol = protocol_version + 1;
  old.member = 1;
  welcome w2;
  h.logic().on_member_joined(old, h.now(), w2);
  EXPECT_NE(w2.error.find("protocol"), std::string::npos);
}

TEST_P(JobLogicTest, CommitsOnlyWhenEveryRankVotedAndDropsStaleVotes) {
  logic_harness h(small_config(2));
  h.form();
  step_done v;
  v.generation = 1;
  v.step = 1;
  v.rank = 0;
  v.tokens = 2;
  v.loss_sum = 2;
  EXPECT_TRUE(all_of<send_commit>(h.vote(v)).empty());
  step_done old = v;
  old.generation = 7;
  old.rank = 1;
  auto stale = h.logic().on_vote(old, h.now());
  EXPECT_TRUE(all_of<send_commit>(stale).empty());
  EXPECT_TRUE(has_event(stale, "stale_message"));
  EXPECT_EQ(h.logic().stale_messages(), 1u);
  v.rank = 1;
  auto a = h.vote(v);
  auto commits = all_of<send_commit>(a);
  ASSERT_EQ(commits.size(), 2u);
  EXPECT_EQ(commits[0].msg.step, 1);
  EXPECT_EQ(h.logic().committed(), 1);
  EXPECT_TRUE(has_event(a, "step"));
}

// Issue 35: the live goodput and MFU read 0 until the next goodput event (a generation change,
// the end). Each step carries them so far: what a goodput event at its commit would say.
TEST_P(JobLogicTest, EachStepCarriesTheGoodputAndMfuSoFar) {
  logic_harness h(small_config(2), 0, 0, 1, "warn", [](job_params& p) {
    p.flops_per_token = 1e6;
    p.peak_flops = 1e9;
  });
  h.form();
  for (int64_t s = 1; s <= 3; ++s) {
    h.advance(1s);
    const auto a = h.step(s);
    std::vector<events::step> steps;
    for (const auto& e : all_of<emit_event>(a))
      if (const auto* p = std::get_if<events::step>(&e.event)) steps.push_back(*p);
    ASSERT_EQ(steps.size(), 1u);
    const events::goodput g = h.logic().goodput_event(h.now());
    ASSERT_TRUE(steps[0].goodput && steps[0].mfu);
    // Each 1 s step of 2 ranks computed 0.1 s on each: a tenth of the rank-seconds.
    EXPECT_NEAR(*steps[0].goodput, 0.1, 1e-9);
    EXPECT_DOUBLE_EQ(*steps[0].goodput, g.goodput);
    // 4 tokens a step at 1 MFLOP each over 2 rank-seconds at 1 GFLOP/s.
    EXPECT_NEAR(*steps[0].mfu, 0.002, 1e-12);
    EXPECT_DOUBLE_EQ(*steps[0].mfu, g.mfu);
  }
}

TEST_P(JobLogicTest, LostDataParallelRankShrinksTheWorldAndKeepsEveryState) {
  logic_harness h(small_config(4));
  h.form();
  for (int s = 1; s <= 3; ++s) h.step(s);
  const int32_t victim = h.logic().member_of_rank(2);
  auto a = h.lose(victim, loss_cause::exit, "killed by signal 9");
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  EXPECT_EQ(h.logic().generation(), 2u);
  auto aborts = all_of<send_abort>(a);
  EXPECT_EQ(aborts.size(), 3u);
  for (const auto& x : aborts) EXPECT_EQ(x.msg.generation, 2u);
  EXPECT_TRUE(has_event(a, "rank_lost"));

  h.advance(50ms);
  auto planned = h.report_all(3);
  auto rc = all_of<send_reconfigure>(planned);
  ASSERT_EQ(rc.size(), 3u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.world, 3);
    EXPECT_EQ(r.msg.source, state_source::self)
        << "every data-parallel survivor holds the whole state";
    EXPECT_EQ(r.msg.start_step, 3);
    EXPECT_TRUE(r.msg.send_to.empty());
  }
  auto plan = strategies::plan_from_json(rc[0].msg.plan_json);
  EXPECT_EQ(plan.shape.dp, 3);
  EXPECT_EQ(plan.replica_micro_batches, (std::vector<int>{2, 1, 1}));
  h.advance(100ms);
  auto done = h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  bool saw = false;
  for (const auto& e : all_of<emit_event>(done))
    if (events::kind(e.event) == "generation") {
      saw = true;
      EXPECT_EQ(std::get<events::generation>(e.event).world, 3);
      EXPECT_EQ(std::get<events::generation>(e.event).cause, "exit");
      EXPECT_NEAR(std::get<events::generation>(e.event).recovery_s, 0.15, 1e-9);
    }
  EXPECT_TRUE(saw);
  // Training goes on at step 4 with three voters.
  EXPECT_EQ(all_of<send_commit>(h.step(4)).size(), 3u);
}

// Steps of `world` ranks, one of them (`slow`) computing `slow_s` where the others take 0.1 s,
// until the job leaves training (a straggler response) or 40 steps; what they caused.
actions vote_with_a_slow_rank(logic_harness& h, int world, int slow, double slow_s) {
  actions out;
  for (int64_t step = 1; step <= 40 && h.logic().state() == job_state::training; ++step) {
    for (int r = 0; r < world; ++r) {
      step_done v;
      v.generation = h.logic().generation();
      v.step = step;
      v.rank = r;
      v.loss_sum = 4.0;
      v.tokens = 2;
      v.compute_s = r == slow ? slow_s : 0.1;
      v.compute_cpu_s = v.compute_s;
      auto a = h.vote(v);
      out.insert(out.end(), a.begin(), a.end());
    }
    h.advance(100ms);
  }
  return out;
}

TEST_P(JobLogicTest, RebalanceKeepsTheReplicasOfAnExpertGroupEqual) {
  // dp4 with ep2: replicas {0, 1} and {2, 3} each share every micro-batch of their group, so
  // a rebalance away from a slow replica must move whole groups' counts.
  auto cfg = small_config(4);
  cfg.batch = 16;  // 8 micro-batches of 2, two per replica
  cfg.model.experts = 4;
  cfg.parallel.ep = 2;
  logic_harness h(cfg, 0, 0, 1, "rebalance");
  h.form();
  const auto shape = plan_for(cfg, 4).shape;
  ASSERT_EQ(shape.dp, 4);
  ASSERT_EQ(shape.ep, 2);
  int slow = -1;
  for (int r = 0; r < 4; ++r)
    if (strategies::coords_of(shape, r).dp == 3) slow = r;
  ASSERT_GE(slow, 0);

  vote_with_a_slow_rank(h, 4, slow, 0.2);
  ASSERT_EQ(h.logic().state(), job_state::recovering) << "the 2x replica was never rebalanced";
  const int64_t held = h.logic().committed();
  auto rc = all_of<send_reconfigure>(h.report_all(held));
  ASSERT_EQ(rc.size(), 4u);
  const auto plan = strategies::plan_from_json(rc[0].msg.plan_json);
  const auto& counts = plan.replica_micro_batches;
  ASSERT_EQ(counts.size(), 4u);
  EXPECT_EQ(counts[0], counts[1]) << "replicas of one ep group must run equally many";
  EXPECT_EQ(counts[2], counts[3]) << "replicas of one ep group must run equally many";
  EXPECT_GT(counts[0], counts[2]) << "the slow group should get fewer micro-batches";
  EXPECT_EQ(counts[0] + counts[1] + counts[2] + counts[3], 8);
}

// --straggler-policy evict: the slow rank is lost as a straggler and told to go at once (a
// final abort whose reason says it was evicted, so that the worker exits 0 and its agent does
// not restart it), while the others open a smaller generation.
TEST_P(JobLogicTest, AnEvictedStragglerIsToldToGo) {
  auto cfg = small_config(4);
  cfg.batch = cfg.micro_batch * 12;  // whole micro-batches for 4 replicas and for the 3 left
  logic_harness h(cfg, 0, 0, 2, "evict");
  h.form();
  const actions all = vote_with_a_slow_rank(h, 4, 3, 0.3);
  ASSERT_EQ(h.logic().state(), job_state::recovering) << "the 3x rank was never evicted";
  std::vector<send_abort> told;
  for (const auto& a : all_of<send_abort>(all))
    if (a.member == 3) told.push_back(a);
  ASSERT_EQ(told.size(), 1u) << "the evicted member should get exactly one abort";
  EXPECT_TRUE(told[0].msg.final);
  EXPECT_TRUE(told[0].msg.reason.starts_with(evicted_prefix)) << told[0].msg.reason;
}

// --straggler-factor: a rank 1.6x the others is a straggler at the default 1.3, not at 2; one
// 2.5x the others is at 2.
TEST_P(JobLogicTest, TheStragglerFactorIsTheThreshold) {
  auto cfg = small_config(4);
  cfg.batch = cfg.micro_batch * 12;
  const auto factor_2 = [](job_params& p) { p.straggler_factor = 2.0; };
  {
    logic_harness h(cfg, 0, 0, 2, "evict");
    h.form();
    const actions all = vote_with_a_slow_rank(h, 4, 3, 0.16);
    EXPECT_TRUE(has_event(all, "straggler")) << "1.6x at the default factor";
  }
  {
    logic_harness h(cfg, 0, 0, 2, "evict", factor_2);
    h.form();
    const actions all = vote_with_a_slow_rank(h, 4, 3, 0.16);
    EXPECT_FALSE(has_event(all, "straggler")) << "1.6x under --straggler-factor 2";
    EXPECT_EQ(h.logic().state(), job_state::training);
  }
  {
    logic_harness h(cfg, 0, 0, 2, "evict", factor_2);
    h.form();
    const actions all = vote_with_a_slow_rank(h, 4, 3, 0.25);
    EXPECT_TRUE(has_event(all, "straggler")) << "2.5x under --straggler-factor 2";
  }
}

// Under load the first generation may never form (a member cannot connect its groups in time
// and says so); the job then trains from generation 2, and training_started must still be
// said, once.
TEST_P(JobLogicTest, TrainingStartedIsSaidOnceWhenTheFirstGenerationToFormIsNotTheFirst) {
  logic_harness h(small_config(2));
  h.join(0);
  ASSERT_EQ(all_of<send_reconfigure>(h.join(1)).size(), 2u);
  reconfigured failed;
  failed.generation = 1;
  failed.member = 1;
  failed.ok = false;
  failed.error = "connect timed out";
  auto opened = h.logic().on_reconfigured(failed, h.now());
  EXPECT_FALSE(has_event(opened, "training_started"));
  ASSERT_EQ(h.logic().generation(), 2u);
  auto events = h.report_all(0);
  const auto formed = h.settle_reconfigure();
  events.insert(events.end(), formed.begin(), formed.end());
  ASSERT_EQ(h.logic().state(), job_state::training);
  size_t said = 0;
  for (const auto& e : all_of<emit_event>(events))
    said += events::kind(e.event) == "training_started";
  EXPECT_EQ(said, 1u);
  // Later generations never say it again.
  h.step(1);
  h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
  const auto again = h.report_all(1);
  const auto reformed = h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_FALSE(has_event(again, "training_started"));
  EXPECT_FALSE(has_event(reformed, "training_started"));
}

// A member that cannot join generation `g` because a group could not connect, with the cause
// its connect_error gave ("" for another kind of failure).
reconfigured could_not_join(uint64_t g, int32_t member, const std::string& cause,
                            const std::string& error = "could not connect") {
  reconfigured r;
  r.generation = g;
  r.member = member;
  r.rank = member;
  r.ok = false;
  r.error = error;
  r.error_cause = cause;
  return r;
}

// Issue 25: a generation that cannot connect its groups for the same reason as the one before
// (which its failure opened) is not retried until the recoveries run out: the job ends with
// exit 1 naming the cause once, one connect deadline after the first failure.
TEST_P(JobLogicTest, AGroupThatCannotConnectTheSameWayTwiceEndsTheJobNamingTheCause) {
  auto cfg = small_config(2);
  logic_harness h(cfg);
  h.join(0);
  ASSERT_EQ(all_of<send_reconfigure>(h.join(1)).size(), 2u);
  const auto first = h.now();
  auto a = h.logic().on_reconfigured(
      could_not_join(1, 1, "unreachable 10.9.9.9",
                     "gloo connect: cannot reach rank 0 at 10.9.9.9:4100 (Network is unreachable)"),
      h.now());
  EXPECT_TRUE(has_event(a, "connect_failed"));
  EXPECT_TRUE(all_of<finish_job>(a).empty()) << "one failure may be transient: it is retried";
  ASSERT_EQ(h.logic().generation(), 2u);
  ASSERT_EQ(all_of<send_reconfigure>(h.report_all(0)).size(), 2u);
  h.advance(std::chrono::milliseconds(cfg.step_timeout_ms));  // the next connect's deadline
  a = h.logic().on_reconfigured(
      could_not_join(2, 0, "unreachable 10.9.9.9",
                     "gloo connect: cannot reach rank 0 at 10.9.9.9:4107 (Network is unreachable)"),
      h.now());
  const auto ends = all_of<finish_job>(a);
  ASSERT_EQ(ends.size(), 1u);
  EXPECT_EQ(ends[0].exit_code, exit_code::failed);
  EXPECT_NE(ends[0].message.find("unreachable: 10.9.9.9"), std::string::npos) << ends[0].message;
  EXPECT_NE(ends[0].message.find("10.9.9.9:4107"), std::string::npos) << ends[0].message;
  EXPECT_NE(ends[0].message.find("same reason"), std::string::npos) << ends[0].message;
  EXPECT_EQ(h.logic().state(), job_state::failed);
  EXPECT_LE(h.now() - first, std::chrono::milliseconds(2 * cfg.step_timeout_ms));
  EXPECT_TRUE(all_of<send_reconfigure>(a).empty()) << "no further generation is tried";
}

// The class is what repeats, not the address or port: a peer whose pairs time out is named by
// each side with its own view (the peer it waited for), and ports change every generation.
TEST_P(JobLogicTest, TheSameClassOfConnectFailureFromAnotherSideStillEndsTheJob) {
  logic_harness h(small_config(2));
  h.join(0);
  h.join(1);
  h.logic().on_reconfigured(could_not_join(1, 1, "timed-out 10.0.0.2"), h.now());
  h.report_all(0);
  h.advance(10s);
  auto a = h.logic().on_reconfigured(could_not_join(2, 0, "timed-out 10.0.0.3"), h.now());
  ASSERT_EQ(all_of<finish_job>(a).size(), 1u);
  EXPECT_NE(all_of<finish_job>(a)[0].message.find("timed-out: 10.0.0.2, then 10.0.0.3"),
            std::string::npos)
      << all_of<finish_job>(a)[0].message;
}

// A pair signed with another job's key: its listening side sees the kernel drop the segments,
// its connecting side only a timeout. Either side may report first; it is one reason.
TEST_P(JobLogicTest, ASignatureMismatchSeenFromEitherSideIsOneReason) {
  logic_harness h(small_config(2));
  h.join(0);
  h.join(1);
  h.logic().on_reconfigured(could_not_join(1, 0, "signature 10.0.0.3"), h.now());
  h.report_all(0);
  auto a = h.logic().on_reconfigured(could_not_join(2, 1, "timed-out 10.0.0.2"), h.now());
  ASSERT_EQ(all_of<finish_job>(a).size(), 1u);
  EXPECT_NE(all_of<finish_job>(a)[0].message.find("signature: 10.0.0.3, then timed-out: 10.0.0.2"),
            std::string::npos)
      << all_of<finish_job>(a)[0].message;
}

TEST_P(JobLogicTest, ConnectFailuresForDifferentReasonsAreRetried) {
  logic_harness h(small_config(2));
  h.join(0);
  h.join(1);
  h.logic().on_reconfigured(could_not_join(1, 1, "refused 10.0.0.2"), h.now());
  h.report_all(0);
  auto a = h.logic().on_reconfigured(could_not_join(2, 1, "timed-out 10.0.0.2"), h.now());
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  EXPECT_EQ(h.logic().generation(), 3u);
  // And the generation after forms and trains: nothing of the failures is held against it.
  h.report_all(0);
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
}

// Only consecutive generations count: one that failed otherwise (a state that could not be
// restored, say) in between breaks the run, as does a member lost in between (a peer that
// died mid-connect is lost and opens a generation of its own, without it).
TEST_P(JobLogicTest, SameCauseFailuresThatAreNotConsecutiveAreRetried) {
  logic_harness h(small_config(4));
  for (int m = 0; m < 4; ++m) h.join(m);
  h.logic().on_reconfigured(could_not_join(1, 1, "refused 10.0.0.2"), h.now());
  h.report_all(0);
  h.logic().on_reconfigured(could_not_join(2, 1, "", "checkpoint damaged"), h.now());
  h.report_all(0);
  auto a = h.logic().on_reconfigured(could_not_join(3, 1, "refused 10.0.0.2"), h.now());
  EXPECT_TRUE(all_of<finish_job>(a).empty()) << "generation 2 failed otherwise";
  ASSERT_EQ(h.logic().generation(), 4u);
  h.report_all(0);
  h.lose(3, loss_cause::exit, "killed by signal 9");  // opens generation 5 without member 3
  ASSERT_EQ(h.logic().generation(), 5u);
  h.report_all(0);
  a = h.logic().on_reconfigured(could_not_join(5, 1, "refused 10.0.0.2"), h.now());
  EXPECT_TRUE(all_of<finish_job>(a).empty()) << "a member was lost in between";
  EXPECT_EQ(h.logic().state(), job_state::recovering);
}

// Failures without a cause keep the old bound: max_failed_recoveries recoveries in a row
// without a committed step.
TEST_P(JobLogicTest, FailuresWithoutACauseAreRetriedUpToTheRecoveryBudget) {
  logic_harness h(small_config(2));
  h.join(0);
  h.join(1);
  actions a;
  int generation = 1;
  for (; generation <= 10 && all_of<finish_job>(a).empty(); ++generation) {
    a = h.logic().on_reconfigured(could_not_join(generation, 1, "", "restore failed"), h.now());
    h.report_all(0);
  }
  ASSERT_EQ(all_of<finish_job>(a).size(), 1u);
  EXPECT_EQ(generation - 1, 6) << "5 recoveries, then the sixth failure ends it";
  EXPECT_NE(all_of<finish_job>(a)[0].message.find("gave up after 5 recoveries"), std::string::npos);
}

TEST_P(JobLogicTest, SecondFailureDuringRecoveryOpensAnotherGeneration) {
  logic_harness h(small_config(4));
  h.form();
  h.step(1);
  h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
  ASSERT_EQ(h.logic().generation(), 2u);
  // One survivor reports for generation 2, then another dies before the rest report.
  state_report early;
  early.generation = 2;
  early.member = h.logic().member_of_rank(0) >= 0 ? h.logic().member_of_rank(0) : 0;
  h.logic().on_state_report(early, h.now());
  auto a = h.lose(3, loss_cause::connection, "closed");
  EXPECT_EQ(h.logic().generation(), 3u);
  EXPECT_EQ(all_of<send_abort>(a).size(), 2u);
  // A report for generation 2 is now stale.
  auto stale = h.logic().on_state_report(early, h.now());
  EXPECT_TRUE(has_event(stale, "stale_message"));
  auto rc = all_of<send_reconfigure>(h.report_all(1));
  ASSERT_EQ(rc.size(), 2u);
  for (const auto& r : rc) EXPECT_EQ(r.msg.world, 2);
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
}

TEST_P(JobLogicTest, LostPipelineStageWithoutReplicaRestoresTheCheckpointAndReplays) {
  auto cfg = small_config(2);
  cfg.parallel.pp = 2;
  cfg.parallel.micro_batches = 4;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 7; ++s) {
    auto a = h.step(s);
    if (s == 5) {  // the checkpoint at step 5
      for (int r = 0; r < 2; ++r) {
        shard_written w;
        w.generation = 1;
        w.step = 5;
        w.rank = r;
        w.pieces_json = "[]";
        auto c = h.logic().on_shard_written(w, h.now());
        for (const auto& cc : all_of<commit_checkpoint>(c))
          h.logic().on_checkpoint_committed(cc, "ckpt5", "");
      }
    }
  }
  ASSERT_EQ(h.logic().last_checkpoint_step(), 5);
  h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
  auto rc = all_of<send_reconfigure>(h.report_all(7));
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].msg.world, 1);
  EXPECT_EQ(rc[0].msg.source, state_source::checkpoint);
  EXPECT_EQ(rc[0].msg.start_step, 5) << "every rank rolls back to the checkpoint and replays";
  EXPECT_EQ(h.logic().committed(), 5);
}

namespace {

shard_written share_of(int64_t step, int rank, bool ok, bool skipped) {
  shard_written w;
  w.generation = 1;
  w.step = step;
  w.rank = rank;
  w.ok = ok;
  w.skipped = skipped;
  w.adam_t = step;
  w.bytes_written = 100;
  w.pieces_json = ok ? "[[" + std::to_string(rank) +
                           ",0,\"wte.weight\",[0,0,1,1],[\"0123456789abcdef0123456789abcdef\"],0]]"
                     : "";
  return w;
}

// Two ranks checkpointing every 2 steps, trained to step 3: checkpoint 2 is in flight.
void train_past_the_first_checkpoint(logic_harness& h) {
  h.form();
  for (int s = 1; s <= 3; ++s) h.step(s);
}

}  // namespace

// Asynchronous writes let steps go on while a checkpoint is written, but at most one
// checkpoint is in flight job-wide, its commit included: the next checkpoint step is decided
// only once the previous manifest is committed, so a crash loses at most one interval.
TEST_P(JobLogicTest, NextCheckpointStepWaitsForThePreviousCommit) {
  auto cfg = small_config(2);
  cfg.checkpoint_every = 2;
  logic_harness h(cfg);
  train_past_the_first_checkpoint(h);  // steps go on while checkpoint 2 is written
  EXPECT_EQ(h.logic().committed(), 3);
  EXPECT_TRUE(h.logic().checkpoints_in_flight());
  EXPECT_TRUE(all_of<send_commit>(h.step(4)).empty()) << "step 4 waits for checkpoint 2";
  EXPECT_EQ(h.logic().committed(), 3);
  EXPECT_TRUE(
      all_of<commit_checkpoint>(h.logic().on_shard_written(share_of(2, 0, true, false), h.now()))
          .empty());
  auto done2 =
      all_of<commit_checkpoint>(h.logic().on_shard_written(share_of(2, 1, true, false), h.now()));
  ASSERT_EQ(done2.size(), 1u);
  EXPECT_EQ(done2[0].step, 2);
  EXPECT_EQ(done2[0].pieces.size(), 2u);
  EXPECT_EQ(done2[0].bytes_written, 200u);
  EXPECT_EQ(h.logic().committed(), 3) << "written is not committed: step 4 still waits";
  auto released = h.logic().on_checkpoint_committed(done2[0], "ckpt2", "");
  EXPECT_TRUE(has_event(released, "checkpoint"));
  const auto commits = all_of<send_commit>(released);
  ASSERT_EQ(commits.size(), 2u) << "both ranks learn that step 4 is decided";
  EXPECT_TRUE(commits[0].msg.checkpoint);
  EXPECT_EQ(h.logic().committed(), 4);
  EXPECT_EQ(h.logic().last_checkpoint_step(), 2);

  // A skipped share drops its checkpoint and releases the next step just the same.
  EXPECT_TRUE(
      has_event(h.logic().on_shard_written(share_of(2, 1, true, false), h.now()), "stale_message"))
      << "a second report";
  h.logic().on_shard_written(share_of(4, 0, true, false), h.now());
  h.step(5);
  EXPECT_TRUE(all_of<send_commit>(h.step(6)).empty());
  auto skipped = h.logic().on_shard_written(share_of(4, 1, false, true), h.now());
  EXPECT_TRUE(all_of<commit_checkpoint>(skipped).empty());
  EXPECT_TRUE(has_event(skipped, "checkpoint_skipped"));
  EXPECT_EQ(all_of<send_commit>(skipped).size(), 2u);
  EXPECT_EQ(h.logic().committed(), 6);

  // A failed share: the failure is reported, and the job goes on.
  h.logic().on_shard_written(share_of(6, 0, true, false), h.now());
  h.step(7);
  EXPECT_TRUE(all_of<send_commit>(h.step(8)).empty());
  auto failed = h.logic().on_shard_written(share_of(6, 1, false, false), h.now());
  EXPECT_TRUE(has_event(failed, "checkpoint_failed"));
  EXPECT_EQ(all_of<send_commit>(failed).size(), 2u);
  EXPECT_EQ(h.logic().committed(), 8);
}

// checkpoint_overlap skip: the step is decided at once and the checkpoint it would have
// asked for is skipped, with an event that says why.
TEST_P(JobLogicTest, OverlapSkipDecidesTheStepWithoutItsCheckpoint) {
  auto cfg = small_config(2);
  cfg.checkpoint_every = 2;
  cfg.checkpoint_overlap = "skip";
  logic_harness h(cfg);
  train_past_the_first_checkpoint(h);
  auto four = h.step(4);
  const auto commits = all_of<send_commit>(four);
  ASSERT_EQ(commits.size(), 2u);
  EXPECT_FALSE(commits[0].msg.checkpoint);
  EXPECT_TRUE(has_event(four, "checkpoint_skipped"));
  EXPECT_EQ(h.logic().committed(), 4);
}

// A generation that ends while votes are held drops them with the step: the new generation
// replays it, and the released checkpoint does not decide a step of the old one.
TEST_P(JobLogicTest, HeldVotesGoWithTheGeneration) {
  auto cfg = small_config(2);
  cfg.checkpoint_every = 2;
  logic_harness h(cfg);
  train_past_the_first_checkpoint(h);
  EXPECT_TRUE(all_of<send_commit>(h.step(4)).empty());
  h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
  EXPECT_EQ(h.logic().committed(), 3);
  commit_checkpoint late;
  late.step = 2;
  EXPECT_TRUE(all_of<send_commit>(h.logic().on_checkpoint_committed(late, "ckpt2", "")).empty());
}

TEST_P(JobLogicTest, SpareTakesTheLostRanksPlaceWithItsStateFromAPeer) {
  auto cfg = small_config(2);
  logic_harness h(cfg, /*spares=*/1);
  h.set_spares(1);
  h.form();
  EXPECT_EQ(h.logic().world(), 2);
  const auto& members = h.logic().members();
  int32_t spare = -1;
  for (const auto& m : members)
    if (m.rank < 0) spare = m.id;
  ASSERT_GE(spare, 0);
  h.step(1);
  h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
  auto rc = all_of<send_reconfigure>(h.report_all(1));
  ASSERT_EQ(rc.size(), 2u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.world, 2) << "the layout does not change";
    if (r.member == spare) {
      EXPECT_EQ(r.msg.source, state_source::peer);
      EXPECT_GE(r.msg.source_rank, 0);
    } else {
      EXPECT_EQ(r.msg.source, state_source::self);
      EXPECT_EQ(r.msg.send_to.size(), 1u);
    }
  }
}

TEST_P(JobLogicTest, SilentMemberIsLostAtTheHeartbeatTimeout) {
  logic_harness h(small_config(2));
  h.form();
  h.step(1);
  // Member 0 keeps beating; member 1 falls silent.
  for (int i = 0; i < 30; ++i) {
    h.advance(100ms);
    h.logic().on_heartbeat(heartbeat{0, 1, 1}, h.now());
    auto a = h.logic().on_tick(h.now());
    if (i < 19) {
      EXPECT_EQ(h.logic().state(), job_state::training) << "tick " << i;
    }
    if (has_event(a, "rank_lost")) {
      for (const auto& e : all_of<emit_event>(a))
        if (events::kind(e.event) == "rank_lost") {
          EXPECT_EQ(std::get<events::rank_lost>(e.event).cause, "hang");
        }
      EXPECT_GE(i, 19);
      EXPECT_EQ(h.logic().state(), job_state::recovering);
      // It wakes up later: its word no longer counts, and it is told to go.
      auto late = h.logic().on_heartbeat(heartbeat{1, 1, 1}, h.now());
      EXPECT_TRUE(has_event(late, "stale_message"));
      auto go = all_of<send_abort>(late);
      ASSERT_EQ(go.size(), 1u);
      EXPECT_TRUE(go[0].msg.final);
      return;
    }
  }
  FAIL() << "the silent member was never declared lost";
}

TEST_P(JobLogicTest, BelowMinRanksTheJobFailsNamingTheLoss) {
  logic_harness h(small_config(2), 0, 0, /*min_ranks=*/2);
  h.form();
  auto a = h.lose(1, loss_cause::exit, "killed by signal 9");
  auto end = all_of<finish_job>(a);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 1);
  EXPECT_NE(end[0].message.find("rank 1 lost"), std::string::npos) << end[0].message;
  EXPECT_NE(end[0].message.find("--min-ranks"), std::string::npos) << end[0].message;
  EXPECT_EQ(h.logic().state(), job_state::failed);
}

// The lost rank wrote its share of checkpoint 2 before it died; the survivor's share arrives
// after the job failed. The failure message already named what --resume continues from, and
// the job's committer is gone: that checkpoint must not be committed behind it.
TEST_P(JobLogicTest, AShareArrivingAfterTheJobFailedCommitsNothing) {
  auto cfg = small_config(2);
  cfg.checkpoint_every = 2;
  logic_harness h(cfg, 0, 0, /*min_ranks=*/2);
  train_past_the_first_checkpoint(h);
  EXPECT_TRUE(h.logic().on_shard_written(share_of(2, 1, true, false), h.now()).empty());
  ASSERT_EQ(all_of<finish_job>(h.lose(1, loss_cause::exit, "killed by signal 9")).size(), 1u);
  ASSERT_EQ(h.logic().state(), job_state::failed);
  EXPECT_TRUE(h.logic().on_shard_written(share_of(2, 0, true, false), h.now()).empty());
  EXPECT_EQ(h.logic().last_checkpoint_step(), -1);
}

TEST_P(JobLogicTest, FailedVoteWaitsForItsCauseThenRecoversInPlace) {
  logic_harness h(small_config(2));
  h.form();
  step_done bad;
  bad.generation = 1;
  bad.step = 1;
  bad.rank = 0;
  bad.ok = false;
  bad.error = "peer lost";
  bad.error_kind = static_cast<int32_t>(comm::comm_errc::peer_lost);
  bad.error_op = "reduce";
  h.logic().on_vote(bad, h.now());
  h.advance(100ms);
  EXPECT_EQ(h.logic().state(), job_state::training);  // still settling
  h.logic().on_tick(h.now());
  EXPECT_EQ(h.logic().state(), job_state::training);
  h.advance(500ms);
  auto a = h.logic().on_tick(h.now());
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  EXPECT_EQ(all_of<send_abort>(a).size(), 2u) << "nobody is evicted for a collective a peer broke";
}

TEST_P(JobLogicTest, RankWhoseOwnCollectiveFailsIsEvicted) {
  logic_harness h(small_config(2));
  h.form();
  step_done bad;
  bad.generation = 1;
  bad.step = 1;
  bad.rank = 1;
  bad.ok = false;
  bad.error = "injected fault";
  bad.error_kind = static_cast<int32_t>(comm::comm_errc::internal);
  h.logic().on_vote(bad, h.now());
  h.advance(600ms);
  auto a = h.logic().on_tick(h.now());
  ASSERT_TRUE(has_event(a, "rank_lost"));
  for (const auto& e : all_of<emit_event>(a))
    if (events::kind(e.event) == "rank_lost") {
      EXPECT_EQ(std::get<events::rank_lost>(e.event).rank, 1);
      EXPECT_EQ(std::get<events::rank_lost>(e.event).cause, "error");
    }
  EXPECT_EQ(all_of<send_abort>(a).size(), 1u);
}

TEST_P(JobLogicTest, WaitingMembersGrowTheWorldAtTheNextStepBoundary) {
  logic_harness h(small_config(2), 0, /*max_ranks=*/4);
  h.form();
  h.step(1);
  h.join(7);
  h.join(8);
  EXPECT_EQ(h.logic().state(), job_state::training) << "admitted at a step boundary, not mid-step";
  auto a = h.step(2);
  ASSERT_EQ(all_of<send_commit>(a).size(), 2u);
  EXPECT_TRUE(all_of<send_commit>(a)[0].msg.hold)
      << "the ranks apply step 2 and wait: no step is thrown away";
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  auto rc = all_of<send_reconfigure>(h.report_all(2));
  ASSERT_EQ(rc.size(), 4u);
  int peers = 0;
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.world, 4);
    peers += r.msg.source == state_source::peer;
  }
  EXPECT_EQ(peers, 2) << "the newcomers receive their state from ranks that hold it";
}

TEST_P(JobLogicTest, MemberJoiningDuringARecoveryWaitsForTheNextGeneration) {
  logic_harness h(small_config(2), 0, /*max_ranks=*/2);
  h.form();
  h.step(1);
  h.lose(1, loss_cause::exit, "gone");
  auto rc = all_of<send_reconfigure>(h.report_all(1));
  ASSERT_EQ(rc.size(), 1u);
  h.join(1);  // restarted by its agent while generation 2 forms
  auto a = h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training) << "the newcomer does not hold up generation 2";
  // It is admitted at the next step boundary.
  h.step(2);
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  EXPECT_EQ(all_of<send_reconfigure>(h.report_all(2)).size(), 2u);
}

TEST_P(JobLogicTest, VoteBeforeTheLastAcknowledgementStillCounts) {
  logic_harness h(small_config(2));
  h.form();
  h.step(1);
  h.join(2);  // spares: the world is at --max-ranks
  h.join(3);
  h.lose(1, loss_cause::exit, "gone");
  auto all = all_of<send_reconfigure>(h.report_all(1));
  ASSERT_EQ(all.size(), 3u);  // two ranks and a spare
  std::vector<send_reconfigure> rc;
  for (const auto& r : all)
    if (r.msg.rank >= 0) rc.push_back(r);
  ASSERT_EQ(rc.size(), 2u);
  reconfigured spare;
  for (const auto& r : all)
    if (r.msg.rank < 0) {
      spare.generation = r.msg.generation;
      spare.member = r.member;
      h.logic().on_reconfigured(spare, h.now());
    }
  // The first rank acknowledges and votes for step 2 before the second acknowledges.
  reconfigured first;
  first.generation = rc[0].msg.generation;
  first.member = rc[0].member;
  first.rank = rc[0].msg.rank;
  h.logic().on_reconfigured(first, h.now());
  step_done v;
  v.generation = first.generation;
  v.step = 2;
  v.rank = first.rank;
  v.tokens = 2;
  auto early = h.vote(v);
  EXPECT_FALSE(has_event(early, "stale_message"));
  reconfigured second = first;
  second.member = rc[1].member;
  second.rank = rc[1].msg.rank;
  h.logic().on_reconfigured(second, h.now());
  v.rank = second.rank;
  auto a = h.vote(v);
  EXPECT_EQ(all_of<send_commit>(a).size(), 2u);
  EXPECT_EQ(h.logic().committed(), 2);
}

TEST_P(JobLogicTest, FirstVoteBeforeTheLastRankJoinedGenerationOneCounts) {
  logic_harness h(small_config(2));
  h.join(0);
  auto rc = all_of<send_reconfigure>(h.join(1));
  ASSERT_EQ(rc.size(), 2u);
  reconfigured first;
  first.generation = 1;
  first.member = rc[0].member;
  first.rank = rc[0].msg.rank;
  h.logic().on_reconfigured(first, h.now());
  step_done v;
  v.generation = 1;
  v.step = 1;
  v.rank = first.rank;
  v.tokens = 2;
  EXPECT_FALSE(has_event(h.vote(v), "stale_message"));
  reconfigured second = first;
  second.member = rc[1].member;
  second.rank = rc[1].msg.rank;
  h.logic().on_reconfigured(second, h.now());
  v.rank = second.rank;
  EXPECT_EQ(all_of<send_commit>(h.vote(v)).size(), 2u);
}

TEST_P(JobLogicTest, PlanRestoreKeepsPipelineStagesOnTheirHolders) {
  auto cfg = small_config(4);
  cfg.parallel.pp = 2;
  cfg.parallel.micro_batches = 4;
  auto old_plan = plan_for(cfg, 4);
  ASSERT_EQ(old_plan.shape.dp, 2);
  std::map<uint64_t, strategies::layout_plan> plans{{1, old_plan}};
  // Rank 3 (dp1, stage 1) is gone; members 0..2 held ranks 0..2 at step 9.
  std::vector<member_info> live;
  for (int r = 0; r < 3; ++r) {
    member_info m;
    m.id = r;
    m.held_generation = 1;
    m.held_rank = r;
    m.held_step = 9;
    live.push_back(m);
  }
  auto next_result =
      strategies::replan_layout(old_plan, 3, cfg.model, strategies::constraints_from(cfg), {1, 4});
  ASSERT_TRUE(strategies::has_plan(next_result));
  const auto& next = strategies::plan_of(next_result);
  EXPECT_EQ(next.shape.pp, 2);
  EXPECT_EQ(next.shape.dp, 1);
  auto rp = plan_restore(live, plans, next, 0, 9, 5);
  EXPECT_EQ(rp.start_step, 9);
  for (size_t r = 0; r < rp.source.size(); ++r) EXPECT_EQ(rp.source[r], state_source::self);
  // ZeRO-1 shards depend on the dp size: a shrink must go back to the checkpoint.
  auto zero_plan = plans;
  auto rz = plan_restore(live, zero_plan, next, 1, 9, 5);
  EXPECT_EQ(rz.start_step, 5);
  for (auto s : rz.source) EXPECT_EQ(s, state_source::checkpoint);
}

TEST_P(JobLogicTest, NoFormingWithinTheDeadlineFails) {
  logic_harness h(small_config(2));
  h.join(0);
  h.advance(61s);
  auto a = h.logic().on_tick(h.now());
  auto end = all_of<finish_job>(a);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_NE(end[0].message.find("1 of 2"), std::string::npos) << end[0].message;
}

// ---- divergence, interrupts and failed checkpoints ---------------------------------------

step_done vote_of(job_logic& l, int64_t step, int32_t rank, double loss_sum, double grad_norm = 1) {
  step_done v;
  v.generation = l.generation();
  v.step = step;
  v.rank = rank;
  v.loss_sum = loss_sum;
  v.tokens = 2;
  v.grad_norm = grad_norm;
  return v;
}

// Every rank votes for `step`; `rank0_loss_sum` is what rank 0 reports.
actions vote_all(logic_harness& h, int64_t step, double rank0_loss_sum, double grad_norm = 1) {
  actions out;
  for (int r = 0; r < h.logic().world(); ++r) {
    auto a = h.logic().on_vote(
        vote_of(h.logic(), step, r, r == 0 ? rank0_loss_sum : 4.0, r == 0 ? grad_norm : 1.0),
        h.now());
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

// Every rank reports its share of checkpoint `step` as durable; the manifest is committed
// (or fails with `commit_error`).
actions write_checkpoint(logic_harness& h, int64_t step, const std::string& commit_error = "") {
  actions out;
  for (int r = 0; r < h.logic().world(); ++r) {
    shard_written w;
    w.generation = h.logic().generation();
    w.step = step;
    w.rank = r;
    w.adam_t = step;
    w.pieces_json = "[]";
    auto a = h.logic().on_shard_written(w, h.now());
    out.insert(out.end(), a.begin(), a.end());
    for (const auto& c : all_of<commit_checkpoint>(a)) {
      auto done = h.logic().on_checkpoint_committed(
          c, commit_error.empty() ? "ckpt" + std::to_string(step) : "", commit_error);
      out.insert(out.end(), done.begin(), done.end());
    }
  }
  return out;
}

// Every rank's share of the validation at `step` (due at the session's last step).
actions evaluate_all(logic_harness& h, int64_t step) {
  actions out;
  for (int r = 0; r < h.logic().world(); ++r) {
    auto a = h.logic().on_eval_done(eval_done{h.logic().generation(), step, r, 1.0, 1}, h.now());
    out.insert(out.end(), a.begin(), a.end());
  }
  return out;
}

// Moves the clock with every member's heartbeat in, so nobody is lost for silence.
void advance_beating(logic_harness& h, std::chrono::milliseconds d) {
  for (auto left = d; left.count() > 0; left -= 500ms) {
    h.advance(std::min<std::chrono::milliseconds>(left, 500ms));
    for (const auto& m : h.logic().members())
      h.logic().on_heartbeat(heartbeat{m.id, h.logic().generation(), 0}, h.now());
  }
}

const emit_event* find_event(const actions& a, const std::string& name) {
  for (const auto& x : a)
    if (auto* e = std::get_if<emit_event>(&x); e && events::kind(e->event) == name) return e;
  return nullptr;
}

TEST_P(JobLogicTest, NonFiniteValuesCrossTheWireAsAClass) {
  for (double x : {0.0, -2.5, 1e300, std::nan(""), HUGE_VAL, -HUGE_VAL}) {
    double sent = x;
    const int8_t c = wire_encode(sent);
    EXPECT_TRUE(std::isfinite(sent)) << "CAF 0.17 cannot pack " << x;
    const double back = wire_decode(sent, c);
    if (std::isnan(x))
      EXPECT_TRUE(std::isnan(back));
    else
      EXPECT_EQ(back, x);
  }
}

TEST_P(JobLogicTest, DivergedStepIsNeverCommittedAndStopsWithExit3) {
  logic_harness h(small_config(2));
  h.form();
  for (int s = 1; s <= 3; ++s) h.step(s);
  // Rank 0's loss arrives as a NaN, encoded for the wire.
  double nan = std::nan("");
  step_done bad = vote_of(h.logic(), 4, 0, nan);
  bad.loss_class = wire_encode(bad.loss_sum);
  auto a = h.logic().on_vote(bad, h.now());
  auto b = h.logic().on_vote(vote_of(h.logic(), 4, 1, 4.0), h.now());
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_TRUE(all_of<send_commit>(a).empty()) << "a diverged step is never committed";
  EXPECT_FALSE(has_event(a, "step"));
  EXPECT_EQ(h.logic().committed(), 3);
  const auto* e = find_event(a, "diverged");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::get<events::diverged>(e->event).step, 4);
  EXPECT_EQ(std::get<events::diverged>(e->event).action, "stop");
  EXPECT_NE(std::get<events::diverged>(e->event).what.find("nan"), std::string::npos);
  auto end = all_of<finish_job>(a);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::diverged);
  EXPECT_NE(end[0].message.find("step 4 diverged"), std::string::npos) << end[0].message;
  EXPECT_NE(end[0].message.find("nan"), std::string::npos) << end[0].message;
  EXPECT_NE(end[0].message.find("no checkpoint was committed"), std::string::npos);
  EXPECT_TRUE(all_of<record_skipped>(a).empty()) << "stop skips nothing";
}

TEST_P(JobLogicTest, NegativeLossAndNonFiniteGradientNormAreDivergence) {
  {
    logic_harness h(small_config(2));
    h.form();
    h.step(1);
    auto a = vote_all(h, 2, -0.5);
    auto end = all_of<finish_job>(a);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_NE(end[0].message.find("below zero"), std::string::npos) << end[0].message;
    EXPECT_NE(end[0].message.find("-0.25"), std::string::npos) << "the per-token value";
  }
  {
    logic_harness h(small_config(2));
    h.form();
    auto a = vote_all(h, 1, 4.0, HUGE_VAL);
    auto end = all_of<finish_job>(a);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_NE(end[0].message.find("gradient norm inf"), std::string::npos) << end[0].message;
  }
}

TEST_P(JobLogicTest, StopWaitsForTheCheckpointInFlightAndNamesIt) {
  logic_harness h(small_config(2));  // checkpoints every 5 steps
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  ASSERT_TRUE(h.logic().checkpoints_in_flight());
  auto a = vote_all(h, 6, std::nan(""));
  EXPECT_TRUE(has_event(a, "diverged"));
  EXPECT_TRUE(all_of<finish_job>(a).empty()) << "step 5's checkpoint is still being written";
  EXPECT_TRUE(h.logic().halting());
  auto done = write_checkpoint(h, 5);
  EXPECT_TRUE(has_event(done, "checkpoint"));
  auto end = all_of<finish_job>(done);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::diverged);
  EXPECT_NE(end[0].message.find("checkpoint is step 5 (ckpt5)"), std::string::npos)
      << end[0].message;
}

TEST_P(JobLogicTest, StopDoesNotWaitPastTheStepTimeoutForACheckpoint) {
  logic_harness h(small_config(2));
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  vote_all(h, 6, std::nan(""));
  advance_beating(h, 5s);
  EXPECT_TRUE(all_of<finish_job>(h.logic().on_tick(h.now())).empty());
  advance_beating(h, 6s);  // past the 10 s step timeout, before the ranks' own 20 s
  auto end = all_of<finish_job>(h.logic().on_tick(h.now()));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::diverged);
}

TEST_P(JobLogicTest, RollbackRestoresTheCheckpointSkipsTheBatchAndStopsAfterMaxRollbacks) {
  auto cfg = small_config(2);
  cfg.on_divergence = "rollback";
  cfg.max_rollbacks = 2;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  write_checkpoint(h, 5);
  h.step(6);
  h.step(7);
  auto a = vote_all(h, 8, std::nan(""));
  EXPECT_TRUE(all_of<send_commit>(a).empty());
  const auto* e = find_event(a, "diverged");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::get<events::diverged>(e->event).action, "rollback");
  EXPECT_EQ(std::get<events::diverged>(e->event).skipped_steps, (std::vector<int64_t>{8}));
  auto skips = all_of<record_skipped>(a);
  ASSERT_EQ(skips.size(), 1u);
  EXPECT_EQ(skips[0].steps, (std::vector<int64_t>{8}));
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  EXPECT_EQ(all_of<send_abort>(a).size(), 2u);
  // The members hold step 7, which passed its checks; still, the rollback goes to step 5.
  auto rc = all_of<send_reconfigure>(h.report_all(7));
  ASSERT_EQ(rc.size(), 2u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.source, state_source::checkpoint);
    EXPECT_EQ(r.msg.start_step, 5);
    EXPECT_EQ(r.msg.skipped_steps, (std::vector<int64_t>{8}));
  }
  auto trained = h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  for (const auto& g : all_of<emit_event>(trained)) {
    if (events::kind(g.event) == "generation") {
      EXPECT_EQ(std::get<events::generation>(g.event).cause, "divergence");
    }
  }
  // The replay trains past step 8 on the next batch.
  for (int s = 6; s <= 8; ++s) EXPECT_EQ(all_of<send_commit>(h.step(s)).size(), 2u);
  // Step 9 diverges, then again on its next batch: the second rollback is the last allowed.
  vote_all(h, 9, std::nan(""));
  h.report_all(8);
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().skipped_steps(), (std::vector<int64_t>{8, 9}));
  for (int s = 6; s <= 8; ++s) h.step(s);
  auto last = vote_all(h, 9, std::nan(""));
  auto end = all_of<finish_job>(last);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::diverged);
  EXPECT_NE(end[0].message.find("2 rollbacks spent"), std::string::npos) << end[0].message;
  EXPECT_EQ(h.logic().rollbacks(), 2);
}

TEST_P(JobLogicTest, ADamagedCheckpointMetInARollbackFallsBackToTheOneBefore) {
  auto cfg = small_config(2);
  cfg.on_divergence = "rollback";
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  write_checkpoint(h, 5);
  for (int s = 6; s <= 10; ++s) h.step(s);
  write_checkpoint(h, 10);
  h.step(11);
  vote_all(h, 12, std::nan(""));
  auto rc = all_of<send_reconfigure>(h.report_all(11));
  ASSERT_EQ(rc.size(), 2u);
  const uint64_t gen = rc[0].msg.generation;
  EXPECT_EQ(rc[0].msg.start_step, 10);
  // Both ranks find step 10's checkpoint damaged: one search for an intact one, no new
  // generation until it answers.
  actions asked;
  for (const auto& r : rc) {
    reconfigured failed;
    failed.generation = gen;
    failed.member = r.member;
    failed.rank = r.msg.rank;
    failed.ok = false;
    failed.error = "checkpoint: chunk 3f..: is damaged";
    failed.error_cause = std::string(damaged_checkpoint_cause) + " 10";
    auto a = h.logic().on_reconfigured(failed, h.now());
    asked.insert(asked.end(), a.begin(), a.end());
  }
  auto searches = all_of<fall_back_checkpoint>(asked);
  ASSERT_EQ(searches.size(), 1u);
  EXPECT_EQ(searches[0].step, 10);
  EXPECT_TRUE(all_of<send_abort>(asked).empty());
  EXPECT_TRUE(all_of<finish_job>(asked).empty());
  EXPECT_EQ(h.logic().generation(), gen);
  // Step 5's reads back: everyone restores it and replays, on the skipped batches.
  checkpoint_fallback_found found;
  found.damaged = 10;
  found.intact = 5;
  found.path = "ckpt5";
  found.error = "damaged";
  found.quarantined = "q10";
  auto back = h.logic().on_checkpoint_fallback(found, h.now());
  const auto* e = find_event(back, "checkpoint_fallback");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(std::get<events::checkpoint_fallback>(e->event).resumed_step, 5);
  EXPECT_EQ(h.logic().last_checkpoint_step(), 5);
  EXPECT_GT(h.logic().generation(), gen);
  auto again = all_of<send_reconfigure>(h.report_all(11));
  ASSERT_EQ(again.size(), 2u);
  for (const auto& r : again) {
    EXPECT_EQ(r.msg.source, state_source::checkpoint);
    EXPECT_EQ(r.msg.start_step, 5);
    EXPECT_EQ(r.msg.skipped_steps, (std::vector<int64_t>{12}));
  }
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  // A late answer for a search nobody waits for changes nothing.
  EXPECT_TRUE(h.logic().on_checkpoint_fallback(found, h.now()).empty());
}

TEST_P(JobLogicTest, ADamagedCheckpointWithNoIntactOneBeforeEndsTheJobNamingIt) {
  auto cfg = small_config(2);
  cfg.on_divergence = "rollback";
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  write_checkpoint(h, 5);
  vote_all(h, 6, std::nan(""));
  auto rc = all_of<send_reconfigure>(h.report_all(5));
  ASSERT_FALSE(rc.empty());
  reconfigured failed;
  failed.generation = rc[0].msg.generation;
  failed.member = rc[0].member;
  failed.ok = false;
  failed.error = "damaged";
  failed.error_cause = std::string(damaged_checkpoint_cause) + " 5";
  ASSERT_EQ(all_of<fall_back_checkpoint>(h.logic().on_reconfigured(failed, h.now())).size(), 1u);
  checkpoint_fallback_found none;
  none.damaged = 5;
  none.error = "chunk 3f: damaged";
  auto end = all_of<finish_job>(h.logic().on_checkpoint_fallback(none, h.now()));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::failed);
  EXPECT_NE(end[0].message.find("step 5 does not read back"), std::string::npos) << end[0].message;
  EXPECT_NE(end[0].message.find("troupe ckpt verify"), std::string::npos) << end[0].message;
}

TEST_P(JobLogicTest, RollbackWithoutACheckpointStartsOverFromTheSeed) {
  auto cfg = small_config(2);
  cfg.on_divergence = "rollback";
  logic_harness h(cfg);
  h.form();
  h.step(1);
  h.step(2);
  vote_all(h, 3, -1.0);
  auto rc = all_of<send_reconfigure>(h.report_all(2));
  ASSERT_EQ(rc.size(), 2u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.source, state_source::init);
    EXPECT_EQ(r.msg.start_step, 0);
  }
}

TEST_P(JobLogicTest, SkippedBatchesMoveTheDataPositionOfLaterSteps) {
  EXPECT_EQ(data_position(1, {}), 0);
  EXPECT_EQ(data_position(7, {8}), 6);
  EXPECT_EQ(data_position(8, {8}), 8) << "step 8 no longer trains on the batch that diverged";
  EXPECT_EQ(data_position(9, {8}), 9);
  EXPECT_EQ(data_position(9, {8, 9}), 10);
  EXPECT_EQ(data_position(8, {8, 8}), 9) << "the replacement batch diverged too";
  // A resumed session starts with the run's skips.
  auto cfg = small_config(2);
  logic_harness h(cfg);
  job_params p;
  p.cfg = cfg;
  p.plan = plan_for(cfg, 2);
  p.members = 2;
  p.skipped_steps = {12, 4};
  job_logic l(p, h.now());
  EXPECT_EQ(l.skipped_steps(), (std::vector<int64_t>{4, 12}));
}

TEST_P(JobLogicTest, InterruptCommitsNoFurtherStepButWaitsForTheCheckpointBeingWritten) {
  {
    logic_harness h(small_config(2));
    h.form();
    h.step(1);
    auto a = h.logic().on_shutdown(h.now());
    EXPECT_TRUE(has_event(a, "interrupted"));
    auto end = all_of<finish_job>(a);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, exit_code::interrupted);
    EXPECT_NE(end[0].message.find("after step 1"), std::string::npos) << end[0].message;
  }
  logic_harness h(small_config(2));
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  auto a = h.logic().on_shutdown(h.now());
  EXPECT_TRUE(all_of<finish_job>(a).empty()) << "step 5's checkpoint is being written";
  EXPECT_TRUE(all_of<send_commit>(h.step(6)).empty()) << "no step after the interrupt";
  EXPECT_EQ(h.logic().committed(), 5);
  auto end = all_of<finish_job>(write_checkpoint(h, 5));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::interrupted);
  EXPECT_NE(end[0].message.find("checkpoint is step 5"), std::string::npos) << end[0].message;
}

// Issue 25 (Slurm): SIGTERM / SIGUSR1 commit the next step with a checkpoint and end with exit
// 75 (requeue) once it is committed; --resume then continues from exactly that step.
TEST_P(JobLogicTest, PreemptCheckpointsTheNextStepAndEndsWithTheRequeueCode) {
  {
    logic_harness h(small_config(2));
    h.form();
    h.step(1);
    h.step(2);
    auto a = h.logic().on_preempt(h.now());
    EXPECT_TRUE(has_event(a, "preempted"));
    EXPECT_TRUE(all_of<finish_job>(a).empty()) << "the next step is still to be checkpointed";
    auto next = h.step(3);
    auto commits = all_of<send_commit>(next);
    ASSERT_EQ(commits.size(), 2u);
    EXPECT_TRUE(commits[0].msg.checkpoint) << "step 3 is not a checkpoint step but must be saved";
    EXPECT_FALSE(commits[0].msg.hold);
    EXPECT_TRUE(all_of<finish_job>(next).empty()) << "its checkpoint is being written";
    EXPECT_TRUE(all_of<send_commit>(h.step(4)).empty()) << "no step after the preempted one";
    auto end = all_of<finish_job>(write_checkpoint(h, 3));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, exit_code::requeue);
    EXPECT_EQ(h.logic().committed(), 3);
    EXPECT_EQ(h.logic().last_checkpoint_step(), 3);
    EXPECT_NE(end[0].message.find("checkpoint is step 3"), std::string::npos) << end[0].message;
    EXPECT_TRUE(h.logic().on_preempt(h.now()).empty()) << "the job has ended";
  }
  {  // before training: at once, with whatever is committed
    logic_harness h(small_config(2));
    auto end = all_of<finish_job>(h.logic().on_preempt(h.now()));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, exit_code::requeue);
  }
  {  // an interrupt already stopping the job keeps its exit code
    logic_harness h(small_config(2));
    h.form();
    for (int s = 1; s <= 5; ++s) h.step(s);
    h.logic().on_shutdown(h.now());
    EXPECT_TRUE(all_of<finish_job>(h.logic().on_preempt(h.now())).empty());
    auto end = all_of<finish_job>(write_checkpoint(h, 5));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, exit_code::interrupted);
  }
  {  // ranks lost while stopping (Slurm's srun kills its tasks on SIGTERM): no recovery, exit
     // 75 with the last committed checkpoint
    logic_harness h(small_config(2));
    h.form();
    for (int s = 1; s <= 5; ++s) h.step(s);
    write_checkpoint(h, 5);
    h.step(6);
    h.logic().on_preempt(h.now());
    auto a = h.logic().on_member_lost(1, loss_cause::exit, "killed by signal 9", h.now());
    auto end = all_of<finish_job>(a);
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, exit_code::requeue);
    EXPECT_TRUE(all_of<send_reconfigure>(a).empty()) << "no new generation";
    EXPECT_NE(end[0].message.find("checkpoint is step 5"), std::string::npos) << end[0].message;
  }
  {  // the last step of the session ends the job as done: nothing to requeue
    auto cfg = small_config(2);
    cfg.steps = 3;
    logic_harness h(cfg);
    h.form();
    h.step(1);
    h.step(2);
    h.logic().on_preempt(h.now());
    h.step(3);
    evaluate_all(h, 3);
    auto end = all_of<finish_job>(write_checkpoint(h, 3));
    ASSERT_EQ(end.size(), 1u);
    EXPECT_EQ(end[0].exit_code, exit_code::done);
  }
}

TEST_P(JobLogicTest, FailedCheckpointWithoutALaterOneEndsWithExit4) {
  auto cfg = small_config(2);
  cfg.steps = 10;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  auto failed = write_checkpoint(h, 5, "checkpoint: /run/LATEST: No space left on device");
  EXPECT_TRUE(has_event(failed, "checkpoint_failed"));
  for (int s = 6; s <= 10; ++s) h.step(s);
  evaluate_all(h, 10);
  auto end = all_of<finish_job>(write_checkpoint(h, 10, "No space left on device"));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::checkpoint_failed);
  EXPECT_NE(end[0].message.find("checkpoint of step 10 failed"), std::string::npos)
      << end[0].message;
  EXPECT_NE(end[0].message.find("no checkpoint was committed"), std::string::npos)
      << end[0].message;
}

TEST_P(JobLogicTest, ALaterCommittedCheckpointMakesUpForAFailedOne) {
  auto cfg = small_config(2);
  cfg.steps = 10;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  write_checkpoint(h, 5, "No space left on device");
  for (int s = 6; s <= 10; ++s) h.step(s);
  evaluate_all(h, 10);
  auto end = all_of<finish_job>(write_checkpoint(h, 10));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::done);
}

TEST_P(JobLogicTest, ExitAfterStepNeverClaimsACheckpointThatFailed) {
  auto cfg = small_config(2);
  cfg.steps = 20;
  cfg.checkpoint_every = 0;
  cfg.exit_after_step = 4;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 4; ++s) h.step(s);
  evaluate_all(h, 4);
  auto end = all_of<finish_job>(write_checkpoint(h, 4, "Read-only file system"));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::checkpoint_failed);
  EXPECT_EQ(end[0].message.find("--resume continues"), std::string::npos) << end[0].message;
  EXPECT_NE(end[0].message.find("nothing to continue from"), std::string::npos) << end[0].message;
}

// ---- a member lost while a checkpoint is being collected ---------------------------------

// Every commit of `a` asks for a checkpoint (true) or none does (false); there is at least one.
bool commits_checkpoint(const actions& a) {
  const auto commits = all_of<send_commit>(a);
  EXPECT_FALSE(commits.empty());
  bool any = false, all = true;
  for (const auto& c : commits) {
    any = any || c.msg.checkpoint;
    all = all && c.msg.checkpoint;
  }
  EXPECT_EQ(any, all) << "the ranks of one step were told different things";
  return all && !commits.empty();
}

// A shard_written of the current generation.
shard_written share_now(logic_harness& h, int64_t step, int rank, bool ok = true,
                        bool skipped = false) {
  shard_written w = share_of(step, rank, ok, skipped);
  w.generation = h.logic().generation();
  return w;
}

// dp4, checkpoint every 10: rank 2 dies after committing step 10, while the shares of
// checkpoint 10 come in. The survivors' shares are not a whole checkpoint, so it is abandoned,
// but the new generation's first committed step takes one in its place: the gap to the last
// committed checkpoint stays a few steps, not an interval of 10. No failure is recorded.
TEST_P(JobLogicTest, ALossWhileACheckpointIsCollectedTakesOneAtTheNextCommittedStep) {
  auto cfg = small_config(4);
  cfg.steps = 20;
  cfg.checkpoint_every = 10;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 10; ++s) h.step(s);
  ASSERT_TRUE(h.logic().checkpoints_in_flight());
  EXPECT_TRUE(h.logic().on_shard_written(share_of(10, 0, true, false), h.now()).empty());
  auto lost = h.lose(h.logic().member_of_rank(2), loss_cause::exit, "killed by signal 9");
  EXPECT_FALSE(has_event(lost, "checkpoint_failed")) << "nothing failed: it is made good";
  const auto* abandoned = find_event(lost, "checkpoint_abandoned");
  EXPECT_NE(abandoned, nullptr);
  if (abandoned) {
    EXPECT_EQ(std::get<events::checkpoint_abandoned>(abandoned->event).step, 10);
    EXPECT_EQ(std::get<events::checkpoint_abandoned>(abandoned->event).generation, 1u);
    EXPECT_EQ(std::get<events::checkpoint_abandoned>(abandoned->event).ranks_reported, 1);
    EXPECT_EQ(std::get<events::checkpoint_abandoned>(abandoned->event).retake_from, 10);
    EXPECT_NE(std::get<events::checkpoint_abandoned>(abandoned->event).reason.find("rank 2 lost"),
              std::string::npos)
        << events::to_json(abandoned->event).dump();
  }
  EXPECT_FALSE(h.logic().checkpoints_in_flight());
  // A survivor's share of the old generation arrives late: counted as stale, commits nothing.
  auto late = h.logic().on_shard_written(share_of(10, 1, true, false), h.now());
  EXPECT_TRUE(has_event(late, "stale_message"));
  EXPECT_TRUE(all_of<commit_checkpoint>(late).empty());

  h.report_all(10);
  h.settle_reconfigure();
  ASSERT_EQ(h.logic().state(), job_state::training);
  ASSERT_EQ(h.logic().world(), 3);
  ASSERT_EQ(h.logic().committed(), 10);
  EXPECT_TRUE(commits_checkpoint(h.step(11))) << "step 11 takes checkpoint 10's place";
  auto written = write_checkpoint(h, 11);
  const auto* saved = find_event(written, "checkpoint");
  ASSERT_NE(saved, nullptr);
  EXPECT_EQ(std::get<events::checkpoint>(saved->event).step, 11);
  EXPECT_EQ(std::get<events::checkpoint>(saved->event).replaces.value_or(-1), 10);
  EXPECT_EQ(h.logic().last_checkpoint_step(), 11);
  EXPECT_FALSE(commits_checkpoint(h.step(12))) << "one checkpoint was owed, not one per step";
  for (int s = 13; s <= 19; ++s) EXPECT_FALSE(commits_checkpoint(h.step(s))) << "step " << s;
  EXPECT_TRUE(commits_checkpoint(h.step(20)));
  evaluate_all(h, 20);
  const auto last = write_checkpoint(h, 20);
  EXPECT_FALSE(
      std::get<events::checkpoint>(find_event(last, "checkpoint")->event).replaces.has_value());
  auto end = all_of<finish_job>(last);
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::done) << end[0].message;
}

// With checkpoint_overlap skip the replacement may find a survivor still writing its share of
// the abandoned checkpoint: it is skipped, and the next committed step tries again. Nothing
// failed, so a job whose last checkpoint is skipped too ends with exit 0, not 4.
TEST_P(JobLogicTest, ALostCheckpointIsRetriedWhenItsReplacementIsSkippedAndNeverEndsWithExit4) {
  auto cfg = small_config(4);
  cfg.steps = 20;
  cfg.checkpoint_every = 10;
  cfg.checkpoint_overlap = "skip";
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 10; ++s) h.step(s);
  auto lost = h.lose(h.logic().member_of_rank(1), loss_cause::exit, "killed by signal 9");
  EXPECT_NE(find_event(lost, "checkpoint_abandoned"), nullptr);
  h.report_all(10);
  h.settle_reconfigure();
  ASSERT_EQ(h.logic().state(), job_state::training);
  EXPECT_TRUE(commits_checkpoint(h.step(11)));
  h.logic().on_shard_written(share_now(h, 11, 0), h.now());
  h.logic().on_shard_written(share_now(h, 11, 1), h.now());
  auto skipped = h.logic().on_shard_written(share_now(h, 11, 2, false, true), h.now());
  EXPECT_TRUE(has_event(skipped, "checkpoint_skipped"));
  EXPECT_TRUE(all_of<commit_checkpoint>(skipped).empty());
  EXPECT_TRUE(commits_checkpoint(h.step(12))) << "still owed: step 12 tries again";
  const auto written = write_checkpoint(h, 12);
  const auto* saved = find_event(written, "checkpoint");
  EXPECT_NE(saved, nullptr);
  if (saved) {
    EXPECT_EQ(std::get<events::checkpoint>(saved->event).replaces.value_or(-1), 10);
  }
  for (int s = 13; s <= 19; ++s) EXPECT_FALSE(commits_checkpoint(h.step(s))) << "step " << s;
  EXPECT_TRUE(commits_checkpoint(h.step(20)));
  evaluate_all(h, 20);
  h.logic().on_shard_written(share_now(h, 20, 0), h.now());
  h.logic().on_shard_written(share_now(h, 20, 1), h.now());
  auto end =
      all_of<finish_job>(h.logic().on_shard_written(share_now(h, 20, 2, false, true), h.now()));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, exit_code::done) << end[0].message;
  EXPECT_EQ(h.logic().last_checkpoint_step(), 12);
}

// No checkpoint in flight when the member is lost (the last one committed, or its manifest
// already with the committer): nothing is abandoned and no extra checkpoint is taken.
TEST_P(JobLogicTest, ALossWithNoCheckpointBeingCollectedTakesNoExtraCheckpoint) {
  auto cfg = small_config(4);
  cfg.steps = 30;
  cfg.checkpoint_every = 10;
  {
    logic_harness h(cfg);
    h.form();
    for (int s = 1; s <= 10; ++s) h.step(s);
    write_checkpoint(h, 10);
    for (int s = 11; s <= 13; ++s) h.step(s);
    auto lost = h.lose(h.logic().member_of_rank(2), loss_cause::exit, "killed by signal 9");
    EXPECT_EQ(find_event(lost, "checkpoint_abandoned"), nullptr);
    h.report_all(13);
    h.settle_reconfigure();
    ASSERT_EQ(h.logic().state(), job_state::training);
    for (int s = 14; s <= 19; ++s) EXPECT_FALSE(commits_checkpoint(h.step(s))) << "step " << s;
    EXPECT_TRUE(commits_checkpoint(h.step(20)));
  }
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 10; ++s) h.step(s);
  // Every share of checkpoint 10 is in: its manifest goes to the committer before the loss.
  actions shares;
  for (int r = 0; r < 4; ++r) {
    auto a = h.logic().on_shard_written(share_of(10, r, true, false), h.now());
    shares.insert(shares.end(), a.begin(), a.end());
  }
  const auto manifest = all_of<commit_checkpoint>(shares);
  ASSERT_EQ(manifest.size(), 1u);
  auto lost = h.lose(h.logic().member_of_rank(2), loss_cause::exit, "killed by signal 9");
  EXPECT_EQ(find_event(lost, "checkpoint_abandoned"), nullptr);
  h.report_all(10);
  h.settle_reconfigure();
  EXPECT_TRUE(
      has_event(h.logic().on_checkpoint_committed(manifest[0], "ckpt10", ""), "checkpoint"));
  EXPECT_EQ(h.logic().last_checkpoint_step(), 10);
  for (int s = 11; s <= 19; ++s) EXPECT_FALSE(commits_checkpoint(h.step(s))) << "step " << s;
}

// A rank had already failed to write its share when the generation ended: that is a real
// failure, reported as one; the loss does not turn it into an abandoned checkpoint.
TEST_P(JobLogicTest, AShareThatFailedBeforeTheLossStaysAFailedCheckpoint) {
  auto cfg = small_config(4);
  cfg.steps = 30;
  cfg.checkpoint_every = 10;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 10; ++s) h.step(s);
  auto full = share_of(10, 0, false, false);
  full.error = "No space left on device";
  h.logic().on_shard_written(full, h.now());
  auto lost = h.lose(h.logic().member_of_rank(2), loss_cause::exit, "killed by signal 9");
  EXPECT_EQ(find_event(lost, "checkpoint_abandoned"), nullptr);
  const auto* failed = find_event(lost, "checkpoint_failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_EQ(std::get<events::checkpoint_failed>(failed->event).step, 10);
  EXPECT_NE(std::get<events::checkpoint_failed>(failed->event).error.find("No space left"),
            std::string::npos)
      << events::to_json(failed->event).dump();
  h.report_all(10);
  h.settle_reconfigure();
  for (int s = 11; s <= 19; ++s) EXPECT_FALSE(commits_checkpoint(h.step(s))) << "step " << s;
  EXPECT_TRUE(commits_checkpoint(h.step(20)));
}

// A pipeline stage without a replica is lost while checkpoint 10 is collected: every rank
// goes back to checkpoint 5 and replays. The replay reaches step 10 again, which takes the
// abandoned checkpoint's place; the replayed steps before it take none.
TEST_P(JobLogicTest, AReplayAfterALossRetakesTheAbandonedCheckpointAtItsOwnStep) {
  auto cfg = small_config(2);
  cfg.parallel.pp = 2;
  cfg.parallel.micro_batches = 4;
  cfg.steps = 30;
  logic_harness h(cfg);
  h.form();
  for (int s = 1; s <= 5; ++s) h.step(s);
  write_checkpoint(h, 5);
  for (int s = 6; s <= 10; ++s) h.step(s);
  auto lost = h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
  ASSERT_NE(find_event(lost, "checkpoint_abandoned"), nullptr);
  auto rc = all_of<send_reconfigure>(h.report_all(10));
  ASSERT_EQ(rc.size(), 1u);
  ASSERT_EQ(rc[0].msg.start_step, 5);
  h.settle_reconfigure();
  ASSERT_EQ(h.logic().state(), job_state::training);
  for (int s = 6; s <= 9; ++s) EXPECT_FALSE(commits_checkpoint(h.step(s))) << "step " << s;
  EXPECT_TRUE(commits_checkpoint(h.step(10)));
  const auto written = write_checkpoint(h, 10);
  const auto* saved = find_event(written, "checkpoint");
  ASSERT_NE(saved, nullptr);
  EXPECT_EQ(std::get<events::checkpoint>(saved->event).replaces.value_or(-1), 10);
  EXPECT_FALSE(commits_checkpoint(h.step(11)));
}

// Agents restart crashed workers (max_restarts 2); a recovery waits up to 1 s for them.
logic_harness with_restarts(int world) {
  return logic_harness(small_config(world), 0, 0, 1, "warn", [](job_params& p) {
    p.max_restarts = 2;
    p.replacement_wait = 1000ms;
  });
}

TEST_P(JobLogicTest, CrashedWorkerBeingRestartedTakesItsOldPlaceInOneGeneration) {
  auto h = with_restarts(4);
  h.form();
  for (int s = 1; s <= 3; ++s) h.step(s);
  const int32_t victim = h.logic().member_of_rank(2);
  h.lose(victim, loss_cause::exit, "killed by signal 9");
  h.advance(20ms);
  auto held = h.report_all(3);
  EXPECT_TRUE(all_of<send_reconfigure>(held).empty()) << "the plan waits for the restart";
  ASSERT_TRUE(find_event(held, "replacement_wait"));
  EXPECT_EQ(std::get<events::replacement_wait>(find_event(held, "replacement_wait")->event).workers,
            1);
  h.advance(50ms);
  EXPECT_TRUE(all_of<send_reconfigure>(h.logic().on_tick(h.now())).empty());
  auto planned = h.join(victim);  // the agent's restart of the same member
  auto rc = all_of<send_reconfigure>(planned);
  ASSERT_EQ(rc.size(), 4u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.world, 4) << "no shrink: one generation, the old layout";
    EXPECT_EQ(r.msg.start_step, 3);
    if (r.member == victim) {
      EXPECT_EQ(r.msg.source, state_source::peer) << "the newcomer's state comes from a peer";
    }
  }
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_EQ(h.logic().generation(), 2u);
  EXPECT_EQ(all_of<send_commit>(h.step(4)).size(), 4u);
}

TEST_P(JobLogicTest, RestartThatDoesNotComeInTimeShrinksAndIsGrownLater) {
  auto h = with_restarts(4);
  h.form();
  h.step(1);
  h.lose(h.logic().member_of_rank(1), loss_cause::connection, "closed");
  EXPECT_TRUE(all_of<send_reconfigure>(h.report_all(1)).empty());
  h.advance(999ms);
  EXPECT_TRUE(all_of<send_reconfigure>(h.logic().on_tick(h.now())).empty());
  h.advance(2ms);
  auto rc = all_of<send_reconfigure>(h.tick());
  ASSERT_EQ(rc.size(), 3u) << "after replacement_wait the job goes on without it";
  EXPECT_EQ(rc[0].msg.world, 3);
  h.settle_reconfigure();
  h.join(1);  // the restart arrives late: admitted by a grow at the next step boundary
  h.step(2);
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  auto reported = h.report_all(2);
  auto grown = all_of<send_reconfigure>(reported);
  ASSERT_EQ(grown.size(), 4u);
  EXPECT_EQ(grown[0].msg.world, 4);
}

TEST_P(JobLogicTest, NoWaitWithoutRestartsOrWhenItsAgentIsGone) {
  {  // hangs are not restarted by an agent: the plan does not wait
    auto h = with_restarts(4);
    h.form();
    h.step(1);
    h.lose(h.logic().member_of_rank(3), loss_cause::hang, "silent");
    EXPECT_EQ(all_of<send_reconfigure>(h.report_all(1)).size(), 3u);
  }
  {  // the agent died with its worker (node loss): nobody will restart it
    auto h = with_restarts(4);
    h.form();
    h.step(1);
    h.lose(h.logic().member_of_rank(0), loss_cause::exit, "killed");
    EXPECT_TRUE(all_of<send_reconfigure>(h.report_all(1)).empty());
    auto rc = all_of<send_reconfigure>(h.logic().on_agent_lost(0, "test", h.now()));
    ASSERT_EQ(rc.size(), 3u);
    EXPECT_EQ(rc[0].msg.world, 3);
  }
  {  // the budget is spent: the third crash on the node is not waited for
    auto h = with_restarts(4);
    h.form();
    int64_t step = 1;
    for (int crash = 0; crash < 3; ++crash) {
      h.step(step);
      const int32_t victim = h.logic().member_of_rank(1);
      h.lose(victim, loss_cause::exit, "killed");
      auto rc = all_of<send_reconfigure>(h.report_all(step));
      if (crash < 2) {
        EXPECT_TRUE(rc.empty()) << "crash " << crash;
        rc = all_of<send_reconfigure>(h.join(victim));
        ASSERT_EQ(rc.size(), 4u) << "crash " << crash;
      } else {
        ASSERT_EQ(rc.size(), 3u) << "the agent has no restart left";
      }
      h.settle_reconfigure();
      ++step;
    }
  }
  {  // an idle spare takes the place at once; the restarted worker becomes the next spare
    logic_harness h(small_config(4), /*spares=*/1, 0, 1, "warn", [](job_params& p) {
      p.max_restarts = 2;
      p.replacement_wait = 1000ms;
    });
    h.set_spares(1);
    h.form();
    h.step(1);
    h.lose(h.logic().member_of_rank(2), loss_cause::exit, "killed");
    const auto rc = all_of<send_reconfigure>(h.report_all(1));
    ASSERT_EQ(rc.size(), 4u) << "no replacement_wait while a spare is idle";
    EXPECT_EQ(rc[0].msg.world, 4);
  }
}

// The members' hello says where each runs and what transport it asked for; when every placed
// rank is on one host and none asked for tcp, the reconfigures say so (one_host).
TEST(JobLogicTransportTest, ReconfiguresSayWhenEveryRankIsOnOneHostAndNoneAskedForTcp) {
  const auto formed_with = [](const std::vector<std::string>& transports) {
    logic_harness h(small_config(static_cast<int>(transports.size())));
    actions out;
    for (size_t m = 0; m < transports.size(); ++m) {
      hello x;
      x.member = static_cast<int32_t>(m);
      x.host = "test";
      x.transport = transports[m];
      welcome w;
      auto a = h.logic().on_member_joined(x, h.now(), w);
      out.insert(out.end(), a.begin(), a.end());
    }
    const auto rc = all_of<send_reconfigure>(out);
    EXPECT_EQ(rc.size(), transports.size());
    bool all = !rc.empty(), any = false;
    for (const auto& r : rc) {
      all = all && r.msg.one_host;
      any = any || r.msg.one_host;
    }
    EXPECT_EQ(all, any) << "every member must be told the same";
    return all;
  };
  EXPECT_TRUE(formed_with({"auto\nhost-a boot-1", "auto\nhost-a boot-1"}));
  EXPECT_TRUE(formed_with({"shm\nhost-a boot-1", "auto\nhost-a boot-1"}));
  EXPECT_FALSE(formed_with({"auto\nhost-a boot-1", "tcp\nhost-a boot-1"}));
  EXPECT_FALSE(formed_with({"auto\nhost-a boot-1 node 0", "auto\nhost-a boot-1 node 1"}));
  EXPECT_FALSE(formed_with({"auto\nhost-a boot-1", ""})) << "a member that said nothing";
  EXPECT_FALSE(formed_with({"bogus\nhost-a boot-1", "bogus\nhost-a boot-1"}));
}

// Each generation's transport event names what comm::choose_transport picks from the hellos
// of its ranks: the backend the group's rank 0 decides on, from the same inputs.
TEST(JobLogicTransportTest, EachGenerationSaysTheTransportItsRanksPick) {
  const auto said = [](const std::vector<std::string>& transports) {
    logic_harness h(small_config(static_cast<int>(transports.size())));
    for (size_t m = 0; m < transports.size(); ++m) {
      h.transport = transports[m];
      h.join(static_cast<int32_t>(m));
    }
    const auto formed = h.settle_reconfigure();
    const auto* e = find_event(formed, "transport");
    EXPECT_NE(e, nullptr);
    return e ? std::get<events::transport>(e->event) : events::transport{};
  };
  auto t = said({"auto\nhost-a boot-1", "auto\nhost-a boot-1"});
  EXPECT_EQ(t.generation, 1u);
  EXPECT_EQ(t.backend, "shm");
  EXPECT_EQ(t.world, 2);
  EXPECT_EQ(t.nodes, 1);
  EXPECT_EQ(t.ranks_per_node, 2);
  EXPECT_FALSE(t.shrunk);
  EXPECT_EQ(said({"auto\nhost-a boot-1", "tcp\nhost-a boot-1"}).backend, "tcp");
  t = said({"auto\nhost-a boot-1", "auto\nhost-b boot-2"});
  EXPECT_EQ(t.backend, "tcp") << "one rank per node: a plain network group";
  EXPECT_EQ(t.nodes, 2);
  EXPECT_EQ(t.ranks_per_node, 1);
  t = said(
      {"auto\nhost-a boot-1", "auto\nhost-a boot-1", "auto\nhost-b boot-2", "auto\nhost-b boot-2"});
  EXPECT_EQ(t.backend, "hierarchical");
  EXPECT_EQ(t.nodes, 2);
  EXPECT_EQ(t.ranks_per_node, 2);
  EXPECT_EQ(said({"shm\nhost-a boot-1", "auto\nhost-b boot-2"}).backend, "invalid");
}

// A harness whose logic sends the plan with the aborts wherever it may.
logic_harness planning_with_aborts(train_config cfg) {
  return logic_harness(std::move(cfg), 0, 0, 1, "warn",
                       [](job_params& p) { p.plan_with_abort = true; });
}

TEST(JobLogicPlanWithAbortTest, ALossInTrainingSendsEachMembersPlaceWithItsAbort) {
  auto h = planning_with_aborts(small_config(4));
  h.form();
  for (int s = 1; s <= 3; ++s) h.step(s);
  const int32_t victim = h.logic().member_of_rank(2);
  auto a = h.lose(victim, loss_cause::exit, "killed by signal 9");
  EXPECT_TRUE(all_of<send_reconfigure>(a).empty()) << "the plan travels inside the aborts";
  const auto aborts = all_of<send_abort>(a);
  ASSERT_EQ(aborts.size(), 3u);
  std::set<int32_t> ranks;
  for (const auto& x : aborts) {
    ASSERT_EQ(x.msg.then.size(), 1u);
    const reconfigure& r = x.msg.then.front();
    EXPECT_EQ(r.generation, 2u);
    EXPECT_EQ(r.world, 3);
    EXPECT_EQ(r.source, state_source::self);
    EXPECT_EQ(r.start_step, 3);
    ranks.insert(r.rank);
  }
  EXPECT_EQ(ranks, (std::set<int32_t>{0, 1, 2}));
  // A report that comes anyway (from a member that missed nothing) changes nothing.
  state_report late;
  late.generation = 2;
  late.member = aborts[0].member;
  late.held_generation = 1;
  late.held_step = 3;
  EXPECT_TRUE(h.logic().on_state_report(late, h.now()).empty());
  h.advance(30ms);
  auto done = h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  const auto* gen = find_event(done, "generation");
  ASSERT_NE(gen, nullptr);
  EXPECT_EQ(std::get<events::generation>(gen->event).planned_with_abort, true);
  EXPECT_EQ(std::get<events::generation>(gen->event).world, 3);
  EXPECT_EQ(all_of<send_commit>(h.step(4)).size(), 3u);
}

// The plan assumed every survivor holds the last committed step; one that does not (the abort
// broke its apply) fails its reconfigure, and the next generation asks everyone.
TEST(JobLogicPlanWithAbortTest, AMemberThatDoesNotHoldWhatThePlanAssumedBringsTheReportRound) {
  auto h = planning_with_aborts(small_config(4));
  h.form();
  for (int s = 1; s <= 3; ++s) h.step(s);
  h.lose(h.logic().member_of_rank(3), loss_cause::exit, "killed by signal 9");
  ASSERT_EQ(h.logic().generation(), 2u);
  reconfigured failed;
  failed.generation = 2;
  failed.member = h.logic().member_of_rank(1);
  failed.rank = 1;
  failed.ok = false;
  failed.error = "asked to keep a state this process does not hold (step -1, wanted 3)";
  auto again = h.logic().on_reconfigured(failed, h.now());
  EXPECT_EQ(h.logic().generation(), 3u);
  EXPECT_EQ(h.logic().state(), job_state::recovering);
  const auto aborts = all_of<send_abort>(again);
  ASSERT_EQ(aborts.size(), 3u);
  for (const auto& x : aborts)
    EXPECT_TRUE(x.msg.then.empty()) << "what the members hold is no longer known";
  // Members 0 and 2 kept step 3; the one whose apply broke holds nothing usable.
  std::vector<send_reconfigure> rc;
  for (const auto& m : h.logic().members()) {
    if (!m.live) continue;
    state_report r;
    r.generation = 3;
    r.member = m.id;
    if (m.id != failed.member) {
      r.held_generation = 1;
      r.held_rank = m.id;  // form() placed member m at rank m
      r.held_step = 3;
    }
    for (const auto& x : all_of<send_reconfigure>(h.logic().on_state_report(r, h.now())))
      rc.push_back(x);
  }
  ASSERT_EQ(rc.size(), 3u);
  for (const auto& r : rc) {
    EXPECT_EQ(r.msg.start_step, 3);
    if (r.member == failed.member)
      EXPECT_EQ(r.msg.source, state_source::peer) << "it gets the state from a replica";
    else
      EXPECT_EQ(r.msg.source, state_source::self);
  }
}

// On one host, plain data parallelism: the ranks left keep their group of before, shrunk, and
// each reconfigure names the old rank of every new one.
TEST(JobLogicPlanWithAbortTest, ALossOnOneHostShrinksTheGroupOfBefore) {
  const auto shrink_after_loss = [](const std::string& transport, int spares,
                                    const std::function<void(job_params&)>& tweak) {
    logic_harness h(small_config(4), spares, 0, 1, "warn", [&](job_params& p) {
      p.plan_with_abort = true;
      if (tweak) tweak(p);
    });
    SCOPED_TRACE(transport + ", spares " + std::to_string(spares));
    h.transport = transport;
    h.form();
    for (int s = 1; s <= 3; ++s) h.step(s);
    auto a = h.lose(h.logic().member_of_rank(1), loss_cause::exit, "killed by signal 9");
    std::map<int32_t, reconfigure> by_rank;
    for (const auto& x : all_of<send_abort>(a))
      for (const auto& r : x.msg.then) by_rank[r.rank] = r;
    h.advance(30ms);
    const auto formed = h.settle_reconfigure();
    const auto* gen = find_event(formed, "generation");
    std::vector<int32_t> kept;
    if (!by_rank.empty()) kept = by_rank.begin()->second.shrink_kept;
    for (const auto& [rank, r] : by_rank) {
      if (rank < 0) continue;
      EXPECT_EQ(r.shrink_kept, kept) << "every rank is told the same";
      EXPECT_EQ(r.shrink_from, kept.empty() ? 0u : 1u);
    }
    if (gen) {
      EXPECT_EQ(std::get<events::generation>(gen->event).shrunk, !kept.empty());
    }
    if (!kept.empty()) {
      EXPECT_NE(gen, nullptr) << "the shrunk generation forms at once";
    }
    return kept;
  };
  const std::string here = "auto\nhost-a boot-1";
  EXPECT_EQ(shrink_after_loss(here, 0, {}), (std::vector<int32_t>{0, 2, 3}));
  // Not on shared memory (a member asked for tcp), not asked for, or a spare that takes the
  // lost rank's place with a peer's state: a new group is connected.
  EXPECT_TRUE(shrink_after_loss("tcp\nhost-a boot-1", 0, {}).empty());
  EXPECT_TRUE(shrink_after_loss(here, 0, [](job_params& p) { p.shrink_groups = false; }).empty());
  EXPECT_TRUE(shrink_after_loss(here, 1, {}).empty());
}

TEST(JobLogicPlanWithAbortTest, RecoveriesThatCannotKnowWhatMembersHoldAskForReports) {
  {  // a second loss while a generation forms
    auto h = planning_with_aborts(small_config(4));
    h.form();
    h.step(1);
    h.lose(h.logic().member_of_rank(1), loss_cause::exit, "gone");
    auto a = h.lose(3, loss_cause::exit, "gone too");
    ASSERT_EQ(h.logic().generation(), 3u);
    for (const auto& x : all_of<send_abort>(a)) EXPECT_TRUE(x.msg.then.empty());
  }
  {  // a rollback after a divergence
    auto cfg = small_config(2);
    cfg.on_divergence = "rollback";
    auto h = planning_with_aborts(cfg);
    h.form();
    for (int s = 1; s <= 5; ++s) h.step(s);
    write_checkpoint(h, 5);
    auto a = vote_all(h, 6, std::nan(""));
    ASSERT_EQ(all_of<send_abort>(a).size(), 2u);
    for (const auto& x : all_of<send_abort>(a)) EXPECT_TRUE(x.msg.then.empty());
  }
  // Layouts whose update is a collective, which the abort may have broken in some rank.
  const auto pipeline = [] {
    auto cfg = small_config(4);
    cfg.parallel.pp = 2;
    cfg.parallel.micro_batches = 4;
    return cfg;
  };
  const auto zero = [] {
    auto cfg = small_config(4);
    cfg.parallel.zero = 1;
    return cfg;
  };
  for (const auto& cfg : {pipeline(), zero()}) {
    auto h = planning_with_aborts(cfg);
    h.form();
    h.step(1);
    auto a = h.lose(h.logic().member_of_rank(3), loss_cause::exit, "killed by signal 9");
    ASSERT_EQ(all_of<send_abort>(a).size(), 3u);
    for (const auto& x : all_of<send_abort>(a))
      EXPECT_TRUE(x.msg.then.empty()) << "pp " << cfg.parallel.pp << ", zero " << cfg.parallel.zero;
  }
  {  // a restarted worker to wait for
    auto h = logic_harness(small_config(4), 0, 0, 1, "warn", [](job_params& p) {
      p.plan_with_abort = true;
      p.max_restarts = 2;
      p.replacement_wait = 1000ms;
    });
    h.form();
    h.step(1);
    auto a = h.lose(h.logic().member_of_rank(2), loss_cause::exit, "killed by signal 9");
    ASSERT_EQ(all_of<send_abort>(a).size(), 3u);
    for (const auto& x : all_of<send_abort>(a)) EXPECT_TRUE(x.msg.then.empty());
  }
}

// A node cut off from the coordinator (issue 25): its two members fall silent together, are
// lost at the heartbeat timeout, and the job goes on without them. When the link heals, what
// they sent meanwhile arrives: votes, shares of a checkpoint, a validation share, a report and
// an acknowledgement of generations the job has left, and heartbeats. Each is counted as
// stale and changes nothing; a heartbeat is answered with a final abort. The node's workers
// come back only as new processes, admitted as new members by a grow.
TEST_P(JobLogicTest, APartitionedNodeIsLostAndNothingItSaysAfterTheHealCounts) {
  auto cfg = small_config(4);
  logic_harness h(cfg, 0, /*max_ranks=*/4);
  for (int32_t m = 0; m < 4; ++m) h.join(m, nullptr, /*node=*/m / 2);
  h.settle_reconfigure();
  ASSERT_EQ(h.logic().state(), job_state::training);
  for (int64_t s = 1; s <= 3; ++s) h.step(s);
  ASSERT_EQ(h.logic().committed(), 3);
  const uint64_t before = h.logic().generation();
  std::map<int32_t, int32_t> rank_of;  // in the generation the cut interrupts
  for (const auto& m : h.logic().members()) rank_of[m.id] = m.rank;
  // Member 3's last heartbeat came a little before member 2's.
  h.advance(100ms);
  for (int32_t m : {0, 1, 2}) h.logic().on_heartbeat(heartbeat{m, before, 3}, h.now());
  const auto cut = h.now();

  // The cut: members 2 and 3 (node 1) fall silent; members 0 and 1 beat on. Both are lost at
  // the heartbeat timeout, not earlier, and the job does not end.
  std::set<int32_t> lost;
  actions after_cut;
  for (int i = 0; i < 40 && lost.size() < 2; ++i) {
    h.advance(100ms);
    for (int32_t m : {0, 1})
      h.logic().on_heartbeat(heartbeat{m, h.logic().generation(), 3}, h.now());
    auto a = h.tick();
    after_cut.insert(after_cut.end(), a.begin(), a.end());
    for (const auto& e : all_of<emit_event>(a)) {
      if (events::kind(e.event) != "rank_lost") continue;
      EXPECT_EQ(std::get<events::rank_lost>(e.event).cause, "hang");
      EXPECT_EQ(std::get<events::rank_lost>(e.event).node, 1);
      EXPECT_GE(h.now() - cut, 2000ms - 100ms) << "lost before the heartbeat timeout";
      lost.insert(std::get<events::rank_lost>(e.event).member);
    }
  }
  ASSERT_EQ(lost, (std::set<int32_t>{2, 3}));
  EXPECT_TRUE(all_of<finish_job>(after_cut).empty());
  EXPECT_TRUE(all_of<send_commit>(after_cut).empty());
  // The survivors report what they hold (the generation being formed began during another
  // recovery, so it asks them), and form it.
  ASSERT_EQ(h.logic().state(), job_state::recovering);
  actions formed;
  for (int32_t m : {0, 1}) {
    state_report r;
    r.generation = h.logic().generation();
    r.member = m;
    r.held_generation = before;
    r.held_rank = rank_of[m];
    r.held_step = 3;
    auto a = h.logic().on_state_report(r, h.now());
    formed.insert(formed.end(), a.begin(), a.end());
  }
  const auto shrink = all_of<send_reconfigure>(formed);
  ASSERT_EQ(shrink.size(), 2u);
  for (const auto& rc : shrink) {
    EXPECT_LT(rc.member, 2);
    reconfigured done;
    done.generation = rc.msg.generation;
    done.member = rc.member;
    done.rank = rc.msg.rank;
    h.logic().on_reconfigured(done, h.now());
  }
  ASSERT_EQ(h.logic().state(), job_state::training);
  ASSERT_EQ(h.logic().world(), 2) << "the job goes on on node 0";
  const uint64_t now_gen = h.logic().generation();
  ASSERT_GT(now_gen, before);
  h.step(4);
  ASSERT_EQ(h.logic().committed(), 4);

  // The heal: everything the cut-off members sent arrives late, for generations the job left.
  const uint64_t stale_before = h.logic().stale_messages();
  std::vector<actions> late;
  for (int32_t rank : {2, 3}) {
    step_done v;
    v.generation = before;
    v.step = 4;
    v.rank = rank;
    v.loss_sum = 4.0;
    v.tokens = 2;
    late.push_back(h.logic().on_vote(v, h.now()));
    step_done next = v;
    next.step = 5;  // a vote for the step the live ranks train now
    late.push_back(h.logic().on_vote(next, h.now()));
    shard_written w;
    w.generation = before;
    w.step = 5;
    w.rank = rank;
    w.pieces_json = "[]";
    late.push_back(h.logic().on_shard_written(w, h.now()));
    late.push_back(h.logic().on_eval_done(eval_done{before, 5, rank, 1.0, 1}, h.now()));
  }
  for (int32_t member : {2, 3}) {
    state_report r;
    r.generation = before + 1;  // the abort of the first loss may have reached them
    r.member = member;
    r.held_generation = before;
    r.held_rank = member;
    r.held_step = 3;
    late.push_back(h.logic().on_state_report(r, h.now()));
    reconfigured done;
    done.generation = before + 1;
    done.member = member;
    done.rank = member;
    late.push_back(h.logic().on_reconfigured(done, h.now()));
  }
  size_t count = 0;
  for (const auto& a : late) {
    ++count;
    EXPECT_TRUE(has_event(a, "stale_message")) << "message " << count;
    EXPECT_TRUE(all_of<send_commit>(a).empty()) << "message " << count << " committed a step";
    EXPECT_TRUE(all_of<commit_checkpoint>(a).empty()) << "message " << count;
    EXPECT_TRUE(all_of<send_reconfigure>(a).empty() && all_of<send_abort>(a).empty())
        << "message " << count << " opened a generation";
  }
  auto beat = h.logic().on_heartbeat(heartbeat{2, before, 3}, h.now());
  EXPECT_TRUE(has_event(beat, "stale_message"));
  const auto go = all_of<send_abort>(beat);
  ASSERT_EQ(go.size(), 1u);
  EXPECT_EQ(go[0].member, 2);
  EXPECT_TRUE(go[0].msg.final) << "an evicted member is told to go";
  EXPECT_EQ(h.logic().stale_messages(), stale_before + late.size() + 1);
  EXPECT_EQ(h.logic().generation(), now_gen);
  EXPECT_EQ(h.logic().committed(), 4);
  EXPECT_EQ(h.logic().world(), 2);

  // New processes on node 1 join as new members and are admitted by a grow at a step
  // boundary: they hold nothing, so their state comes from the ranks that have it.
  h.join(2, nullptr, 1);
  h.join(3, nullptr, 1);
  EXPECT_EQ(h.logic().state(), job_state::training);
  auto boundary = h.step(5);
  ASSERT_EQ(h.logic().committed(), 5);
  ASSERT_EQ(h.logic().state(), job_state::recovering) << "a grow at the step boundary";
  std::vector<reconfigure> placed;
  for (const auto& a : all_of<send_abort>(boundary))
    for (const auto& r : a.msg.then) placed.push_back(r);
  if (placed.empty()) {  // the report round: the old members hold their state, the new nothing
    for (const auto& m : h.logic().members()) {
      if (!m.live) continue;
      state_report r;
      r.generation = h.logic().generation();
      r.member = m.id;
      if (m.id < 2) {
        r.held_generation = now_gen;
        r.held_rank = m.rank;
        r.held_step = 5;
      }
      for (const auto& rc : all_of<send_reconfigure>(h.logic().on_state_report(r, h.now())))
        placed.push_back(rc.msg);
    }
  }
  ASSERT_EQ(placed.size(), 4u);
  for (const auto& r : placed) {
    EXPECT_GT(r.generation, now_gen);
    EXPECT_EQ(r.world, 4);
    EXPECT_EQ(r.start_step, 5);
    if (r.member >= 2) {
      EXPECT_EQ(r.source, state_source::peer) << "member " << r.member << " holds nothing";
    } else {
      EXPECT_EQ(r.source, state_source::self);
    }
  }
}

// The decisions the actor used to make: whose exit loses a member, and whom a fault hits.
TEST(JobLogicMovedDecisionsTest, AWorkerExitLosesItsMemberOnlyForItsCurrentProcess) {
  logic_harness h(small_config(2));
  h.form();
  const int32_t member = h.logic().member_of_rank(1);
  worker_exited earlier;
  earlier.member = member;
  earlier.pid = 55;  // a process of the member before it was restarted
  earlier.exit_code = 1;
  auto a = h.logic().on_worker_exited(earlier, h.now());
  EXPECT_EQ(event_names(a), std::vector<std::string>{"worker_exited"});
  EXPECT_EQ(h.logic().state(), job_state::training);

  worker_exited w;
  w.member = member;
  w.pid = 1000 + member;  // the harness's pid of the member's process
  w.signal = 9;
  a = h.logic().on_worker_exited(w, h.now());
  const auto names = event_names(a);
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "worker_exited");
  EXPECT_EQ(names[1], "rank_lost");
  for (const auto& e : all_of<emit_event>(a)) {
    if (events::kind(e.event) != "rank_lost") continue;
    EXPECT_EQ(std::get<events::rank_lost>(e.event).reason,
              "process " + std::to_string(w.pid) + " killed by signal 9");
  }
  EXPECT_EQ(h.logic().state(), job_state::recovering);
}

TEST(JobLogicMovedDecisionsTest, AFaultHitsTheProcessThatHoldsItsRankNow) {
  logic_harness h(small_config(4));
  h.form();
  chaos::fault f;
  f.target = chaos::fault_target::rank;
  f.id = 3;
  EXPECT_EQ(h.logic().fault_victims(f), std::vector<int32_t>{1000 + h.logic().member_of_rank(3)});
  h.lose(h.logic().member_of_rank(0), loss_cause::exit, "killed");
  h.report_all(0);
  h.settle_reconfigure();
  ASSERT_EQ(h.logic().world(), 3);
  // Rank 3 is gone from the shrunken world: a schedule drawn for 4 ranks hits rank 0.
  EXPECT_EQ(h.logic().fault_victims(f), std::vector<int32_t>{1000 + h.logic().member_of_rank(0)});
}

TEST(JobLogicMovedDecisionsTest, AnAgentLostIsLoggedUntilTheJobEnds) {
  logic_harness h(small_config(2));
  h.form();
  auto a = h.logic().on_agent_lost(0, "connection closed", h.now());
  ASSERT_EQ(event_names(a), std::vector<std::string>{"agent_lost"});
  EXPECT_EQ(std::get<events::agent_lost>(all_of<emit_event>(a)[0].event).reason,
            "connection closed");
  h.logic().on_shutdown(h.now());
  h.advance(20s);
  h.tick();
  ASSERT_NE(h.logic().state(), job_state::training);
  EXPECT_TRUE(h.logic().on_agent_lost(0, "connection closed", h.now()).empty());
}

// The coordinator itself was stopped (SIGSTOP, a stalled VM) for longer than the heartbeat
// timeout: when it runs again, every member's last beat looks old because the coordinator read
// nothing meanwhile. The late tick shows the stall; nobody is evicted, and the clocks restart,
// so a member that really stays silent is still lost one timeout later.
TEST(JobLogicStallTest, ACoordinatorStallRestartsTheHeartbeatClocksInsteadOfEvicting) {
  logic_harness h(small_config(2), 0, 0, 1, "warn",
                  [](job_params& p) { p.stall_gap = p.heartbeat_timeout / 2; });
  h.form();
  h.step(1);
  for (int i = 0; i < 5; ++i) {
    h.advance(100ms);
    for (int32_t m : {0, 1}) h.logic().on_heartbeat(heartbeat{m, 1, 1}, h.now());
    ASSERT_TRUE(all_of<finish_job>(h.tick()).empty());
  }
  EXPECT_EQ(h.logic().take_stall(), 0ms);
  h.advance(2500ms);  // stopped: no tick ran, no beat was read
  auto a = h.tick();
  EXPECT_FALSE(has_event(a, "rank_lost"));
  EXPECT_TRUE(all_of<send_abort>(a).empty());
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_EQ(h.logic().take_stall(), 2500ms);
  EXPECT_EQ(h.logic().take_stall(), 0ms) << "taken once";
  // Member 0 beats again; member 1 stays silent and is lost a full timeout after the stall.
  for (int i = 1; i <= 30; ++i) {
    h.advance(100ms);
    h.logic().on_heartbeat(heartbeat{0, 1, 1}, h.now());
    a = h.tick();
    if (has_event(a, "rank_lost")) {
      EXPECT_GT(i, 20) << "lost before a fresh timeout passed";
      EXPECT_EQ(h.logic().state(), job_state::recovering);
      return;
    }
  }
  FAIL() << "a member silent after the stall was never lost";
}

// Without stall detection (the logic's default) the same gap evicts both members: what the
// detection changes.
TEST(JobLogicStallTest, WithoutStallDetectionTheSameGapIsAHang) {
  logic_harness h(small_config(2), 0, 0, /*min_ranks=*/1);
  h.form();
  h.step(1);
  h.advance(100ms);
  h.tick();
  h.advance(2500ms);
  EXPECT_TRUE(has_event(h.tick(), "rank_lost"));
}

worker_exited killed_before_joining(int32_t member, int32_t pid) {
  worker_exited w;
  w.member = member;
  w.pid = pid;
  w.signal = 9;
  return w;
}

// A first worker killed before its hello: the job forms without it once the others joined,
// on a world the planner fits to them, and says so in the generation's reason.
TEST(JobLogicFormingTest, AWorkerDeadBeforeJoiningIsLeftOutWhileMinRanksAllows) {
  logic_harness h(small_config(2));
  h.join(0);
  auto a = h.exited(killed_before_joining(1, 77));
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  const auto rc = all_of<send_reconfigure>(a);
  ASSERT_EQ(rc.size(), 1u);
  EXPECT_EQ(rc[0].member, 0);
  EXPECT_EQ(rc[0].msg.world, 1);
  EXPECT_NE(rc[0].msg.reason.find("without member 1"), std::string::npos) << rc[0].msg.reason;
  EXPECT_NE(rc[0].msg.reason.find("killed by signal 9"), std::string::npos) << rc[0].msg.reason;
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_EQ(h.logic().world(), 1);
}

// The same death reported before the others joined: forming waits for them, then goes on
// with the world the planner fits to those who came (4 asked, 3 came: 3 ranks, the replicas
// sharing the micro-batches unevenly).
TEST(JobLogicFormingTest, AnEarlyDeathWaitsForTheOthersThenFormsWithoutIt) {
  logic_harness h(small_config(4));
  auto a = h.exited(killed_before_joining(3, 77));
  EXPECT_TRUE(all_of<send_reconfigure>(a).empty());
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  EXPECT_TRUE(all_of<send_reconfigure>(h.join(0)).empty());
  EXPECT_TRUE(all_of<send_reconfigure>(h.join(1)).empty());
  a = h.join(2);
  ASSERT_EQ(all_of<send_reconfigure>(a).size(), 3u);
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_EQ(h.logic().world(), 3);
}

// Too few can still join for --min-ranks: the job fails at once, naming the member, how it
// ended and what to do, instead of waiting for the join deadline.
TEST(JobLogicFormingTest, BelowMinRanksTheJobFailsAtOnceNamingTheMissingMember) {
  logic_harness h(small_config(2), 0, 0, /*min_ranks=*/2);
  h.join(0);
  auto end = all_of<finish_job>(h.exited(killed_before_joining(1, 77)));
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 1);
  for (const char* words :
       {"member 1", "process 77 was killed by signal 9", "--min-ranks 2", "--max-restarts"})
    EXPECT_NE(end[0].message.find(words), std::string::npos) << words << ": " << end[0].message;
  EXPECT_EQ(h.logic().state(), job_state::failed);
}

// With restarts left, the member's agent starts it again: the job waits for the restart (it
// joins like the others); once the agent's restarts are spent, the next death leaves it out.
TEST(JobLogicFormingTest, WithRestartsLeftTheJobWaitsForTheRestartedWorker) {
  logic_harness h(small_config(4), 0, 0, 1, "warn", [](job_params& p) { p.max_restarts = 1; });
  launch_plan plan;
  agent_hello agent;
  agent.pid = 500;
  h.logic().on_agent_joined(agent, plan);
  ASSERT_EQ(plan.members, (std::vector<int32_t>{0, 1, 2, 3}));
  for (int32_t m : {0, 1, 2}) h.join(m);
  auto a = h.exited(killed_before_joining(3, 77));
  EXPECT_TRUE(all_of<send_reconfigure>(a).empty()) << "formed without the worker being restarted";
  EXPECT_TRUE(all_of<finish_job>(a).empty());
  // The restart dies too, and the agent has no restart left: the job forms without it.
  a = h.exited(killed_before_joining(3, 78));
  EXPECT_EQ(all_of<send_reconfigure>(a).size(), 3u);
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().state(), job_state::training);
  EXPECT_EQ(h.logic().world(), 3);
}

TEST(JobLogicFormingTest, ARestartedWorkerThatJoinsFormsTheFullWorld) {
  logic_harness h(small_config(2), 0, 0, 1, "warn", [](job_params& p) { p.max_restarts = 2; });
  launch_plan plan;
  h.logic().on_agent_joined(agent_hello{}, plan);
  h.join(0);
  EXPECT_TRUE(all_of<send_reconfigure>(h.exited(killed_before_joining(1, 77))).empty());
  EXPECT_EQ(all_of<send_reconfigure>(h.join(1)).size(), 2u);
  h.settle_reconfigure();
  EXPECT_EQ(h.logic().world(), 2);
}

// Too few can still join (one died before joining): the job fails at once. A member that is
// merely slow is named when the join deadline passes.
TEST(JobLogicFormingTest, TheJoinDeadlineNamesTheMissingMembers) {
  logic_harness h(small_config(4), 0, 0, /*min_ranks=*/4);
  h.join(0);
  h.exited(killed_before_joining(2, 77));
  EXPECT_EQ(h.logic().state(), job_state::failed) << "4 ranks can no longer join";

  logic_harness slow(small_config(2), 0, 0, 1, "warn", [](job_params& p) { p.form_timeout = 30s; });
  slow.join(0);
  slow.advance(29s);
  EXPECT_TRUE(all_of<finish_job>(slow.tick()).empty());
  slow.advance(1s);
  auto end = all_of<finish_job>(slow.tick());
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 1);
  for (const char* words :
       {"only 1 of 2 workers joined within 30 s", "member 1", "--join-timeout-ms"})
    EXPECT_NE(end[0].message.find(words), std::string::npos) << words << ": " << end[0].message;
}

// Every worker joined, but none took its place in the first generation (a Python script that
// called troupe.init() and never made its Trainer): the error says so, not "only 2 of 2
// joined", and names what the script must do.
TEST(JobLogicFormingTest, MembersThatNeverTakeTheirPlacesAreNamed) {
  auto cfg = small_config(2);
  cfg.workload_command = {"python3", "train.py"};
  logic_harness h(cfg);
  h.join(0);
  EXPECT_EQ(all_of<send_reconfigure>(h.join(1)).size(), 2u);
  h.advance(std::chrono::milliseconds(cfg.step_timeout_ms) + 5min);
  auto end = all_of<finish_job>(h.tick());
  ASSERT_EQ(end.size(), 1u);
  EXPECT_EQ(end[0].exit_code, 1);
  for (const char* words : {"every worker joined, but generation 1 did not start",
                            "members 0, 1 did not take their places", "troupe.Trainer"})
    EXPECT_NE(end[0].message.find(words), std::string::npos) << words << ": " << end[0].message;
  EXPECT_EQ(end[0].message.find("only 2 of 2"), std::string::npos) << end[0].message;
}

INSTANTIATE_TEST_SUITE_P(Recovery, JobLogicTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? std::string("PlanWithAbort")
                                              : std::string("ReportRound");
                         });

}  // namespace
}  // namespace troupe::actors
