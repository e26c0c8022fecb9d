// The pipeline stage actors: two stages in two actor systems of this process, connected over
// the middleman (TCP) through a real key-value store, exchange pass notices; credits stop a
// stage that would overrun its neighbour; a neighbour's actor that goes away fails the wait
// at once with peer_lost; a missing notice fails at the deadline naming the pass.

#include "actors/worker/stage.hpp"

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <chrono>
#include <future>
#include <memory>

#include "actors/wire/messages.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using strategies::pipe_op;
using strategies::pipe_pass;

strategies::timed_op pass(pipe_pass p, int micro_batch, int stage) {
  strategies::timed_op t;
  t.stage = stage;
  t.op = pipe_op{p, micro_batch};
  return t;
}

struct two_stages {
  comm::tcp_store_server server;
  system_config cfg0, cfg1;
  std::unique_ptr<caf::actor_system> sys0, sys1;
  std::unique_ptr<comm::kv_store> store0, store1;
  std::unique_ptr<stage_link> first, last;

  explicit two_stages(int credits, std::chrono::milliseconds timeout = 5s) {
    cfg0.load<caf::io::middleman>();
    cfg1.load<caf::io::middleman>();
    sys0 = std::make_unique<caf::actor_system>(cfg0);
    sys1 = std::make_unique<caf::actor_system>(cfg1);
    store0 = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
    store1 = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
    // Each constructor waits for the other's address, so build them side by side.
    auto later = std::async(std::launch::async, [&] {
      return std::make_unique<stage_link>(*sys1, *store1, 1, "pp.test", 1, 2, 0, timeout);
    });
    first = std::make_unique<stage_link>(*sys0, *store0, 1, "pp.test", 0, 2, credits, timeout);
    last = later.get();
    first->begin_step(1);
    last->begin_step(1);
  }
};

TEST(StageLinkTest, NoticesFlowBothWaysAndCreditsComeBack) {
  two_stages s(2);
  s.first->done(pass(pipe_pass::forward, 0, 0));    // credit 2 -> 1
  s.last->waiting(pipe_op{pipe_pass::forward, 0});  // the notice arrived
  s.first->done(pass(pipe_pass::forward, 1, 0));    // 1 -> 0
  s.last->done(pass(pipe_pass::backward, 0, 1));
  s.first->waiting(pipe_op{pipe_pass::backward, 0});  // takes B0's notice: credit back to 1
  s.first->done(pass(pipe_pass::forward, 2, 0));      // allowed again
  s.last->waiting(pipe_op{pipe_pass::forward, 1});
  s.last->waiting(pipe_op{pipe_pass::forward, 2});
}

TEST(StageLinkTest, AStageThatWouldOverrunItsNeighbourIsStopped) {
  two_stages s(1);
  s.first->done(pass(pipe_pass::forward, 0, 0));
  EXPECT_THROW(s.first->done(pass(pipe_pass::forward, 1, 0)), std::logic_error);
}

TEST(StageLinkTest, AMissingNoticeFailsAtTheDeadlineNamingThePass) {
  two_stages s(2, 300ms);
  const auto start = std::chrono::steady_clock::now();
  try {
    s.last->waiting(pipe_op{pipe_pass::forward, 3});
    FAIL() << "no notice was sent, yet the wait returned";
  } catch (const comm::comm_error& e) {
    EXPECT_EQ(e.code(), comm::comm_errc::timeout);
    EXPECT_NE(std::string(e.what()).find("stage 0's notice of F3"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
}

TEST(StageLinkTest, ANoticeOfAnotherStepDoesNotCount) {
  two_stages s(2, 300ms);
  s.first->begin_step(7);
  s.first->done(pass(pipe_pass::forward, 0, 0));
  EXPECT_THROW(s.last->waiting(pipe_op{pipe_pass::forward, 0}),
               comm::comm_error);  // it waits for step 1's
}

TEST(StageLinkTest, ANeighbourThatGoesAwayFailsTheWaitAtOnce) {
  two_stages s(2, 30s);
  auto waiting = std::async(std::launch::async, [&] {
    s.last->waiting(pipe_op{pipe_pass::forward, 0});
  });
  const auto start = std::chrono::steady_clock::now();
  s.first.reset();  // its actor exits and its node says so
  try {
    waiting.get();
    FAIL() << "the wait returned without a notice";
  } catch (const comm::comm_error& e) {
    EXPECT_EQ(e.code(), comm::comm_errc::peer_lost) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

}  // namespace
}  // namespace troupe::actors
