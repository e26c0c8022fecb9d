// The committer's fence: a coordinator that lost the lead (etcd) commits nothing, takes back
// what it wrote while it was being deposed, and never moves a LATEST another one moved.

#include "actors/coordinator/checkpoint_committer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>

#include "actors/wire/messages.hpp"
#include "tests/checkpoint/test_support.hpp"

namespace troupe::actors {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct commit_answer {
  int64_t step = -1;
  std::string path, error;
};

class CommitterFence : public ::testing::Test {
 protected:
  void SetUp() override {
    // Step 10 committed by "this coordinator" before; step 20 written by the ranks, awaiting
    // its manifest.
    ckpt::testing::write_checkpoint(dir_.str(), ckpt::testing::make_full(50, 10), 2);
    pending_ = ckpt::testing::write_checkpoint(dir_.str(), ckpt::testing::make_full(50, 20), 2,
                                               /*commit=*/false);
  }

  // A committer whose fence answers the n-th question (1-based) with `leads(n)`.
  std::unique_ptr<checkpoint_committer> committer(std::function<bool(int)> leads) {
    auto c = std::make_unique<checkpoint_committer>(dir_.str(), ckpt::retention_policy{1, 0},
                                                    caf::actor_cast<caf::actor>(self_));
    if (leads) c->set_fence([this, leads] { return leads(++asked_); });
    return c;
  }

  commit_answer answer() {
    commit_answer a;
    self_->receive(
        [&](ckpt_done_atom, int64_t step, const std::string& path, const std::string& error) {
          a = {step, path, error};
        },
        caf::after(10s) >> [] { ADD_FAILURE() << "no answer from the committer"; });
    return a;
  }

  std::optional<int64_t> latest() const { return ckpt::read_latest_step(dir_.str()); }
  bool manifest_of_20() const {
    return fs::exists(ckpt::testing::step_path(dir_.str(), 20) / "manifest.json");
  }

  ckpt::testing::temp_dir dir_;
  ckpt::manifest pending_;
  std::atomic<int> asked_{0};
  system_config cfg_;
  caf::actor_system sys_{cfg_};
  caf::scoped_actor self_{sys_};
};

TEST_F(CommitterFence, CommitsWhileItLeads) {
  auto c = committer([](int) { return true; });
  c->commit(pending_);
  const commit_answer a = answer();
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(latest(), 20);
  EXPECT_TRUE(manifest_of_20());
}

TEST_F(CommitterFence, CommitsNothingOnceDeposed) {
  auto c = committer([](int) { return false; });
  c->commit(pending_);
  const commit_answer a = answer();
  EXPECT_NE(a.error.find("no longer leads"), std::string::npos) << a.error;
  EXPECT_EQ(latest(), 10);
  EXPECT_FALSE(manifest_of_20());
}

TEST_F(CommitterFence, DeposedBetweenManifestAndLatestTakesTheManifestBack) {
  // Leads when the manifest is renamed into place, not when LATEST would be.
  auto c = committer([](int n) { return n == 1; });
  c->commit(pending_);
  const commit_answer a = answer();
  EXPECT_FALSE(a.error.empty());
  EXPECT_EQ(latest(), 10);
  EXPECT_FALSE(manifest_of_20()) << "a manifest written by a deposed leader stayed committed";
}

TEST_F(CommitterFence, DeposedDuringTheLastRenameTakesLatestBack) {
  // Leads at both checks, but is found deposed right after (a stall between the last check
  // and the rename it allowed).
  auto c = committer([](int n) { return n <= 2; });
  c->commit(pending_);
  const commit_answer a = answer();
  EXPECT_NE(a.error.find("lost the lead"), std::string::npos) << a.error;
  EXPECT_EQ(latest(), 10);
  EXPECT_FALSE(manifest_of_20());
}

TEST_F(CommitterFence, NeverMovesALatestAnotherCoordinatorMoved) {
  auto c = committer([](int) { return true; });
  ckpt::point_latest_at(dir_.str(), 30);  // the new leader committed step 30 meanwhile
  c->commit(pending_);
  const commit_answer a = answer();
  EXPECT_NE(a.error.find("did not commit"), std::string::npos) << a.error;
  EXPECT_EQ(latest(), 30);
  EXPECT_FALSE(manifest_of_20());
}

TEST_F(CommitterFence, WithoutAFenceCommitsAsAlways) {
  auto c = committer(nullptr);
  ckpt::point_latest_at(dir_.str(), 10);
  c->commit(pending_);
  EXPECT_EQ(answer().error, "");
  EXPECT_EQ(latest(), 20);
}

}  // namespace
}  // namespace troupe::actors
