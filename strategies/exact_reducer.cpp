#include "strategies/exact_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::strategies {
bool reduces_exactly(const train_config& cfg, const layout& shape) {
  const auto& p = cfg.parallel;
  if (p.reduction == "exact") return true;
  return p.reduction == "auto" && !cfg.external_workload() && shape.ep == 1 &&
         cfg.model.experts == 0;
}

bool backend_reduces_exactly(const train_config& cfg, const layout& shape, bool has_plan,
                             const std::string& backend) {
  if (cfg.parallel.reduction == "exact" && !has_plan)
    throw std::invalid_argument(backend +
                                ": --reduction exact needs the plan's micro-batches; layout " +
                                describe(shape) + " without a plan");
  return has_plan && reduces_exactly(cfg, shape);
}

exact_reducer::exact_reducer(const std::vector<int>& counts, int replica, size_t n,
                             size_t bucket_floats, bool descending)
    : replica_(replica), n_(n), bucket_floats_(std::max<size_t>(1, bucket_floats)) {
  if (replica < 0 || static_cast<size_t>(replica) >= counts.size())
    throw std::invalid_argument("exact_reducer: replica " + std::to_string(replica) + " of " +
                                std::to_string(counts.size()));
  for (size_t r = 0; r < counts.size(); ++r) {
    if (counts[r] < 0)
      throw std::invalid_argument("exact_reducer: replica " + std::to_string(r) + " has " +
                                  std::to_string(counts[r]) + " micro-batches");
    if (static_cast<int>(r) == replica) {
      first_ = M_;
      count_ = counts[r];
    }
    M_ += counts[r];
  }
  counts_ = counts;
  if (M_ < 1) throw std::invalid_argument("exact_reducer: a step of no micro-batches");
  int at = 0;
  for (const int c : counts) {
    pieces_.push_back(c > 0 ? comm::canonical_pieces(M_, at, at + c)
                            : std::vector<comm::tree_node>{});
    at += c;
  }
  if (count_ > 0) accumulator_.emplace(M_, first_, count_, n_, descending);
}

void exact_reducer::begin_step() {
  if (accumulator_) accumulator_->reset();
  losses_.assign(static_cast<size_t>(count_), 0.0);
  added_ = 0;
}

void exact_reducer::add_micro_batch(int index, std::vector<float>& gradient, double loss_sum) {
  if (!accumulator_)
    throw std::logic_error("exact_reducer: replica " + std::to_string(replica_) +
                           " holds no micro-batches but was given " + std::to_string(index));
  accumulator_->take_leaf(index, gradient);  // checks the order and the size
  losses_[static_cast<size_t>(index - first_)] = loss_sum;
  ++added_;
}

void exact_reducer::check_ready(const comm::communicator& dp) const {
  if (static_cast<size_t>(dp.size()) != pieces_.size() || dp.rank() != replica_)
    throw std::logic_error("exact_reducer: planned for replica " + std::to_string(replica_) +
                           " of " + std::to_string(pieces_.size()) + ", the group has rank " +
                           std::to_string(dp.rank()) + " of " + std::to_string(dp.size()));
  if (added_ != count_)
    throw std::logic_error("exact_reducer: " + std::to_string(added_) + " of this replica's " +
                           std::to_string(count_) + " micro-batches were added");
}

void exact_reducer::all_reduce(comm::communicator& dp, float* out, const comm::op_options& opts) {
  all_reduce(dp, out, 0, n_, opts);
}

comm::tree_sum_parts exact_reducer::parts() {
  piece_values_.clear();
  if (accumulator_)  // a replica without micro-batches sends nothing and combines the rest
    for (const auto& v : accumulator_->values()) piece_values_.push_back(v.data());
  return {M_, &pieces_, piece_values_, std::max<size_t>(1, bucket_floats_ / pieces_.size()),
          &buffers_};
}

void exact_reducer::all_reduce(comm::communicator& dp, float* out, size_t begin, size_t end,
                               const comm::op_options& opts) {
  check_ready(dp);
  if (begin > end || end > n_)
    throw std::invalid_argument("exact_reducer: floats [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") of " + std::to_string(n_));
  dp.all_reduce_tree(parts(), begin, end, out, opts);
}

void exact_reducer::reduce_scatter(comm::communicator& dp, size_t block, float* shard,
                                   const comm::op_options& opts) {
  check_ready(dp);
  std::vector<comm::extent> owned(pieces_.size());
  for (size_t j = 0; j < owned.size(); ++j) {
    const size_t lo = std::min(n_, j * block);
    owned[j] = {lo, std::min(n_, lo + block) - lo};
  }
  dp.reduce_scatter_tree(parts(), owned, shard, opts);
}

