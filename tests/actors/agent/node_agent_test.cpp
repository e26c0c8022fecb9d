// How an agent of a job with several coordinators takes each one's answer to its hello: it
// follows only the leader, and never one of an older leadership than it already followed. And
// how it takes its coordinator's silence: with standbys, it looks for the leader after a
// heartbeat timeout; alone, it waits the coordinator timeout and fences.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "actors/agent/node_supervisor.hpp"
#include "actors/wire/connect.hpp"
#include "actors/wire/messages.hpp"

namespace troupe::actors {
namespace {

launch_plan answer(int64_t epoch, std::string error = "") {
  launch_plan p;
  p.epoch = epoch;
  p.error = std::move(error);
  return p;
}

TEST(LeaderAnswer, TheLeaderOfTheSameOrANewerEpochTakesTheAgentOn) {
  EXPECT_EQ(judge_leader_answer(answer(0), 0), leader_answer::accepted);  // no etcd at all
  EXPECT_EQ(judge_leader_answer(answer(7), 0), leader_answer::accepted);  // first contact
  // The leader it followed, asked again after a silence it survived.
  EXPECT_EQ(judge_leader_answer(answer(7), 7), leader_answer::accepted);
  EXPECT_EQ(judge_leader_answer(answer(12), 7), leader_answer::accepted);
}

TEST(LeaderAnswer, AStandbySendsTheAgentOn) {
  const std::string standby = std::string(not_leading_prefix) + "the leader is 10.0.0.2:7000";
  EXPECT_EQ(judge_leader_answer(answer(0, standby), 0), leader_answer::not_leading);
  // Its epoch does not matter: it leads nothing.
  EXPECT_EQ(judge_leader_answer(answer(3, standby), 9), leader_answer::not_leading);
}

TEST(LeaderAnswer, ADeposedLeaderIsPassedOver) {
  EXPECT_EQ(judge_leader_answer(answer(6), 7), leader_answer::stale);
}

TEST(LeaderAnswer, ARefusalIsFinal) {
  EXPECT_EQ(judge_leader_answer(answer(7, "protocol 3, this job speaks 4"), 0),
            leader_answer::refused);
  // The prefix counts only at the start.
  EXPECT_EQ(judge_leader_answer(answer(7, "job over; not leading: anything"), 0),
            leader_answer::refused);
}

// A coordinator as an agent sees it: one that stands by, or a leader of `epoch` that takes
// the agent on and then, after `linger`, either goes away (the agent must find the next
// leader) or tells it to stop (the job is over). Each writes a line per hello to `log_fd`.
struct fake_coordinator {
  bool leads = false;
  int64_t epoch = 0;
  bool then_stop = false;  // false: quit
  std::chrono::milliseconds linger{200};
};

caf::behavior coordinator_role(caf::event_based_actor* self, size_t index, fake_coordinator role,
                               int log_fd) {
  // Whoever is still here when the test is long over goes, so that its process ends.
  self->delayed_send(self, std::chrono::seconds(15), tick_atom::value);
  return {
      [=](const agent_hello& h) {
        const std::string line = std::to_string(index) + " " + std::to_string(h.rejoin) + " " +
                                 std::to_string(h.node) + " " + std::to_string(h.epoch_seen) + " " +
                                 std::to_string(h.members.size()) + "\n";
        (void)!::write(log_fd, line.data(), line.size());
        launch_plan plan;
        if (!role.leads) {
          plan.error = std::string(not_leading_prefix) + "standing by";
          return plan;
        }
        plan.node = 3;
        plan.epoch = role.epoch;
        plan.coordinator_timeout_ms = 20000;  // these do not beat
        auto agent = caf::actor_cast<caf::actor>(self->current_sender());
        if (role.then_stop)
          self->delayed_send(agent, role.linger, stop_atom::value);
        else
          self->delayed_send(self, role.linger, tick_atom::value);
        return plan;
      },
      [=](tick_atom) { self->quit(); },
  };
}

std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  return out;
}

// The agent passes a standby over, follows the leader, and when that leader goes away passes
// over a deposed one (older epoch) and rejoins the new leader, saying what it runs; then it
// stops when that leader says so. The coordinators live in a process of their own (actors of
// two systems in one process would share one node id).
TEST(AgentTakeover, FindsTheLeaderAtStartAndRejoinsTheNextOne) {
  const std::vector<fake_coordinator> roles{
      {false, 0},        // a standby
      {true, 5},         // the first leader; goes away
      {true, 4, true},   // deposed a while ago, and still answering
      {true, 6, true}};  // the new leader; ends the job
  int ports[2], hellos[2];
  ASSERT_EQ(::pipe(ports), 0);
  ASSERT_EQ(::pipe(hellos), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ports[0]);
    ::close(hellos[0]);
    {
      system_config cfg;
      cfg.use_network();
      caf::actor_system sys{cfg};
      for (size_t i = 0; i < roles.size(); ++i) {
        auto a = sys.spawn(coordinator_role, i, roles[i], hellos[1]);
        auto port = publish_for_job(sys, a, 0, "127.0.0.1", false, "test");
        const uint16_t p = port ? *port : 0;
        (void)!::write(ports[1], &p, sizeof p);
      }
      ::close(ports[1]);
    }
    ::_exit(0);
  }
  ::close(ports[1]);
  ::close(hellos[1]);
  agent_args args;
  for (size_t i = 0; i < roles.size(); ++i) {
    uint16_t p = 0;
    ASSERT_EQ(::read(ports[0], &p, sizeof p), static_cast<ssize_t>(sizeof p));
    ASSERT_NE(p, 0);
    args.coordinators.push_back({"127.0.0.1", p});
  }
  args.coordinator_host = args.coordinators.front().host;
  args.coordinator_port = args.coordinators.front().port;
  args.connect_timeout_ms = 10000;

  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(run_agent(args), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // index, rejoin, node, epoch seen, members: one hello each, in this order.
  EXPECT_EQ(read_all(hellos[0]),
            "0 0 -1 0 0\n"
            "1 0 -1 0 0\n"
            "2 1 3 5 0\n"
            "3 1 3 5 0\n");
  ::close(ports[0]);
  ::close(hellos[0]);
}

// A leader that takes the agent on and then never beats: the agent, alone with it or with a
// standby beside it, must notice the silence. What it does with a rejoining agent's hello:
// take it back on and then stop it (the job is over), or say that it no longer leads.
struct silent_leader {
  int32_t heartbeat_timeout_ms = 300;
  int32_t coordinator_timeout_ms = 2500;
  bool takes_rejoin = true;
};

int64_t monotonic_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Index 0 is the silent leader and any other a standby; each hello writes a line "index
// rejoin ms" to `log_fd` (ms on the steady clock, which both processes share).
caf::behavior silent_role(caf::event_based_actor* self, size_t index, silent_leader role,
                          int log_fd) {
  self->delayed_send(self, std::chrono::seconds(15), tick_atom::value);
  return {
      [=](const agent_hello& h) {
        const std::string line = std::to_string(index) + " " + std::to_string(h.rejoin) + " " +
                                 std::to_string(monotonic_ms()) + "\n";
        (void)!::write(log_fd, line.data(), line.size());
        launch_plan plan;
        if (index != 0 || (h.rejoin && !role.takes_rejoin)) {
          plan.error = std::string(not_leading_prefix) + "standing by";
          return plan;
        }
        plan.node = 0;
        plan.epoch = 1;
        plan.coordinator_timeout_ms = role.coordinator_timeout_ms;
        plan.heartbeat_timeout_ms = role.heartbeat_timeout_ms;
        if (h.rejoin)
          self->delayed_send(caf::actor_cast<caf::actor>(self->current_sender()),
                             std::chrono::milliseconds(50), stop_atom::value);
        return plan;
      },
      [=](tick_atom) { self->quit(); },
  };
}

struct hello_line {
  size_t index = 0;
  bool rejoin = false;
  int64_t ms = 0;
};

std::vector<hello_line> parse_hellos(const std::string& text) {
  std::vector<hello_line> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    hello_line h;
    int rejoin = 0;
    long long ms = 0;
    if (std::sscanf(line.c_str(), "%zu %d %lld", &h.index, &rejoin, &ms) == 3) {
      h.rejoin = rejoin != 0;
      h.ms = ms;
      out.push_back(h);
    }
  }
  return out;
}

