// The actor around job_logic under CAF 0.17's deterministic test coordinator
// (test_coordinator_fixture): one message at a time, in an order the test chooses, on a
// virtual clock. Stand-in members (event-based actors that only receive) join a 2-rank job;
// the test asserts each message the supervisor sends, to whom and with what, through the
// formation, a vote round, the loss of a rank (its actor going down, its agent's exit
// report, or its heartbeats stopping) and the recovery that follows, and the forming
// deadline. Time moves only by advance_time: no test here sleeps or waits on the wall clock.

// clang-format off
#include "tests/actors/caf_dsl_in_gtest.hpp"  // first: the CAF test engine
// clang-format on

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <typeinfo>
#include <vector>

#include "actors/coordinator/job_supervisor.hpp"
#include "actors/wire/messages.hpp"
#include "strategies/planner.hpp"
#include "tests/actors/coordinator/small_job_setup.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

// A worker's two actors as the supervisor sees them: the step loop (welcome, reconfigurations,
// commits, stop) and the control path (aborts, the coordinator's heartbeats); also the
// launcher waiting for the result. The test reads their mailboxes; they answer nothing (CAF's
// drop handler would answer an error, which ends the supervisor).
caf::behavior stand_in() {
  return {[](const welcome&) {},   [](const reconfigure&) {},
          [](const commit&) {},    [](const abort_generation&) {},
          [](const heartbeat&) {}, [](const node_commit&) {},
          [](stop_atom) {},        [](result_atom, const job_result&) {}};
}

struct member {
  int32_t id = -1;
  caf::actor rank;
  caf::actor control;
};

step_done vote(uint64_t generation, int64_t step, int32_t rank, double loss_sum) {
  step_done v;
  v.generation = generation;
  v.step = step;
  v.rank = rank;
  v.loss_sum = loss_sum;
  v.tokens = 4;
  v.lr = 0.01;
  return v;
}

