// --fault specs: every kind parses, every malformed spec is refused with its field named, and a
// random schedule is the same for a seed everywhere.

#include "chaos/fault_spec.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "runtime/config.hpp"

namespace troupe::chaos {
namespace {

using std::chrono::milliseconds;

const fault_bounds job{.world = 4, .nodes = 2, .steps = 100};

fault one(const std::string& spec, const fault_bounds& b = job) {
  auto faults = parse_fault(spec, b);
  EXPECT_EQ(faults.size(), 1u) << spec;
  return faults.empty() ? fault{} : faults.front();
}

// The message of the config_error the spec is refused with; "" when it is accepted.
std::string refusal(const std::string& spec, const fault_bounds& b = job) {
  try {
    parse_fault(spec, b);
  } catch (const config_error& e) {
    return e.what();
  }
  return "";
}

TEST(FaultSpecTest, KillsARank) {
  const auto f = one("kill:rank=1:step=8");
  EXPECT_EQ(f.kind, fault_kind::kill);
  EXPECT_EQ(f.target, fault_target::rank);
  EXPECT_EQ(f.id, 1);
  EXPECT_EQ(f.step, 8);
  EXPECT_EQ(f.duration, milliseconds(0));
  EXPECT_EQ(f.spec, "kill:rank=1:step=8");
}

TEST(FaultSpecTest, KillsANodeOrTheCoordinator) {
  const auto n = one("kill:node=1:step=12");
  EXPECT_EQ(n.target, fault_target::node);
  EXPECT_EQ(n.id, 1);
  EXPECT_EQ(n.step, 12);
  const auto c = one("kill:coordinator:step=15");
  EXPECT_EQ(c.kind, fault_kind::kill);
  EXPECT_EQ(c.target, fault_target::coordinator);
  EXPECT_EQ(c.id, -1);
  EXPECT_EQ(c.step, 15);
  EXPECT_EQ(c.commits, -1);
  const auto mid = one("kill:coordinator:step=15:commits=2");
  EXPECT_EQ(mid.target, fault_target::coordinator);
  EXPECT_EQ(mid.commits, 2);
}

TEST(FaultSpecTest, StopsARankForADuration) {
  const auto forever = one("stop:rank=2:step=5");
  EXPECT_EQ(forever.kind, fault_kind::stop);
  EXPECT_EQ(forever.id, 2);
  EXPECT_EQ(forever.step, 5);
  EXPECT_EQ(forever.duration, milliseconds(0));
  EXPECT_EQ(one("stop:rank=2:step=5:for=3s").duration, milliseconds(3000));
  EXPECT_EQ(one("stop:rank=2:step=5:for=500ms").duration, milliseconds(500));
  EXPECT_EQ(one("stop:rank=2:step=5:for=1.5s").duration, milliseconds(1500));
  EXPECT_EQ(one("stop:rank=2:step=5:for=0.25s").duration, milliseconds(250));
  EXPECT_EQ(one("stop:rank=2:step=5:for=0.001s").duration, milliseconds(1));
  EXPECT_EQ(one("stop:rank=2:step=5:for=86400s").duration, milliseconds(86'400'000));
}

TEST(FaultSpecTest, PoisonsTheBatchOfOneStepOnce) {
  const auto f = one("diverge:step=7");
  EXPECT_EQ(f.kind, fault_kind::diverge);
  EXPECT_EQ(f.target, fault_target::rank);
  EXPECT_EQ(f.id, 0);
  EXPECT_EQ(f.step, 7);
  EXPECT_EQ(one("diverge:rank=3:step=2").id, 3);
  const std::vector<fault> faults{f};
  EXPECT_TRUE(diverges(faults, 0, 6));
  EXPECT_FALSE(diverges(faults, 0, 7)) << "the batch was skipped: the replay is clean";
  EXPECT_FALSE(diverges(faults, 1, 6)) << "another rank";
  EXPECT_FALSE(diverges(faults, 0, 5));
  EXPECT_NE(refusal("diverge:rank=9:step=2").find("outside the world"), std::string::npos);
  // Under --exit-after-step 100 of --steps 200, a batch of step 150 can still be met (after
  // skips); a kill at step 150 cannot.
  EXPECT_EQ(parse_faults("diverge:step=150", 4, 1, 100, 200).at(0).step, 150);
  EXPECT_THROW(parse_faults("diverge:step=201", 4, 1, 100, 200), config_error);
  EXPECT_THROW(parse_faults("kill:rank=0:step=150", 4, 1, 100, 200), config_error);
  EXPECT_NE(refusal("diverge:rank=1").find("step= is missing"), std::string::npos);
}

TEST(FaultSpecTest, SlowsARankFromAStep) {
  const auto f = one("slow:rank=0:factor=2:from=10");
  EXPECT_EQ(f.kind, fault_kind::slow);
  EXPECT_EQ(f.target, fault_target::rank);
  EXPECT_EQ(f.id, 0);
  EXPECT_EQ(f.step, 10);
  EXPECT_DOUBLE_EQ(f.factor, 2.0);
  EXPECT_DOUBLE_EQ(one("slow:rank=3:factor=1.25:from=1").factor, 1.25);
}

TEST(FaultSpecTest, FieldsComeInAnyOrder) {
  auto a = one("kill:step=8:rank=1");
  auto b = one("kill:rank=1:step=8");
  a.spec = b.spec;
  EXPECT_EQ(a, b);
  EXPECT_EQ(one("slow:from=10:factor=2:rank=0").factor, 2.0);
  EXPECT_EQ(one("kill:step=15:coordinator").target, fault_target::coordinator);
}

TEST(FaultSpecTest, TheLastStepAndTheWholeWorldAreAllowed) {
  EXPECT_EQ(one("kill:rank=3:step=100").step, 100);
  EXPECT_EQ(one("kill:node=0:step=1").step, 1);
}

TEST(FaultSpecTest, AnUnknownLastStepOnlyChecksTheLowerBound) {
  const fault_bounds open{.world = 4, .nodes = 2, .steps = 0};
  EXPECT_EQ(one("kill:rank=1:step=123456", open).step, 123456);
  EXPECT_NE(refusal("kill:rank=1:step=0", open), "");
  EXPECT_NE(refusal("kill:rank=1:step=99999999999999", open), "");  // beyond any run
}

TEST(FaultSpecTest, MessagesNameTheSpecTheFieldAndWhatIsAllowed) {
  EXPECT_EQ(refusal("kill:rank=7:step=3"),
            "--fault 'kill:rank=7:step=3': rank 7 is outside the world of 4 (0..3)");
  EXPECT_EQ(refusal("kill:node=2:step=3"),
            "--fault 'kill:node=2:step=3': node 2 is outside the job's 2 nodes (0..1)");
  EXPECT_EQ(refusal("kill:rank=1:step=101"),
            "--fault 'kill:rank=1:step=101': step 101 is after the run's last step 100 (1..100)");
  EXPECT_EQ(refusal("kill:rank=1:step=0"),
            "--fault 'kill:rank=1:step=0': step must be 1 or more (steps are numbered from 1), "
            "got 0");
  EXPECT_EQ(refusal("kill:rank=1:step=2:color=red"),
            "--fault 'kill:rank=1:step=2:color=red': unknown field 'color' (kill takes rank, "
            "node, coordinator, step, commits)");
  EXPECT_EQ(refusal("explode:rank=1:step=2"),
            "--fault 'explode:rank=1:step=2': unknown kind 'explode' (kill, stop, slow, diverge "
            "or random)");
  EXPECT_EQ(refusal("slow:rank=0:factor=nan:from=3"),
            "--fault 'slow:rank=0:factor=nan:from=3': factor must be more than 1 and at most 100, "
            "got 'nan'");
}

TEST(FaultSpecTest, RefusesEveryMalformedSpec) {
  // Each with a piece of the message it must carry.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {":", "unknown kind ''"},
      {"kill", "name the target"},
      {"KILL:rank=1:step=2", "unknown kind 'KILL'"},
      {" kill:rank=1:step=2", "unknown kind ' kill'"},
      // targets
      {"kill:step=2", "name the target"},
      {"kill:rank=1:node=0:step=2", "name one target"},
      {"kill:rank=1:coordinator:step=2", "name one target"},
      {"kill:coordinator=1:step=2", "coordinator takes no value"},
      {"kill:rank=1:step=2:commits=1", "commits= is for kill:coordinator only"},
      {"kill:coordinator:step=2:commits=9", "commits 9 is outside 0..4"},
      {"kill:coordinator:step=2:commits=x", "commits must be a whole number"},
      {"kill:rank:step=2", "expected key=value, got 'rank'"},
      {"kill:rank=-1:step=2", "rank -1 is outside the world of 4"},
      {"kill:rank=4:step=2", "rank 4 is outside the world of 4"},
      {"kill:rank=x:step=2", "rank must be a whole number, got 'x'"},
      {"kill:rank=1.0:step=2", "rank must be a whole number"},
      {"kill:rank=+1:step=2", "rank must be a whole number"},
      {"kill:rank=0x1:step=2", "rank must be a whole number"},
      {"kill:rank=99999999999999999999:step=2", "rank '99999999999999999999' is too large"},
      {"kill:node=-1:step=2", "node -1 is outside"},
      {"stop:node=0:step=2", "stop applies to a rank only"},
      {"stop:coordinator:step=2", "stop applies to a rank only"},
      {"slow:node=0:factor=2:from=2", "slow applies to a rank only"},
      // steps
      {"kill:rank=1", "step= is missing"},
      {"kill:rank=1:step=", "step has no value"},
      {"kill:rank=1:step=-3", "step must be 1 or more"},
      {"kill:rank=1:step=8.5", "step must be a whole number, got '8.5'"},
      {"kill:rank=1:step=8x", "step must be a whole number, got '8x'"},
      {"kill:rank=1:step= 8", "step must be a whole number"},
      {"kill:rank=1:step=8 ", "step must be a whole number"},
      {"kill:rank=1:step=99999999999999999999", "is too large"},
      {"kill:rank=1:step=101", "after the run's last step 100"},
      // structure
      {"kill:rank=1:rank=1:step=2", "rank is given twice"},
      {"kill:rank=1:step=2:step=3", "step is given twice"},
      {"kill:rank=1:step=2:", "field 4 is empty"},
      {"kill::rank=1:step=2", "field 2 is empty"},
      {"kill:rank=1:=2:step=2", "a field has no name"},
      {"kill:rank=1:step=2:for=3s", "unknown field 'for'"},
      {"kill:rank=1:step=2:garbage", "expected key=value, got 'garbage'"},
      {"kill:rank=1:step=2;", "step must be a whole number, got '2;'"},
      // stop durations
      {"stop:rank=1", "step= is missing"},
      {"stop:step=2", "rank= is missing"},
      {"stop:rank=1:step=2:for=3", "for must be a duration like 500ms, 3s or 1.5s, got '3'"},
      {"stop:rank=1:step=2:for=s", "for must be a duration"},
      {"stop:rank=1:step=2:for=ms", "for must be a duration"},
      {"stop:rank=1:step=2:for=-3s", "for must be a duration"},
      {"stop:rank=1:step=2:for=+3s", "for must be a duration"},
      {"stop:rank=1:step=2:for=.5s", "for must be a duration"},
      {"stop:rank=1:step=2:for=5.s", "for must be a duration"},
      {"stop:rank=1:step=2:for=1.5ms", "for must be a duration"},
      {"stop:rank=1:step=2:for=1.2345s", "for must be a duration"},
      {"stop:rank=1:step=2:for=3m", "for must be a duration"},
      {"stop:rank=1:step=2:for=3S", "for must be a duration"},
      {"stop:rank=1:step=2:for=1e3ms", "for must be a duration"},
      {"stop:rank=1:step=2:for=0s", "for must be more than 0"},
      {"stop:rank=1:step=2:for=0ms", "for must be more than 0"},
      {"stop:rank=1:step=2:for=86401s", "for must be at most 86400s"},
      {"stop:rank=1:step=2:for=86400001ms", "for must be at most 86400s"},
      {"stop:rank=1:step=2:for=99999999999999999999s", "is too large"},
      // slow factors
      {"slow:rank=0:from=10", "factor= is missing"},
      {"slow:rank=0:factor=2", "from= is missing"},
      {"slow:factor=2:from=10", "rank= is missing"},
      {"slow:rank=0:factor=2:step=10", "unknown field 'step'"},
      {"slow:rank=0:factor=1:from=10", "factor must be more than 1"},
      {"slow:rank=0:factor=0.5:from=10", "factor must be more than 1"},
      {"slow:rank=0:factor=-2:from=10", "factor must be more than 1"},
      {"slow:rank=0:factor=inf:from=10", "factor must be more than 1"},
      {"slow:rank=0:factor=infinity:from=10", "factor must be more than 1"},
      {"slow:rank=0:factor=1e999:from=10", "factor must be more than 1"},
      {"slow:rank=0:factor=101:from=10", "at most 100"},
      {"slow:rank=0:factor=two:from=10", "factor must be a number like 2 or 1.5, got 'two'"},
      {"slow:rank=0:factor=2x:from=10", "factor must be a number"},
      {"slow:rank=0:factor=0x2:from=10", "factor must be a number"},
      {"slow:rank=0:factor=2:from=0", "from must be 1 or more"},
      {"slow:rank=0:factor=2:from=101", "from 101 is after the run's last step 100"},
  };
  for (const auto& [spec, piece] : cases) {
    const std::string message = refusal(spec);
    EXPECT_NE(message.find(piece), std::string::npos)
        << "spec '" << spec << "': got '" << message << "', wanted '" << piece << "'";
    if (!spec.empty()) {
      EXPECT_NE(message.find(spec), std::string::npos) << message;
    }
  }
}

TEST(FaultSpecTest, UnprintableBytesAreEscapedInMessages) {
  const std::string message = refusal(std::string("kill:rank=\x01\xff:step=2"));
  EXPECT_NE(message.find("rank=\\x01\\xff"), std::string::npos) << message;
}

TEST(FaultSpecTest, AnEmptyWorldHasNoRankToHit) {
  const fault_bounds none{.world = 0, .nodes = 0, .steps = 100};
  EXPECT_NE(refusal("kill:rank=0:step=2", none).find("no rank to hit"), std::string::npos);
  EXPECT_NE(refusal("kill:node=0:step=2", none).find("no node to hit"), std::string::npos);
  EXPECT_NE(refusal("random:kills=1:seed=1", none).find("no rank to kill"), std::string::npos);
}

// Never crashes, whatever it is given: every input parses or is refused with a config_error.
TEST(FaultSpecTest, AnyInputParsesOrIsRefused) {
  const std::vector<std::string> pieces = {"kill",        "stop",  "slow",
                                           "random",      ":",     ":",
                                           "=",           "rank",  "node",
                                           "coordinator", "step",  "for",
                                           "factor",      "from",  "kills",
                                           "seed",        "every", "nodes",
                                           "0",           "1",     "3",
                                           "-",           ".",     "5",
                                           "ms",          "s",     "99999999999999999999",
                                           "nan",         "inf",   "e",
                                           "\xff",        " ",     ";"};
  uint64_t x = 12345;
  const auto next = [&x] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  for (int i = 0; i < 20000; ++i) {
    std::string spec;
    const auto n = next() % 12;
    for (uint64_t k = 0; k < n; ++k) spec += pieces[next() % pieces.size()];
    try {
      for (const auto& f : parse_fault(spec, job)) {
        EXPECT_GE(f.step, 1) << spec;
        EXPECT_LE(f.step, job.steps) << spec;
        EXPECT_FALSE(to_json(f).empty());
      }
    } catch (const config_error&) {
    }
  }
}

// --- random schedules ---

std::vector<fault> schedule(const std::string& spec, const fault_bounds& b = job) {
  return parse_fault(spec, b);
}

TEST(FaultSpecTest, RandomExpandsIntoItsKills) {
  const auto kills = schedule("random:kills=10:seed=3");
  ASSERT_EQ(kills.size(), 10u);
  for (const auto& f : kills) {
    EXPECT_EQ(f.kind, fault_kind::kill);
    EXPECT_EQ(f.target, fault_target::rank);
    EXPECT_GE(f.id, 0);
    EXPECT_LT(f.id, job.world);
    EXPECT_EQ(f.spec, "random:kills=10:seed=3");
  }
}

TEST(FaultSpecTest, RandomIsTheSameForASeedAndDiffersAcrossSeeds) {
  EXPECT_EQ(schedule("random:kills=10:seed=3"), schedule("random:kills=10:seed=3"));
  // The spec differs, so compare only what is done when.
  const auto plan = [](const std::vector<fault>& faults) {
    std::vector<std::pair<int64_t, int>> out;
    for (const auto& f : faults) out.emplace_back(f.step, f.id);
    return out;
  };
  EXPECT_NE(plan(schedule("random:kills=10:seed=3")), plan(schedule("random:kills=10:seed=4")));
  std::set<std::vector<std::pair<int64_t, int>>> distinct;
  for (int seed = 0; seed < 20; ++seed)
    distinct.insert(plan(schedule("random:kills=5:seed=" + std::to_string(seed))));
  EXPECT_GE(distinct.size(), 19u);
}

// Pins the draws: a schedule must not change across platforms, compilers or releases, since
// a chaos run is reproduced from its seed.
TEST(FaultSpecTest, RandomScheduleIsPinned) {
  const auto kills = schedule("random:kills=4:seed=42:nodes=1");
  std::vector<std::tuple<int64_t, fault_target, int>> got;
  for (const auto& f : kills) got.emplace_back(f.step, f.target, f.id);
  // Computed independently (a few lines of Python with the splitmix64 constants) as well.
  const std::vector<std::tuple<int64_t, fault_target, int>> want = {{24, fault_target::rank, 2},
                                                                    {38, fault_target::rank, 2},
                                                                    {59, fault_target::node, 1},
                                                                    {69, fault_target::rank, 2}};
  EXPECT_EQ(got, want);
}

TEST(FaultSpecTest, RandomKillsAreSpacedAndInRange) {
  for (uint64_t seed = 0; seed < 200; ++seed) {
    for (const auto& [spec, from, every] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
             {"random:kills=10:seed=", 5, 5},
             {"random:kills=3:from=20:every=30:seed=", 20, 30},
             {"random:kills=18:every=5:from=10:seed=", 10, 5}}) {
      const std::string s = spec + std::to_string(seed);
      const auto kills = schedule(s);
      ASSERT_FALSE(kills.empty());
      EXPECT_GE(kills.front().step, from) << s;
      EXPECT_LE(kills.back().step, job.steps) << s;
      for (size_t i = 1; i < kills.size(); ++i)
        EXPECT_GE(kills[i].step - kills[i - 1].step, every) << s;
      for (const auto& f : kills) {
        EXPECT_GE(f.id, 0);
        EXPECT_LT(f.id, job.world);
      }
    }
  }
}

