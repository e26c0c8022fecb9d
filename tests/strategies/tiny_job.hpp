#pragma once
// A job small enough to train a few steps of every layout in a test: a tiny GPT config and a
// byte dataset of a repeated phrase, the same in every test that compares layouts.

#include <cstdint>
#include <vector>

#include "runtime/config.hpp"
#include "runtime/data/dataset.hpp"

namespace troupe::testing {

inline train_config tiny_config(int n_layer) {
  train_config cfg;
  cfg.model.n_layer = n_layer;
  cfg.model.n_head = 4;
  cfg.model.d_model = 32;
  cfg.model.context = 16;
  cfg.model.vocab = 256;
  cfg.batch = 8;
  cfg.micro_batch = 2;
  cfg.steps = 3;
  cfg.eval_batches = 2;
  cfg.optim.warmup_steps = 1;
  cfg.optim.grad_clip = 0.05;  // small, so clipping (and the global norm) matters
  return cfg;
}

inline token_dataset tiny_data() {
  std::vector<uint8_t> bytes(20000);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>("the quick brown fox "[i % 20] + (i / 97) % 3);
  return token_dataset::from_bytes(std::move(bytes), 0.1);
}

}  // namespace troupe::testing