namespace {

// comm::sum_of_squares's eight running sums, with the values whose flag is 0 left out (a square
// is never negative, so adding +0 in their place would leave the same bits).
double masked_sum_of_squares(const float* values, const uint8_t* counted, size_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) {
    const double v = values[i];
    s[i % 8] += counted[i] != 0 ? v * v : 0.0;
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

}  // namespace

std::vector<double> block_sq_sums(const float* values, size_t first, size_t count,
                                  const uint8_t* counted) {
  if (first % norm_block != 0 && count > 0)  // an empty shard may lie at the end, anywhere
    throw std::invalid_argument("block_sq_sums: values start at " + std::to_string(first) +
                                ", not at a multiple of " + std::to_string(norm_block));
  std::vector<double> out;
  out.reserve((count + norm_block - 1) / norm_block);
  for (size_t b = 0; b < count; b += norm_block) {
    const size_t len = std::min(count, b + norm_block) - b;
    out.push_back(counted == nullptr ? comm::sum_of_squares(values + b, len)
                                     : masked_sum_of_squares(values + b, counted + b, len));
  }
  return out;
}

double exact_sq_sum(const float* values, size_t n, const uint8_t* counted) {
  double sum = 0;
  for (const double block : block_sq_sums(values, 0, n, counted)) sum += block;
  return sum;
}

double exact_grad_norm(const float* values, size_t n) { return std::sqrt(exact_sq_sum(values, n)); }

double exact_grad_norm(comm::communicator& dp, const float* shard, size_t offset, size_t count,
                       size_t block, const comm::op_options& opts) {
  return std::sqrt(exact_sq_sum(dp, shard, offset, count, block, opts));
}

double exact_sq_sum(comm::communicator& dp, const float* shard, size_t offset, size_t count,
                    size_t block, const comm::op_options& opts, const uint8_t* counted) {
  if (block % norm_block != 0)
    throw std::invalid_argument("exact_grad_norm: shards of " + std::to_string(block) +
                                " floats are not whole norm blocks of " +
                                std::to_string(norm_block));
  std::vector<double> mine = block_sq_sums(shard, offset, count, counted);
  // Every shard has block / norm_block places; those past the model (the last shards) add 0,
  // which leaves the sum's bits as they are.
  mine.resize(block / norm_block, 0.0);
  std::vector<double> all(mine.size() * static_cast<size_t>(dp.size()));
  if (dp.size() == 1)
    all = mine;
  else
    dp.all_gather(mine.data(), all.data(), mine.size() * sizeof(double), opts);
  double sum = 0;
  for (const double b : all) sum += b;
  return sum;
}

double exact_eval_sum(comm::communicator& dp, const std::vector<double>& mine, int batches,
                      const comm::op_options& opts) {
  const auto world = static_cast<size_t>(dp.size());
  const size_t per = (static_cast<size_t>(std::max(batches, 0)) + world - 1) / world;
  if (mine.size() > per)
    throw std::invalid_argument("exact_eval_sum: " + std::to_string(mine.size()) +
                                " losses for a replica's share of " + std::to_string(per));
  std::vector<double> padded(per, 0.0);
  std::copy(mine.begin(), mine.end(), padded.begin());
  std::vector<double> all(per * world);
  if (world == 1)
    all = padded;
  else if (per > 0)
    dp.all_gather(padded.data(), all.data(), per * sizeof(double), opts);
  double sum = 0;
  for (size_t b = 0; b < static_cast<size_t>(std::max(batches, 0)); ++b)
    sum += all[(b % world) * per + b / world];
  return sum;
}

double exact_reducer::job_loss_sum(comm::communicator& dp, const comm::op_options& opts) {
  if (added_ != count_)
    throw std::logic_error(
        "exact_reducer: the loss of a step whose micro-batches were not all "
        "added");
  const int most = *std::max_element(counts_.begin(), counts_.end());
  std::vector<double> mine(static_cast<size_t>(most), 0.0);
  std::copy(losses_.begin(), losses_.end(), mine.begin());
  std::vector<double> all(mine.size() * counts_.size());
  if (dp.size() == 1)
    all = mine;
  else
    dp.all_gather(mine.data(), all.data(), mine.size() * sizeof(double), opts);
  // Replica r's losses are micro-batches [first_r, first_r + counts[r]): rank order then
  // position is index order.
  double sum = 0;
  for (size_t r = 0; r < counts_.size(); ++r)
    for (int i = 0; i < counts_[r]; ++i) sum += all[r * mine.size() + static_cast<size_t>(i)];
  return sum;
}

}  // namespace troupe::strategies