TEST(FaultSpecTest, RandomSchedulesThatJustFitUseEveryStep) {
  // 20 kills 5 apart from step 5 end exactly at step 100: no slack, no randomness in steps.
  const auto kills = schedule("random:kills=20:seed=9");
  ASSERT_EQ(kills.size(), 20u);
  for (size_t i = 0; i < kills.size(); ++i) EXPECT_EQ(kills[i].step, 5 + 5 * int64_t(i));
}

TEST(FaultSpecTest, RandomNodeKillsHitNodes) {
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const auto kills = schedule("random:kills=6:nodes=2:seed=" + std::to_string(seed));
    ASSERT_EQ(kills.size(), 6u);
    int nodes = 0;
    for (const auto& f : kills) {
      if (f.target != fault_target::node) continue;
      ++nodes;
      EXPECT_GE(f.id, 0);
      EXPECT_LT(f.id, job.nodes);
    }
    EXPECT_EQ(nodes, 2) << seed;
  }
  for (const auto& f : schedule("random:kills=3:nodes=3:seed=1"))
    EXPECT_EQ(f.target, fault_target::node);
}

TEST(FaultSpecTest, RandomWithoutALastStepStillSpacesItsKills) {
  const fault_bounds open{.world = 4, .nodes = 2, .steps = 0};
  const auto kills = schedule("random:kills=50:seed=5:every=7", open);
  ASSERT_EQ(kills.size(), 50u);
  EXPECT_GE(kills.front().step, 5);
  for (size_t i = 1; i < kills.size(); ++i) {
    EXPECT_GE(kills[i].step - kills[i - 1].step, 7);
    EXPECT_LT(kills[i].step - kills[i - 1].step, 14);
  }
}

