#include "strategies/workload_description.hpp"

#include "strategies/state_layout.hpp"

namespace troupe::strategies {

workload_description describe_workload(const train_config& cfg) {
  workload_description d;
  if (cfg.external_workload()) {  // the user's program: its table comes from the ranks
    d.name = cfg.workload_command.front();
    d.count_unit = "samples";
    d.constraints = constraints_from(cfg);
    return d;
  }
  d.name = "gpt";
  d.tensors = tensor_table(cfg.model);
  for (const auto& t : d.tensors) {
    const auto [rows, cols] = ckpt::as_matrix(t.shape);
    d.global_numel += static_cast<size_t>(rows * cols);
  }
  d.flops_per_count = training_flops_per_token(cfg.model);
  d.count_unit = "tokens";
  d.constraints = constraints_from(cfg);
  return d;
}

double training_flops_per_token(const model_config& m) {
  double active = 0;
  for (const ckpt::tensor_shape& t : tensor_table(m)) {
    double numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<double>(d);
    if (m.experts > 0 && t.name.find(".moe.experts.") != std::string::npos)
      numel *= static_cast<double>(m.top_k) / m.experts;
    active += numel;
  }
  return 6 * active + 12.0 * m.n_layer * m.d_model * m.context;
}

}  // namespace troupe::strategies
