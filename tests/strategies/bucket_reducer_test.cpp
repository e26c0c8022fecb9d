// The runtime's overlapped bucket reducer with 4 ranks as threads of this process, over the
// shared-memory backend and over gloo on loopback TCP: buckets announced out of order (from
// two threads, as a backward with intra-op threads would), twice, out of range or never, and a
// reduction aborted or timed out while a peer never joins it.

#include "strategies/bucket_reducer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <future>
#include <mutex>
#include <numeric>
#include <thread>

#include "runtime/comm/collective_math.hpp"
#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/data/random.hpp"

namespace troupe::strategies {
namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

constexpr int world = 4;
// Sizes in floats: a one-float bucket, an empty one (every rank skips it alike), and one past
// gloo's 64 KiB one-round path, which gloo sums by its ring instead of in rank order.
const std::vector<size_t> bucket_sizes{1000, 1, 4097, 0, 20000, 300};

/// Records the buffers of the all-reduces it forwards, in call order: the reducer's thread is
/// the only caller during a step, and finish() returning orders those writes before the reads.
class recording_communicator final : public comm::communicator {
 public:
  explicit recording_communicator(std::unique_ptr<comm::communicator> inner)
      : inner_(std::move(inner)) {}
  std::vector<const float*> reduced;
  std::vector<comm::reduce_op> ops;

  const comm::comm_identity& identity() const override { return inner_->identity(); }
  void all_reduce(float* data, size_t count, comm::reduce_op op,
                  const comm::op_options& opts) override {
    reduced.push_back(data);
    ops.push_back(op);
    inner_->all_reduce(data, count, op, opts);
  }
  void broadcast(void* data, size_t bytes, int root, const comm::op_options& opts) override {
    inner_->broadcast(data, bytes, root, opts);
  }
  void barrier(const comm::op_options& opts) override { inner_->barrier(opts); }
  void reduce_scatter(const float* in, float* out, size_t count, comm::reduce_op op,
                      const comm::op_options& opts) override {
    inner_->reduce_scatter(in, out, count, op, opts);
  }
  void all_gather(const void* in, void* out, size_t bytes, const comm::op_options& opts) override {
    inner_->all_gather(in, out, bytes, opts);
  }
  void all_to_all(const void* in, void* out, size_t bytes_per_rank,
                  const comm::op_options& opts) override {
    inner_->all_to_all(in, out, bytes_per_rank, opts);
  }
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes, const comm::op_options& opts) override {
    inner_->all_to_allv(in, send_bytes, out, recv_bytes, opts);
  }
  void send(const void* data, size_t bytes, int peer, uint32_t tag,
            const comm::op_options& opts) override {
    inner_->send(data, bytes, peer, tag, opts);
  }
  void recv(void* data, size_t bytes, int peer, uint32_t tag,
            const comm::op_options& opts) override {
    inner_->recv(data, bytes, peer, tag, opts);
  }
  void abort() override { inner_->abort(); }
  bool aborted() const override { return inner_->aborted(); }

 private:
  std::unique_ptr<comm::communicator> inner_;
};

/// A group of `world` ranks connected as threads; the stores stay open as long as the group.
struct group {
  comm::tcp_store_server server;
  std::vector<std::unique_ptr<comm::kv_store>> stores;
  std::vector<std::unique_ptr<recording_communicator>> comms;
};

std::unique_ptr<group> connect_group(const std::string& backend, uint64_t generation = 1) {
  auto g = std::make_unique<group>();
  std::vector<
      std::future<std::pair<std::unique_ptr<comm::kv_store>, std::unique_ptr<comm::communicator>>>>
      ranks;
  ranks.reserve(world);
  for (int r = 0; r < world; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = comm::connect_tcp_store("127.0.0.1", g->server.port(), 10s);
      const comm::comm_identity id{generation, "dp0", r, world};
      auto c = backend == "shm" ? comm::make_shm_communicator(*store, id)
                                : comm::make_gloo_communicator(*store, id);
      return std::make_pair(std::move(store), std::move(c));
    }));
  for (auto& f : ranks) {
    auto [store, c] = f.get();
    g->stores.push_back(std::move(store));
    g->comms.push_back(std::make_unique<recording_communicator>(std::move(c)));
  }
  return g;
}

/// Rank `rank`'s gradient at element i of bucket k in step `step`: in [-1, 1), not exactly
/// summable, so the order of the sum shows in the bits.
float gradient(int step, int rank, size_t k, size_t i) {
  const double u =
      to_unit(hash_words(static_cast<uint64_t>(step), static_cast<uint64_t>(rank), k, i));
  return static_cast<float>(2 * u - 1);
}

