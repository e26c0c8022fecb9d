#include "strategies/expert_parallel/expert_parallel.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

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

std::string check_ep_batch(int batch, int micro_batch, int ep, int edp) {
  const auto str = [](int v) { return std::to_string(v); };
  if (batch < 1 || micro_batch < 1 || ep < 1 || edp < 1)
    return "batch, micro_batch, ep and dp / ep must be >= 1";
  if (batch % micro_batch != 0)
    return "micro_batch (" + str(micro_batch) + ") must divide batch (" + str(batch) +
           ") for an MoE model: each ep group computes whole micro-batches of the one-rank run";
  if (micro_batch % ep != 0)
    return "ep (" + str(ep) + ") must divide micro_batch (" + str(micro_batch) +
           "): the ep ranks share each micro-batch equally, since MoE capacity and aux loss are "
           "figures of a whole micro-batch; use a micro_batch that is a multiple of ep";
  const int K = batch / micro_batch;
  if (K % edp != 0)
    return "dp / ep (" + str(edp) + ") must divide the " + str(K) +
           " micro-batches of a step (batch / micro_batch) so each copy of the experts runs "
           "whole micro-batches; use a smaller micro_batch, a larger batch or fewer ranks";
  return {};
}

ep_sample_plan plan_ep_samples(int batch, int micro_batch, int ep, int edp, int e, int x) {
  if (auto why = check_ep_batch(batch, micro_batch, ep, edp); !why.empty())
    throw std::invalid_argument(why);
  if (e < 0 || e >= ep || x < 0 || x >= edp)
    throw std::invalid_argument("plan_ep_samples: need 0 <= e < ep and 0 <= x < dp / ep");
  ep_sample_plan p;
  p.micro_batch = micro_batch;
  p.micro_batches = batch / micro_batch;
  p.count = p.micro_batches / edp;
  p.first_micro_batch = x * p.count;
  p.slice = micro_batch / ep;
  p.slice_offset = e * p.slice;
  return p;
}

}  // namespace troupe::strategies