struct silent_run {
  int exit_code = -1;
  std::chrono::milliseconds took{0};
  std::vector<hello_line> hellos;
};

// Runs an agent against `count` coordinators (the first the silent leader, the others
// standbys), served from a process of their own.
silent_run run_against_silent_leader(size_t count, silent_leader role) {
  silent_run out;
  int ports[2], hellos[2];
  if (::pipe(ports) != 0 || ::pipe(hellos) != 0) return out;
  const pid_t child = ::fork();
  if (child < 0) return out;
  if (child == 0) {
    ::close(ports[0]);
    ::close(hellos[0]);
    {
      system_config cfg;
      cfg.use_network();
      caf::actor_system sys{cfg};
      for (size_t i = 0; i < count; ++i) {
        auto a = sys.spawn(silent_role, i, role, hellos[1]);
        auto port = publish_for_job(sys, a, 0, "127.0.0.1", false, "test");
        const uint16_t p = port ? *port : 0;
        (void)!::write(ports[1], &p, sizeof p);
      }
      ::close(ports[1]);
    }
    ::_exit(0);
  }
  ::close(ports[1]);
  ::close(hellos[1]);
  agent_args args;
  bool published = true;
  for (size_t i = 0; i < count; ++i) {
    uint16_t p = 0;
    if (::read(ports[0], &p, sizeof p) != static_cast<ssize_t>(sizeof p) || p == 0)
      published = false;
    args.coordinators.push_back({"127.0.0.1", p});
  }
  if (published) {
    args.coordinator_host = args.coordinators.front().host;
    args.coordinator_port = args.coordinators.front().port;
    args.connect_timeout_ms = 10000;
    const auto start = std::chrono::steady_clock::now();
    out.exit_code = run_agent(args);
    out.took = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
  }
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  out.hellos = parse_hellos(read_all(hellos[0]));
  ::close(ports[0]);
  ::close(hellos[0]);
  return out;
}