/// One rank's gradient memory: a flat buffer cut into the buckets, as a workload lays it out.
struct rank_memory {
  std::vector<float> flat;
  std::vector<gradient_bucket> buckets;
  rank_memory() : flat(std::accumulate(bucket_sizes.begin(), bucket_sizes.end(), size_t{0})) {
    size_t at = 0;
    for (const size_t n : bucket_sizes) {
      buckets.push_back({std::span<float>(flat.data() + at, n)});
      at += n;
    }
  }
  void fill(int step, int rank) {
    for (size_t k = 0; k < buckets.size(); ++k) fill(step, rank, k);
  }
  /// Bucket k's gradients of this step, written as backward would, just before announcing it.
  void fill(int step, int rank, size_t k) {
    for (size_t i = 0; i < buckets[k].values.size(); ++i)
      buckets[k].values[i] = gradient(step, rank, k, i);
  }
  /// What the memory holds before backward: a reduction launched before its bucket was
  /// announced would sum this instead of the gradients.
  void poison() { std::fill(flat.begin(), flat.end(), 1e30f); }
};

/// Bucket k summed over the ranks in rank order, as a single process would.
std::vector<float> reference_sum(int step, size_t k) {
  std::vector<float> sum(bucket_sizes[k], 0.0f);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += gradient(step, r, k, i);
  return sum;
}

// The reducer's rule: each bucket's sum of squares (comm::sum_of_squares), in bucket order.
double norm_of(const std::vector<gradient_bucket>& buckets) {
  double sum = 0;
  for (const auto& b : buckets) sum += comm::sum_of_squares(b.values.data(), b.values.size());
  return std::sqrt(sum);
}

/// Whether `backend` sums bucket k in rank order: shm always, gloo up to its one-round size.
bool rank_ordered(const std::string& backend, size_t k) {
  return backend == "shm" ||
         bucket_sizes[k] * sizeof(float) <= comm::gloo_options{}.small_all_reduce_bytes;
}

/// Checks rank memories after a step: every bucket the reference sum (bitwise where the
/// backend sums in rank order, else within rounding) and the same bits on every rank.
void expect_reduced(const std::string& backend, int step, const std::vector<rank_memory>& mem) {
  for (size_t k = 0; k < bucket_sizes.size(); ++k) {
    const auto want = reference_sum(step, k);
    for (int r = 0; r < world; ++r) {
      const auto got = mem[static_cast<size_t>(r)].buckets[k].values;
      ASSERT_TRUE(std::equal(got.begin(), got.end(), mem[0].buckets[k].values.begin()))
          << "ranks disagree in bucket " << k;
      for (size_t i = 0; i < want.size(); ++i) {
        if (rank_ordered(backend, k))
          ASSERT_EQ(got[i], want[i]) << "bucket " << k << " element " << i << " rank " << r;
        else
          ASSERT_NEAR(got[i], want[i], 1e-5f) << "bucket " << k << " element " << i;
      }
    }
  }
}

/// Runs body(rank) on every rank's thread; rethrows the first failure.
template <class Body>
void on_ranks(Body body) {
  std::vector<std::future<void>> ranks;
  ranks.reserve(world);
  for (int r = 0; r < world; ++r) ranks.push_back(std::async(std::launch::async, body, r));
  for (auto& f : ranks) f.get();
}

