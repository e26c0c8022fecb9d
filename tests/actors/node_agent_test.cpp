// How an agent of a job with several coordinators takes each one's answer to its hello: it
// follows only the leader, and never one of an older leadership than it already followed.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include "actors/connect.hpp"
#include "actors/messages.hpp"
#include "actors/node_supervisor.hpp"

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

}  // namespace
}  // namespace troupe::actors