// With a standby beside it the leader's silence counts after the heartbeat timeout, as it does
// for the workers: the agent asks for the leader long before the coordinator timeout.
TEST(AgentTakeover, LooksForTheLeaderAfterAHeartbeatTimeoutOfSilence) {
  const silent_leader role{300, 2500, true};
  const auto run = run_against_silent_leader(2, role);
  EXPECT_EQ(run.exit_code, 0);
  // The first hello at start, then the search: the standby first, the silent one last.
  ASSERT_EQ(run.hellos.size(), 3u);
  EXPECT_FALSE(run.hellos[0].rejoin);
  EXPECT_EQ(run.hellos[1].index, 1u);
  EXPECT_TRUE(run.hellos[1].rejoin);
  EXPECT_EQ(run.hellos[2].index, 0u);
  EXPECT_TRUE(run.hellos[2].rejoin);
  const int64_t silent_for = run.hellos[1].ms - run.hellos[0].ms;
  EXPECT_GE(silent_for, role.heartbeat_timeout_ms);
  EXPECT_LT(silent_for, role.coordinator_timeout_ms - 500);
}

// Alone, the coordinator keeps the whole coordinator timeout: the agent asks nobody, and
// fences its node (exit 1) only once the coordinator timeout has passed.
TEST(AgentTakeover, AloneItWaitsTheCoordinatorTimeoutThenFences) {
  const silent_leader role{300, 1500, true};
  const auto run = run_against_silent_leader(1, role);
  EXPECT_EQ(run.exit_code, 1);
  ASSERT_EQ(run.hellos.size(), 1u);
  EXPECT_FALSE(run.hellos[0].rejoin);
  EXPECT_GE(run.took.count(), role.coordinator_timeout_ms);
  EXPECT_LT(run.took.count(), 8000);
}

// Looking early does not fence early, nor late: with nobody leading, the agent searches for
// the coordinator timeout from when it started looking (as a worker does), then fences.
TEST(AgentTakeover, NoLeaderWithinTheCoordinatorTimeoutFencesTheNode) {
  const silent_leader role{300, 1500, false};
  const auto run = run_against_silent_leader(2, role);
  EXPECT_EQ(run.exit_code, 1);
  ASSERT_GE(run.hellos.size(), 3u);
  for (size_t i = 1; i < run.hellos.size(); ++i) EXPECT_TRUE(run.hellos[i].rejoin);
  const int64_t searched = run.hellos.back().ms - run.hellos[1].ms;
  EXPECT_LE(searched, role.coordinator_timeout_ms + 500);
  EXPECT_GE(run.took.count(), role.heartbeat_timeout_ms + role.coordinator_timeout_ms);
  EXPECT_LT(run.took.count(), 8000);
}

}  // namespace
}  // namespace troupe::actors