TEST(FaultSpecTest, RefusesMalformedRandomSchedules) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"random", "kills= is missing"},
      {"random:seed=3", "kills= is missing"},
      {"random:kills=10", "seed= is missing"},
      {"random:kills=0:seed=3", "kills must be in 1..10000, got 0"},
      {"random:kills=-1:seed=3", "kills must be in 1..10000"},
      {"random:kills=10001:seed=3", "kills must be in 1..10000"},
      {"random:kills=x:seed=3", "kills must be a whole number"},
      {"random:kills=10:seed=-1", "seed must be a whole number"},
      {"random:kills=10:seed=18446744073709551616", "seed '18446744073709551616' is too large"},
      {"random:kills=10:seed=3:seed=4", "seed is given twice"},
      {"random:kills=10:seed=3:rank=1", "unknown field 'rank'"},
      {"random:kills=10:seed=3:step=1",
       "unknown field 'step' (random takes kills, seed, from, "
       "every, nodes)"},
      {"random:kills=10:seed=3:from=0", "from must be 1 or more"},
      {"random:kills=10:seed=3:from=101", "after the run's last step 100"},
      {"random:kills=10:seed=3:every=0", "every must be in 1..100"},
      {"random:kills=10:seed=3:every=101", "every must be in 1..100"},
      {"random:kills=10:seed=3:nodes=11", "nodes must be in 0..10"},
      {"random:kills=10:seed=3:nodes=-1", "nodes must be in 0..10"},
      {"random:kills=21:seed=3",
       "21 kills 5 steps apart from step 5 need steps up to 105, after "
       "the last step 100"},
      {"random:kills=2:seed=3:from=99:every=5", "need steps up to 104"},
      {"random:kills=10:seed=3:", "field 4 is empty"},
  };
  for (const auto& [spec, piece] : cases) {
    const std::string message = refusal(spec);
    EXPECT_NE(message.find(piece), std::string::npos)
        << "spec '" << spec << "': got '" << message << "', wanted '" << piece << "'";
  }
  // The largest seed is allowed.
  EXPECT_EQ(schedule("random:kills=1:seed=18446744073709551615").size(), 1u);
}

