#pragma once
// The readable reference training step of one rank: which samples it computes, how its
// micro-batch gradients are scaled and accumulated, and the validation loss. Every
// parallel layout is tested against this.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"
#include "runtime/model/gpt.hpp"

namespace troupe {

/// What one rank's share of a step produced.
struct grad_result {
  double loss_sum = 0;   ///< sum of per-token losses (nats) over this share
  int64_t tokens = 0;    ///< tokens in this share
  double compute_s = 0;  ///< wall seconds spent in forward/backward
};

/// This rank's share of step `step`: global samples [rank*G/W, (rank+1)*G/W) with
/// G = cfg.batch and W = world (the caller guarantees W divides G), in micro-batches of at
/// most cfg.micro_batch sequences of cfg.model.context tokens. m.grads() is zeroed first,
/// then accumulates gradients scaled so that their SUM over all ranks is the gradient of
/// the global mean loss over G*T tokens. The global mean loss is the sum of loss_sum over
/// ranks divided by G*T. Throws std::invalid_argument on a bad rank, world or batch.
grad_result compute_gradients(gpt& m, const token_dataset& d, const train_config& cfg, int64_t step,
                              int rank, int world);

/// Mean validation loss over cfg.eval_batches micro-batches of cfg.micro_batch sequences
/// (the same windows every call, so successive values are comparable). No gradients.
double evaluate(gpt& m, const token_dataset& d, const train_config& cfg);

/// Threads OpenBLAS may use (n < 1 counts as 1). Process-wide: ranks that are threads of
/// one process share it; ranks that are processes on one machine should each use 1.
void set_blas_threads(int n);

/// The data position (the 0-based "step" of token_dataset::fill_train) that 1-based step
/// `step` trains on: step - 1, moved on by one for every batch skipped at or before it
/// (`skipped_steps` holds one entry per skip, the step whose batch diverged). A pure function,
/// so every rank and every replay agrees on it.
inline int64_t data_position(int64_t step, const std::vector<int64_t>& skipped_steps) {
  int64_t position = step - 1;
  for (int64_t s : skipped_steps) position += s <= step ? 1 : 0;
  return position;
}

/// The global samples one data-parallel replica computes in a step: [first, first + count),
/// in micro-batches of `micro_batch` sequences (the last may be shorter).
struct sample_share {
  int first = 0;
  int count = 0;
  int micro_batch = 1;
};

/// Replica `replica`'s share when replica r runs counts[r] micro-batches of `micro_batch`
/// sequences, after those of the replicas before it (the plan's division of a step; uneven
/// when the data-parallel size does not divide the micro-batches). Throws
/// std::invalid_argument for a replica outside counts or a non-positive size.
inline sample_share replica_share(const std::vector<int>& counts, int micro_batch, int replica) {
  if (replica < 0 || static_cast<size_t>(replica) >= counts.size() || micro_batch < 1)
    throw std::invalid_argument("replica_share: replica " + std::to_string(replica) + " of " +
                                std::to_string(counts.size()) + ", micro_batch " +
                                std::to_string(micro_batch));
  int before = 0;
  for (int r = 0; r < replica; ++r) before += counts[static_cast<size_t>(r)];
  return {before * micro_batch, counts[static_cast<size_t>(replica)] * micro_batch, micro_batch};
}

/// The loop behind compute_gradients, for any model with zero_grads() and
/// forward_backward() (the dense gpt, a tensor-parallel shard): every layout runs the same
/// samples with the same B/G scaling per micro-batch, so the sum over replicas is the
/// single-rank gradient whatever the division. After each micro-batch,
/// `after_micro_batch(index, loss_sum)` is told the step's micro-batch index (share.first /
/// share.micro_batch for the first) and its loss summed over its tokens; it may take the
/// gradients the model holds and zero them (the exact reduction keeps micro-batches apart).
template <class Model, class AfterMicroBatch>
grad_result compute_share_gradients(Model& m, const token_dataset& d, const train_config& cfg,
                                    int64_t step, const sample_share& share,
                                    AfterMicroBatch&& after_micro_batch) {
  const int G = cfg.batch;
  const int T = cfg.model.context;
  if (share.first < 0 || share.count < 0 || share.first + share.count > G || share.micro_batch < 1)
    throw std::invalid_argument("compute_gradients: samples [" + std::to_string(share.first) +
                                ", +" + std::to_string(share.count) + ") in micro-batches of " +
                                std::to_string(share.micro_batch) + " do not fit a batch of " +
                                std::to_string(G));
  const int mb = std::max(1, std::min(share.micro_batch, share.count));
  // Sized once per call; at most micro_batch * T bytes each, small next to the model.
  std::vector<token_id> inputs(static_cast<size_t>(mb) * T);
  std::vector<token_id> targets(inputs.size());

  grad_result r;
  m.zero_grads();
  const auto start = std::chrono::steady_clock::now();
  for (int s = 0; s < share.count; s += mb) {
    const int B = std::min(mb, share.count - s);
    d.fill_train(cfg.seed, step, share.first + s, B, T, inputs.data(), targets.data());
    // forward_backward yields grad_scale * d(mean over B*T)/dθ; B/G turns it into this
    // micro-batch's part of d(mean over G*T)/dθ.
    const auto scale = static_cast<float>(static_cast<double>(B) / G);
    const double mean = m.forward_backward(inputs.data(), targets.data(), B, T, scale);
    r.loss_sum += mean * B * T;
    r.tokens += static_cast<int64_t>(B) * T;
    after_micro_batch((share.first + s) / share.micro_batch, mean * B * T);
  }
  r.compute_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

template <class Model>
grad_result compute_share_gradients(Model& m, const token_dataset& d, const train_config& cfg,
                                    int64_t step, const sample_share& share) {
  return compute_share_gradients(m, d, cfg, step, share, [](int, double) {});
}

/// compute_share_gradients for rank `rank` of `world` equal replicas: samples
/// [rank*G/W, (rank+1)*G/W) in micro-batches of at most cfg.micro_batch.
template <class Model>
grad_result compute_share_gradients(Model& m, const token_dataset& d, const train_config& cfg,
                                    int64_t step, int rank, int world) {
  const int G = cfg.batch;
  if (world < 1 || rank < 0 || rank >= world || G < 1 || G % world != 0 || cfg.micro_batch < 1) {
    throw std::invalid_argument(
        "compute_gradients: need 0 <= rank < world, world dividing batch (" + std::to_string(G) +
        ") and micro_batch >= 1; got rank " + std::to_string(rank) + " of " +
        std::to_string(world) + ", micro_batch " + std::to_string(cfg.micro_batch));
  }
  const int share = G / world;
  return compute_share_gradients(
      m, d, cfg, step, sample_share{rank * share, share, std::min(cfg.micro_batch, share)});
}

/// The loop behind evaluate, for any model with forward_loss().
template <class Model>
double evaluate_model(Model& m, const token_dataset& d, const train_config& cfg) {
  const int B = cfg.micro_batch;
  const int T = cfg.model.context;
  if (cfg.eval_batches < 1 || B < 1) {
    throw std::invalid_argument("evaluate: eval_batches and micro_batch must be >= 1");
  }
  std::vector<token_id> inputs(static_cast<size_t>(B) * T);
  std::vector<token_id> targets(inputs.size());
  double sum = 0;
  for (int b = 0; b < cfg.eval_batches; ++b) {
    d.fill_val(cfg.seed, b, 0, B, T, inputs.data(), targets.data());
    sum += m.forward_loss(inputs.data(), targets.data(), B, T);
  }
  return sum / cfg.eval_batches;
}

}  // namespace troupe
