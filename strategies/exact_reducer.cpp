#include "strategies/exact_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::strategies {
comm::op_options remaining(std::chrono::steady_clock::time_point deadline,
                           const comm::op_options& opts) {
  comm::op_options out = opts;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  out.timeout = std::max(left, std::chrono::milliseconds(1));
  return out;
}

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

void exact_reducer::combine_alone(float* out) {
  std::vector<comm::tree_piece> pieces;
  for (size_t k = 0; k < accumulator_->nodes().size(); ++k)
    pieces.push_back({accumulator_->nodes()[k], accumulator_->values()[k].data()});
  comm::combine_pieces(M_, pieces, n_, out, scratch_);
}

void exact_reducer::all_reduce(comm::communicator& dp, float* out, const comm::op_options& opts) {
  all_reduce(dp, out, 0, n_, opts);
}

void exact_reducer::all_reduce(comm::communicator& dp, float* out, size_t begin, size_t end,
                               const comm::op_options& opts) {
  check_ready(dp);
  if (begin > end || end > n_)
    throw std::invalid_argument("exact_reducer: floats [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") of " + std::to_string(n_));
  if (dp.size() == 1 && begin == 0 && end == n_) return combine_alone(out);
  if (dp.size() == 1) {
    gathered_.resize(n_);
    combine_alone(gathered_.data());
    std::copy(gathered_.data() + begin, gathered_.data() + end, out + begin);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  const auto world = static_cast<size_t>(dp.size());
  for (size_t first = begin; first < end; first += bucket_floats_) {
    // Floats [first, first + len): replica j owns the j-th of size() equal slices (the last
    // ones shorter or empty); the combined slices are then gathered.
    const size_t len = std::min(bucket_floats_, end - first);
    const size_t slice = (len + world - 1) / world;
    const auto range_of = [&](size_t j) {
      const size_t lo = std::min(len, j * slice);
      return std::pair{first + lo, std::min(len, lo + slice) - lo};
    };
    if (mine_.size() < slice) mine_.resize(slice);  // past this rank's range: never read
    const comm::op_options left = remaining(deadline, opts);
    combine_ranges(dp, range_of, mine_.data(), left);
    if (slice * world == len) {  // the slices tile the bucket: gather straight into place
      dp.all_gather(mine_.data(), out + first, slice * sizeof(float), left);
      continue;
    }
    gathered_.resize(slice * world);
    dp.all_gather(mine_.data(), gathered_.data(), slice * sizeof(float), left);
    for (size_t j = 0; j < world; ++j)
      std::copy_n(gathered_.data() + j * slice, range_of(j).second, out + range_of(j).first);
  }
}

void exact_reducer::reduce_scatter(comm::communicator& dp, size_t block, float* shard,
                                   const comm::op_options& opts) {
  check_ready(dp);
  if (dp.size() == 1) {
    gathered_.resize(n_);
    combine_alone(gathered_.data());
    std::copy_n(gathered_.data(), n_, shard);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  // Chunks of each owner's block, so that what is sent and received at once stays within a
  // bucket's worth per piece.
  const size_t chunk = std::max<size_t>(1, bucket_floats_ / static_cast<size_t>(dp.size()));
  for (size_t c0 = 0; c0 < block; c0 += chunk) {
    const auto range_of = [&](size_t j) {
      const size_t lo = std::min(n_, j * block + c0);
      const size_t hi = std::min({n_, j * block + std::min(block, c0 + chunk)});
      return std::pair{lo, hi > lo ? hi - lo : size_t{0}};
    };
    combine_ranges(dp, range_of, shard + c0, remaining(deadline, opts));
  }
}

// Every replica sends owner j floats range_of(j) = [lo, lo + len) of each of its pieces; this
// replica combines what it receives for its own range, in tree order, into `mine`.
void exact_reducer::combine_ranges(comm::communicator& dp,
                                   const std::function<std::pair<size_t, size_t>(size_t)>& range_of,
                                   float* mine, const comm::op_options& opts) {
  const auto world = static_cast<size_t>(dp.size());
  const auto me = static_cast<size_t>(replica_);
  const size_t my_pieces = pieces_[me].size();
  const size_t mine_len = range_of(me).second;
  std::vector<size_t> send_bytes(world), recv_bytes(world);
  size_t send_floats = 0, recv_floats = 0;
  for (size_t j = 0; j < world; ++j) {
    send_bytes[j] = my_pieces * range_of(j).second * sizeof(float);
    recv_bytes[j] = pieces_[j].size() * mine_len * sizeof(float);
    send_floats += my_pieces * range_of(j).second;
    recv_floats += pieces_[j].size() * mine_len;
  }
  send_.resize(send_floats);
  recv_.resize(recv_floats);
  float* at = send_.data();
  for (size_t j = 0; j < world; ++j) {
    const auto [lo, len] = range_of(j);
    for (size_t k = 0; k < my_pieces; ++k)
      at = std::copy_n(accumulator_->values()[k].data() + lo, len, at);
  }
  dp.all_to_allv(send_.data(), send_bytes, recv_.data(), recv_bytes, opts);
  if (mine_len == 0) return;
  std::vector<comm::tree_piece> pieces;
  const float* from = recv_.data();
  for (size_t j = 0; j < world; ++j)
    for (const comm::tree_node& node : pieces_[j]) {
      pieces.push_back({node, from});
      from += mine_len;
    }
  comm::combine_pieces(M_, pieces, mine_len, mine, scratch_);
}

std::vector<double> block_sq_sums(const float* values, size_t first, size_t count,
                                  const uint8_t* counted) {
  if (first % norm_block != 0 && count > 0)  // an empty shard may lie at the end, anywhere
    throw std::invalid_argument("block_sq_sums: values start at " + std::to_string(first) +
                                ", not at a multiple of " + std::to_string(norm_block));
  std::vector<double> out;
  out.reserve((count + norm_block - 1) / norm_block);
  for (size_t b = 0; b < count; b += norm_block) {
    double sum = 0;
    const size_t end = std::min(count, b + norm_block);
    if (counted == nullptr) {
      for (size_t i = b; i < end; ++i) sum += static_cast<double>(values[i]) * values[i];
    } else {  // + 0 for a value left out: the sum's bits stay as they are
      for (size_t i = b; i < end; ++i)
        if (counted[i] != 0) sum += static_cast<double>(values[i]) * values[i];
    }
    out.push_back(sum);
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
