#include "strategies/expert_parallel/expert_parallel.hpp"

#include <cstring>

namespace troupe::strategies {

ep_exchange::ep_exchange(comm::communicator& comm, const comm::op_options& opts)
    : comm_(comm), opts_(opts) {}

void ep_exchange::all_gather(const void* in, void* out, size_t bytes) {
  const size_t p = static_cast<size_t>(comm_.size());
  replicas_.resize(p * bytes);
  for (size_t r = 0; r < p; ++r) std::memcpy(replicas_.data() + r * bytes, in, bytes);
  comm_.all_to_all(replicas_.data(), out, bytes, opts_);
}

void ep_exchange::all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                              const std::vector<size_t>& recv_bytes) {
  comm_.all_to_allv(in, send_bytes, out, recv_bytes, opts_);
}

bool is_expert_param(const param_tensor& t) {
  return t.name.find(".moe.experts.") != std::string::npos;
}

void reduce_expert_parallel_grads(gpt& model, comm::communicator& comm,
                                  const comm::op_options& opts) {
  const int p = comm.size();
  if (p == 1) return;
  // Replicated tensors interleave with the experts block by block: gather them into one
  // buffer so the group pays for one all-reduce, not one per tensor.
  std::vector<float> replicated;
  for (const param_tensor& t : model.param_table()) {
    if (is_expert_param(t)) continue;
    replicated.insert(replicated.end(), model.grads() + t.offset,
                      model.grads() + t.offset + t.numel);
  }
  comm.all_reduce(replicated.data(), replicated.size(), comm::reduce_op::average, opts);
  const float inv_p = 1.0f / static_cast<float>(p);
  size_t at = 0;
  for (const param_tensor& t : model.param_table()) {
    float* g = model.grads() + t.offset;
    if (is_expert_param(t)) {
      for (size_t i = 0; i < t.numel; ++i) g[i] *= inv_p;
      continue;
    }
    std::memcpy(g, replicated.data() + at, t.numel * sizeof(float));
    at += t.numel;
  }
}

}  // namespace troupe::strategies
