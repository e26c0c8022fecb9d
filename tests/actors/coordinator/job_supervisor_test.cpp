// The actor around the job supervisor's logic, driven by stand-in members (scoped actors) in
// a real actor system: joins and the first generation, votes and commits, a lost member
// opening the next generation, and the end. The decisions themselves are tested as a pure
// state machine in job_logic_test.cpp.

#include "actors/coordinator/job_supervisor.hpp"

#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "actors/wire/connect.hpp"
#include "actors/wire/messages.hpp"
#include "strategies/planner.hpp"
#include "tests/actors/coordinator/small_job_setup.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

step_done vote(uint64_t generation, int64_t step, int32_t rank, double loss_sum, int64_t tokens) {
  step_done v;
  v.generation = generation;
  v.step = step;
  v.rank = rank;
  v.loss_sum = loss_sum;
  v.tokens = tokens;
  v.lr = 0.01;
  return v;
}

TEST(JobPolicyTest, CheckpointAndEvaluationSchedule) {
  EXPECT_TRUE(checkpoint_due(10, 20, 10));
  EXPECT_FALSE(checkpoint_due(9, 20, 10));
  EXPECT_TRUE(checkpoint_due(20, 20, 0));  // the last step is always kept
  EXPECT_FALSE(checkpoint_due(5, 20, 0));
  EXPECT_TRUE(evaluation_due(7, 7, 100));
  EXPECT_TRUE(evaluation_due(100, 400, 100));
  EXPECT_FALSE(evaluation_due(101, 400, 100));
}

TEST(JobPolicyTest, ParseEndpoint) {
  std::string host;
  uint16_t port = 0;
  EXPECT_TRUE(parse_endpoint("127.0.0.1:4000", host, port));
  EXPECT_EQ(host, "127.0.0.1");
  EXPECT_EQ(port, 4000);
  EXPECT_FALSE(parse_endpoint("127.0.0.1", host, port));
  EXPECT_FALSE(parse_endpoint(":80", host, port));
  EXPECT_FALSE(parse_endpoint("h:0", host, port));
  EXPECT_FALSE(parse_endpoint("h:70000", host, port));
  EXPECT_FALSE(parse_endpoint("h:12x", host, port));
}

TEST(JobPolicyTest, AdvertisedAddressFacesTheCoordinator) {
  EXPECT_EQ(local_address_toward("127.0.0.1", 9), "127.0.0.1");
  EXPECT_EQ(local_address_toward("127.0.0.5", 9), "127.0.0.1");  // loopback leaves by loopback
  EXPECT_EQ(local_address_toward("no-such-host.invalid", 9), "127.0.0.1");
}

class JobSupervisorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/troupe-js-XXXXXX";
    dir_ = mkdtemp(tmpl);
    events_.emplace(monitoring::event_log::open(dir_ + "/events.jsonl"));
  }
  void TearDown() override {
    if (supervisor_) caf::anon_send_exit(supervisor_, caf::exit_reason::kill);
    std::filesystem::remove_all(dir_);
  }

  void start(int world, int steps) {
    job_setup s = test::small_job_setup(world, steps, dir_, *events_, registry_,
                                        caf::actor_cast<caf::actor>(listener_));
    // The stand-in members send no heartbeats (job_logic_test covers them).
    s.cfg.elastic.heartbeat_timeout_ms = 60000;
    supervisor_ = spawn_job_supervisor(sys_, s);
  }

  welcome join(caf::scoped_actor& member, int m, int32_t protocol = protocol_version) {
    welcome w;
    hello h;
    h.protocol = protocol;
    h.member = m;
    h.pid = 100 + m;
    h.host = "test";
    member->request(supervisor_, 5s, h)
        .receive([&](welcome& x) { w = x; },
                 [&](caf::error& e) { ADD_FAILURE() << sys_.render(e); });
    return w;
  }

  // Answers the member's reconfigure; returns it.
  std::optional<reconfigure> take_place(caf::scoped_actor& member) {
    auto r = next<reconfigure>(member);
    if (r) {
      reconfigured done;
      done.generation = r->generation;
      done.member = r->member;
      done.rank = r->rank;
      member->send(supervisor_, done);
    }
    return r;
  }

  template <class T>
  std::optional<T> next(caf::scoped_actor& who, std::chrono::milliseconds timeout = 5s) {
    // Other messages (the coordinator's heartbeats) keep arriving: wait against a deadline.
    std::optional<T> got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto left = timeout; !got && left.count() > 0;
         left = std::chrono::duration_cast<std::chrono::milliseconds>(
             deadline - std::chrono::steady_clock::now()))
      who->receive([&](T& x) { got = x; }, [&](const heartbeat&) {}, [&](caf::message&) {},
                   caf::after(left) >> [] {});
    return got;
  }

  std::vector<std::string> event_names() {
    std::vector<std::string> out;
    std::ifstream in(dir_ + "/events.jsonl");
    for (std::string line; std::getline(in, line);)
      out.push_back(nlohmann::json::parse(line)["event"]);
    return out;
  }

  std::string dir_;
  std::optional<monitoring::event_log> events_;
  monitoring::metrics_registry registry_;
  system_config cfg_;
  caf::actor_system sys_{cfg_};
  caf::scoped_actor listener_{sys_};
  caf::actor supervisor_;
};

