// The search for the leader among a job's coordinators (actors/wire/leader_search.hpp), driven
// by hand: every verdict, the pacing and its cap, the deadline, the single-coordinator refusal,
// the epoch rule, where a search starts and a standby that names the leader.

#include "actors/wire/leader_search.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <variant>
#include <vector>

namespace troupe::actors::wire {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;

const search_time t0 = search_time{} + 1h;
const std::vector<std::string> three = {"a:1", "b:2", "c:3"};

std::string describe(const search_action& a) {
  if (auto* x = std::get_if<ask_endpoint>(&a)) return "ask " + std::to_string(x->index);
  if (auto* x = std::get_if<wait_until>(&a))
    return "wait " + std::to_string((x->until - t0) / 1ms) + " ms after t0";
  if (auto* x = std::get_if<give_up>(&a))
    return std::string("give up: ") + to_string(x->reason) + " at " + std::to_string(x->index);
  const auto& f = std::get<leader_found>(a);
  return "leader " + std::to_string(f.index) + " of epoch " + std::to_string(f.epoch);
}

// The ask the machine must hand out now; a ticket of 0 (never handed out) when it does not.
ask_endpoint ask_now(leader_search_machine& m, search_time now) {
  const auto a = m.next(now);
  EXPECT_TRUE(std::holds_alternative<ask_endpoint>(a)) << describe(a);
  if (auto* x = std::get_if<ask_endpoint>(&a)) return *x;
  return ask_endpoint{0, 99, 0ms, 0ms, false};
}

search_time wait_now(leader_search_machine& m, search_time now) {
  const auto a = m.next(now);
  EXPECT_TRUE(std::holds_alternative<wait_until>(a)) << describe(a);
  if (auto* x = std::get_if<wait_until>(&a)) return x->until;
  return search_time{};
}

give_up give_up_now(leader_search_machine& m, search_time now) {
  const auto a = m.next(now);
  EXPECT_TRUE(std::holds_alternative<give_up>(a)) << describe(a);
  if (auto* x = std::get_if<give_up>(&a)) return *x;
  return give_up{give_up_reason::no_endpoints, 99};
}

reply said(verdict v, int64_t epoch = 0) { return reply{v, epoch, std::nullopt, 0, {}}; }

// A policy without pauses, so that a test of verdicts reads as a list of asks.
search_policy quick() {
  search_policy p;
  p.first_pause = p.max_pause = 0ms;
  return p;
}

leader_search_machine machine(search_policy p, search_start s = {},
                              std::vector<std::string> endpoints = three) {
  if (s.deadline == search_time::max()) s.deadline = t0 + 60s;
  return leader_search_machine(std::move(endpoints), p, s);
}

TEST(LeaderSearchNames, EveryEnumeratorHasItsOwnName) {
  std::set<std::string> names;
  for (auto v :
       {verdict::welcomed, verdict::not_leading, verdict::stale, verdict::refused,
        verdict::told_to_go, verdict::other_job, verdict::connection_refused, verdict::no_answer})
    names.insert(to_string(v));
  EXPECT_EQ(names.size(), 8u);
  names.clear();
  for (auto r :
       {give_up_reason::deadline, give_up_reason::refused, give_up_reason::told_to_go,
        give_up_reason::other_job, give_up_reason::nobody_listens, give_up_reason::no_endpoints})
    names.insert(to_string(r));
  EXPECT_EQ(names.size(), 6u);
  EXPECT_STRNE(to_string(pacing::after_each_try), to_string(pacing::after_each_round));
}

TEST(LeaderSearchStart, StartsAtTheLastKnownLeaderAndGoesRoundRobin) {
  auto m = machine(quick(), {.last_leader = 1});
  std::vector<size_t> order;
  for (int i = 0; i < 4; ++i) {
    const auto a = ask_now(m, t0);
    order.push_back(a.index);
    m.on_answer(a.ticket, said(verdict::not_leading), t0);
  }
  EXPECT_EQ(order, (std::vector<size_t>{1, 2, 0, 1}));
  EXPECT_EQ(m.asked(), (std::vector<std::string>{"b:2", "c:3", "a:1"}));
}

TEST(LeaderSearchStart, ALostLeaderIsAskedLast) {
  auto m = machine(quick(), {.last_leader = 0, .leader_lost = true});
  std::vector<size_t> order;
  for (int i = 0; i < 3; ++i) {
    const auto a = ask_now(m, t0);
    order.push_back(a.index);
    m.on_answer(a.ticket, said(verdict::connection_refused), t0);
  }
  EXPECT_EQ(order, (std::vector<size_t>{1, 2, 0}));
  // Alone, the lost one is the only one to ask.
  auto alone = machine(quick(), {.last_leader = 0, .leader_lost = true}, {"a:1"});
  EXPECT_EQ(ask_now(alone, t0).index, 0u);
}

TEST(LeaderSearchVerdicts, AWelcomeEndsTheSearchWithThatLeader) {
  auto m = machine(quick());
  const auto a = ask_now(m, t0);
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::welcomed, 4), t0), verdict::welcomed);
  for (int i = 0; i < 2; ++i) {  // final: asked again, it says the same
    const auto done = m.next(t0 + 1s);
    ASSERT_TRUE(std::holds_alternative<leader_found>(done)) << describe(done);
    EXPECT_EQ(std::get<leader_found>(done).index, 0u);
    EXPECT_EQ(std::get<leader_found>(done).epoch, 4);
  }
  EXPECT_TRUE(m.finished());
  EXPECT_EQ(m.epoch_floor(), 4);
}

