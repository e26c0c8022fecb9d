// What a worker's control path remembers of the coordinator's aborts: a member forming a
// generation gives up once an abort for a newer one (or a final one) has come; and how a
// worker cut off from the coordinator fences itself and ends, on its own.

#include "actors/worker/worker_control.hpp"

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <thread>

#include "runtime/config.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

TEST(WorkerShared, AGenerationIsSupersededByAnAbortForANewerOneOnly) {
  worker_shared shared;
  EXPECT_FALSE(shared.superseded(0));
  EXPECT_FALSE(shared.superseded(3));
  // The coordinator opens generation 5: whoever still forms 4 or older gives up; 5 goes on.
  shared.abort_older_than(5, false, "rank 2 was lost");
  EXPECT_TRUE(shared.superseded(3));
  EXPECT_TRUE(shared.superseded(4));
  EXPECT_FALSE(shared.superseded(5));
  EXPECT_FALSE(shared.superseded(6));
  // A late abort of an older generation changes nothing.
  shared.abort_older_than(2, false, "late");
  EXPECT_TRUE(shared.superseded(4));
  EXPECT_FALSE(shared.superseded(5));
  // The job's end supersedes every generation.
  shared.abort_older_than(0, true, "the job ended");
  EXPECT_TRUE(shared.superseded(5));
  EXPECT_TRUE(shared.superseded(1000));
}

TEST(WorkerShared, AFencedProcessSaysSo) {
  worker_shared shared;
  EXPECT_FALSE(shared.fenced());
  shared.fence();
  EXPECT_TRUE(shared.fenced());
}

// A member fences itself later than the coordinator gives up on it: the coordinator timeout
// in effect is longer than the heartbeat timeout, by default and whenever it is set.
TEST(CoordinatorTimeout, MembersOutwaitTheCoordinatorsVerdictOnThem) {
  for (int heartbeat : {100, 2000, 5000}) {
    elastic_config e;
    e.heartbeat_timeout_ms = heartbeat;
    EXPECT_EQ(coordinator_timeout_ms(e), 5 * heartbeat) << "the default";
    e.coordinator_timeout_ms = heartbeat + 1;
    EXPECT_EQ(coordinator_timeout_ms(e), heartbeat + 1);
  }
}

// The heartbeat thread of a worker whose coordinator falls silent: while the coordinator
// beats, the process lives on past the fence limit; once it stops, the process ends (exit 1)
// within the limit and a check, saying that it lost the coordinator and fenced itself. It
// does so on its own: no agent, no step loop, nothing else in the process helps.
TEST(HeartbeatThreadDeathTest, FencesAndEndsTheProcessWhenTheCoordinatorFallsSilent) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr auto timeout = 300ms;  // the coordinator timeout: fence at 300 ms
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EXIT(
      {
        caf::actor_system_config cfg;
        caf::actor_system sys{cfg};
        auto coordinator = sys.spawn([]() -> caf::behavior { return {[](const heartbeat&) {}}; });
        auto shared = std::make_shared<worker_shared>();
        heartbeat_thread beats(coordinator, 7, shared, 50ms, timeout);
        // The coordinator beats for twice the fence limit: nothing happens.
        for (auto until = std::chrono::steady_clock::now() + 600ms;
             std::chrono::steady_clock::now() < until;) {
          shared->coordinator_seen();
          std::this_thread::sleep_for(20ms);
        }
        if (shared->fenced()) std::_Exit(3);
        // Then it falls silent: the heartbeat thread ends the process.
        std::this_thread::sleep_for(2 * timeout + 500ms);
        std::_Exit(0);  // not reached
      },
      ::testing::ExitedWithCode(1),
      "lost the coordinator: no heartbeat from it for 0\\.3.*fenced: this worker sends no vote, "
      "writes no checkpoint and exits");
  const auto took = std::chrono::steady_clock::now() - start;
  // 600 ms of beats, the fence at 300 ms and a check of 10 ms, plus starting the process.
  EXPECT_LT(took, 600ms + 2 * timeout + 1500ms);
}

// Coordinator takeover: the answers a member looking for the leader gets, and what it makes of
// them.
TEST(LeaderSearch, AWelcomeIsJudgedByLeadershipThenEpoch) {
  welcome w;
  w.epoch = 4;
  EXPECT_EQ(judge_welcome(w, 4), welcome_verdict::leader);
  EXPECT_EQ(judge_welcome(w, 3), welcome_verdict::leader);
  EXPECT_EQ(judge_welcome(w, 5), welcome_verdict::stale) << "a deposed leader that still answers";
  w.error = std::string(not_leading_prefix) + "coordinator 2 stands by";
  EXPECT_EQ(judge_welcome(w, 0), welcome_verdict::not_leading);
  w.error = "the job's protocol is 7, this worker speaks 6";
  EXPECT_EQ(judge_welcome(w, 0), welcome_verdict::refused);
  // Declared lost (or evicted) while it was away: asking the others will not help.
  w.error = removed_reason("member 3 was declared lost");
  EXPECT_EQ(judge_welcome(w, 0), welcome_verdict::told_to_go);
  w.error = evicted_reason("compute 3x the median");
  EXPECT_EQ(judge_welcome(w, 0), welcome_verdict::told_to_go);
}

