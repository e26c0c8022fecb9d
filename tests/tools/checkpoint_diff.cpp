// Compares the parameters of two runs' latest committed checkpoints (any world size or
// layout: both are read back in the single-rank flat layout, every byte verified).
// usage: checkpoint_diff RUN_DIR_A RUN_DIR_B
// prints "rel_l2 X max_abs Y numel N step S": ||a - b|| / ||a|| over all parameters (AdamW
// turns float reassociation in near-zero gradients into full-size steps on single elements,
// so an element-wise relative bound says little) and the worst element; exit 1 on error.

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "checkpoint/checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: checkpoint_diff RUN_DIR_A RUN_DIR_B\n");
    return 2;
  }
  try {
    auto load = [](const char* dir) {
      auto man = troupe::ckpt::latest_committed(dir);
      if (!man) throw std::runtime_error(std::string("no committed checkpoint in ") + dir);
      return troupe::ckpt::load_full_state(dir, *man);
    };
    auto a = load(argv[1]), b = load(argv[2]);
    if (a.params.size() != b.params.size() || a.step != b.step) {
      std::fprintf(stderr, "checkpoints differ in shape or step (%zu@%lld vs %zu@%lld)\n",
                   a.params.size(), static_cast<long long>(a.step), b.params.size(),
                   static_cast<long long>(b.step));
      return 1;
    }
    double diff_sq = 0, norm_sq = 0, worst = 0;
    for (size_t i = 0; i < a.params.size(); ++i) {
      double x = a.params[i], y = b.params[i];
      diff_sq += (x - y) * (x - y);
      norm_sq += x * x;
      worst = std::max(worst, std::fabs(x - y));
    }
    std::printf("rel_l2 %.3e max_abs %.3e numel %zu step %lld\n",
                std::sqrt(diff_sq / std::max(norm_sq, 1e-30)), worst, a.params.size(),
                static_cast<long long>(a.step));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_diff: %s\n", e.what());
    return 1;
  }
}
