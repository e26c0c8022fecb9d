// The status board's rank table at the size of a large job (issue 41): a rank_joined or a
// rank_lost costs a logarithm. At small sizes the table is checked against the board as it was
// before, a JSON array that each join scanned and sorted again whole; then a job of 100,000
// ranks forms, which that board took minutes for.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "monitoring/events/events.hpp"
#include "monitoring/status_board.hpp"

namespace troupe::monitoring {
namespace {

using nlohmann::json;

// The rank table as the board kept it before: rows erased by a scan, every row sorted again
// on each join, a loss marked by a scan. The oracle; only the rank rows are modelled.
struct reference_table {
  json rows = json::array();

  void join(const events::rank_joined& e) {
    if (e.rank < 0) return;
    json row = {
        {"rank", e.rank}, {"member", e.member}, {"node", e.node}, {"pid", e.pid}, {"host", e.host}};
    for (auto it = rows.begin(); it != rows.end();)
      it = (*it).value("rank", -1.0) == e.rank ? rows.erase(it) : it + 1;
    rows.push_back(std::move(row));
    std::stable_sort(rows.begin(), rows.end(), [](const json& x, const json& y) {
      return x.value("rank", 0.0) < y.value("rank", 0.0);
    });
  }

  void lost(int member) {
    for (auto& row : rows)
      if (row.value("member", -1.0) == member) row["lost"] = true;
  }

  // set_ranks without a vote noted: no step times.
  void set(const std::vector<status_rank>& ranks) {
    rows = json::array();
    for (const auto& r : ranks) {
      json row = {{"rank", r.rank},
                  {"member", r.member},
                  {"node", r.node},
                  {"host", r.host},
                  {"pid", r.pid},
                  {"heartbeat_age_s", r.heartbeat_age_s},
                  {"straggler_score", r.straggler_score},
                  {"step_s", nullptr},
                  {"compute_s", nullptr}};
      rows.push_back(std::move(row));
    }
  }
};

events::rank_joined joined(int rank, int member) {
  return {.member = member,
          .rank = rank,
          .pid = 1000 + member,
          .host = "h" + std::to_string(member % 7),
          .node = member % 5,
          .generation = 1};
}

events::job_start session(int world) {
  events::job_start e;
  e.world = world;
  e.steps = 9;
  e.layout = {{"describe", "dp" + std::to_string(world)}};
  return e;
}

events::step step(int64_t number, double loss) {
  events::step e;
  e.step = number;
  e.loss = loss;
  e.world = 2;
  e.generation = 1;
  return e;
}

events::rank_lost lost(int member) {
  events::rank_lost e;
  e.member = member;
  e.rank = -1;
  return e;
}

// Random joins (ranks rejoining with other members), losses, tick tables and new sessions,
// through both ways in (an events.jsonl line, a typed event): the same table as the oracle's
// after every one.
TEST(StatusBoardScale, TheRankTableIsTheOneTheOldBoardKept) {
  for (bool typed : {false, true}) {
    std::mt19937 rng(41);
    status_board board;
    reference_table oracle;
    const auto observe = [&](const events::job_event& e) {
      if (typed)
        board.observe(e);
      else
        board.observe(events::to_json(e));
    };
    int next_member = 0;
    for (int i = 0; i < 3000; ++i) {
      const int what = static_cast<int>(rng() % 100);
      if (what < 70) {
        const int rank = static_cast<int>(rng() % 40) - 1;  // -1: a spare, not shown
        const auto e = joined(rank, rng() % 4 == 0 ? static_cast<int>(rng() % 60) : next_member++);
        observe(e);
        oracle.join(e);
      } else if (what < 90) {
        const int member = static_cast<int>(rng() % (next_member + 1));
        observe(lost(member));
        oracle.lost(member);
      } else if (what < 97) {
        std::vector<status_rank> rows;
        for (int r = 0; r < 40; ++r)
          if (rng() % 3 != 0)
            rows.push_back({r, static_cast<int>(rng() % 60), r % 3, "t", 7 + r, 0.25, 1.5});
        board.set_ranks(1, rows);
        oracle.set(rows);
      } else {
        observe(session(40));
        oracle.rows = json::array();
      }
      ASSERT_EQ(board.snapshot()["ranks"].dump(), oracle.rows.dump())
          << "after operation " << i << (typed ? " (typed)" : " (JSON)");
    }
  }
}

// The typed way in gives the document the JSON way gives, the last events included.
TEST(StatusBoardScale, ATypedEventFoldsAsItsLineDoes) {
  status_board from_lines, from_types;
  std::vector<events::job_event> run = {
      session(2),
      joined(1, 1),
      joined(0, 0),
      events::state{.from = "forming",
                    .to = "training",
                    .value = 1,
                    .generation = 1,
                    .step = 0,
                    .reason = "formed"},
      step(1, 2.5),
      step(2, 2.25),
      lost(1),
      events::untyped{json{{"event", "from_the_future"}, {"note", "hi"}, {"unix_ms", 5}}}};
  for (const auto& e : run) {
    from_lines.observe(events::to_json(e));
    from_types.observe(e);
  }
  // The clock's fields differ by the microseconds between the two calls.
  const auto without_clock = [](json doc) {
    doc.erase("updated_unix_ms");
    for (auto& e : doc["events"])
      if (e["event"] != "from_the_future") e.erase("unix_ms");
    return doc;
  };
  const json lines = without_clock(from_lines.snapshot());
  EXPECT_EQ(without_clock(from_types.snapshot()), lines);
  EXPECT_EQ(lines["events"].size(), 7u);        // the run of two steps keeps its newest
  EXPECT_EQ(lines["events"][6]["unix_ms"], 5);  // the future kind kept its own time
}

// A job of 100,000 ranks forms, its members joining in any order, and a tenth of them are
// lost: the old board sorted every row on each join (hours at this size).
TEST(StatusBoardScale, AHundredThousandRanksJoinInUnderTwoSeconds) {
  constexpr int ranks = 100000;
  std::vector<int> order(ranks);
  for (int r = 0; r < ranks; ++r) order[static_cast<size_t>(r)] = r;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  std::vector<json> lines;
  lines.reserve(ranks);
  for (int r : order) lines.push_back(events::to_json(joined(r, r)));

  status_board board;
  const auto start = std::chrono::steady_clock::now();
  for (const auto& line : lines) board.observe(line);
  for (int m = 0; m < ranks; m += 10) board.observe(events::job_event{lost(m)});
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 2.0) << ranks << " joins and " << ranks / 10 << " losses";
  std::printf("%d rank_joined lines and %d typed rank_lost folded in %.3f s\n", ranks, ranks / 10,
              took);

  const json doc = board.snapshot();
  ASSERT_EQ(doc["ranks"].size(), static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const json& row = doc["ranks"][static_cast<size_t>(r)];
    ASSERT_EQ(row["rank"], r);
    ASSERT_EQ(row.value("lost", false), r % 10 == 0) << row.dump();
  }
}

}  // namespace
}  // namespace troupe::monitoring
