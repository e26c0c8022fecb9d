#include "strategies/bucket_reducer.hpp"

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "runtime/comm/collective_math.hpp"

namespace troupe::strategies {
namespace {

using clock_type = std::chrono::steady_clock;

// The kinds of misuse ready() records; the top byte of misuse_.
constexpr uint64_t announced_twice = 1;
constexpr uint64_t out_of_range = 2;
constexpr int kind_shift = 56;
constexpr uint64_t bucket_mask = (uint64_t{1} << kind_shift) - 1;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now().time_since_epoch())
      .count();
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

bucket_reducer::bucket_reducer(comm::communicator* comm, std::vector<gradient_bucket> buckets,
                               std::chrono::milliseconds op_timeout)
    : comm_(comm),
      buckets_(std::move(buckets)),
      op_timeout_(op_timeout),
      announced_(std::make_unique<std::atomic<uint8_t>[]>(buckets_.size())) {
  if (op_timeout_ <= std::chrono::milliseconds::zero())
    throw std::invalid_argument("bucket_reducer: op_timeout must be positive, not " +
                                std::to_string(op_timeout_.count()) + " ms");
  thread_ = std::thread([this] { run(); });
  // A name in top and gdb; failing to set it costs nothing but the name.
  (void)pthread_setname_np(thread_.native_handle(), "troupe-reduce");
}

bucket_reducer::~bucket_reducer() {
  if (step_open_.load() && !aborted_.load()) abort();
  stop_.store(true);
  wake();
  thread_.join();
}

void bucket_reducer::wake() noexcept {
  wake_.fetch_add(1, std::memory_order_release);
  wake_.notify_all();
}

template <class Pred>
void bucket_reducer::await(Pred done) {
  // Read the word before the condition: a change made after the check bumps the word, so the
  // wait returns at once instead of missing it.
  for (uint32_t seen = wake_.load(std::memory_order_acquire); !done();
       seen = wake_.load(std::memory_order_acquire))
    wake_.wait(seen, std::memory_order_acquire);
}

void bucket_reducer::begin_step() {
  if (step_open_.load() && !aborted_.load())
    throw std::logic_error("bucket_reducer::begin_step: the previous step was not finished");
  {
    // The thread is idle between steps (finish() and abort() wait for it), so the flags can be
    // reset without racing it.
    std::lock_guard lock(done_mu_);
    if (done_seq_ != step_seq_.load())
      throw std::logic_error("bucket_reducer::begin_step: the previous step is still reducing");
  }
  for (size_t k = 0; k < buckets_.size(); ++k) announced_[k].store(0, std::memory_order_relaxed);
  misuse_.store(0, std::memory_order_relaxed);
  deadline_ns_.store(0, std::memory_order_relaxed);
  launched_.store(0, std::memory_order_relaxed);
  reduced_.store(0, std::memory_order_relaxed);
  step_open_.store(true, std::memory_order_release);
  step_seq_.fetch_add(1, std::memory_order_release);
  wake();
}

void bucket_reducer::ready(size_t bucket) {
  if (!step_open_.load(std::memory_order_acquire)) return;
  uint64_t kind = 0;
  if (bucket >= buckets_.size())
    kind = out_of_range;
  else if (announced_[bucket].exchange(1, std::memory_order_acq_rel) != 0)
    kind = announced_twice;
  if (kind != 0) {
    uint64_t none = 0;
    const uint64_t what = (kind << kind_shift) | (std::min<uint64_t>(bucket, bucket_mask));
    misuse_.compare_exchange_strong(none, what, std::memory_order_acq_rel);
    return;
  }
  wake();
}

reduced_step bucket_reducer::finish() {
  if (!step_open_.load()) throw std::logic_error("bucket_reducer::finish: no step was begun");
  // The deadline first, so that every bucket announced below is launched with it.
  deadline_ns_.store(now_ns() + std::chrono::nanoseconds(op_timeout_).count(),
                     std::memory_order_release);
  for (size_t k = 0; k < buckets_.size(); ++k) {
    uint8_t none = 0;
    announced_[k].compare_exchange_strong(none, 1, std::memory_order_acq_rel);
  }
  wake();
  const auto t0 = clock_type::now();
  std::exception_ptr failure;
  reduced_step result;
  {
    std::unique_lock lock(done_mu_);
    const uint64_t step = step_seq_.load();
    done_cv_.wait(lock, [&] { return done_seq_ == step; });
    failure = std::exchange(failure_, nullptr);
    result = result_;
  }
  result.wait_s = seconds_since(t0);
  step_open_.store(false, std::memory_order_release);

  const uint64_t misuse = misuse_.load(std::memory_order_acquire);
  if (misuse != 0) {
    const uint64_t bucket = misuse & bucket_mask;
    const std::string name = "gradient bucket " + std::to_string(bucket);
    if ((misuse >> kind_shift) == announced_twice)
      throw workload_error(name +
                           " was announced ready twice in one step: its gradient changed "
                           "after it was final, and its reduction may already have begun (a "
                           "reentrant or repeated backward; turn overlap off for such models)");
    throw workload_error(name + " was announced ready, but the workload has only " +
                         std::to_string(buckets_.size()) + " buckets");
  }
  if (failure) std::rethrow_exception(failure);
  last_ = result;
  return result;
}

void bucket_reducer::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  if (comm_ != nullptr) {
    try {
      comm_->abort();
    } catch (...) {
      // abort() is documented not to fail; if a backend did, the deadline still ends the wait.
    }
  }
  wake();
  std::unique_lock lock(done_mu_);
  done_cv_.wait(lock, [&] { return done_seq_ == step_seq_.load(); });
}