TEST(LeaderSearchVerdicts, PassingAnswersMoveToTheNextCoordinator) {
  for (auto v : {verdict::not_leading, verdict::stale, verdict::connection_refused,
                 verdict::no_answer, verdict::other_job}) {
    auto m = machine(quick());
    const auto a = ask_now(m, t0);
    EXPECT_EQ(m.on_answer(a.ticket, reply{v, 0, std::nullopt, 0, "words"}, t0), v);
    EXPECT_EQ(ask_now(m, t0).index, 1u) << to_string(v);
    EXPECT_EQ(m.record(0).last, v);
    EXPECT_EQ(m.record(0).detail, "words");
    EXPECT_EQ(m.last_answer(), "words");
  }
}

TEST(LeaderSearchVerdicts, ARefusalEndsTheSearchOnlyWhenThePolicySaysSo) {
  auto p = quick();
  auto stops = machine(p);
  auto a = ask_now(stops, t0);
  stops.on_answer(a.ticket, said(verdict::refused), t0);
  const auto g = give_up_now(stops, t0);
  EXPECT_EQ(g.reason, give_up_reason::refused);
  EXPECT_EQ(g.index, 0u);

  p.stop_on_refusal = false;  // a rehoming worker: a leader taking over may refuse a moment
  auto goes_on = machine(p);
  a = ask_now(goes_on, t0);
  goes_on.on_answer(a.ticket, said(verdict::refused), t0);
  EXPECT_EQ(ask_now(goes_on, t0).index, 1u);
}

TEST(LeaderSearchVerdicts, ToldToGoAlwaysEndsTheSearch) {
  auto p = quick();
  p.stop_on_refusal = false;
  auto m = machine(p, {.last_leader = 2});
  const auto a = ask_now(m, t0);
  m.on_answer(a.ticket, reply{verdict::told_to_go, 3, std::nullopt, 0, "removed: lost"}, t0);
  const auto g = give_up_now(m, t0);
  EXPECT_EQ(g.reason, give_up_reason::told_to_go);
  EXPECT_EQ(g.index, 2u);
  EXPECT_EQ(m.last_answer(), "removed: lost");
}

TEST(LeaderSearchVerdicts, AnotherJobsAddressEndsTheSearchWhenThePolicySaysSo) {
  auto p = quick();
  p.stop_on_other_job = true;
  auto m = machine(p);
  const auto a = ask_now(m, t0);
  m.on_answer(a.ticket, said(verdict::other_job), t0);
  EXPECT_EQ(give_up_now(m, t0).reason, give_up_reason::other_job);
}

