// The sampler of user workloads (runtime/data/sampler.hpp): every epoch a bijection of the
// dataset, each run of N global slots one epoch, epochs in orders of their own, the same
// global batch however the world splits it, and fixed values that a platform, compiler or
// refactoring change would break.

#include "runtime/data/sampler.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace troupe {
namespace {

/// Which of [0, n) perm(0..n-1) hits; empty if a value is out of range or hit twice.
std::string bijection_error(const epoch_permutation& perm, int64_t n) {
  std::vector<bool> seen(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t x = perm(i);
    if (x < 0 || x >= n) return "perm(" + std::to_string(i) + ") = " + std::to_string(x);
    if (seen[static_cast<size_t>(x)]) return std::to_string(x) + " hit twice";
    seen[static_cast<size_t>(x)] = true;
  }
  return "";
}

std::vector<int64_t> order_of(const sampler& s, int64_t epoch) {
  const auto perm = s.permutation(epoch);
  std::vector<int64_t> out(static_cast<size_t>(s.dataset_size()));
  for (int64_t i = 0; i < s.dataset_size(); ++i) out[static_cast<size_t>(i)] = perm(i);
  return out;
}

TEST(sampler, RefusesWhatIsNotADatasetOrABatch) {
  auto message = [](auto make) {
    try {
      make();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] { sampler(1, 0, 8); }), "sampler: dataset_size must be in [1, 2^62], not 0");
  EXPECT_NE(message([] { sampler(1, -5, 8); }).find("not -5"), std::string::npos);
  EXPECT_NE(message([] { sampler(1, (int64_t{1} << 62) + 1, 8); }).find("not 4611686018427387905"),
            std::string::npos);
  EXPECT_EQ(message([] { sampler(1, 10, 0); }), "sampler: global_batch must be positive, not 0");
  EXPECT_NE(message([] { sampler(1, 10, -3); }).find("not -3"), std::string::npos);

  const sampler s(1, 10, 8);
  EXPECT_NE(message([&] { (void)s.index(0, 8); }).find("slot 8 is not within a batch of 8"),
            std::string::npos);
  EXPECT_NE(message([&] { (void)s.index(0, -1); }).find("slot -1"), std::string::npos);
  EXPECT_NE(message([&] { (void)s.index(-2, 0); }).find("not -2"), std::string::npos);
  EXPECT_NE(message([&] { (void)s.index(int64_t{1} << 61, 0); }).find("beyond the last batch"),
            std::string::npos);
  EXPECT_NE(message([&] {
              (void)s.indices(0, {6, 3, 1});
            }).find("share [6, +3)"),
            std::string::npos);
  EXPECT_NE(message([&] {
              (void)s.indices(0, {-1, 1, 1});
            }).find("share [-1, +1)"),
            std::string::npos);
  EXPECT_TRUE(s.indices(3, {8, 0, 1}).empty());  // an empty share at the batch's end
}

TEST(sampler, EveryEpochIsABijectionForEveryDatasetUpTo5000) {
  for (int64_t n = 1; n <= 5000; ++n) {
    const sampler s(1337, n, 64);
    ASSERT_EQ(bijection_error(s.permutation(0), n), "") << "n " << n << " epoch 0";
    // Later epochs on a sample of sizes: primes, powers of two and four, their neighbours.
    if (n < 20 || n % 97 == 0 || n == 1024 || n == 4096 || n == 4093 || n == 4097 || n == 4999 ||
        n == 2048 || n == 2047) {
      for (const int64_t epoch : {int64_t{1}, int64_t{2}, int64_t{977}, int64_t{1} << 40})
        ASSERT_EQ(bijection_error(s.permutation(epoch), n), "") << "n " << n << " e " << epoch;
    }
  }
}

TEST(sampler, EachRunOfNSlotsIsOneEpochCoveringEveryIndexOnce) {
  for (const int64_t n : {1, 2, 3, 7, 64, 97, 1000, 1024, 4093, 4096})
    for (const int batch : {1, 5, 64, 5000}) {
      const sampler s(42, n, batch);
      // Slots numbered across batches: position p, slot i is global slot p * batch + i.
      std::vector<int64_t> slots;
      for (int64_t p = 0; static_cast<int64_t>(slots.size()) < 3 * n; ++p)
        for (int i = 0; i < batch; ++i) slots.push_back(s.index(p, i));
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        std::vector<int64_t> block(slots.begin() + epoch * n, slots.begin() + (epoch + 1) * n);
        EXPECT_EQ(block, order_of(s, epoch)) << "n " << n << " batch " << batch;
        std::sort(block.begin(), block.end());
        std::vector<int64_t> all(static_cast<size_t>(n));
        std::iota(all.begin(), all.end(), int64_t{0});
        EXPECT_EQ(block, all) << "n " << n << " batch " << batch << " epoch " << epoch;
      }
    }
}