class SupervisorDsl : public ::testing::Test,
                      public test_coordinator_fixture<troupe::actors::system_config> {
 protected:
  static constexpr int heartbeat_timeout_ms = 2000;
  static constexpr int form_timeout_ms = 60000;

  SupervisorDsl() {
    char tmpl[] = "/tmp/troupe-jsdsl-XXXXXX";
    dir_ = mkdtemp(tmpl);
    events_.emplace(monitoring::event_log::open(dir_ + "/events.jsonl"));
    listener_ = sys.spawn(stand_in);
    // 100 steps: never reached, so no test needs the final checkpoint's disk work.
    job_setup s = test::small_job_setup(2, 100, dir_, *events_, registry_, listener_);
    s.form_timeout_ms = form_timeout_ms;
    s.cfg.elastic.heartbeat_timeout_ms = heartbeat_timeout_ms;
    supervisor_ = spawn_job_supervisor(sys, s);
    // Its first tick, sent to itself at the start, finds nobody to watch; the next one waits
    // on the virtual clock.
    run_actor(supervisor_);
  }

  ~SupervisorDsl() override {
    // The supervisor ticks for as long as it lives, and the fixture's destructor runs until
    // no timeout is pending: stop it first.
    for (const auto& a : {supervisor_, listener_}) caf::anon_send_exit(a, caf::exit_reason::kill);
    for (const auto& m : members_)
      for (const auto& a : {m.rank, m.control}) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
    std::filesystem::remove_all(dir_);
  }

  // Lets `who` handle everything in its mailbox, and nobody else anything.
  size_t run_actor(const caf::actor& who) {
    auto* job = dynamic_cast<caf::resumable*>(caf::actor_cast<caf::abstract_actor*>(who));
    return sched.run_jobs_filtered([job](caf::resumable* x) { return x == job; });
  }

  // inject((T), from(src).to(dst).with(msg)): the message arrives from src and dst handles it.
  template <class T>
  void inject_from(const caf::actor& src, const caf::actor& dst, const T& msg) {
    caf::send_as(src, dst, msg);
    run_actor(dst);
  }

  // The message `dst` would handle next, described; empty when its mailbox is empty. Keeps
  // it in the mailbox. EXPECT_EQ(pending(x), "") is disallow for every kind of message.
  std::string pending(const caf::actor& dst) {
    const auto* e = caf::actor_cast<caf::abstract_actor*>(dst)->peek_at_next_mailbox_element();
    return e ? caf::to_string(e->content()) : std::string();
  }

  // expect((T), from(src).to(dst)): dst's next message is a T that src sent. Returns it, after
  // dst has handled it (a stand-in drops it), so the test can assert its fields; nullopt, with
  // the test failed, otherwise.
  template <class T>
  std::optional<T> expect_from(const caf::actor& src, const caf::actor& dst) {
    const auto* e = caf::actor_cast<caf::abstract_actor*>(dst)->peek_at_next_mailbox_element();
    if (!e) {
      ADD_FAILURE() << "no message waiting, expected a " << typeid(T).name();
      return std::nullopt;
    }
    if (!e->content().match_elements<T>()) {
      ADD_FAILURE() << "the next message is " << caf::to_string(e->content());
      return std::nullopt;
    }
    EXPECT_EQ(e->sender, caf::actor_cast<caf::strong_actor_ptr>(src))
        << "sender of " << caf::to_string(e->content());
    T out = e->content().get_as<T>(0);
    EXPECT_TRUE(sched.prioritize(dst));
    sched.run_once();
    return out;
  }

  // allow((heartbeat), from(supervisor).to(dst)) for as many as there are.
  void drop_heartbeats(const caf::actor& dst) {
    auto* who = caf::actor_cast<caf::abstract_actor*>(dst);
    for (auto* e = who->peek_at_next_mailbox_element();
         e && e->content().match_elements<heartbeat>(); e = who->peek_at_next_mailbox_element()) {
      ASSERT_TRUE(sched.prioritize(dst));
      sched.run_once();
    }
  }

  // `relay`: the member's node relay (aggregation through the agents), or none.
  member join(int32_t id, const caf::actor& relay = nullptr) {
    member m{id, sys.spawn(stand_in), sys.spawn(stand_in)};
    members_.push_back(m);
    hello h;
    h.member = id;
    h.pid = 100 + id;
    h.host = "test";
    h.control = m.control;
    h.relay = relay;
    inject_from(m.rank, supervisor_, h);
    return m;
  }

  // Both members join; each is told its place in generation 1 and answers.
  std::pair<member, member> form(const caf::actor& relay = nullptr) {
    const member r0 = join(0, relay);
    auto w0 = expect_from<welcome>(supervisor_, r0.rank);
    EXPECT_TRUE(w0 && w0->error.empty());
    // Half the job is not a job: nobody is placed yet.
    EXPECT_EQ(pending(r0.rank), "");
    const member r1 = join(1, relay);
    // The last member completes the job: the plan goes to both, the one that joined last
    // before its own welcome (it waits in its mailbox until the welcome is in).
    for (const member& m : {r0, r1}) {
      auto r = expect_from<reconfigure>(supervisor_, m.rank);
      if (!r) continue;
      EXPECT_EQ(r->generation, 1u);
      EXPECT_EQ(r->rank, m.id);
      EXPECT_EQ(r->world, 2);
      EXPECT_EQ(r->source, state_source::init);
      EXPECT_NE(r->plan_json.find("\"dp\":2"), std::string::npos) << r->plan_json;
    }
    auto w1 = expect_from<welcome>(supervisor_, r1.rank);
    EXPECT_TRUE(w1 && w1->error.empty() && w1->heartbeat_interval_ms > 0);
    for (const member& m : {r0, r1}) {
      reconfigured done;
      done.generation = 1;
      done.member = m.id;
      done.rank = m.id;
      inject_from(m.rank, supervisor_, done);
    }
    return {r0, r1};
  }

  // The survivor r0 after losing its peer: the abort of generation 1 on its control path,
  // carrying generation 2 with r0 alone, restored from its own memory. A loss in the middle
  // of training needs no state report: the survivor holds the last committed step.
  // `windowed`: the loss was noticed by a message (a down, an exit report), so it waits the
  // regroup window (job_params::regroup_window) for others that come with it and nothing is
  // aborted before the window is over; losses a tick finds (silence) are regrouped at once.
  void expect_recovery_of(const member& r0, bool windowed = true) {
    drop_heartbeats(r0.control);
    if (windowed) {
      EXPECT_EQ(pending(r0.control), "");
      EXPECT_EQ(advance_time(std::chrono::milliseconds(25)), 1u);
      run_actor(supervisor_);
      drop_heartbeats(r0.control);
    }
    auto ab = expect_from<abort_generation>(supervisor_, r0.control);
    ASSERT_TRUE(ab);
    EXPECT_EQ(ab->generation, 2u);
    EXPECT_FALSE(ab->final);
    EXPECT_EQ(pending(r0.rank), "");  // the place travels with the abort, nothing else
    ASSERT_EQ(ab->then.size(), 1u);
    const std::optional<reconfigure> again = ab->then.front();
    EXPECT_EQ(again->generation, 2u);
    EXPECT_EQ(again->member, 0);
    EXPECT_EQ(again->rank, 0);
    EXPECT_EQ(again->world, 1);
    EXPECT_EQ(again->start_step, 1);
    EXPECT_EQ(again->source, state_source::self);
    reconfigured done;
    done.generation = 2;
    done.member = 0;
    done.rank = 0;
    inject_from(r0.rank, supervisor_, done);
    // The next step is voted and committed by the one rank of generation 2.
    inject_from(r0.rank, supervisor_, vote(2, 2, 0, 8.0));
    auto c = expect_from<commit>(supervisor_, r0.rank);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->generation, 2u);
    EXPECT_EQ(c->step, 2);
  }

  // Commits step 1 with both votes.
  void train_one_step(const member& r0, const member& r1) {
    inject_from(r0.rank, supervisor_, vote(1, 1, 0, 10.0));
    inject_from(r1.rank, supervisor_, vote(1, 1, 1, 20.0));
    for (const member& m : {r0, r1}) ASSERT_TRUE(expect_from<commit>(supervisor_, m.rank));
  }

  std::string dir_;
  std::optional<monitoring::event_log> events_;
  monitoring::metrics_registry registry_;
  caf::actor listener_;
  caf::actor supervisor_;
  std::vector<member> members_;
};