TEST(LeaderSearchVerdicts, ConnectErrorsAreClassifiedFromTheirWords) {
  EXPECT_EQ(verdict_of_connect_error("cannot reach ...: Connection refused"),
            verdict::connection_refused);
  EXPECT_EQ(verdict_of_connect_error("10.0.0.1:7000 belongs to job 0011, this process's join "
                                     "token is for job 2233"),
            verdict::other_job);
  EXPECT_EQ(verdict_of_connect_error("connection_timeout"), verdict::no_answer);
  EXPECT_EQ(verdict_of_connect_error(""), verdict::no_answer);
}

TEST(LeaderSearchEpochs, ALeaderOfAnOlderEpochIsPassedOver) {
  auto m = machine(quick(), {.epoch_seen = 5});
  auto a = ask_now(m, t0);
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::welcomed, 4), t0), verdict::stale);
  EXPECT_EQ(m.record(0).detail, "leads epoch 4, older than epoch 5");
  a = ask_now(m, t0);
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::welcomed, 5), t0), verdict::welcomed);
  EXPECT_TRUE(std::holds_alternative<leader_found>(m.next(t0)));
}

TEST(LeaderSearchEpochs, ADeposedLeadersRefusalOrRemovalDoesNotCount) {
  auto m = machine(quick(), {.epoch_seen = 5});
  auto a = ask_now(m, t0);
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::told_to_go, 3), t0), verdict::stale);
  a = ask_now(m, t0);
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::refused, 4), t0), verdict::stale);
  EXPECT_FALSE(m.finished());
  EXPECT_EQ(ask_now(m, t0).index, 2u);
}

TEST(LeaderSearchEpochs, ANewerLeaderRaisesTheFloor) {
  auto p = quick();
  p.stop_on_refusal = false;
  auto m = machine(p, {.epoch_seen = 5});
  auto a = ask_now(m, t0);
  m.on_answer(a.ticket, said(verdict::refused, 7), t0);  // epoch 7 exists: 6 is deposed
  EXPECT_EQ(m.epoch_floor(), 7);
  a = ask_now(m, t0);
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::welcomed, 6), t0), verdict::stale);
  // Without etcd every epoch is 0: nothing is ever stale.
  auto plain = machine(quick());
  a = ask_now(plain, t0);
  EXPECT_EQ(plain.on_answer(a.ticket, said(verdict::welcomed, 0), t0), verdict::welcomed);
}

TEST(LeaderSearchStandby, AStandbyNamingTheLeaderIsFollowedAtOnce) {
  auto p = quick();
  p.first_pause = p.max_pause = 100ms;  // pausing after each try: the named one goes first
  auto m = machine(p, {.epoch_seen = 2});
  auto a = ask_now(m, t0);
  EXPECT_EQ(a.index, 0u);
  EXPECT_EQ(m.index_of("c:3"), 2u);
  m.on_answer(a.ticket, reply{verdict::not_leading, 0, m.index_of("c:3"), 9, "not leading"}, t0);
  EXPECT_EQ(m.epoch_floor(), 9);
  a = ask_now(m, t0);  // no pause
  EXPECT_EQ(a.index, 2u);
  // It did not answer: the pause owed, then the round goes on where it was.
  m.on_answer(a.ticket, said(verdict::no_answer), t0 + 10ms);
  EXPECT_EQ(wait_now(m, t0 + 10ms), t0 + 110ms);
  EXPECT_EQ(ask_now(m, t0 + 110ms).index, 1u);
}