// --- lists ---

TEST(FaultSpecTest, ParseFaultsSortsByStepAndKeepsTheOrderWithinAStep) {
  const auto all = parse_faults({"kill:rank=0:step=9", "stop:rank=1:step=3", "kill:rank=2:step=9",
                                 "kill:coordinator:step=1", "slow:rank=3:factor=2:from=9"},
                                job);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].target, fault_target::coordinator);
  EXPECT_EQ(all[1].kind, fault_kind::stop);
  EXPECT_EQ(all[2].spec, "kill:rank=0:step=9");
  EXPECT_EQ(all[3].spec, "kill:rank=2:step=9");
  EXPECT_EQ(all[4].spec, "slow:rank=3:factor=2:from=9");
}

TEST(FaultSpecTest, ParseFaultsMergesRandomSchedules) {
  const auto all = parse_faults({"random:kills=5:seed=1", "kill:node=1:step=50"}, job);
  ASSERT_EQ(all.size(), 6u);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_LE(all[i - 1].step, all[i].step);
  EXPECT_TRUE(parse_faults(std::vector<std::string>{}, job).empty());
  EXPECT_THROW(parse_faults({"kill:rank=0:step=9", "kill:rank=9:step=9"}, job), config_error);
}

TEST(FaultSpecTest, ParseFaultsReadsTheJoinedConfigForm) {
  EXPECT_TRUE(parse_faults("", 4, 2, 100).empty());
  const auto all = parse_faults("kill:rank=0:step=9;kill:rank=1:step=3", 4, 1, 100);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 3);
  EXPECT_EQ(all[1].step, 9);
  EXPECT_THROW(parse_faults("kill:rank=0:step=9;", 4, 1, 100), config_error);
}

