#include "strategies/expert_parallel/expert_parallel.hpp"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

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

namespace {

// Rank e of copy x when copy y runs per_copy[y] micro-batches of micro_batch sequences, the
// copies one after another in the step.
ep_sample_plan copy_plan(const std::vector<int>& per_copy, int micro_batch, int ep, int e, int x) {
  if (e < 0 || e >= ep || x < 0 || static_cast<size_t>(x) >= per_copy.size())
    throw std::invalid_argument("plan_ep_samples: need 0 <= e < ep and 0 <= x < dp / ep");
  ep_sample_plan p;
  p.micro_batch = micro_batch;
  for (size_t y = 0; y < per_copy.size(); ++y) {
    if (static_cast<int>(y) < x) p.first_micro_batch += per_copy[y];
    p.micro_batches += per_copy[y];
  }
  p.count = per_copy[static_cast<size_t>(x)];
  p.slice = micro_batch / ep;
  p.slice_offset = e * p.slice;
  return p;
}

}  // namespace

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
  return copy_plan(std::vector<int>(static_cast<size_t>(edp), batch / micro_batch / edp),
                   micro_batch, ep, e, x);
}

std::string check_ep_batching(const std::vector<int>& replica_micro_batches, int micro_batch,
                              int ep) {
  const auto str = [](auto v) { return std::to_string(v); };
  const auto& counts = replica_micro_batches;
  if (micro_batch < 1 || ep < 1) return "the micro-batch size and ep must be >= 1";
  if (counts.empty() || counts.size() % static_cast<size_t>(ep) != 0)
    return "the plan divides the step among " + str(counts.size()) +
           " data-parallel replicas, which is not a multiple of ep (" + str(ep) + ")";
  if (micro_batch % ep != 0)
    return "ep (" + str(ep) + ") must divide the plan's micro-batch size (" + str(micro_batch) +
           "): the ep ranks share each micro-batch equally, since MoE capacity and aux loss are "
           "figures of a whole micro-batch";
  for (size_t first = 0; first < counts.size(); first += static_cast<size_t>(ep))
    for (size_t d = first; d < first + static_cast<size_t>(ep); ++d) {
      if (counts[d] < 1) return "the plan gives replica " + str(d) + " no micro-batch";
      if (counts[d] != counts[first])
        return "the plan gives replica " + str(first) + " " + str(counts[first]) +
               " micro-batches but replica " + str(d) + " of the same ep group " + str(counts[d]) +
               "; the ranks of an ep group share every micro-batch, so they run equally many";
    }
  return {};
}

ep_sample_plan plan_ep_samples(const std::vector<int>& replica_micro_batches, int micro_batch,
                               int ep, int e, int x) {
  if (auto why = check_ep_batching(replica_micro_batches, micro_batch, ep); !why.empty())
    throw std::invalid_argument(why);
  std::vector<int> per_copy;
  for (size_t d = 0; d < replica_micro_batches.size(); d += static_cast<size_t>(ep))
    per_copy.push_back(replica_micro_batches[d] * ep);
  return copy_plan(per_copy, micro_batch, ep, e, x);
}

}  // namespace troupe::strategies
