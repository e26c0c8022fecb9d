#include "strategies/exact_reducer.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <string>

namespace troupe::strategies {
namespace {

// What remains of a deadline shared by several collectives, at least 1 ms.
comm::op_options remaining(std::chrono::steady_clock::time_point deadline,
                           const comm::op_options& opts) {
  comm::op_options out = opts;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  out.timeout = std::max(left, std::chrono::milliseconds(1));
  return out;
}

}  // namespace

bool reduces_exactly(const train_config& cfg, const layout& shape) {
  const auto& p = cfg.parallel;
  if (p.reduction == "exact") return true;
  return p.reduction == "auto" && !cfg.external_workload() && shape.tp == 1 && shape.pp == 1 &&
         shape.ep == 1 && p.zero == 0 && cfg.model.experts == 0;
}

exact_reducer::exact_reducer(const std::vector<int>& counts, int replica, size_t n,
                             size_t bucket_floats)
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
  if (count_ > 0) accumulator_.emplace(M_, first_, count_, n_);
}

void exact_reducer::begin_step() {
  if (accumulator_) accumulator_->reset();
  losses_.clear();
  added_ = 0;
}

void exact_reducer::add_micro_batch(int index, std::vector<float>& gradient, double loss_sum) {
  if (!accumulator_)
    throw std::logic_error("exact_reducer: replica " + std::to_string(replica_) +
                           " holds no micro-batches but was given " + std::to_string(index));
  accumulator_->take_leaf(index, gradient);  // checks the order and the size
  losses_.push_back(loss_sum);
  ++added_;
}

void exact_reducer::all_reduce(comm::communicator& dp, float* out, const comm::op_options& opts) {
  if (static_cast<size_t>(dp.size()) != pieces_.size() || dp.rank() != replica_)
    throw std::logic_error("exact_reducer: planned for replica " + std::to_string(replica_) +
                           " of " + std::to_string(pieces_.size()) + ", the group has rank " +
                           std::to_string(dp.rank()) + " of " + std::to_string(dp.size()));
  if (added_ != count_)
    throw std::logic_error("exact_reducer: " + std::to_string(added_) + " of this replica's " +
                           std::to_string(count_) + " micro-batches were added");
  if (dp.size() == 1) {
    std::vector<comm::tree_piece> pieces;
    for (size_t k = 0; k < accumulator_->nodes().size(); ++k)
      pieces.push_back({accumulator_->nodes()[k], accumulator_->values()[k].data()});
    comm::combine_pieces(M_, pieces, n_, out, scratch_);
    return;
  }
  const auto deadline = std::chrono::steady_clock::now() + opts.timeout;
  for (size_t first = 0; first < n_; first += bucket_floats_)
    exchange_bucket(dp, first, std::min(bucket_floats_, n_ - first), out,
                    remaining(deadline, opts));
}

// Floats [first, first + len) of the gradient: replica j owns the j-th of size() equal slices
// (the last ones shorter or empty); every replica sends each owner that slice of each of its
// pieces, the owner combines them in tree order, and the combined slices are gathered.
void exact_reducer::exchange_bucket(comm::communicator& dp, size_t first, size_t len, float* out,
                                    const comm::op_options& opts) {
  const auto world = static_cast<size_t>(dp.size());
  const auto me = static_cast<size_t>(replica_);
  const size_t slice = (len + world - 1) / world;
  const auto slice_len = [&](size_t j) {
    const size_t lo = std::min(len, j * slice);
    return std::min(len, lo + slice) - lo;
  };
  const size_t my_pieces = pieces_[me].size();
  std::vector<size_t> send_bytes(world), recv_bytes(world);
  size_t send_floats = 0, recv_floats = 0;
  for (size_t j = 0; j < world; ++j) {
    send_bytes[j] = my_pieces * slice_len(j) * sizeof(float);
    recv_bytes[j] = pieces_[j].size() * slice_len(me) * sizeof(float);
    send_floats += my_pieces * slice_len(j);
    recv_floats += pieces_[j].size() * slice_len(me);
  }
  send_.resize(send_floats);
  recv_.resize(recv_floats);
  float* at = send_.data();
  for (size_t j = 0; j < world; ++j)
    for (size_t k = 0; k < my_pieces; ++k) {
      const float* from = accumulator_->values()[k].data() + first + j * slice;
      at = std::copy_n(from, slice_len(j), at);
    }
  dp.all_to_allv(send_.data(), send_bytes, recv_.data(), recv_bytes, opts);

  const size_t mine_len = slice_len(me);
  if (mine_.size() < slice) mine_.resize(slice);  // past mine_len: padding, never read
  if (mine_len > 0) {
    std::vector<comm::tree_piece> pieces;
    const float* from = recv_.data();
    for (size_t j = 0; j < world; ++j)
      for (const comm::tree_node& node : pieces_[j]) {
        pieces.push_back({node, from});
        from += mine_len;
      }
    comm::combine_pieces(M_, pieces, mine_len, mine_.data(), scratch_);
  }
  if (slice * world == len) {  // the slices tile the bucket: gather straight into place
    dp.all_gather(mine_.data(), out + first, slice * sizeof(float), opts);
    return;
  }
  gathered_.resize(slice * world);
  dp.all_gather(mine_.data(), gathered_.data(), slice * sizeof(float), opts);
  for (size_t j = 0; j < world; ++j)
    std::copy_n(gathered_.data() + j * slice, slice_len(j), out + first + j * slice);
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