TEST(sampler, EpochsAndSeedsGiveOtherOrders) {
  for (const int64_t n : {97, 1000, 4096, 4999}) {
    const sampler s(7, n, 16);
    std::vector<int64_t> identity(static_cast<size_t>(n));
    std::iota(identity.begin(), identity.end(), int64_t{0});
    std::set<std::vector<int64_t>> orders;
    for (int64_t epoch = 0; epoch < 8; ++epoch) {
      const auto order = order_of(s, epoch);
      EXPECT_NE(order, identity) << "n " << n << " epoch " << epoch;
      orders.insert(order);
    }
    EXPECT_EQ(orders.size(), 8u) << "n " << n;
    EXPECT_NE(order_of(sampler(8, n, 16), 0), order_of(s, 0)) << "n " << n;
  }
}

TEST(sampler, UnshuffledReadsTheDatasetInOrder) {
  const sampler s(7, 10, 4, false);
  for (int64_t p = 0; p < 6; ++p)
    for (int i = 0; i < 4; ++i) EXPECT_EQ(s.index(p, i), (p * 4 + i) % 10);
}

/// The shares of a global batch of `batch` in micro-batches of `micro` over `world` replicas:
/// contiguous, micro-batch aligned, micro-batches spread as evenly as they go (the planner's
/// replica_micro_batches); a replica may get none.
std::vector<sample_span> split(int batch, int micro, int world) {
  const int micro_batches = (batch + micro - 1) / micro;
  std::vector<sample_span> out;
  int first_mb = 0;
  for (int r = 0; r < world; ++r) {
    const int mbs = micro_batches / world + (r < micro_batches % world ? 1 : 0);
    const int first = std::min(batch, first_mb * micro);
    const int end = std::min(batch, (first_mb + mbs) * micro);
    out.push_back({first, end - first, micro});
    first_mb += mbs;
  }
  return out;
}

TEST(sampler, AStepIsTheSameBatchWhateverTheWorld) {
  for (const auto& [n, batch, micro] :
       {std::tuple{int64_t{10000}, 64, 4}, std::tuple{int64_t{100}, 60, 5},  // straddles epochs
        std::tuple{int64_t{37}, 50, 7},                                      // G > N, ragged
        std::tuple{int64_t{1}, 3, 1}}) {
    const sampler s(99, n, batch);
    for (const int64_t position : {int64_t{0}, int64_t{1}, int64_t{12345}}) {
      const auto whole = s.indices(position, {0, batch, micro});
      ASSERT_EQ(whole.size(), static_cast<size_t>(batch));
      for (int i = 0; i < batch; ++i)
        ASSERT_EQ(whole[static_cast<size_t>(i)], s.index(position, i)) << "slot " << i;
      for (int world = 1; world <= 9; ++world) {
        std::vector<int64_t> joined;
        for (const sample_span& share : split(batch, micro, world)) {
          const auto part = s.indices(position, share);
          joined.insert(joined.end(), part.begin(), part.end());
        }
        EXPECT_EQ(joined, whole) << "world " << world << " position " << position;
      }
    }
  }
}

TEST(sampler, FixedValuesCatchAPlatformChange) {
  // Computed once by this implementation and, independently, by a Python transcription of the
  // same arithmetic (splitmix64, hash_words, 4 Feistel rounds, cycle walking).
  struct expected {
    uint64_t seed;
    int64_t n;
    int batch;
    int64_t position;
    int slot;
    int64_t index;
  };
  for (const expected& e :
       {expected{1337, 10000, 64, 0, 0, 1388}, expected{1337, 10000, 64, 0, 63, 4430},
        expected{1337, 10000, 64, 156, 16, 2389}, expected{1337, 10000, 64, 1000000, 5, 3722},
        expected{7, 1, 8, 5, 3, 0}, expected{7, 2, 3, 100, 2, 1},
        expected{42, 4999, 7, 12345, 6, 2609}, expected{0, 4096, 4096, 3, 4095, 2604},
        expected{UINT64_MAX, int64_t{1} << 40, 1024, 1 << 20, 1023, 863546997939}})
    EXPECT_EQ(sampler(e.seed, e.n, e.batch).index(e.position, e.slot), e.index)
        << "seed " << e.seed << " n " << e.n << " position " << e.position << " slot " << e.slot;
}

}  // namespace
}  // namespace troupe