TEST_F(SupervisorDsl, FormsTheJobWhenEveryMemberHasJoined) {
  form();
  EXPECT_EQ(pending(supervisor_), "");
  // Formed, not yet ticking towards anything but its next tick.
  EXPECT_EQ(sched.clock().schedule().size(), 1u);
}

TEST_F(SupervisorDsl, CommitsAStepOnceEveryRankVoted) {
  auto [r0, r1] = form();
  inject_from(r0.rank, supervisor_, vote(1, 1, 0, 10.0));
  EXPECT_EQ(pending(r0.rank), "");  // one vote of two: no commit
  EXPECT_EQ(pending(r1.rank), "");
  // A vote of another generation counts for nothing.
  inject_from(r1.rank, supervisor_, vote(7, 1, 1, 20.0));
  EXPECT_EQ(pending(r0.rank), "");
  inject_from(r1.rank, supervisor_, vote(1, 1, 1, 20.0));
  for (const member& m : {r0, r1}) {
    auto c = expect_from<commit>(supervisor_, m.rank);
    ASSERT_TRUE(c);
    EXPECT_EQ(c->generation, 1u);
    EXPECT_EQ(c->step, 1);
    EXPECT_FALSE(c->checkpoint);
    EXPECT_FALSE(c->evaluate);
  }
  // The metrics follow the commit in the same handler: (10 + 20) / (4 + 4) tokens.
  EXPECT_NE(registry_.render_prometheus().find("\ntroupe_loss 3.75\n"), std::string::npos)
      << registry_.render_prometheus();
}

TEST_F(SupervisorDsl, AMemberWhoseActorGoesDownIsReplacedByRecovery) {
  auto [r0, r1] = form();
  train_one_step(r0, r1);
  caf::anon_send_exit(r1.rank, caf::exit_reason::kill);
  run_actor(r1.rank);                  // r1's step loop dies ...
  run_actor(supervisor_);              // ... and the supervisor's monitor reports it
  EXPECT_EQ(pending(r1.control), "");  // the lost member is not asked for anything
  expect_recovery_of(r0);
}

TEST_F(SupervisorDsl, AnAgentsExitReportLosesTheMember) {
  auto [r0, r1] = form();
  train_one_step(r0, r1);
  const caf::actor agent = sys.spawn(stand_in);
  worker_exited w;
  w.member = 1;
  w.pid = 101;
  w.signal = 9;
  // An exit report of an earlier process of the member changes nothing.
  worker_exited earlier = w;
  earlier.pid = 55;
  inject_from(agent, supervisor_, earlier);
  EXPECT_EQ(pending(r0.control), "");
  inject_from(agent, supervisor_, w);
  expect_recovery_of(r0);
  caf::anon_send_exit(agent, caf::exit_reason::kill);
}

