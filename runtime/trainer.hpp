#pragma once
// The readable reference training step of one rank: which samples it computes, how its
// micro-batch gradients are scaled and accumulated, and the validation loss. Every
// parallel layout is tested against this.

#include <cstdint>

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
grad_result compute_gradients(gpt& m, const byte_dataset& d, const train_config& cfg, int64_t step,
                              int rank, int world);

/// Mean validation loss over cfg.eval_batches micro-batches of cfg.micro_batch sequences
/// (the same windows every call, so successive values are comparable). No gradients.
double evaluate(gpt& m, const byte_dataset& d, const train_config& cfg);

/// Threads OpenBLAS may use (n < 1 counts as 1). Process-wide: ranks that are threads of
/// one process share it; ranks that are processes on one machine should each use 1.
void set_blas_threads(int n);

}  // namespace troupe