TEST(EpochFence, OnlyOlderEpochsAreDropped) {
  EXPECT_FALSE(from_older_epoch(0, 0)) << "one coordinator without etcd";
  EXPECT_FALSE(from_older_epoch(7, 7));
  EXPECT_FALSE(from_older_epoch(8, 7));
  EXPECT_TRUE(from_older_epoch(6, 7));
}

// Stopping a generation because its coordinator is lost is no abort: the new leader's
// generations must not count as superseded.
TEST(WorkerShared, AbortingTheRunningGenerationSupersedesNothing) {
  worker_shared shared;
  shared.abort_running("the coordinator is silent");
  EXPECT_FALSE(shared.superseded(0));
  EXPECT_FALSE(shared.superseded(100));
}

TEST(ControlActor, DropsTheBeatsAndAbortsOfAnOlderCoordinator) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor rank{sys};
  auto shared = std::make_shared<worker_shared>();
  shared->epoch_seen().store(5);
  auto control = sys.spawn(control_actor, shared, caf::actor(rank));
  std::this_thread::sleep_for(150ms);
  heartbeat old_beat;
  old_beat.epoch = 4;
  caf::anon_send(control, old_beat);
  abort_generation old_abort;
  old_abort.generation = 9;
  old_abort.epoch = 4;
  caf::anon_send(control, old_abort);
  bool forwarded = false;
  rank->receive([&](const abort_generation&) { forwarded = true; }, caf::after(300ms) >> [] {});
  EXPECT_FALSE(forwarded);
  EXPECT_GT(shared->coordinator_silence(), 0.4) << "an old coordinator's beat is no sign of life";
  EXPECT_FALSE(shared->superseded(8));
  heartbeat beat;
  beat.epoch = 5;
  caf::anon_send(control, beat);
  abort_generation abort;
  abort.generation = 9;
  abort.epoch = 6;
  caf::anon_send(control, abort);
  rank->receive([&](const abort_generation& a) { forwarded = a.generation == 9; },
                caf::after(2s) >> [] {});
  EXPECT_TRUE(forwarded);
  EXPECT_LT(shared->coordinator_silence(), 0.3);
  EXPECT_TRUE(shared->superseded(8));
  caf::anon_send_exit(control, caf::exit_reason::user_shutdown);
}

// With standby coordinators the heartbeat thread does not end the process: it tells the rank
// actor once per silence, and a retarget at the new leader restarts the silence clock.
TEST(HeartbeatThread, WithStandbysTellsTheRankActorOncePerSilence) {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor rank{sys};
  auto coordinator = sys.spawn([]() -> caf::behavior { return {[](const heartbeat&) {}}; });
  auto shared = std::make_shared<worker_shared>();
  heartbeat_thread beats(coordinator, 7, shared, 20ms, 200ms, caf::actor(rank));
  auto silences_within = [&](std::chrono::milliseconds span) {
    int told = 0;
    for (auto until = std::chrono::steady_clock::now() + span;
         std::chrono::steady_clock::now() < until;)
      rank->receive([&](silent_atom) { ++told; }, caf::after(20ms) >> [] {});
    return told;
  };
  EXPECT_EQ(silences_within(700ms), 1);
  EXPECT_TRUE(shared->rehoming().load());
  EXPECT_FALSE(shared->fenced());
  // The new leader took the member on: a fresh silence is counted from here.
  beats.retarget(coordinator);
  shared->rehoming().store(false);
  EXPECT_LT(shared->coordinator_silence(), 0.1);
  EXPECT_EQ(silences_within(100ms), 0);
  EXPECT_EQ(silences_within(600ms), 1);
  caf::anon_send_exit(coordinator, caf::exit_reason::user_shutdown);
}

// Alone (no standbys), the rank actor is told at the first limit, and when it has not been
// taken back on by the second one after that (its search never returned), the heartbeat
// thread fences and ends the process itself.
TEST(HeartbeatThreadDeathTest, EndsTheProcessWhenTheRankIsNotTakenBackInTime) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        caf::actor_system_config cfg;
        caf::actor_system sys{cfg};
        caf::scoped_actor rank{sys};
        auto coordinator = sys.spawn([]() -> caf::behavior { return {[](const heartbeat&) {}}; });
        auto shared = std::make_shared<worker_shared>();
        heartbeat_thread beats(coordinator, 7, shared, 20ms, silence_policy{200ms, 300ms},
                               caf::actor(rank));
        bool told = false;
        rank->receive([&](silent_atom) { told = true; }, caf::after(2s) >> [] {});
        if (!told || shared->fenced()) std::_Exit(3);
        std::this_thread::sleep_for(3s);  // 300 ms and a second later the thread ends us
        std::_Exit(0);                    // not reached
      },
      ::testing::ExitedWithCode(1), "lost the coordinator: no heartbeat from it for 1\\.[0-9]+ s");
}

}  // namespace
}  // namespace troupe::actors
