#include "strategies/gpt_workload.hpp"

#include <string>
#include <utility>

#include "strategies/replan.hpp"
#include "strategies/state_layout.hpp"

namespace troupe::strategies {
namespace {

micro_batching batching_of(const layout_plan& plan) {
  return micro_batching{plan.micro_batch_size, plan.replica_micro_batches};
}

placed_box box_of(const ckpt::placed_piece& p) {
  return placed_box{p.tensor,        {p.where.row, p.where.col, p.where.rows, p.where.cols},
                    p.local_offset,  p.replicas,
                    p.replica_index, p.saved};
}

ckpt::placed_piece piece_of(const placed_box& b) {
  ckpt::placed_piece p;
  p.tensor = b.tensor;
  p.where = {b.where.row, b.where.col, b.where.rows, b.where.cols};
  p.local_offset = b.local_offset;
  p.replicas = b.replicas;
  p.replica_index = b.replica_index;
  p.saved = b.saved;
  return p;
}

size_t region_index(const state_region& r) {
  const auto i = ckpt::array_index(r.array);
  if (!i || r.type != dtype::f32)
    throw workload_error("state array '" + r.array + "' (" + std::string(dtype_name(r.type)) +
                         ") is not one of the GPT's f32 arrays (params, exp_avg, exp_avg_sq)");
  return static_cast<size_t>(*i);
}

}  // namespace

gpt_generation::gpt_generation(const train_config& cfg, const token_dataset& data,
                               const layout_plan& plan, int rank, uint64_t generation,
                               const connect_fn& connect)
    : cfg_(cfg),
      data_(data),
      engine_(cfg, plan.shape, rank, generation, connect, batching_of(plan)) {}

state_view gpt_generation::state() {
  return gpt_state_view(cfg_.model, engine_.state_map(), engine_.state());
}

step_outcome gpt_generation::compute(const step_work& work) {
  const grad_result g = engine_.compute(data_, work.data_position);
  step_outcome out;
  // Ranks that compute the same loss as another (tp peers, all but the last pipeline stage)
  // report none, so the job's sum counts each token once.
  if (engine_.reports_loss()) {
    out.loss_sum = g.loss_sum;
    out.count = g.tokens;
  }
  out.model_comm_s = engine_.take_model_comm_seconds();
  return out;
}

eval_result gpt_generation::evaluate(const eval_env& env) {
  (void)env;  // the engine takes the config's validation batches and its own replica share
  const eval_share share = engine_.evaluate(data_);
  return {share.loss_sum, share.batches};
}

void gpt_generation::abort() noexcept {
  try {
    engine_.abort();
  } catch (...) {  // aborting is best effort: the generation is not trained afterwards
  }
}

workload_traits gpt_workload::traits() const {
  workload_traits t;
  t.name = "gpt";
  t.layouts = layout_support::planned;
  t.reduces = reduction::by_workload;
  t.nonnegative_loss = true;  // cross-entropy
  t.count_unit = "tokens";
  return t;
}

std::unique_ptr<workload_generation> gpt_workload::make_generation(const generation_env& env) {
  return std::make_unique<gpt_generation>(cfg_, data_, plan_from_json(env.plan_json), env.rank,
                                          env.generation, env.connect);
}

state_view gpt_state_view(const model_config& model, const ckpt::state_map& map,
                          const local_state& buffers) {
  state_view v;
  for (const auto& t : tensor_table(model))
    v.tensors.push_back({t.name, "", t.shape, dtype::f32, tensor_role::parameter});
  if (buffers.buffers.size() != ckpt::array_names.size())
    throw workload_error("the GPT's state has " + std::to_string(buffers.buffers.size()) +
                         " buffers, not one per state array");
  for (size_t i = 0; i < ckpt::array_names.size(); ++i) {
    state_region r;
    r.array = std::string(ckpt::array_names[i]);
    r.type = dtype::f32;
    r.bytes = std::as_writable_bytes(buffers.buffers[i]);
    for (const auto& p : map.arrays[i]) r.pieces.push_back(box_of(p));
    v.regions.push_back(std::move(r));
  }
  if (buffers.adam_t) v.counters.push_back({"adam_t", buffers.adam_t});
  return v;
}

ckpt::state_map state_map_of(const state_view& view) {
  ckpt::state_map map;
  for (const auto& r : view.regions) {
    auto& pieces = map.arrays[region_index(r)];
    for (const auto& box : r.pieces) pieces.push_back(piece_of(box));
  }
  return map;
}

local_state local_state_of(const state_view& view) {
  local_state s;
  s.buffers.resize(ckpt::array_names.size());
  for (const auto& r : view.regions) {
    auto* first = reinterpret_cast<float*>(r.bytes.data());
    s.buffers[region_index(r)] = std::span<float>(first, r.bytes.size() / sizeof(float));
  }
  for (const auto& c : view.counters)
    if (c.name == "adam_t") s.adam_t = c.value;
  return s;
}

}  // namespace troupe::strategies