comm::op_options bucket_reducer::options_now() const {
  comm::op_options opts;
  opts.timeout = op_timeout_;
  const int64_t deadline = deadline_ns_.load(std::memory_order_acquire);
  if (deadline != 0) {
    // After finish(): what is left of the whole reduction's deadline, as
    // gradient_allreducer gives its buckets (at least 1 ms, so a late bucket times out
    // through the communicator, which then is dead on every rank alike).
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::nanoseconds(deadline - now_ns()));
    opts.timeout = std::clamp(left, std::chrono::milliseconds(1), op_timeout_);
  }
  return opts;
}

void bucket_reducer::run() noexcept {
  uint64_t seen = 0;
  for (;;) {
    await([&] { return stop_.load() || step_seq_.load() != seen; });
    if (stop_.load()) return;
    seen = step_seq_.load();
    std::exception_ptr broken;
    try {
      run_step();
    } catch (...) {
      // Only an allocation can fail outside a collective; the step fails with it.
      broken = std::current_exception();
    }
    {
      std::lock_guard lock(done_mu_);
      if (broken) failure_ = broken;
      done_seq_ = seen;
    }
    done_cv_.notify_all();
  }
}

void bucket_reducer::run_step() {
  const bool collective = comm_ != nullptr && comm_->size() > 1;
  double sum_sq = 0;
  double collective_s = 0;
  std::exception_ptr failure;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    await([&] {
      return aborted_.load() || stop_.load() || announced_[k].load(std::memory_order_acquire) != 0;
    });
    if (aborted_.load() || stop_.load()) {
      failure = std::make_exception_ptr(comm::comm_error(
          comm::comm_errc::aborted, "the gradient reduction was aborted before bucket " +
                                        std::to_string(k) + " of " +
                                        std::to_string(buckets_.size())));
      break;
    }
    launched_.store(k + 1, std::memory_order_release);
    const std::span<float> values = buckets_[k].values;
    // Every rank has the same bucket sizes (one model), so skipping an empty one skips it
    // everywhere.
    if (collective && !values.empty()) {
      const auto t0 = clock_type::now();
      try {
        comm_->all_reduce(values.data(), values.size(), comm::reduce_op::sum, options_now());
      } catch (...) {
        collective_s += seconds_since(t0);
        failure = std::current_exception();
        break;
      }
      collective_s += seconds_since(t0);
    }
    // The same bits on every rank: they hold the same reduced values.
    sum_sq += comm::sum_of_squares(values.data(), values.size());
    reduced_.store(k + 1, std::memory_order_release);
  }
  std::lock_guard lock(done_mu_);
  failure_ = failure;
  result_ = {std::sqrt(sum_sq), collective_s, 0.0};
}

}  // namespace troupe::strategies