TEST(LeaderSearchStandby, ANameIsFollowedOnceAndOnlyWhenItIsNews) {
  auto m = machine(quick(), {.epoch_seen = 5});
  auto a = ask_now(m, t0);
  m.on_answer(a.ticket, reply{verdict::not_leading, 0, 1, 0, {}}, t0);  // epoch not said
  a = ask_now(m, t0);
  EXPECT_EQ(a.index, 1u);
  // The named one names another in turn: not followed, the round goes on from 1.
  m.on_answer(a.ticket, reply{verdict::not_leading, 0, 0, 0, {}}, t0);
  a = ask_now(m, t0);
  EXPECT_EQ(a.index, 1u);
  // A name of an epoch already passed, and a standby naming itself, are ignored.
  m.on_answer(a.ticket, reply{verdict::not_leading, 0, 0, 4, {}}, t0);
  a = ask_now(m, t0);
  EXPECT_EQ(a.index, 2u);
  m.on_answer(a.ticket, reply{verdict::not_leading, 0, 2, 0, {}}, t0);
  EXPECT_EQ(ask_now(m, t0).index, 0u);
  EXPECT_EQ(m.epoch_floor(), 5);
}

TEST(LeaderSearchPacing, TheBackoffDoublesUpToItsCap) {
  search_policy p = agent_rejoin_policy(false);
  auto m = machine(p, {.deadline = t0 + 1h}, {"a:1"});
  search_time now = t0;
  std::vector<int64_t> pauses;
  for (int i = 0; i < 8; ++i) {
    const auto a = ask_now(m, now);
    now += 10ms;
    m.on_answer(a.ticket, said(verdict::no_answer), now);
    const auto until = wait_now(m, now);
    pauses.push_back((until - now) / 1ms);
    now = until;
  }
  EXPECT_EQ(pauses, (std::vector<int64_t>{250, 500, 1000, 2000, 4000, 5000, 5000, 5000}));
}

TEST(LeaderSearchPacing, AConstantPauseAfterEachTry) {
  auto m = machine(worker_start_policy());
  auto a = ask_now(m, t0);
  m.on_answer(a.ticket, said(verdict::not_leading), t0);
  EXPECT_EQ(wait_now(m, t0), t0 + 50ms);
  EXPECT_EQ(wait_now(m, t0 + 20ms), t0 + 50ms);  // woken early: still the same pause
  a = ask_now(m, t0 + 50ms);
  m.on_answer(a.ticket, said(verdict::not_leading), t0 + 60ms);
  EXPECT_EQ(wait_now(m, t0 + 60ms), t0 + 110ms);
}

TEST(LeaderSearchPacing, APauseAfterEachFullRoundOnly) {
  auto p = quick();
  p.pace = pacing::after_each_round;
  p.first_pause = 100ms;
  p.max_pause = 400ms;
  p.backoff = 2;
  auto m = machine(p);
  search_time now = t0;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < 3; ++i) {
      const auto a = ask_now(m, now);  // a round goes back to back
      EXPECT_EQ(a.index, i);
      m.on_answer(a.ticket, said(verdict::connection_refused), now);
    }
    const auto until = wait_now(m, now);
    EXPECT_EQ(until - now, milliseconds(100 << round));
    now = until;
  }
}

TEST(LeaderSearchDeadline, TriesAreCutToTheDeadlineButNotBelowTheirFloor) {
  auto p = agent_start_policy();  // connect 1500 ms (floor 200), hello 10 s (floor 1000)
  auto m = machine(p, {.deadline = t0 + 5s});
  auto a = ask_now(m, t0);
  EXPECT_EQ(a.connect_within, 1500ms);
  EXPECT_EQ(a.answer_within, 5s);
  m.on_answer(a.ticket, said(verdict::no_answer), t0 + 4900ms);
  a = ask_now(m, t0 + 5000ms);  // past the deadline, but not every one was asked
  EXPECT_EQ(a.connect_within, 200ms);
  EXPECT_EQ(a.answer_within, 1000ms);
}

TEST(LeaderSearchDeadline, ThePauseThatWouldCrossTheDeadlineEndsTheSearchAtTheDeadline) {
  auto m = machine(worker_start_policy(), {.deadline = t0 + 1s});
  auto a = ask_now(m, t0);
  m.on_answer(a.ticket, said(verdict::not_leading), t0 + 900ms);
  EXPECT_EQ(wait_now(m, t0 + 900ms), t0 + 950ms);
  a = ask_now(m, t0 + 950ms);
  EXPECT_EQ(a.answer_within, 50ms);
  m.on_answer(a.ticket, said(verdict::not_leading), t0 + 960ms);
  // 960 + 50 >= 1000: nothing more will be asked, but the search lasts its whole window.
  EXPECT_EQ(wait_now(m, t0 + 960ms), t0 + 1000ms);
  const auto g = give_up_now(m, t0 + 1000ms);
  EXPECT_EQ(g.reason, give_up_reason::deadline);
  EXPECT_EQ(g.index, 1u);
  EXPECT_EQ(m.summary(), "a:1: not leading; b:2: not leading; c:3: not asked");
}

