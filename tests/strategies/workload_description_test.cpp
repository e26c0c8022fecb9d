// What the coordinator knows of the built-in GPT (strategies/workload_description.hpp): the
// state table a manifest lists, one array's size (what a resume checks), the FLOPs of a token
// (MFU) and the planner's constraints, each the figure the coordinator used before it asked.

#include "strategies/workload_description.hpp"

#include <gtest/gtest.h>

#include "runtime/model/gpt.hpp"
#include "strategies/state_layout.hpp"

namespace troupe::strategies {
namespace {

TEST(WorkloadDescription, TheGptAsTheCoordinatorSeesIt) {
  train_config cfg;
  cfg.model.n_layer = 2;
  cfg.model.d_model = 32;
  cfg.model.n_head = 4;
  cfg.model.context = 16;
  cfg.parallel.tp = 2;
  const workload_description d = describe_workload(cfg);
  EXPECT_EQ(d.name, "gpt");
  EXPECT_EQ(d.count_unit, "tokens");
  const auto table = tensor_table(cfg.model);
  ASSERT_EQ(d.tensors.size(), table.size());
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(d.tensors[i].name, table[i].name);
    EXPECT_EQ(d.tensors[i].shape, table[i].shape);
    EXPECT_EQ(d.tensors[i].offset, table[i].offset);
  }
  EXPECT_EQ(d.global_numel, gpt(cfg.model).num_params());
  // Dense: 6 per parameter and the attention scores.
  EXPECT_DOUBLE_EQ(d.flops_per_count,
                   6.0 * static_cast<double>(d.global_numel) + 12.0 * 2 * 32 * 16);
  EXPECT_EQ(d.constraints.tp, constraints_from(cfg).tp);
  EXPECT_EQ(d.constraints.tp, 2);
}

TEST(WorkloadDescription, AnMoeTokenCountsTheExpertsItReaches) {
  train_config cfg;
  cfg.model.n_layer = 2;
  cfg.model.d_model = 32;
  cfg.model.n_head = 4;
  cfg.model.context = 16;
  cfg.model.experts = 4;
  cfg.model.top_k = 1;
  const workload_description d = describe_workload(cfg);
  EXPECT_EQ(d.global_numel, gpt(cfg.model).num_params());
  // Fewer FLOPs than if every expert's parameters were active.
  EXPECT_LT(d.flops_per_count, 6.0 * static_cast<double>(d.global_numel) + 12.0 * 2 * 32 * 16);
}

}  // namespace
}  // namespace troupe::strategies
