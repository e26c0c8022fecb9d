// What a worker's control path remembers of the coordinator's aborts: a member forming a
// generation gives up once an abort for a newer one (or a final one) has come.

#include "actors/worker_control.hpp"

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

TEST(WorkerShared, AGenerationIsSupersededByAnAbortForANewerOneOnly) {
  worker_shared shared;
  EXPECT_FALSE(shared.superseded(0));
  EXPECT_FALSE(shared.superseded(3));
  // The coordinator opens generation 5: whoever still forms 4 or older gives up; 5 goes on.
  shared.abort_older_than(5, false, "rank 2 was lost");
  EXPECT_TRUE(shared.superseded(3));
  EXPECT_TRUE(shared.superseded(4));
  EXPECT_FALSE(shared.superseded(5));
  EXPECT_FALSE(shared.superseded(6));
  // A late abort of an older generation changes nothing.
  shared.abort_older_than(2, false, "late");
  EXPECT_TRUE(shared.superseded(4));
  EXPECT_FALSE(shared.superseded(5));
  // The job's end supersedes every generation.
  shared.abort_older_than(0, true, "the job ended");
  EXPECT_TRUE(shared.superseded(5));
  EXPECT_TRUE(shared.superseded(1000));
}

}  // namespace
}  // namespace troupe::actors
