// How a coordinator reaches its etcd (coordinator/ha/local_etcd.hpp): the job's own etcd for
// --etcd local, started in the run directory, answering, and gone (by pid) when the link ends;
// endpoints that do not answer, or do not answer as etcd does, named in the error by the
// deadline.

#include "coordinator/ha/local_etcd.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "runtime/config.hpp"
#include "tests/runtime/etcd/etcd_cluster.hpp"
#include "tests/runtime/etcd/fake_etcd.hpp"

namespace troupe::coordinator::ha {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

TEST(LocalEtcd, TheJobsOwnEtcdStartsAnswersAndStops) {
  if (!etcd::testing::have_etcd()) GTEST_SKIP() << "no /usr/bin/etcd";
  etcd::testing::temp_dir dir;
  train_config cfg;
  cfg.run_dir = dir.path().string();
  cfg.etcd.endpoints = "local";
  check_etcd_options(cfg);
  std::string url;
  {
    etcd_link link(cfg, "job");
    ASSERT_TRUE(link.local());
    url = link.client_urls();
    EXPECT_EQ(url.rfind("http://127.0.0.1:", 0), 0u) << url;
    EXPECT_NE(link.words().find("the job's own etcd"), std::string::npos) << link.words();
    link.wait_until_answering(clock_type::now() + 20s);
    link.client().put("/troupe/job/probe", "1");
    EXPECT_TRUE(std::filesystem::exists(dir.path() / "etcd"));
  }
  // Stopped with the link: nothing answers there any more.
  etcd::etcd_client after(etcd::testing::options_for({url}, 300ms));
  EXPECT_THROW(after.get("/troupe/job/probe"), etcd::etcd_error);
}

TEST(LocalEtcd, EndpointsThatDoNotAnswerAreNamedByTheDeadline) {
  etcd::testing::fake_etcd fake;
  train_config cfg;
  cfg.etcd.endpoints = fake.url();
  cfg.etcd.timeout_ms = 500;
  etcd_link link(cfg, "job");
  EXPECT_FALSE(link.local());
  fake.stop_serving();
  try {
    link.wait_until_answering(clock_type::now() + 500ms);
    ADD_FAILURE() << "an etcd that refuses connections answered";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(fake.url()), std::string::npos) << what;
    EXPECT_NE(what.find("did not answer within --etcd-timeout-ms (500 ms)"), std::string::npos)
        << what;
  }
  fake.resume_serving();
  fake.fail_next(1000, etcd::testing::failure::error(2, "not the gateway"), "/v3/kv/range");
  EXPECT_THROW(link.wait_until_answering(clock_type::now() + 300ms), std::runtime_error);
  fake.clear_failures();
  EXPECT_NO_THROW(link.wait_until_answering(clock_type::now() + 2s));
}

TEST(LocalEtcd, UnreadableCertificateFilesAreRefusedBeforeAnythingStarts) {
  train_config cfg;
  cfg.etcd.endpoints = "https://127.0.0.1:2379";
  cfg.etcd.cacert = "/nonexistent/ca.pem";
  try {
    check_etcd_options(cfg);
    ADD_FAILURE() << "an unreadable CA file was accepted";
  } catch (const config_error& e) {
    EXPECT_NE(std::string(e.what()).find("--etcd-cacert '/nonexistent/ca.pem'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace troupe::coordinator::ha