/// Waits until pred() holds, polling, at most `limit`; false if it never did.
template <class Pred>
bool eventually(Pred pred, std::chrono::milliseconds limit = 30s) {
  const auto end = clock_type::now() + limit;
  while (!pred()) {
    if (clock_type::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

class bucket_reducer_test : public ::testing::TestWithParam<std::string> {};

TEST_P(bucket_reducer_test, OutOfOrderReadyGivesInOrderCollectivesAndRankOrderSums) {
  auto g = connect_group(GetParam());
  std::vector<rank_memory> mem(world);
  std::vector<std::vector<reduced_step>> results(world);
  on_ranks([&](int r) {
    auto& m = mem[static_cast<size_t>(r)];
    auto& c = *g->comms[static_cast<size_t>(r)];
    bucket_reducer reducer(&c, m.buckets, 30s);
    for (int step = 1; step <= 3; ++step) {
      m.poison();
      c.reduced.clear();
      reducer.begin_step();
      // Each rank and step announces in an order of its own, half from another thread, the
      // last bucket first, so bucket 0 is announced late.
      std::vector<size_t> order(bucket_sizes.size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::reverse(order.begin(), order.end());
      std::rotate(order.begin() + 1, order.begin() + 1 + (r + step) % 4, order.end());
      auto backward = [&](size_t from) {
        for (size_t j = from; j < order.size(); j += 2) {
          m.fill(step, r, order[j]);
          reducer.ready(order[j]);
        }
      };
      std::thread helper(backward, size_t{1});
      backward(0);
      helper.join();
      results[static_cast<size_t>(r)].push_back(reducer.finish());
      EXPECT_EQ(reducer.launched(), bucket_sizes.size());
      EXPECT_EQ(reducer.reduced(), bucket_sizes.size());
      // Every non-empty bucket once, in index order, summed (never averaged).
      std::vector<const float*> want;
      for (const auto& b : m.buckets)
        if (!b.values.empty()) want.push_back(b.values.data());
      EXPECT_EQ(c.reduced, want) << "rank " << r << " step " << step;
      EXPECT_TRUE(std::all_of(c.ops.begin(), c.ops.end(),
                              [](comm::reduce_op op) { return op == comm::reduce_op::sum; }));
    }
  });
  expect_reduced(GetParam(), 3, mem);
  for (int r = 0; r < world; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    ASSERT_EQ(res.size(), 3u);
    // The norm is of the reduced values, in double, bucket by bucket: the same bits as a
    // reference over them, and the same on every rank.
    EXPECT_EQ(res.back().grad_norm, norm_of(mem[static_cast<size_t>(r)].buckets));
    EXPECT_EQ(res.back().grad_norm, results[0].back().grad_norm);
    for (const auto& s : res) {
      EXPECT_GT(s.collective_s, 0.0);
      EXPECT_GE(s.wait_s, 0.0);
    }
  }
}

TEST_P(bucket_reducer_test, BucketsNeverAnnouncedAreReducedByFinish) {
  auto g = connect_group(GetParam());
  std::vector<rank_memory> mem(world);
  on_ranks([&](int r) {
    auto& m = mem[static_cast<size_t>(r)];
    bucket_reducer reducer(g->comms[static_cast<size_t>(r)].get(), m.buckets, 30s);
    m.poison();
    reducer.begin_step();
    // Rank 0 announces nothing (no samples this step); the others every r-th bucket from r.
    std::vector<bool> announced(bucket_sizes.size());
    if (r > 0)
      for (size_t k = static_cast<size_t>(r); k < bucket_sizes.size();
           k += static_cast<size_t>(r)) {
        m.fill(7, r, k);
        reducer.ready(k);
        announced[k] = true;
      }
    // The rest is final when compute returns.
    for (size_t k = 0; k < bucket_sizes.size(); ++k)
      if (!announced[k]) m.fill(7, r, k);
    const reduced_step s = reducer.finish();
    EXPECT_EQ(s.grad_norm, reducer.local_grad_norm());
    EXPECT_EQ(s.grad_norm, norm_of(m.buckets));
  });
  expect_reduced(GetParam(), 7, mem);
}

TEST_P(bucket_reducer_test, ABucketAnnouncedTwiceFailsTheStepNamingIt) {
  auto g = connect_group(GetParam());
  std::vector<rank_memory> mem(world);
  std::vector<std::string> errors(world);
  on_ranks([&](int r) {
    auto& m = mem[static_cast<size_t>(r)];
    bucket_reducer reducer(g->comms[static_cast<size_t>(r)].get(), m.buckets, 30s);
    // Step 1: rank 1 announces bucket 2 twice, rank 2 a bucket that does not exist.
    m.fill(1, r);
    reducer.begin_step();
    for (size_t k = 0; k < bucket_sizes.size(); ++k) reducer.ready(k);
    if (r == 1) reducer.ready(2);
    if (r == 2) reducer.ready(99);
    try {
      reducer.finish();
    } catch (const workload_error& e) {
      errors[static_cast<size_t>(r)] = e.what();
    }
    // The failing ranks still took part in every collective, so the group is usable: step 2
    // succeeds everywhere.
    m.fill(2, r);
    reducer.begin_step();
    reducer.finish();
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("gradient bucket 2 was announced ready twice in one step"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[2].find("gradient bucket 99"), std::string::npos) << errors[2];
  EXPECT_NE(errors[2].find("has only 6 buckets"), std::string::npos) << errors[2];
  EXPECT_EQ(errors[3], "");
  expect_reduced(GetParam(), 2, mem);
}

/// Ranks 0-2 finish a step that rank 3 never joins (it never announces a bucket nor calls
/// finish). Returns their finish() futures once each has launched bucket 0.
struct stuck_step {
  std::unique_ptr<group> g;
  std::vector<rank_memory> mem = std::vector<rank_memory>(world);
  std::vector<std::unique_ptr<bucket_reducer>> reducers;
  std::vector<std::future<std::pair<comm::comm_errc, double>>> finished;  // code, seconds

  stuck_step(const std::string& backend, std::chrono::milliseconds op_timeout)
      : g(connect_group(backend)) {
    for (int r = 0; r < world; ++r) {
      mem[static_cast<size_t>(r)].fill(1, r);
      reducers.push_back(std::make_unique<bucket_reducer>(
          g->comms[static_cast<size_t>(r)].get(), mem[static_cast<size_t>(r)].buckets, op_timeout));
      reducers.back()->begin_step();
    }
    for (int r = 0; r + 1 < world; ++r)
      finished.push_back(std::async(std::launch::async, [this, r] {
        auto& reducer = *reducers[static_cast<size_t>(r)];
        for (size_t k = 0; k < bucket_sizes.size(); ++k) reducer.ready(k);
        const auto t0 = clock_type::now();
        try {
          reducer.finish();
        } catch (const comm::comm_error& e) {
          return std::make_pair(e.code(),
                                std::chrono::duration<double>(clock_type::now() - t0).count());
        }
        return std::make_pair(comm::comm_errc{}, 0.0);
      }));
  }
};

TEST_P(bucket_reducer_test, AbortMidReductionReturnsPromptlyAndLeavesTheBuckets) {
  stuck_step s(GetParam(), 60s);
  for (int r = 0; r + 1 < world; ++r)
    ASSERT_TRUE(eventually([&] { return s.reducers[static_cast<size_t>(r)]->launched() >= 1; }));
  const auto t0 = clock_type::now();
  for (int r = 0; r + 1 < world; ++r) s.reducers[static_cast<size_t>(r)]->abort();
  // Once abort() returned no thread writes the buckets: mark them and check below, after the
  // reducers' threads are joined.
  for (int r = 0; r + 1 < world; ++r)
    std::fill(s.mem[static_cast<size_t>(r)].flat.begin(), s.mem[static_cast<size_t>(r)].flat.end(),
              -7.0f);
  for (auto& f : s.finished) {
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
    const auto [code, seconds] = f.get();
    // The first aborted rank's peers may see it gone before their own abort() arrives.
    EXPECT_TRUE(code == comm::comm_errc::aborted || code == comm::comm_errc::peer_lost)
        << comm::to_string(code);
  }
  const double abort_s = std::chrono::duration<double>(clock_type::now() - t0).count();
  EXPECT_LT(abort_s, 10.0) << "the deadline was 60 s";
  for (int r = 0; r + 1 < world; ++r) EXPECT_EQ(s.reducers[static_cast<size_t>(r)]->reduced(), 0u);
  // Rank 3's step is still open: its destructor aborts it rather than wait for the deadline.
  s.reducers.clear();
  for (int r = 0; r + 1 < world; ++r)
    for (const float x : s.mem[static_cast<size_t>(r)].flat) ASSERT_EQ(x, -7.0f);
}

TEST_P(bucket_reducer_test, TheDeadlineEndsAReductionAPeerNeverJoins) {
  stuck_step s(GetParam(), 400ms);
  for (auto& f : s.finished) {
    ASSERT_EQ(f.wait_for(30s), std::future_status::ready);
    const auto [code, seconds] = f.get();
    // The first rank to time out is gone for the others, who may notice that first.
    EXPECT_TRUE(code == comm::comm_errc::timeout || code == comm::comm_errc::peer_lost)
        << comm::to_string(code);
    EXPECT_LT(seconds, 10.0);
  }
  s.reducers[world - 1]->abort();
  EXPECT_THROW(s.reducers[world - 1]->finish(), comm::comm_error);
}

INSTANTIATE_TEST_SUITE_P(backends, bucket_reducer_test, ::testing::Values("shm", "gloo"),
                         [](const auto& p) { return p.param; });

TEST(bucket_reducer_single, AReplicaAloneOnlyMeasuresTheNorm) {
  rank_memory m;
  m.fill(3, 0);
  const std::vector<float> before = m.flat;
  bucket_reducer reducer(nullptr, m.buckets, 1s);
  EXPECT_THROW(reducer.finish(), std::logic_error);
  reducer.ready(0);  // outside a step: ignored
  reducer.begin_step();
  EXPECT_THROW(reducer.begin_step(), std::logic_error);
  reducer.ready(4);
  const reduced_step s = reducer.finish();
  EXPECT_EQ(m.flat, before);
  EXPECT_EQ(s.grad_norm, norm_of(m.buckets));
  EXPECT_EQ(s.collective_s, 0.0);
  // After an abort every step fails, at once and without touching the buckets.
  reducer.abort();
  reducer.begin_step();
  try {
    reducer.finish();
    ADD_FAILURE() << "an aborted reducer finished a step";
  } catch (const comm::comm_error& e) {
    EXPECT_EQ(e.code(), comm::comm_errc::aborted);
    EXPECT_NE(std::string(e.what()).find("before bucket 0 of 6"), std::string::npos) << e.what();
  }
  EXPECT_EQ(reducer.launched(), 0u);
}

/// Rank 0 of a pair whose peer never comes: an all-reduce waits until abort(), then, as a
/// backend unwinding slowly might, writes into the buffer 50 ms later before it throws.
class late_writer final : public comm::communicator {
 public:
  const comm::comm_identity& identity() const override { return id_; }
  void all_reduce(float* data, size_t count, comm::reduce_op, const comm::op_options&) override {
    {
      std::unique_lock lock(mu_);
      in_flight_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return aborted_; });
    }
    std::this_thread::sleep_for(50ms);
    std::fill_n(data, count, 42.0f);
    throw comm::comm_error(comm::comm_errc::aborted, "late_writer aborted");
  }
  void abort() override {
    std::lock_guard lock(mu_);
    aborted_ = true;
    cv_.notify_all();
  }
  bool aborted() const override {
    std::lock_guard lock(mu_);
    return aborted_;
  }
  void await_in_flight() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return in_flight_; });
  }
  void broadcast(void*, size_t, int, const comm::op_options&) override { unused(); }
  void barrier(const comm::op_options&) override { unused(); }
  void reduce_scatter(const float*, float*, size_t, comm::reduce_op,
                      const comm::op_options&) override {
    unused();
  }
  void all_gather(const void*, void*, size_t, const comm::op_options&) override { unused(); }
  void all_to_all(const void*, void*, size_t, const comm::op_options&) override { unused(); }
  void all_to_allv(const void*, const std::vector<size_t>&, void*, const std::vector<size_t>&,
                   const comm::op_options&) override {
    unused();
  }
  void send(const void*, size_t, int, uint32_t, const comm::op_options&) override { unused(); }
  void recv(void*, size_t, int, uint32_t, const comm::op_options&) override { unused(); }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("not used by the reducer"); }
  comm::comm_identity id_{1, "dp0", 0, 2};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool in_flight_ = false;
  bool aborted_ = false;
};

