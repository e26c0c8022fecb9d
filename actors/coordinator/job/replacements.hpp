#pragma once
// Who fills the places of the members a job loses, and when the layout changes for it:
// workers that agents are restarting (the next plan may wait for them), idle spares that let
// the layout grow at a step boundary, and survivors that can shrink the group they already
// have instead of connecting a new one. A pure state machine: time is an argument.

#include <cstdint>
#include <map>
#include <vector>

#include "actors/coordinator/job/generation_plan.hpp"
#include "actors/coordinator/job/job_actions.hpp"
#include "actors/coordinator/job/job_params.hpp"
#include "actors/coordinator/job/membership.hpp"
#include "actors/coordinator/restore_plan.hpp"

namespace troupe::actors {

class replacements {
 public:
  explicit replacements(const job_params& p);

  /// A member on `node` was lost by `cause`. A crashed worker whose agent is alive and has
  /// restarts left comes back in a moment: the next plan may wait for it until
  /// replacement_wait from now.
  void member_lost(int node, loss_cause cause, logic_time now);
  /// A worker joined on `node` while the job recovers: one fewer to wait for.
  void rejoined(int node);
  /// An agent is gone: it restarts no worker any more.
  void agent_lost(int node);
  /// Workers being restarted that the next plan would wait for.
  int awaited() const;
  /// Whether the workers being restarted would let the next plan use more ranks than the
  /// `live` members alone (an idle spare may already take the lost place).
  bool waiting_adds_ranks(const strategies::layout_plan& plan, int live) const;
  /// Whether the next plan waits now: restarted workers are expected, in time, and worth it.
  bool worth_waiting(const strategies::layout_plan& plan, int live, logic_time now) const;
  /// Until when a held plan waits.
  logic_time deadline() const { return deadline_; }

  /// The plan is held for the restarted workers (a replacement_wait event the first time).
  void hold(uint64_t generation, logic_time now, actions& out);
  bool held() const { return held_; }
  /// Every live member reports again before any plan: nothing is held.
  void unhold() { held_ = false; }
  /// The next generation is planned: who has not rejoined by now joins later, by a grow.
  void planned();

  /// Whether `idle` members would let the `live` ones use a larger layout than `plan`.
  bool grow_wanted(const strategies::layout_plan& plan, int live, int idle) const;
  /// The rank each new rank held in the generation before, when the plan just made can
  /// shrink that generation's group (reconfigure::shrink_kept): both layouts plain data
  /// parallelism without ZeRO on one host, and every new rank an old one keeping its own
  /// state. Empty otherwise.
  std::vector<int32_t> shrink_kept(const strategies::layout& before, bool before_one_host,
                                   const generation_plan& now, const membership& members) const;

 private:
  replanner replan_;
  std::chrono::milliseconds wait_;
  int max_restarts_ = 0;
  bool shrink_groups_ = true;
  int zero_ = 0;
  std::map<int, int> awaited_;        // by node: workers that died with restarts left
  std::map<int, int> restarts_used_;  // by node, as predicted from the crashes seen
  std::vector<int> lost_nodes_;       // agents gone
  logic_time deadline_{};
  bool held_ = false;
};

}  // namespace troupe::actors
