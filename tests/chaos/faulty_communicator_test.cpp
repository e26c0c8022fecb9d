// Fault plans parse strictly, and the decorator fails, hangs (until abort or deadline)
// exactly on the planned call of a real single-rank Gloo communicator.

#include "chaos/faulty_communicator.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::chaos {
namespace {

using namespace std::chrono_literals;

TEST(FaultPlanTest, Parses) {
  EXPECT_FALSE(parse_fault_plan(""));
  auto p = parse_fault_plan("hang@7");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->kind, comm_fault::hang);
  EXPECT_EQ(p->at_call, 7u);
  EXPECT_FALSE(p->every);
  auto d = parse_fault_plan("delay@2,every,delay:250");
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->every);
  EXPECT_EQ(d->delay, 250ms);
  EXPECT_THROW(parse_fault_plan("explode@1"), std::invalid_argument);
  EXPECT_THROW(parse_fault_plan("fail@x"), std::invalid_argument);
  EXPECT_THROW(parse_fault_plan("fail@0"), std::invalid_argument);
  EXPECT_THROW(parse_fault_plan("fail@1,sometimes"), std::invalid_argument);
  EXPECT_THROW(parse_fault_plan("delay@1,every"), std::invalid_argument);  // delays nothing
  EXPECT_THROW(parse_fault_plan("delay@1,delay:0"), std::invalid_argument);
  EXPECT_THROW(parse_fault_plan("fail@1,delay:5"), std::invalid_argument);
}

class FaultyCommunicatorTest : public ::testing::Test {
 protected:
  std::unique_ptr<faulty_communicator> make(fault_plan plan) {
    auto inner =
        comm::make_gloo_communicator(*store_, comm::comm_identity{++generation_, "world", 0, 1});
    return std::make_unique<faulty_communicator>(std::move(inner), plan);
  }
  comm::tcp_store_server server_{"127.0.0.1", 0};
  std::unique_ptr<comm::kv_store> store_ = comm::connect_tcp_store("127.0.0.1", server_.port(), 5s);
  uint64_t generation_ = 0;
};

TEST_F(FaultyCommunicatorTest, FailsExactlyOnThePlannedCall) {
  auto c = make({comm_fault::fail, 2});
  float x = 1;
  c->all_reduce(&x, 1, comm::reduce_op::sum, {});
  try {
    c->barrier({});
    FAIL() << "the second call should fail";
  } catch (const comm::comm_error& e) {
    EXPECT_EQ(e.code(), comm::comm_errc::internal);
    EXPECT_NE(std::string(e.what()).find("barrier #2"), std::string::npos);
  }
  c->all_reduce(&x, 1, comm::reduce_op::sum, {});  // not "every": the third call is fine
  EXPECT_EQ(x, 1.0f);
}

TEST_F(FaultyCommunicatorTest, HangEndsAtTheDeadline) {
  auto c = make({comm_fault::hang, 1});
  float x = 1;
  auto t0 = std::chrono::steady_clock::now();
  try {
    c->all_reduce(&x, 1, comm::reduce_op::sum, {200ms});
    FAIL() << "a hang should time out";
  } catch (const comm::comm_error& e) {
    EXPECT_EQ(e.code(), comm::comm_errc::internal);
  }
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 5s);
}

TEST_F(FaultyCommunicatorTest, AbortUnblocksAHang) {
  auto c = make({comm_fault::hang, 1});
  std::thread aborter([&] {
    // Abort only once the collective is in flight.
    while (c->calls() == 0) std::this_thread::yield();
    c->abort();
  });
  float x = 1;
  auto t0 = std::chrono::steady_clock::now();
  try {
    c->all_reduce(&x, 1, comm::reduce_op::sum, {30s});
    FAIL() << "abort should unblock the hang";
  } catch (const comm::comm_error& e) {
    EXPECT_EQ(e.code(), comm::comm_errc::aborted);
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

}  // namespace
}  // namespace troupe::chaos