TEST(bucket_reducer_single, AbortReturnsOnlyOnceTheThreadLeftTheBuckets) {
  late_writer c;
  rank_memory m;
  {
    bucket_reducer reducer(&c, m.buckets, 60s);
    reducer.begin_step();
    reducer.ready(0);
    c.await_in_flight();
    reducer.abort();
    // Whatever the thread wrote, it wrote before abort() returned.
    m.poison();
  }  // joins the thread
  for (const float x : m.flat) ASSERT_EQ(x, 1e30f);
}

TEST(bucket_reducer_single, RefusesANonPositiveDeadline) {
  EXPECT_THROW(bucket_reducer(nullptr, {}, 0ms), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::strategies

// The norm's arithmetic: eight running sums, any length (the tail of n % 8 included), within
// double rounding of an exact sum, and the same bits for the same values.
TEST(sum_of_squares, MatchesAnExactSumForAnyLength) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{1001}}) {
    std::vector<float> v(n);
    long double exact = 0;
    for (size_t i = 0; i < n; ++i) {
      v[i] = static_cast<float>(std::sin(static_cast<double>(i) * 0.7) * 3.0);
      exact += static_cast<long double>(v[i]) * v[i];
    }
    const double got = troupe::comm::sum_of_squares(v.data(), n);
    EXPECT_NEAR(got, static_cast<double>(exact), 1e-12 * std::max(1.0, got)) << "n = " << n;
    EXPECT_EQ(got, troupe::comm::sum_of_squares(v.data(), n));
  }
}
