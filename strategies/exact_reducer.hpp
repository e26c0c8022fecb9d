#pragma once
// `--reduction exact` (issue 42): a step's gradient and loss summed in one order whatever the
// world. Every micro-batch's gradient enters one binary tree over the global micro-batch
// index (runtime/comm/tree_sum.hpp): a replica sums its own micro-batches into the tree's
// nodes that lie inside its range (its pieces), and the owner of each slice of the gradient
// combines every replica's pieces of that slice in tree order. One replica holding every
// micro-batch computes the same tree, so the bits do not depend on how many replicas there
// are, which of them holds which micro-batches (uneven plans, rebalanced stragglers), or the
// transport. The loss is summed over micro-batches in index order, the same way.
//
// Traffic: a replica holding one piece sends what a reduce-scatter plus an all-gather send
// (an all-reduce's bytes); one holding k pieces sends k times its reduce-scatter share. Every
// split of the default 4 micro-batches over 1 to 4 replicas, and every power-of-two split,
// gives one piece per replica.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/tree_sum.hpp"
#include "runtime/config.hpp"
#include "strategies/mesh.hpp"

namespace troupe::strategies {

/// Whether a job's steps on `shape` are summed by the exact reduction: --reduction exact
/// (whose unsupported layouts are refused before they get here), or auto (the default) where
/// it applies: the built-in GPT's dense layouts (dp with tp, pp and ZeRO-1 in any combination),
/// without ep or experts. Under tp and pp the guarantee holds while their degrees stay fixed:
/// each shard is summed exactly over its dp group, and the tp, pp and tied-embedding sums are
/// the same at those degrees.
/// Never with --reduction fast.
bool reduces_exactly(const train_config& cfg, const layout& shape);
/// What remains of a deadline that several collectives share (runtime/comm/communicator.hpp).
using comm::remaining;
/// Whether an engine backend built for `shape` sums exactly: reduces_exactly, with the plan's
/// micro-batches at hand (`has_plan`). --reduction exact without them is refused
/// (std::invalid_argument naming `backend`); auto sums the fast way there (tests of the
/// layouts alone build backends without a plan).
bool backend_reduces_exactly(const train_config& cfg, const layout& shape, bool has_plan,
                             const std::string& backend);

/// The exact gradient norm: the sum of squares in double over fixed blocks of norm_block
/// floats anchored at index 0, each block summed as comm::sum_of_squares sums (eight running
/// sums, value i into sum i mod 8, then added in a fixed order), the blocks added in block
/// order. A ZeRO shard that starts at a multiple of norm_block holds whole blocks, so the
/// shards' block sums, gathered, give the bits the whole buffer gives.
inline constexpr size_t norm_block = 1024;
/// The block sums of values [first, first + count) of a buffer (first a multiple of
/// norm_block unless count is 0; std::invalid_argument otherwise). With `counted` (one flag
/// per value, as `values`), a value whose flag is 0 adds nothing (a pipeline stage's copy of
/// the tied embedding, a tp peer's replicated tensors).
std::vector<double> block_sq_sums(const float* values, size_t first, size_t count,
                                  const uint8_t* counted = nullptr);
/// The exact norm of a whole buffer of n floats.
double exact_grad_norm(const float* values, size_t n);
/// The exact norm of a buffer sharded over `dp` in blocks of `block` floats (a multiple of
/// norm_block), this rank's shard being [offset, offset + count). Collective over `dp`.
double exact_grad_norm(comm::communicator& dp, const float* shard, size_t offset, size_t count,
                       size_t block, const comm::op_options& opts);
/// The squares' sums behind the two norms above (their square roots), with `counted` as in
/// block_sq_sums: what a model-parallel rank adds to its tp and pp peers'.
double exact_sq_sum(const float* values, size_t n, const uint8_t* counted = nullptr);
double exact_sq_sum(comm::communicator& dp, const float* shard, size_t offset, size_t count,
                    size_t block, const comm::op_options& opts, const uint8_t* counted = nullptr);

/// The validation loss summed in batch order, the same on any world: batch b of `batches` is
/// replica b % dp's, and `mine` holds this replica's per-batch losses in its order (b = r,
/// r + dp, ...). Collective over `dp`; every replica gets the sum.
double exact_eval_sum(comm::communicator& dp, const std::vector<double>& mine, int batches,
                      const comm::op_options& opts);

class exact_reducer {
 public:
  /// `counts`: the plan's micro-batches per replica, in data-parallel order (replica r holds
  /// those after replicas 0..r-1's); `replica`: this rank's index among them; `n`: gradient
  /// floats; `bucket_floats`: the most floats one round of the portable tree sum moves (its
  /// memory; the shared-memory and gloo backends send or read the pieces in place).
  /// `descending`: this replica's micro-batches come from its last down (a GPipe stage's
  /// backward passes). Throws std::invalid_argument on a replica outside counts or a negative
  /// count.
  exact_reducer(const std::vector<int>& counts, int replica, size_t n, size_t bucket_floats,
                bool descending = false);

  int micro_batches() const { return M_; }
  /// This replica's micro-batches: [first(), first() + count()) of micro_batches().
  int first() const { return first_; }
  int count() const { return count_; }

  /// Starts a step: forgets the last one's leaves and losses (their buffers are kept).
  void begin_step();
  /// Micro-batch `index`'s gradient (n floats, taken: `gradient` comes back as a spare buffer
  /// of n floats with unspecified contents) and its loss summed over its tokens. In index
  /// order (descending if built so), each of this replica's micro-batches once.
  void add_micro_batch(int index, std::vector<float>& gradient, double loss_sum);

  /// The sum of every replica's micro-batch gradients into `out` (n floats), the same bits on
  /// every replica and on any world. Collective over `dp` (the replicas, in plan order).
  void all_reduce(comm::communicator& dp, float* out, const comm::op_options& opts);
  /// The same for floats [begin, end) of n only (into those of `out`, n floats): the tied
  /// embedding's region of a ZeRO-1 pipeline stage. Collective over `dp`.
  void all_reduce(comm::communicator& dp, float* out, size_t begin, size_t end,
                  const comm::op_options& opts);
  /// The same sum, only this replica's block of it (ZeRO-1): floats [r * block, (r + 1) *
  /// block) of n, clipped to n, into `shard` (block floats; what lies past n is left as it
  /// is). The bits of the same floats of all_reduce's. Collective over `dp`.
  void reduce_scatter(comm::communicator& dp, size_t block, float* shard,
                      const comm::op_options& opts);
  /// The step's loss summed over every micro-batch in index order: what one replica holding
  /// all of them would sum. Collective over `dp`.
  double job_loss_sum(comm::communicator& dp, const comm::op_options& opts);

 private:
  void check_ready(const comm::communicator& dp) const;
  /// This step's pieces as the data plane's tree sums take them.
  comm::tree_sum_parts parts();

  int M_ = 0, first_ = 0, count_ = 0, replica_ = 0;
  size_t n_ = 0, bucket_floats_ = 0;
  std::vector<int> counts_;                            ///< per replica, its micro-batches
  std::vector<std::vector<comm::tree_node>> pieces_;   ///< per replica, its canonical pieces
  std::optional<comm::tree_accumulator> accumulator_;  ///< none for a replica without work
  std::vector<double> losses_;                         ///< this step's, by index - first_
  int added_ = 0;
  std::vector<const float*> piece_values_;  ///< parts()'s, reused
  comm::tree_sum_buffers buffers_;          ///< the data plane's, reused
};

}  // namespace troupe::strategies
