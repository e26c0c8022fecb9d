#pragma once
// What the coordinator process knows of the job's workload (docs/WORKLOAD.md, "In the
// coordinator process"). It trains nothing and holds no workload object, yet it lists the
// state's tensors in every manifest, measures MFU from the FLOPs of a token, checks that a
// resumed checkpoint is this model's, and plans layouts within what the workload can run: all
// of it from the config alone, in this one place.

#include <cstddef>
#include <string>
#include <vector>

#include "checkpoint/state_map.hpp"
#include "runtime/config.hpp"
#include "strategies/planner.hpp"

namespace troupe::strategies {

struct workload_description {
  std::string name;  ///< "gpt"
  /// The state table each manifest lists (single-rank layout, flat offsets).
  std::vector<ckpt::tensor_shape> tensors;
  /// Elements of one state array (the parameters): what a resumed checkpoint must hold.
  size_t global_numel = 0;
  /// Training FLOPs per unit of count_unit, for MFU; 0 = not known (no MFU).
  double flops_per_count = 0;
  std::string count_unit = "tokens";
  /// What the layout planner may choose for this workload.
  plan_constraints constraints;
};

/// The job's workload as the coordinator sees it. The built-in GPT only, for now.
workload_description describe_workload(const train_config& cfg);

/// Training FLOPs of one token of `m`: 6 per active parameter (forward and backward; an MoE
/// token reaches top_k of its experts) and the attention scores, 12 x layers x width x context.
double training_flops_per_token(const model_config& m);

}  // namespace troupe::strategies
