#pragma once
// Expert parallelism: connects a rank's MoE layers to the ranks that own the other experts
// through a communicator, and turns the gradients each rank computed into those of the
// whole expert-parallel micro-batch.
//
// Layout: an ep group of p ranks, E divisible by p; rank r owns experts
// [r E/p, (r+1) E/p) of every MoE block and a replica of every other tensor. Each rank
// feeds its own micro-batch; the group computes exactly the single-rank model on the
// concatenation of the ranks' micro-batches in rank order (see runtime/model/moe.hpp for
// why capacity and token order then agree), up to floating-point reassociation.
//
// One step on rank r of the group:
//   gpt m(cfg, &exchange);                 // exchange: an ep_exchange over the ep communicator
//   loss_r = m.forward_backward(...);      // all_to_allv inside every MoE block, both passes
//   reduce_expert_parallel_grads(m, comm, opts);
//   loss = mean over the group of loss_r   // equals the single-rank loss of the whole batch

#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/model/gpt.hpp"
#include "runtime/model/moe.hpp"

namespace troupe::strategies {

/// The MoE layers' view of an expert-parallel group, over one communicator of that group
/// (not owned; it must outlive the exchange). Every call uses `opts` for its deadline and
/// throws comm::comm_error as the communicator does.
class ep_exchange final : public moe::expert_exchange {
 public:
  ep_exchange(comm::communicator& comm, const comm::op_options& opts);
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  /// An all-to-all of this rank's block sent to every rank, so a backend needs only the
  /// all-to-all pair of collectives.
  void all_gather(const void* in, void* out, size_t bytes) override;
  void all_to_allv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                   const std::vector<size_t>& recv_bytes) override;

 private:
  comm::communicator& comm_;
  comm::op_options opts_;
  std::vector<unsigned char> replicas_;  // size() copies of the block to all-gather
};

/// Whether a tensor is an expert's (sharded over the ep group) rather than replicated.
bool is_expert_param(const param_tensor& t);

/// After forward_backward on every rank of the ep group: averages the replicated tensors'
/// gradients over the group, and divides the local experts' gradients by the group size
/// (they already hold the sum over every rank's tokens, each scaled by its rank's
/// 1/tokens). Afterwards every rank holds, for the tensors it has, the gradient of the
/// single-rank model on the whole micro-batch: the mean of the ranks' objectives. The
/// ranks' micro-batches must have equal sizes for that mean to be the whole batch's.
void reduce_expert_parallel_grads(gpt& model, comm::communicator& comm,
                                  const comm::op_options& opts);

/// Which samples one rank of a dp x ep layout computes in a step (tp = pp = 1).
///
/// The single-rank reference runs the global batch G in K = G / mb micro-batches of mb
/// sequences, and an MoE layer's capacity and aux loss are figures of one whole micro-batch.
/// So an ep group computes whole reference micro-batches together: ep rank e takes the
/// slice [e mb/ep, (e+1) mb/ep) of each (the slices in ep-rank order are the micro-batch,
/// which is the token order moe_layer assumes), and the dp/ep copies x of the group split the
/// K micro-batches into contiguous runs in copy order: equal ones, [x K/X, (x+1) K/X), from
/// the config; from the coordinator's plan, the micro-batches of the copy's replicas.
struct ep_sample_plan {
  int micro_batch = 0;        ///< mb: sequences of one reference micro-batch
  int micro_batches = 0;      ///< K = G / mb in the whole step
  int first_micro_batch = 0;  ///< this copy's first
  int count = 0;              ///< this copy's number of micro-batches, K / X
  int slice = 0;              ///< sequences this rank takes of each: mb / ep
  int slice_offset = 0;       ///< where its slice starts inside a micro-batch: e * slice

  /// First global sample of this rank's slice of the i-th of its micro-batches.
  int first_sample(int i) const { return (first_micro_batch + i) * micro_batch + slice_offset; }
};

/// Why a global batch of `batch` sequences in micro-batches of `micro_batch` cannot be split
/// over `ep` expert shards times `edp` copies as ep_sample_plan describes (mb must divide the
/// batch, ep must divide mb, edp must divide the number of micro-batches), or an empty string.
std::string check_ep_batch(int batch, int micro_batch, int ep, int edp);

/// The plan of ep rank `e` in copy `x`; throws std::invalid_argument with check_ep_batch's
/// reason, or for e, x out of range.
ep_sample_plan plan_ep_samples(int batch, int micro_batch, int ep, int edp, int e, int x);

/// Why the coordinator's division of a step cannot run over `ep` expert shards, or an empty
/// string. The division (strategies::micro_batching): replica d of the dp group runs
/// replica_micro_batches[d] micro-batches of `micro_batch` sequences, after those of the
/// replicas before it. The ep group of copy x is replicas [x ep, (x+1) ep) (mesh.hpp), so the
/// group runs their micro-batches together, each of its ranks an equal slice of every one.
/// That needs a multiple of ep replicas, ep dividing micro_batch, and equal counts within each
/// ep group: a rank cannot run fewer micro-batches than the peers it shares them with.
/// Different groups may run different counts.
std::string check_ep_batching(const std::vector<int>& replica_micro_batches, int micro_batch,
                              int ep);

/// The plan of ep rank `e` in copy `x` under that division: the same as the overload above
/// for an even division whose micro_batch is the config's. Throws std::invalid_argument with
/// check_ep_batching's reason, or for e, x out of range.
ep_sample_plan plan_ep_samples(const std::vector<int>& replica_micro_batches, int micro_batch,
                               int ep, int e, int x);

}  // namespace troupe::strategies
