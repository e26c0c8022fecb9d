// The coordinator's leadership through etcd (coordinator/ha/job_etcd.hpp) against the fake
// etcd: it leads and writes the job's config and state under its epoch; a lapsed lease pauses
// it and winning again resumes it under a newer epoch; another coordinator having led
// meanwhile makes it step aside; another run's state under the same job id is refused.

#include "coordinator/ha/job_etcd.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/config.hpp"
#include "tests/runtime/etcd/etcd_cluster.hpp"
#include "tests/runtime/etcd/fake_etcd.hpp"
#include "tests/runtime/sys/eventually.hpp"

namespace troupe::coordinator::ha {
namespace {

using namespace std::chrono_literals;
using etcd::testing::fake_etcd;
using sys::testing::eventually;

struct election_fixture {
  etcd::testing::temp_dir dir;
  fake_etcd fake{[] {
    etcd::testing::fake_options o;
    o.expire_leases = false;
    return o;
  }()};
  train_config cfg;
  monitoring::metrics_registry registry;
  std::optional<monitoring::event_log> events;

  explicit election_fixture(const std::string& incarnation = "inc-1") {
    cfg.run_dir = dir.path().string();
    cfg.job_id = "job";
    cfg.etcd.endpoints = fake.url();
    cfg.etcd.timeout_ms = 8000;
    std::ofstream(dir.path() / "incarnation") << incarnation << "\n";
    events.emplace(monitoring::event_log::open((dir.path() / "events.jsonl").string()));
  }
  nlohmann::json key(const std::string& name) const {
    const auto kv = fake.get("/troupe/job/" + name);
    return kv ? nlohmann::json::parse(kv->value) : nlohmann::json();
  }
};

TEST(JobEtcd, LeadsAndMarksTheStateAndConfigWithItsEpoch) {
  election_fixture f;
  job_etcd etcd(f.cfg, f.registry, *f.events);
  ASSERT_TRUE(etcd.enabled());
  etcd.lead("127.0.0.1:1234", [] {});
  EXPECT_TRUE(etcd.leading());
  EXPECT_TRUE(etcd.confirm_leading());
  EXPECT_GT(etcd.epoch(), 0);
  EXPECT_EQ(f.key("state")["epoch"], etcd.epoch());
  EXPECT_EQ(f.key("state")["incarnation"], "inc-1");
  EXPECT_EQ(f.key("config")["job_id"], "job");
  events::checkpoint written;
  written.step = 20;
  etcd.observe(written);
  ASSERT_TRUE(eventually([&] { return f.key("state").value("checkpoint_step", 0) == 20; }));
  etcd.forget_on_lost();
}

TEST(JobEtcd, ALapsedLeasePausesAndWinningAgainResumesUnderANewerEpoch) {
  election_fixture f;
  job_etcd etcd(f.cfg, f.registry, *f.events);
  std::atomic<int> paused{0}, lost{0};
  std::atomic<int64_t> resumed{0};
  etcd.lead("127.0.0.1:1234", [&] { ++lost; });
  etcd.on_pause([&] { ++paused; }, [&](int64_t e) { resumed = e; }, [](const std::string&) {});
  const int64_t first = etcd.epoch();
  f.fake.expire_lease(f.fake.get("/troupe/job/leader")->lease);
  ASSERT_TRUE(eventually([&] { return paused.load() == 1; }, 5s));
  ASSERT_TRUE(eventually([&] { return resumed.load() > 0; }, 10s));
  EXPECT_GT(resumed.load(), first);
  EXPECT_EQ(lost.load(), 0);
  EXPECT_EQ(f.key("state")["epoch"], resumed.load());
  etcd.forget_on_lost();
}

TEST(JobEtcd, AnotherLeaderWhilePausedMakesItStepAside) {
  election_fixture f;
  job_etcd etcd(f.cfg, f.registry, *f.events);
  std::atomic<int> paused{0}, lost{0};
  std::atomic<int64_t> resumed{0};
  etcd.lead("127.0.0.1:1234", [&] { ++lost; });
  etcd.on_pause([&] { ++paused; }, [&](int64_t e) { resumed = e; }, [](const std::string&) {});
  // While the lease is gone, another coordinator leads and marks the state with its epoch.
  f.fake.expire_lease(f.fake.get("/troupe/job/leader")->lease);
  f.fake.put("/troupe/job/state", R"({"epoch":123456,"incarnation":"inc-1"})");
  ASSERT_TRUE(eventually([&] { return lost.load() == 1; }, 10s));
  EXPECT_EQ(resumed.load(), 0);
  EXPECT_NE(etcd.lost_reason().find("another coordinator led the job"), std::string::npos)
      << etcd.lost_reason();
  etcd.forget_on_lost();
}

TEST(JobEtcd, AnotherRunsStateUnderTheSameIdIsRefused) {
  election_fixture f("inc-mine");
  f.fake.put("/troupe/job/state",
             R"({"committed_step":9,"incarnation":"inc-theirs","run_dir":"/x","host":"h"})");
  job_etcd etcd(f.cfg, f.registry, *f.events);
  EXPECT_THROW(etcd.refuse_another_job(), config_error);
  EXPECT_THROW(etcd.lead("127.0.0.1:1234", [] {}), config_error);
  EXPECT_EQ(f.fake.get("/troupe/job/state")->value.find("inc-mine"), std::string::npos);
}

TEST(JobEtcdRealEtcd, LeadsThroughARealEtcd) {
  if (!etcd::testing::have_etcd()) GTEST_SKIP() << "no /usr/bin/etcd";
  etcd::testing::etcd_cluster cluster(1);
  election_fixture f;
  f.cfg.etcd.endpoints = cluster.urls()[0];
  job_etcd etcd(f.cfg, f.registry, *f.events);
  etcd.lead("127.0.0.1:1234", [] {});
  EXPECT_TRUE(etcd.confirm_leading());
  etcd::etcd_client reader(etcd::testing::options_for(cluster.urls()));
  const auto state = reader.get("/troupe/job/state");
  ASSERT_TRUE(state.has_value());
  EXPECT_EQ(nlohmann::json::parse(state->value)["epoch"], etcd.epoch());
  etcd.forget_on_lost();
}

}  // namespace
}  // namespace troupe::coordinator::ha
