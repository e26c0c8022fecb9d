// The node relay (actors/agent/node_relay.hpp) under CAF 0.17's deterministic test coordinator:
// stand-ins for the coordinator and two members, one message at a time, a virtual clock. The
// relay must bundle a step's votes once every rank it carries is in (or its window passed, or
// a vote failed), drop an older generation's votes, bundle the beats per interval, hand out
// the coordinator's node_commit and beat, and follow a takeover to the newer leader.

// clang-format off
#include "tests/actors/caf_dsl_in_gtest.hpp"  // first: the CAF test engine
// clang-format on

#include "actors/agent/node_relay.hpp"

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "actors/wire/messages.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

caf::behavior stand_in() {
  return {[](const node_votes&) {}, [](const node_beats&) {}, [](const commit&) {},
          [](const heartbeat&) {}};
}

step_done vote(uint64_t generation, int64_t step, int32_t rank, bool ok = true) {
  step_done v;
  v.generation = generation;
  v.step = step;
  v.rank = rank;
  v.ok = ok;
  return v;
}

class RelayDsl : public ::testing::Test,
                 public test_coordinator_fixture<troupe::actors::system_config> {
 protected:
  RelayDsl() {
    coordinator_ = sys.spawn(stand_in);
    for (auto& m : members_) m = sys.spawn(stand_in);
    relay_setup s;
    s.coordinator = coordinator_;
    s.vote_window = 100ms;
    s.beat_interval = 400ms;
    s.to_coordinator = &to_;
    s.from_coordinator = &from_;
    relay_ = sys.spawn(node_relay, s);
    run_relay();
  }

  ~RelayDsl() override {
    for (const auto& a : {relay_, coordinator_, members_[0], members_[1]})
      caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
  }

  // Lets the relay alone handle what is in its mailbox: the stand-ins' mailboxes keep what the
  // relay sent them for the test to read.
  void run_relay() {
    auto* job = dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(relay_));
    sched.run_jobs_filtered([job](caf::resumable* x) { return x == job; });
  }

  void deliver(const caf::actor& from, const caf::message& msg) {
    caf::send_as(from, relay_, msg);
    run_relay();
  }

  void wait(std::chrono::milliseconds t) {
    advance_time(t);
    run_relay();
  }

  void place(uint64_t generation, std::vector<int32_t> ranks) {
    for (int32_t i = 0; i < 2; ++i)
      deliver(members_[i],
              caf::make_message(relay_placed_atom::value, i, members_[i], generation,
                                ranks[static_cast<size_t>(i)], coordinator_, int64_t{0}));
  }

  // The next message in `who`'s mailbox as a T (taken out), or nullopt.
  template <class T>
  std::optional<T> next(const caf::actor& who) {
    auto* a = caf::actor_cast<caf::abstract_actor*>(who);
    const auto* e = a->peek_at_next_mailbox_element();
    if (!e || !e->content().match_elements<T>()) return std::nullopt;
    T out = e->content().get_as<T>(0);
    EXPECT_TRUE(sched.prioritize(who));
    sched.run_once();
    return out;
  }

  bool idle(const caf::actor& who) {
    return caf::actor_cast<caf::abstract_actor*>(who)->peek_at_next_mailbox_element() == nullptr;
  }

  std::atomic<uint64_t> to_{0}, from_{0};
  caf::actor coordinator_, relay_;
  caf::actor members_[2];
};

TEST_F(RelayDsl, SendsAStepsVotesOnceEveryRankItCarriesVoted) {
  place(1, {0, 1});
  deliver(members_[0], caf::make_message(vote(1, 1, 0)));
  EXPECT_TRUE(idle(coordinator_));  // one of two
  deliver(members_[1], caf::make_message(vote(1, 1, 1)));
  auto bundle = next<node_votes>(coordinator_);
  ASSERT_TRUE(bundle);
  ASSERT_EQ(bundle->votes.size(), 2u);
  EXPECT_EQ(bundle->votes[0].rank, 0);
  EXPECT_EQ(bundle->votes[1].rank, 1);
  EXPECT_EQ(to_.load(), 1u);
  // The window's timer of the first vote finds nothing left to send.
  wait(100ms);
  EXPECT_TRUE(idle(coordinator_));
}

TEST_F(RelayDsl, ASpareIsNotWaitedForAndAFailedVoteGoesAtOnce) {
  place(1, {0, -1});  // member 1 is a spare: one rank to wait for
  deliver(members_[0], caf::make_message(vote(1, 1, 0)));
  auto one = next<node_votes>(coordinator_);
  ASSERT_TRUE(one);
  EXPECT_EQ(one->votes.size(), 1u);
  place(2, {0, 1});
  deliver(members_[1], caf::make_message(vote(2, 1, 1, false)));
  auto failed = next<node_votes>(coordinator_);
  ASSERT_TRUE(failed);
  ASSERT_EQ(failed->votes.size(), 1u);
  EXPECT_FALSE(failed->votes[0].ok);
}

TEST_F(RelayDsl, AVoteWindowSendsWhatCameWhenARankNeverVotes) {
  place(1, {0, 1});
  deliver(members_[0], caf::make_message(vote(1, 1, 0)));
  wait(99ms);
  EXPECT_TRUE(idle(coordinator_));
  wait(1ms);
  auto late = next<node_votes>(coordinator_);
  ASSERT_TRUE(late);
  EXPECT_EQ(late->votes.size(), 1u);
}