TEST_F(SupervisorDsl, SilenceLongerThanTheHeartbeatTimeoutIsAHang) {
  auto [r0, r1] = form();
  train_one_step(r0, r1);
  // r0 beats every half second of virtual time; r1 says nothing. Each advance fires the one
  // pending tick, whose handler looks at the clock and schedules the next.
  heartbeat beat{0, 1, 1};
  for (int i = 1; i * 500 <= heartbeat_timeout_ms; ++i) {
    inject_from(r0.control, supervisor_, beat);
    EXPECT_EQ(advance_time(500ms), 1u);
    run_actor(supervisor_);
    for (const member& m : {r0, r1}) {
      auto b = expect_from<heartbeat>(supervisor_, m.control);  // the coordinator's own beat
      ASSERT_TRUE(b);
      EXPECT_EQ(b->member, -1);
    }
    ASSERT_EQ(pending(r0.control), "") << "evicted after " << i * 500 << " ms";
  }
  // 2.5 s since r1's last sign of life (its join), over the 2 s timeout.
  inject_from(r0.control, supervisor_, beat);
  EXPECT_EQ(advance_time(500ms), 1u);
  run_actor(supervisor_);
  expect_recovery_of(r0, false);
}

// The coordinator beats as its members do, once per heartbeat interval (a fifth of the 2 s
// timeout, as the welcome says), not on each 100 ms tick: ten times fewer messages.
TEST_F(SupervisorDsl, BeatsOncePerHeartbeatIntervalNotOnEveryTick) {
  auto [r0, r1] = form();
  std::vector<int> beat_at_tick;
  for (int tick = 1; tick <= 16; ++tick) {
    for (const member& m : {r0, r1}) inject_from(m.control, supervisor_, heartbeat{m.id, 1, 0});
    EXPECT_EQ(advance_time(100ms), 1u);
    run_actor(supervisor_);
    int to_members = 0;
    for (const member& m : {r0, r1})
      while (!pending(m.control).empty()) {
        auto b = expect_from<heartbeat>(supervisor_, m.control);
        ASSERT_TRUE(b);
        EXPECT_EQ(b->member, -1);
        ++to_members;
      }
    if (to_members > 0) {
      EXPECT_EQ(to_members, 2) << "tick " << tick;  // one each
      beat_at_tick.push_back(tick);
    }
  }
  // Its first tick (at 0 ms, before anybody joined) was a beat; then every 400 ms.
  EXPECT_EQ(beat_at_tick, (std::vector<int>{4, 8, 12, 16}));
}

TEST_F(SupervisorDsl, AJobThatNeverFormsFailsAtTheFormDeadline) {
  const member r0 = join(0);
  ASSERT_TRUE(expect_from<welcome>(supervisor_, r0.rank));
  // One tick short of the deadline: nothing happens.
  advance_time(std::chrono::milliseconds(form_timeout_ms) - 200ms);
  run_actor(supervisor_);
  EXPECT_EQ(pending(listener_), "");
  drop_heartbeats(r0.control);
  EXPECT_EQ(pending(r0.control), "");
  advance_time(300ms);
  run_actor(supervisor_);
  // The job fails: the member is told to go (abort, final), then to stop; the launcher gets
  // the result.
  auto ab = expect_from<abort_generation>(supervisor_, r0.control);
  ASSERT_TRUE(ab);
  EXPECT_TRUE(ab->final);
  EXPECT_NE(ab->reason.find("only 1 of 2 workers joined within 60 s"), std::string::npos)
      << ab->reason;
  const auto stop = expect_from<caf::atom_value>(supervisor_, r0.rank);
  EXPECT_TRUE(stop && *stop == stop_atom::value);
  const auto* e = caf::actor_cast<caf::abstract_actor*>(listener_)->peek_at_next_mailbox_element();
  ASSERT_NE(e, nullptr);
  ASSERT_TRUE((e->content().match_elements<caf::atom_value, job_result>()));
  EXPECT_EQ(e->content().get_as<caf::atom_value>(0), result_atom::value);
  const auto& res = e->content().get_as<job_result>(1);
  EXPECT_EQ(res.exit_code, exit_code::failed);
  EXPECT_EQ(res.steps_done, 0);
  // Its wall time is the virtual time the job lived.
  EXPECT_NEAR(res.wall_s, form_timeout_ms / 1000.0 + 0.1, 1e-9);
  // A finished job stops ticking: nothing is left on the clock.
  EXPECT_TRUE(sched.clock().schedule().empty());
}