TEST(LeaderSearchDeadline, ALateStartAsksOnceOrEveryoneOnce) {
  // The worker's search: at least one try, then it gives up.
  auto once = machine(quick(), {.deadline = t0 - 1s});
  auto a = ask_now(once, t0);
  EXPECT_EQ(a.connect_within, 1ms);
  once.on_answer(a.ticket, said(verdict::no_answer), t0);
  EXPECT_EQ(give_up_now(once, t0).reason, give_up_reason::deadline);
  // The agent's: every coordinator once.
  auto p = quick();
  p.ask_each_before_giving_up = true;
  auto each = machine(p, {.last_leader = 1, .deadline = t0 - 1s});
  for (size_t i : {1u, 2u, 0u}) {
    a = ask_now(each, t0);
    EXPECT_EQ(a.index, i);
    each.on_answer(a.ticket, said(verdict::no_answer), t0);
  }
  EXPECT_EQ(give_up_now(each, t0).reason, give_up_reason::deadline);
  EXPECT_EQ(each.tries(), 3u);
}

TEST(LeaderSearchDeadline, AnUnansweredTryTimesOutAndItsLateAnswerIsDropped) {
  auto p = quick();
  p.connect_try = 100ms;
  p.answer_try = 300ms;
  auto m = machine(p);
  const auto a = ask_now(m, t0);
  EXPECT_EQ(wait_now(m, t0 + 50ms), t0 + 400ms);  // one hello in flight at a time
  const auto b = ask_now(m, t0 + 400ms);
  EXPECT_EQ(b.index, 1u);
  EXPECT_EQ(m.record(0).last, verdict::no_answer);
  EXPECT_EQ(m.record(0).detail, "no answer within 400 ms");
  EXPECT_EQ(m.on_answer(a.ticket, said(verdict::welcomed), t0 + 450ms), std::nullopt);
  EXPECT_EQ(m.asking()->ticket, b.ticket);
  EXPECT_FALSE(m.finished());
}

TEST(LeaderSearchDeadline, NoDeadlineDoesNotOverflow) {
  auto m = leader_search_machine({"a:1"}, agent_rejoin_policy(false), {});
  const auto a = ask_now(m, t0);
  EXPECT_GT(a.answer_within, std::chrono::hours(24 * 365 * 100));  // the clock's whole range
  EXPECT_EQ(wait_now(m, t0 + 1h), search_time::max());
}

TEST(LeaderSearchLoneCoordinator, ARefusedConnectionToTheOnlyOneEndsTheSearch) {
  auto alone = machine(agent_rejoin_policy(false), {}, {"a:1"});
  auto a = ask_now(alone, t0);
  alone.on_answer(a.ticket, said(verdict::connection_refused), t0);
  EXPECT_EQ(give_up_now(alone, t0).reason, give_up_reason::nobody_listens);
  // A silence may be a cut: it goes on.
  auto silent = machine(agent_rejoin_policy(false), {}, {"a:1"});
  a = ask_now(silent, t0);
  silent.on_answer(a.ticket, said(verdict::no_answer), t0);
  EXPECT_EQ(wait_now(silent, t0), t0 + 250ms);
  // With standbys another may lead.
  auto several = machine(agent_rejoin_policy(true));
  a = ask_now(several, t0);
  several.on_answer(a.ticket, said(verdict::connection_refused), t0);
  EXPECT_EQ(wait_now(several, t0), t0 + 250ms);
  // Without the rule (the worker), it goes on too.
  auto worker = machine(worker_rehome_policy(false, 10s), {}, {"a:1"});
  a = ask_now(worker, t0);
  worker.on_answer(a.ticket, said(verdict::connection_refused), t0);
  EXPECT_EQ(wait_now(worker, t0), t0 + 50ms);
}