TEST_F(RelayDsl, ANewGenerationDropsTheOldOnesVotes) {
  place(1, {0, 1});
  deliver(members_[0], caf::make_message(vote(1, 5, 0)));
  place(2, {0, 1});
  wait(100ms);
  EXPECT_TRUE(idle(coordinator_)) << "generation 1's vote was sent after generation 2 began";
}

TEST_F(RelayDsl, BundlesEachMembersNewestBeatPerInterval) {
  place(1, {0, 1});
  deliver(members_[0], caf::make_message(heartbeat{0, 1, 3}));
  deliver(members_[0], caf::make_message(heartbeat{0, 1, 4}));
  deliver(members_[1], caf::make_message(heartbeat{1, 1, 4}));
  EXPECT_TRUE(idle(coordinator_));
  wait(400ms);
  auto beats = next<node_beats>(coordinator_);
  ASSERT_TRUE(beats);
  ASSERT_EQ(beats->beats.size(), 2u);
  EXPECT_EQ(beats->beats[0].member, 0);
  EXPECT_EQ(beats->beats[0].step, 4);
  EXPECT_EQ(beats->beats[1].member, 1);
  // Nothing new: no bundle.
  wait(400ms);
  EXPECT_TRUE(idle(coordinator_));
}

TEST_F(RelayDsl, HandsEachMemberItsCommitAndEveryMemberTheCoordinatorsBeat) {
  place(1, {0, 1});
  node_commit c;
  c.msg.generation = 1;
  c.msg.step = 7;
  c.members = {1, 0};
  c.peer_wait_s = {0.25, 0.5};
  deliver(coordinator_, caf::make_message(c));
  for (int32_t i = 0; i < 2; ++i) {
    auto mine = next<commit>(members_[i]);
    ASSERT_TRUE(mine) << "member " << i;
    EXPECT_EQ(mine->step, 7);
    EXPECT_EQ(mine->peer_wait_s, i == 0 ? 0.5 : 0.25);
  }
  deliver(coordinator_, caf::make_message(heartbeat{-1, 1, 7}));
  for (const auto& m : members_) EXPECT_TRUE(next<heartbeat>(m));
  EXPECT_EQ(from_.load(), 2u);
}

heartbeat leader_beat(int64_t epoch) {
  heartbeat b{-1, 1, 7};
  b.epoch = epoch;
  return b;
}

// A standby took over (etcd): the relay carries to the coordinator that reaches it with a
// newer epoch, and drops what the deposed one still sends. The agent's word (lead_atom) counts
// the same way: an older leader's is ignored.
TEST_F(RelayDsl, FollowsANewerLeaderAndDropsTheOlderOnesWord) {
  const caf::actor standby = sys.spawn(stand_in);
  const caf::actor deposed = coordinator_;
  place(1, {0, 1});
  deliver(deposed, caf::make_message(leader_beat(3)));
  for (const auto& m : members_) EXPECT_TRUE(next<heartbeat>(m));
  // The standby leads with epoch 5: its beat reaches the members and the relay follows it.
  deliver(standby, caf::make_message(leader_beat(5)));
  for (const auto& m : members_) EXPECT_TRUE(next<heartbeat>(m));
  deliver(members_[0], caf::make_message(vote(1, 1, 0)));
  deliver(members_[1], caf::make_message(vote(1, 1, 1)));
  EXPECT_TRUE(next<node_votes>(standby));
  EXPECT_TRUE(idle(deposed));
  // The deposed leader's beat and commit are not handed on.
  deliver(deposed, caf::make_message(leader_beat(3)));
  node_commit stale;
  stale.msg.generation = 1;
  stale.msg.step = 1;
  stale.msg.epoch = 3;
  stale.members = {0, 1};
  deliver(deposed, caf::make_message(stale));
  for (const auto& m : members_) EXPECT_TRUE(idle(m));
  // Nor is an agent's word of an older leader; a newer one's is followed.
  deliver(members_[0], caf::make_message(lead_atom::value, deposed, int32_t{400}, int64_t{3}));
  deliver(members_[0], caf::make_message(heartbeat{0, 1, 1}));
  wait(400ms);
  EXPECT_TRUE(next<node_beats>(standby));
  EXPECT_TRUE(idle(deposed));
  const caf::actor next_leader = sys.spawn(stand_in);
  deliver(members_[0], caf::make_message(lead_atom::value, next_leader, int32_t{400}, int64_t{6}));
  deliver(members_[0], caf::make_message(heartbeat{0, 1, 2}));
  wait(400ms);
  EXPECT_TRUE(next<node_beats>(next_leader));
  for (const auto& a : {standby, next_leader}) caf::anon_send_exit(a, caf::exit_reason::kill);
}

// After a takeover a member takes its place in the new leader's generation and votes at once:
// its placing names the new leader, so the relay carries that vote to it even though the new
// leader has not reached the relay yet (the race relay_test met: the vote went to the dead
// leader and the step never committed).
TEST_F(RelayDsl, AMembersPlacingBringsTheNewLeaderBeforeItsVote) {
  const caf::actor standby = sys.spawn(stand_in);
  for (int32_t i = 0; i < 2; ++i)
    deliver(members_[i], caf::make_message(relay_placed_atom::value, i, members_[i], uint64_t{2}, i,
                                           standby, int64_t{9}));
  deliver(members_[0], caf::make_message(vote(2, 1, 0)));
  deliver(members_[1], caf::make_message(vote(2, 1, 1)));
  EXPECT_TRUE(next<node_votes>(standby));
  EXPECT_TRUE(idle(coordinator_));
  caf::anon_send_exit(standby, caf::exit_reason::kill);
}

}  // namespace
}  // namespace troupe::actors
