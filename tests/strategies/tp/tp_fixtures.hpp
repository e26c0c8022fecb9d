#pragma once
// Test support shared by the thread and process tensor-parallel tests: the model shape and
// the micro-batch both sides compute, so a peer process and the test agree without messages.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/data/random.hpp"

namespace troupe::tensor_parallel::test {

/// Two blocks of four heads over 32 channels: splits 1, 2 and 4 ways.
inline model_config small_config() {
  model_config m;
  m.n_layer = 2;
  m.n_head = 4;
  m.d_model = 32;
  m.context = 16;
  m.vocab = 256;
  return m;
}

/// B sequences of T bytes drawn from a small alphabet with repeats.
struct batch {
  int B, T;
  std::vector<token_id> inputs, targets;
  batch(int b, int t, unsigned seed) : B(b), T(t), inputs(b * t), targets(b * t) {
    for (int i = 0; i < b * t; ++i) {
      inputs[i] = static_cast<token_id>((seed * 131 + i * 37) % 29 + 90);
      targets[i] = static_cast<token_id>((seed * 71 + i * 53) % 31 + 88);
    }
  }
};

/// Adds N(0, 0.05) noise to every parameter, so biases and LayerNorms are away from their
/// initial 0 and 1 and a bias counted t times, or a scale missed, shows.
inline void perturb(float* params, size_t n) {
  for (size_t i = 0; i < n; ++i) params[i] += static_cast<float>(0.05 * normal_at(99, 0, i));
}

}  // namespace troupe::tensor_parallel::test