// Aggregation through the agents: a node's relay brings its ranks' votes in one message, and
// the coordinator answers it with one node_commit for them, not one commit per rank.
TEST_F(SupervisorDsl, ARelayCarriesItsNodesVotesAndTakesOneCommitForThem) {
  const caf::actor relay = sys.spawn(stand_in);
  auto [r0, r1] = form(relay);
  inject_from(relay, supervisor_, node_votes{{vote(1, 1, 0, 10.0)}});
  EXPECT_EQ(pending(relay), "");  // one vote of two: no commit
  inject_from(relay, supervisor_, node_votes{{vote(1, 1, 1, 20.0)}});
  auto c = expect_from<node_commit>(supervisor_, relay);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->msg.generation, 1u);
  EXPECT_EQ(c->msg.step, 1);
  EXPECT_EQ(c->members, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(c->peer_wait_s.size(), 2u);
  EXPECT_EQ(pending(relay), "");  // one message for the node
  for (const member& m : {r0, r1}) EXPECT_EQ(pending(m.rank), "");
  EXPECT_NE(registry_.render_prometheus().find("\ntroupe_loss 3.75\n"), std::string::npos);
  // Both votes in one bundle commit the next step the same way.
  inject_from(relay, supervisor_, node_votes{{vote(1, 2, 0, 10.0), vote(1, 2, 1, 20.0)}});
  c = expect_from<node_commit>(supervisor_, relay);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->msg.step, 2);
  EXPECT_EQ(c->members.size(), 2u);
  caf::anon_send_exit(relay, caf::exit_reason::kill);
}

// A relay's node_beats keep every member it carries alive, and the coordinator's own beat goes
// to the relay once for them all.
TEST_F(SupervisorDsl, NodeBeatsKeepTheirMembersAliveAndTheRelayIsBeatenOnce) {
  const caf::actor relay = sys.spawn(stand_in);
  auto [r0, r1] = form(relay);
  for (int i = 1; i * 500 <= 2 * heartbeat_timeout_ms; ++i) {
    inject_from(relay, supervisor_, node_beats{{heartbeat{0, 1, 0}, heartbeat{1, 1, 0}}});
    EXPECT_EQ(advance_time(500ms), 1u);
    run_actor(supervisor_);
    auto b = expect_from<heartbeat>(supervisor_, relay);
    ASSERT_TRUE(b);
    EXPECT_EQ(b->member, -1);
    EXPECT_EQ(pending(relay), "") << "one beat for the node";
    for (const member& m : {r0, r1})
      ASSERT_EQ(pending(m.control), "") << "after " << i * 500 << " ms";
  }
  caf::anon_send_exit(relay, caf::exit_reason::kill);
}

// Bundles longer than any node are refused whole: none of their entries counts.
TEST_F(SupervisorDsl, ABundleLongerThanAnyNodeIsRefusedWhole) {
  const caf::actor relay = sys.spawn(stand_in);
  form(relay);
  node_votes flood;
  for (size_t i = 0; i <= max_bundle; ++i)
    flood.votes.push_back(vote(1, 1, static_cast<int32_t>(i % 2), 10.0));
  inject_from(relay, supervisor_, flood);
  EXPECT_EQ(pending(relay), "");  // no commit
  inject_from(relay, supervisor_, node_votes{{vote(1, 1, 0, 10.0), vote(1, 1, 1, 20.0)}});
  EXPECT_TRUE(expect_from<node_commit>(supervisor_, relay));
  caf::anon_send_exit(relay, caf::exit_reason::kill);
}

// A member declared lost (silent past the timeout) whose process speaks again is told it was
// removed. Workers beat without a sender: the answer goes to its control actor, where before it
// went to the missing sender and was lost.
TEST_F(SupervisorDsl, ARemovedMembersBeatWithoutASenderIsAnsweredAtItsControl) {
  auto [r0, r1] = form();
  train_one_step(r0, r1);
  heartbeat beat{0, 1, 1};
  for (int i = 1; i * 500 <= heartbeat_timeout_ms + 500; ++i) {
    inject_from(r0.control, supervisor_, beat);
    EXPECT_EQ(advance_time(500ms), 1u);
    run_actor(supervisor_);
    if (i * 500 <= heartbeat_timeout_ms) {
      drop_heartbeats(r0.control);
      drop_heartbeats(r1.control);
    }
  }
  expect_recovery_of(r0, false);
  drop_heartbeats(r1.control);
  ASSERT_EQ(pending(r1.control), "");
  caf::anon_send(supervisor_, heartbeat{1, 1, 1});  // r1's heartbeat thread wakes up
  run_actor(supervisor_);
  drop_heartbeats(r1.control);
  auto told = expect_from<abort_generation>(supervisor_, r1.control);
  ASSERT_TRUE(told);
  EXPECT_TRUE(told->final);
  EXPECT_EQ(told->reason.rfind(std::string(removed_prefix), 0), 0u) << told->reason;
}

}  // namespace
}  // namespace troupe::actors
