// membership's indexed lookups and kept counts (actors/coordinator/job/membership.hpp) against
// a scan of members() through random admits, losses, placements and report rounds, and a job of
// 200,000 members whose every heartbeat, vote lookup, report and reconfigure costs O(1).

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include "actors/coordinator/job/membership.hpp"

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;

const logic_time t0 = logic_time{} + 1000s;

job_params params(int members) {
  job_params p;
  p.members = members;
  p.nodes = 1;
  p.heartbeat_timeout = 2000ms;
  return p;
}

hello worker(int32_t member, int32_t pid) {
  hello h;
  h.member = member;
  h.pid = pid;
  h.host = "test";
  return h;
}

// The answers membership gave when every query was a scan of members().
const member_info* scanned(const membership& m, int32_t id) {
  for (const auto& x : m.members())
    if (x.id == id) return &x;
  return nullptr;
}

int32_t scanned_member_of_rank(const membership& m, int32_t rank) {
  for (const auto& x : m.members())
    if (x.live && x.rank == rank && rank >= 0) return x.id;
  return -1;
}

int scanned_count(const membership& m, bool (*which)(const member_info&)) {
  return static_cast<int>(std::count_if(m.members().begin(), m.members().end(), which));
}

void expect_agrees_with_scan(const membership& m, int max_id, const std::string& after) {
  SCOPED_TRACE(after);
  for (int32_t id = -2; id <= max_id + 2; ++id) ASSERT_EQ(m.find(id), scanned(m, id)) << id;
  for (int32_t r = -2; r <= max_id + 2; ++r)
    ASSERT_EQ(m.member_of_rank(r), scanned_member_of_rank(m, r)) << r;
  EXPECT_EQ(m.live_count(), scanned_count(m, [](const member_info& x) { return x.live; }));
  EXPECT_EQ(m.idle_count(),
            scanned_count(m, [](const member_info& x) { return x.live && x.rank < 0; }));
  EXPECT_EQ(m.everyone_reported(),
            scanned_count(m, [](const member_info& x) { return x.live && !x.reported; }) == 0);
  EXPECT_EQ(m.everyone_reconfigured(),
            scanned_count(m, [](const member_info& x) { return x.live && !x.reconfigured; }) == 0);
  int first = 0;
  for (const auto& x : m.members()) first += x.live && x.id >= 0 && x.id < m.expected();
  EXPECT_EQ(m.live_first_members(), first);
  const member_info* unready = nullptr;
  for (const auto& x : m.members())
    if (x.live && !(x.reported && x.reconfigured)) {
      unready = &x;
      break;
    }
  EXPECT_EQ(m.first_unready(), unready);
}

TEST(MembershipIndex, AgreesWithAScanThroughAdmitsLossesPlacementsAndReports) {
  for (unsigned seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    constexpr int max_id = 24;
    membership m(params(12));  // ids 12..24 are members that joined later
    auto pick = [&](int hi) { return std::uniform_int_distribution<int>(0, hi)(rng); };
    int32_t pid = 1000;
    actions out;
    for (int op = 0; op < 400; ++op) {
      std::string what;
      switch (pick(9)) {
        case 0:
        case 1: {  // a worker joins (a first one, a later one, a restart, a duplicate)
          welcome w;
          const int32_t id = pick(max_id);
          m.admit(worker(id, pid++), pick(1) == 0, false, t0, w, out);
          what = "admit " + std::to_string(id);
          break;
        }
        case 2: {
          const int32_t id = pick(max_id);
          m.lose(id, pick(3) == 0 ? loss_cause::straggler : loss_cause::exit, "test", 0, out);
          what = "lose " + std::to_string(id);
          break;
        }
        case 3: {  // a generation of live, lost and unknown members
          restore_plan plan;
          std::vector<int32_t> ids(max_id + 3);
          std::iota(ids.begin(), ids.end(), -1);
          std::shuffle(ids.begin(), ids.end(), rng);
          ids.resize(static_cast<size_t>(pick(max_id)));
          plan.member_of_rank = ids;
          m.place(plan);
          what = "place";
          break;
        }
        case 4:
          m.next_generation();
          m.abort_live("test", out);
          what = "abort_live";
          break;
        case 5:
          if (pick(1) == 0)
            m.all_reported();
          else
            m.assume_reports(3);
          what = "all reported";
          break;
        case 6: {
          state_report r;
          r.member = pick(max_id);
          r.held_generation = 1;
          r.held_rank = pick(5);
          m.report(r);
          what = "report " + std::to_string(r.member);
          break;
        }
        case 7:
          m.mark_reconfigured(pick(max_id));
          what = "reconfigured";
          break;
        case 8: {
          heartbeat h;
          h.member = pick(max_id);
          m.record_heartbeat(h, t0 + 1s, out);
          what = "heartbeat";
          break;
        }
        default:
          m.set_held(pick(max_id), 2, pick(5), 9);
          what = "set_held";
      }
      out.clear();
      expect_agrees_with_scan(m, max_id, "op " + std::to_string(op) + ": " + what);
      if (HasFatalFailure()) return;
    }
  }
}

// What the coordinator does per message, at a size where a scan per message (the old lookups)
// would take minutes: 200,000 heartbeats, votes, state reports and reconfigures.
TEST(MembershipIndex, EveryPerMessageQueryOfAHugeJobIsConstantTime) {
  constexpr int n = 200'000;
  membership m(params(n));
  actions out;
  for (int32_t id = 0; id < n; ++id) {
    welcome w;
    ASSERT_TRUE(m.admit(worker(id, 1000 + id), true, false, t0, w, out));
  }
  out.clear();
  out.shrink_to_fit();
  EXPECT_EQ(m.live_first_members(), n);
  // Rank r is held by member n - 1 - r, so a rank and its member differ.
  restore_plan plan;
  plan.member_of_rank.resize(n);
  for (int32_t r = 0; r < n; ++r) plan.member_of_rank[static_cast<size_t>(r)] = n - 1 - r;
  m.all_reported();
  m.place(plan);

  const auto start = std::chrono::steady_clock::now();
  int64_t checked = 0;
  for (int32_t r = 0; r < n; ++r) {
    heartbeat h;
    h.member = r;
    m.record_heartbeat(h, t0 + 1s, out);
    const int32_t voter = m.member_of_rank(r);  // a vote
    const member_info* info = m.find(voter);
    checked += voter == n - 1 - r && info && info->rank == r;
    m.mark_reconfigured(voter);
    checked += m.everyone_reconfigured() == (r == n - 1);
    checked += m.live_count() == n && m.idle_count() == 0;
  }
  EXPECT_TRUE(out.empty()) << "every heartbeat came from a live member";
  m.next_generation();
  m.abort_live("a loss", out);
  for (int32_t id = 0; id < n; ++id) {
    state_report s;
    s.member = id;
    s.held_generation = 1;
    s.held_rank = n - 1 - id;
    checked += m.report(s);
    checked += m.everyone_reported() == (id == n - 1);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(checked, 5LL * n);
  EXPECT_LT(seconds, 2.0) << "per-message lookups scan the members";
  // A loss takes its rank's member away.
  ASSERT_TRUE(m.lose(n - 1, loss_cause::exit, "test", 0, out));
  EXPECT_EQ(m.member_of_rank(0), -1);
  EXPECT_EQ(m.live_count(), n - 1);
}

}  // namespace
}  // namespace troupe::actors