TEST(LeaderSearchConnection, ASilentOldConnectionIsTriedAgainAnewAtOnce) {
  auto m = machine(worker_start_policy(), {.last_leader = 2, .connected = true});
  auto a = ask_now(m, t0);
  EXPECT_EQ(a.index, 2u);
  EXPECT_TRUE(a.reuse_connection);
  EXPECT_EQ(a.connect_within, 0ms);
  EXPECT_EQ(a.answer_within, 1500ms);  // a connection try, not the whole hello window
  m.on_answer(a.ticket, said(verdict::no_answer), t0 + 1500ms);
  a = ask_now(m, t0 + 1500ms);  // no pause
  EXPECT_EQ(a.index, 2u);
  EXPECT_FALSE(a.reuse_connection);
  EXPECT_EQ(a.connect_within, 1500ms);
  EXPECT_EQ(a.answer_within, 30s);
  m.on_answer(a.ticket, said(verdict::not_leading), t0 + 1600ms);
  EXPECT_EQ(ask_now(m, t0 + 1650ms).index, 0u);
  EXPECT_EQ(m.record(2).tries, 2u);
}

TEST(LeaderSearchConnection, AnOldConnectionThatAnswersIsAnsweredAsAnyOther) {
  auto m = machine(worker_start_policy(), {.connected = true});
  auto a = ask_now(m, t0);
  m.on_answer(a.ticket, said(verdict::not_leading), t0);
  a = ask_now(m, t0 + 50ms);
  EXPECT_EQ(a.index, 1u);
  EXPECT_FALSE(a.reuse_connection);
}

TEST(LeaderSearchMachine, NoCoordinatorsNoSearch) {
  auto m = leader_search_machine({}, quick(), {});
  EXPECT_EQ(give_up_now(m, t0).reason, give_up_reason::no_endpoints);
}

TEST(LeaderSearchPresets, TodaysValuesPerCaller) {
  const auto connect = worker_connect_policy();
  EXPECT_EQ(connect.connect_try, 1500ms);
  EXPECT_EQ(connect.first_pause, 100ms);
  EXPECT_TRUE(connect.stop_on_other_job);

  const auto start = worker_start_policy();
  EXPECT_EQ(start.answer_try, 30s);
  EXPECT_EQ(start.first_pause, 50ms);
  EXPECT_TRUE(start.stop_on_refusal);
  EXPECT_FALSE(start.ask_each_before_giving_up);

  EXPECT_EQ(worker_rehome_policy(true, 20s).answer_try, 3s);
  EXPECT_EQ(worker_rehome_policy(true, 8s).answer_try, 2s);
  EXPECT_EQ(worker_rehome_policy(false, 8s).answer_try, 8s);
  EXPECT_EQ(worker_rehome_policy(true, 8s).connect_try, 250ms);
  EXPECT_FALSE(worker_rehome_policy(true, 8s).stop_on_refusal);

  const auto agent = agent_start_policy();
  EXPECT_EQ(agent.connect_floor, 200ms);
  EXPECT_EQ(agent.answer_floor, 1000ms);
  EXPECT_EQ(agent.answer_try, 10s);
  EXPECT_TRUE(agent.ask_each_before_giving_up);
  EXPECT_FALSE(agent.lone_refusal_is_final);

  EXPECT_EQ(agent_rehome_policy(10s, 0ms).answer_try, 2500ms);
  EXPECT_EQ(agent_rehome_policy(20s, 4s).answer_try, 2s);
  EXPECT_EQ(agent_rehome_policy(20s, 4s).connect_try, 400ms);

  const auto rejoin = agent_rejoin_policy(true);
  EXPECT_EQ(rejoin.answer_try, 3000ms);
  EXPECT_EQ(rejoin.max_pause, 5000ms);
  EXPECT_TRUE(rejoin.lone_refusal_is_final);
}

}  // namespace
}  // namespace troupe::actors::wire
