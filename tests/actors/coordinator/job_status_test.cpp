// What the coordinator's tick adds to the status board (actors/coordinator/job_status.hpp): the
// rank table, published at most once a second (it costs a row per rank), but at once when a new
// generation, job state or leadership epoch changes what it shows.

#include "actors/coordinator/job_status.hpp"

#include <gtest/gtest.h>

#include "tests/actors/coordinator/logic_test_support.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

const logic_time t0 = logic_time{} + 1000s;

job_params two_ranks() {
  job_params p;
  p.cfg = test_support::small_config(2);
  p.plan = strategies::plan_of(strategies::plan_layout(2, p.cfg));
  p.members = 2;
  p.bounds.min_ranks = 1;
  p.bounds.max_ranks = 2;
  return p;
}

// Members 0 and 1 join: generation 1 places them, and its reconfigures are returned.
std::vector<send_reconfigure> form(job_logic& logic) {
  std::vector<send_reconfigure> sent;
  for (int32_t id : {0, 1}) {
    hello h;
    h.member = id;
    h.pid = 100 + id;
    h.host = "test";
    welcome w;
    for (auto& r : test_support::all_of<send_reconfigure>(logic.on_member_joined(h, t0, w)))
      sent.push_back(std::move(r));
  }
  return sent;
}

size_t rows(const monitoring::status_board& board) { return board.snapshot()["ranks"].size(); }

TEST(StatusPublisher, AtMostOnceASecondButAtOnceWhenTheTableChanges) {
  job_logic logic(two_ranks(), t0);
  const auto reconfigures = form(logic);
  ASSERT_EQ(reconfigures.size(), 2u);
  monitoring::status_board board;
  status_publisher tick(1s);
  EXPECT_TRUE(tick.tick(board, logic, t0, 0));  // the first tick publishes
  EXPECT_EQ(rows(board), 2u);
  EXPECT_EQ(board.snapshot()["role"], "leader");

  // Between publishes the table is left as it is (here: emptied by hand).
  board.set_ranks(1, {});
  EXPECT_FALSE(tick.tick(board, logic, t0 + 100ms, 0));
  EXPECT_FALSE(tick.tick(board, logic, t0 + 999ms, 0));
  EXPECT_EQ(rows(board), 0u);
  EXPECT_TRUE(tick.tick(board, logic, t0 + 1000ms, 0));
  EXPECT_EQ(rows(board), 2u);

  // The job starts training: at once.
  for (const auto& r : reconfigures) {
    reconfigured done;
    done.generation = r.msg.generation;
    done.member = r.member;
    done.rank = r.msg.rank;
    logic.on_reconfigured(done, t0 + 1100ms);
  }
  ASSERT_EQ(logic.state(), job_state::training);
  EXPECT_TRUE(tick.tick(board, logic, t0 + 1100ms, 0));
  EXPECT_FALSE(tick.tick(board, logic, t0 + 1200ms, 0));

  // Another leadership epoch: at once.
  EXPECT_TRUE(tick.tick(board, logic, t0 + 1300ms, 3));
  EXPECT_EQ(board.snapshot()["epoch"], 3);

  // A rank is lost: generation 2, its one rank shown at once.
  logic.on_member_lost(1, loss_cause::connection, "its connection closed", t0 + 1400ms);
  ASSERT_EQ(logic.generation(), 2u);
  EXPECT_TRUE(tick.tick(board, logic, t0 + 1400ms, 3));
  EXPECT_EQ(rows(board), 1u);
  EXPECT_FALSE(tick.tick(board, logic, t0 + 1500ms, 3));
}

}  // namespace
}  // namespace troupe::actors
