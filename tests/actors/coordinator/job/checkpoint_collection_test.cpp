// Checkpoints as the coordinator collects them (actors/coordinator/job/checkpoint_collection.hpp):
// which steps ask for one, shares reported, a manifest handed over, abandoned and owed checkpoints.

#include "actors/coordinator/job/checkpoint_collection.hpp"

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

job_params params() {
  job_params p;
  p.cfg.steps = 20;
  p.cfg.checkpoint_every = 5;
  return p;
}

shard_written share(int32_t rank, int64_t step, uint64_t generation = 1) {
  shard_written w;
  w.generation = generation;
  w.step = step;
  w.rank = rank;
  w.pieces_json = "[]";
  w.adam_t = step;
  w.bytes_written = 100;
  return w;
}

std::vector<std::string> event_names(const actions& a) {
  std::vector<std::string> out;
  for (const auto& x : a)
    if (auto* e = std::get_if<emit_event>(&x)) out.push_back(events::kind(e->event));
  return out;
}

using outcome = checkpoint_collection::share_outcome;

TEST(CheckpointDue, EveryIntervalAndAtTheLastStep) {
  EXPECT_TRUE(checkpoint_due(10, 20, 5));
  EXPECT_FALSE(checkpoint_due(11, 20, 5));
  EXPECT_TRUE(checkpoint_due(20, 20, 0));
  EXPECT_FALSE(checkpoint_due(10, 20, 0));
}

TEST(CheckpointCollection, HandsTheManifestOverOnceEveryShareIsIn) {
  checkpoint_collection c(params());
  EXPECT_TRUE(c.wanted(5, false));
  EXPECT_FALSE(c.wanted(6, false));
  EXPECT_TRUE(c.wanted(6, true));  // preempted: the next step checkpoints
  c.start(5, 2);
  EXPECT_TRUE(c.in_flight());
  actions out;
  EXPECT_EQ(c.add_share(share(0, 5), 1, 2, out), outcome::awaited);
  EXPECT_EQ(c.add_share(share(0, 5), 1, 2, out), outcome::stale);     // twice
  EXPECT_EQ(c.add_share(share(1, 5, 2), 1, 2, out), outcome::stale);  // another generation
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(c.add_share(share(1, 5), 1, 2, out), outcome::awaited);
  ASSERT_EQ(out.size(), 1u);
  const auto manifest = std::get<commit_checkpoint>(out[0]);
  EXPECT_EQ(manifest.step, 5);
  EXPECT_EQ(manifest.bytes_written, 200u);
  EXPECT_TRUE(c.in_flight());  // until the committer answers
  out.clear();
  c.committed(manifest, "/run/ckpt-5", "", 1, out);
  EXPECT_FALSE(c.in_flight());
  EXPECT_EQ(c.last_step(), 5);
  EXPECT_EQ(event_names(out), std::vector<std::string>{"checkpoint"});
  EXPECT_FALSE(c.wanted(5, false));  // a replayed step already has it
  EXPECT_EQ(c.words(), "the last committed checkpoint is step 5 (/run/ckpt-5)");
}

TEST(CheckpointCollection, AFailedShareFailsTheCheckpointUntilALaterOneIsCommitted) {
  checkpoint_collection c(params());
  c.start(5, 2);
  actions out;
  shard_written bad = share(1, 5);
  bad.ok = false;
  bad.error = "disk full";
  c.add_share(share(0, 5), 1, 2, out);
  EXPECT_EQ(c.add_share(bad, 1, 2, out), outcome::given_up);
  EXPECT_EQ(event_names(out), std::vector<std::string>{"checkpoint_failed"});
  EXPECT_EQ(c.failed_step(), 5);
  EXPECT_EQ(c.failed_error(), "rank 1: disk full");
  commit_checkpoint later;
  later.step = 10;
  c.committed(later, "/run/ckpt-10", "", 1, out);
  EXPECT_EQ(c.failed_step(), -1);
}

// A rank still writing the previous checkpoint skips its share (rank_checkpoints.cpp: not ok,
// no optimizer step); the ranks that wrote theirs are not compared with its step of 0, in
// whichever order the shares arrive (a mixed job of real and simulated members found this).
TEST(CheckpointCollection, ASkippedShareIsNotTakenForAnotherOptimizerStep) {
  shard_written skipped = share(1, 5);
  skipped.ok = false;
  skipped.skipped = true;
  skipped.adam_t = 0;
  skipped.error = "the previous checkpoint was still being written (checkpoint_overlap skip)";
  for (bool skipped_first : {true, false}) {
    checkpoint_collection c(params());
    c.start(5, 3);
    actions out;
    if (skipped_first) c.add_share(skipped, 1, 3, out);
    c.add_share(share(0, 5), 1, 3, out);
    if (!skipped_first) c.add_share(skipped, 1, 3, out);
    EXPECT_EQ(c.add_share(share(2, 5), 1, 3, out), outcome::given_up) << skipped_first;
    EXPECT_EQ(event_names(out), std::vector<std::string>{"checkpoint_skipped"}) << skipped_first;
    EXPECT_EQ(c.failed_step(), -1) << skipped_first;
  }
  // Two ranks that did write theirs, at different steps, still fail it.
  checkpoint_collection c(params());
  c.start(5, 2);
  actions out;
  shard_written behind = share(1, 5);
  behind.adam_t = 4;
  c.add_share(share(0, 5), 1, 2, out);
  EXPECT_EQ(c.add_share(behind, 1, 2, out), outcome::given_up);
  EXPECT_EQ(event_names(out), std::vector<std::string>{"checkpoint_failed"});
}

TEST(CheckpointCollection, AnAbandonedCheckpointIsOwedByTheNextCommittedStep) {
  checkpoint_collection c(params());
  c.start(5, 2);
  actions out;
  c.add_share(share(0, 5), 1, 2, out);
  c.abandon("rank 1 lost", 2, out);
  EXPECT_EQ(event_names(out), std::vector<std::string>{"checkpoint_abandoned"});
  EXPECT_FALSE(c.in_flight());
  EXPECT_TRUE(c.wanted(6, false));  // owed: the first commit from step 5 on takes it
  c.start(6, 1);
  out.clear();
  EXPECT_EQ(c.add_share(share(0, 6, 2), 2, 1, out), outcome::awaited);
  EXPECT_EQ(std::get<commit_checkpoint>(out.at(0)).replaces, 5);
  EXPECT_FALSE(c.wanted(7, false));  // paid
}

}  // namespace
}  // namespace troupe::actors
