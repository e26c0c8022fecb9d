#include "actors/coordinator/job/step_commit.hpp"

#include <algorithm>
#include <cmath>

#include "actors/coordinator/job/checkpoint_collection.hpp"
#include "actors/coordinator/job/divergence.hpp"
#include "monitoring/events/events.hpp"
#include "runtime/comm/communicator.hpp"

namespace troupe::actors {

bool evaluation_due(int64_t step, int64_t total_steps, int every) {
  return checkpoint_due(step, total_steps, every);
}

double step_votes::mean_loss() const {
  return tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0;
}

step_commit::step_commit(const job_params& p, logic_time now)
    : settle_(p.settle),
      zero_(p.cfg.parallel.zero),
      rank_labels_(p.cfg.metrics_rank_labels),
      committed_(p.start_step),
      last_commit_(now) {}

void step_commit::new_generation() {
  pending_ = step_votes{};
  held_ = false;
  failure_.clear();
  failure_reports_.clear();
  program_failed_ = false;
  eval_step_ = -1;
}

void step_commit::count(const step_done& v, int world, uint64_t generation, logic_time now,
                        actions& out) {
  auto& p = pending_;
  if (p.step != v.step) {
    p = step_votes{};
    p.step = v.step;
    p.arrived.assign(static_cast<size_t>(world), now);
    p.rank_compute_s.assign(static_cast<size_t>(world), std::nan(""));
    optimizer_state_bytes_.clear();
    peak_rss_bytes_.clear();
  }
  p.arrived[static_cast<size_t>(v.rank)] = now;
  p.rank_compute_s[static_cast<size_t>(v.rank)] =
      v.compute_cpu_s > 0 ? v.compute_cpu_s : v.compute_s;
  ++p.count;
  const double loss_sum = wire_decode(v.loss_sum, v.loss_class);
  const double grad_norm = wire_decode(v.grad_norm, v.grad_norm_class);
  p.loss_sum += loss_sum;
  p.tokens += v.tokens;
  p.lr = v.lr;
  p.compute_s += v.compute_s;
  p.max_compute_s = std::max(p.max_compute_s, v.compute_s);
  p.comm_s += v.comm_s;
  p.control_s += v.control_s;
  p.peer_wait_s += v.peer_wait_s;
  p.optim_s += v.optim_s;
  p.ckpt_stall_s += v.ckpt_stall_s;
  if (p.diverged.empty()) p.diverged = vote_divergence(v.rank, loss_sum, v.tokens, grad_norm);
  if (v.optim_state_bytes > 0 && world <= rank_labels_) {
    out.push_back(emit_event{events::memory{.rank = v.rank,
                                            .step = v.step,
                                            .generation = generation,
                                            .optimizer_state_bytes = v.optim_state_bytes,
                                            .peak_rss_bytes = v.peak_rss_bytes,
                                            .zero = zero_}});
  } else if (v.optim_state_bytes > 0) {
    // Ten thousand lines a generation would say less than one line of their spread.
    optimizer_state_bytes_.push_back(v.optim_state_bytes);
    peak_rss_bytes_.push_back(v.peak_rss_bytes);
  }
  if (p.count == world && !optimizer_state_bytes_.empty()) {
    out.push_back(emit_event{events::memory_summary{
        .step = v.step,
        .generation = generation,
        .ranks = static_cast<int32_t>(optimizer_state_bytes_.size()),
        .optimizer_state_bytes = events::spread_of(std::move(optimizer_state_bytes_)),
        .peak_rss_bytes = events::spread_of(std::move(peak_rss_bytes_)),
        .zero = zero_}});
    optimizer_state_bytes_.clear();
    peak_rss_bytes_.clear();
  }
}

void step_commit::fail(const step_done& v, logic_time now) {
  // A rank whose peer died reports the broken collective, often before the peer's own loss
  // reaches us; the root cause gets a moment to arrive so the verdict names it.
  failure_reports_[v.rank] = v.error_kind;
  if (v.error_op == program_failure_op && !program_failed_) {
    // The program's own error outranks a collective that broke because of it.
    program_failed_ = true;
    failure_.clear();
  }
  if (!failure_.empty()) return;
  failure_ = "rank " + std::to_string(v.rank) + " failed step " + std::to_string(v.step) + " (" +
             (v.error_op.empty() ? std::string("step") : v.error_op) +
             (v.error_group.empty() ? "" : ", group " + v.error_group) + "): " + v.error;
  settle_deadline_ = now + settle_;
}

step_votes step_commit::take() {
  step_votes v = std::move(pending_);
  pending_ = step_votes{};
  return v;
}

bool step_commit::failure_settled(logic_time now) const {
  return !failure_.empty() && now >= settle_deadline_;
}

std::vector<int32_t> step_commit::culprits(int world) const {
  std::vector<int32_t> culprits;
  bool timed_out = false;
  for (const auto& [rank, kind] : failure_reports_) {
    const auto errc = static_cast<comm::comm_errc>(kind);
    if (kind == 0 || errc == comm::comm_errc::internal || errc == comm::comm_errc::invalid)
      culprits.push_back(rank);
    timed_out = timed_out || errc == comm::comm_errc::timeout;
  }
  if (culprits.empty() && timed_out)
    for (int r = 0; r < world; ++r)
      if (!failure_reports_.count(r)) culprits.push_back(r);
  return culprits;
}

double step_commit::commit(const step_votes& v, double loss, logic_time now) {
  const double step_s = std::chrono::duration<double>(now - last_commit_).count();
  last_commit_ = now;
  committed_ = v.step;
  last_loss_ = loss;
  tokens_trained_ += v.tokens;
  return step_s;
}

void step_commit::expect_validation(int64_t step) {
  eval_step_ = step;
  eval_sum_ = 0;
  eval_batches_ = 0;
  evals_in_ = 0;
}

bool step_commit::add_validation(const eval_done& e, int world, uint64_t generation, actions& out) {
  eval_sum_ += wire_decode(e.loss_sum, e.loss_class);
  eval_batches_ += e.batches;
  if (++evals_in_ < world) return false;
  if (eval_batches_ > 0) {  // a workload that does not evaluate reports no batches
    last_val_ = eval_sum_ / static_cast<double>(eval_batches_);
    out.push_back(emit_event{events::validation{eval_step_, last_val_, generation}});
  }
  eval_step_ = -1;
  return true;
}

}  // namespace troupe::actors