TEST_F(JobSupervisorTest, CommitsOnlyWhenEveryRankVoted) {
  start(2, 3);
  caf::scoped_actor r0{sys_}, r1{sys_};
  auto w0 = join(r0, 0);
  EXPECT_TRUE(w0.error.empty()) << w0.error;
  join(r1, 1);
  auto p0 = take_place(r0);
  auto p1 = take_place(r1);
  ASSERT_TRUE(p0 && p1);
  EXPECT_EQ(p0->generation, 1u);
  EXPECT_EQ(p0->world, 2);
  ASSERT_EQ(p0->rank, 0);

  r0->send(supervisor_, vote(1, 1, 0, 10.0, 5));
  // One vote is not enough: no commit yet (a short wait: the commit would be immediate).
  EXPECT_FALSE(next<commit>(r0, 200ms));
  // A vote from a stale generation is ignored.
  r1->send(supervisor_, vote(7, 1, 1, 10.0, 5));
  EXPECT_FALSE(next<commit>(r0, 200ms));
  r1->send(supervisor_, vote(1, 1, 1, 20.0, 5));
  auto c0 = next<commit>(r0);
  auto c1 = next<commit>(r1);
  ASSERT_TRUE(c0 && c1);
  EXPECT_EQ(c0->step, 1);
  EXPECT_FALSE(c0->checkpoint);
  // (10 + 20) / (5 + 5) tokens. The commit goes out before the metrics are updated (the
  // ranks should not wait for bookkeeping), so wait for the gauge with a deadline.
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (registry_.render_prometheus().find("\ntroupe_loss 3\n") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  EXPECT_NE(registry_.render_prometheus().find("\ntroupe_loss 3\n"), std::string::npos)
      << registry_.render_prometheus();
}

TEST_F(JobSupervisorTest, RefusesDuplicatesAndOtherProtocols) {
  start(2, 3);
  caf::scoped_actor r0{sys_}, dup{sys_}, bad{sys_}, old{sys_};
  EXPECT_TRUE(join(r0, 0).error.empty());
  EXPECT_NE(join(dup, 0).error.find("already joined"), std::string::npos);
  EXPECT_NE(join(bad, -3).error.find("not a valid member"), std::string::npos);
  EXPECT_NE(join(old, 1, protocol_version + 1).error.find("protocol"), std::string::npos);
}

TEST_F(JobSupervisorTest, LostMemberOpensTheNextGenerationForTheSurvivors) {
  start(2, 3);
  caf::scoped_actor r0{sys_};
  join(r0, 0);
  {
    caf::scoped_actor r1{sys_};
    join(r1, 1);
    take_place(r0);
    take_place(r1);
  }  // r1 terminates: the supervisor's monitor fires
  auto ab = next<abort_generation>(r0);
  ASSERT_TRUE(ab);
  EXPECT_EQ(ab->generation, 2u);
  EXPECT_FALSE(ab->final);
  // A loss in the middle of training: the survivor's place comes with the abort, and it
  // reports nothing.
  ASSERT_EQ(ab->then.size(), 1u);
  const reconfigure* again = &ab->then.front();
  EXPECT_EQ(again->generation, 2u);
  reconfigured done;
  done.generation = again->generation;
  done.member = again->member;
  done.rank = again->rank;
  r0->send(supervisor_, done);
  EXPECT_EQ(again->world, 1);
  EXPECT_EQ(again->source, state_source::self);
  r0->send(supervisor_, vote(2, 1, 0, 8.0, 4));
  auto c = next<commit>(r0);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->generation, 2u);
  auto names = event_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "rank_lost"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "generation"), names.end());
}

TEST_F(JobSupervisorTest, FinishesAfterFinalCheckpointAndValidation) {
  start(1, 1);
  caf::scoped_actor r0{sys_};
  join(r0, 0);
  take_place(r0);
  r0->send(supervisor_, vote(1, 1, 0, 8.0, 4));
  auto c = next<commit>(r0);
  ASSERT_TRUE(c);
  EXPECT_TRUE(c->checkpoint);  // the last step is always checkpointed and evaluated
  EXPECT_TRUE(c->evaluate);
  r0->send(supervisor_, eval_done{1, 1, 0, 3.0, 2});
  // A failed shard write is reported, not committed; the job still ends, and its exit status
  // says that nothing was saved after the failure.
  shard_written failed;
  failed.generation = 1;
  failed.step = 1;
  failed.ok = false;
  failed.error = "disk full";
  r0->send(supervisor_, failed);
  std::optional<job_result> res;
  listener_->receive([&](result_atom, job_result& r) { res = r; }, caf::after(5s) >> [] {});
  ASSERT_TRUE(res);
  EXPECT_EQ(res->exit_code, exit_code::checkpoint_failed) << res->message;
  EXPECT_NE(res->message.find("checkpoint of step 1 failed (rank 0: disk full)"), std::string::npos)
      << res->message;
  EXPECT_DOUBLE_EQ(res->val_loss, 1.5);
  EXPECT_EQ(res->steps_done, 1);
  EXPECT_TRUE(next<stop_atom>(r0).has_value());
  auto names = event_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "checkpoint_failed"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "validation"), names.end());
}

}  // namespace
}  // namespace troupe::actors