// --- JSON ---

TEST(FaultSpecTest, ToJsonDescribesTheFault) {
  const auto kill = to_json(one("kill:rank=1:step=8"));
  EXPECT_EQ(kill,
            nlohmann::json::parse(
                R"({"what":"kill","target":"rank","id":1,"step":8,"spec":"kill:rank=1:step=8"})"));
  const auto node = to_json(one("kill:node=1:step=12"));
  EXPECT_EQ(node["target"], "node");
  const auto coord = to_json(one("kill:coordinator:step=15"));
  EXPECT_EQ(coord["target"], "coordinator");
  EXPECT_EQ(coord["id"], -1);
  const auto stop = to_json(one("stop:rank=2:step=5:for=1.5s"));
  EXPECT_EQ(stop["what"], "stop");
  EXPECT_EQ(stop["for_ms"], 1500);
  EXPECT_FALSE(to_json(one("stop:rank=2:step=5")).contains("for_ms"));
  const auto slow = to_json(one("slow:rank=0:factor=2.5:from=10"));
  EXPECT_EQ(slow["what"], "slow");
  EXPECT_DOUBLE_EQ(slow["factor"].get<double>(), 2.5);
  EXPECT_EQ(slow["step"], 10);
}

TEST(FaultSpecTest, ToJsonKeepsAHandMadeSpecForTheEventLogToEscape) {
  fault f;
  f.spec = "\xff\xfe not utf-8";
  nlohmann::json j;
  EXPECT_NO_THROW(j = to_json(f));
  EXPECT_EQ(j.at("spec").get<std::string>(), f.spec);
}

}  // namespace
}  // namespace troupe::chaos
