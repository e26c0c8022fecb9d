#pragma once
// Who a coordinator that takes a job over still waits for: the members the rejoined agents run
// and whether each is back, and how many ranks of the newest generation the live rejoined
// members hold. Kept as counts, so each rejoin costs O(1), not a pass over the job.

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "actors/coordinator/restore_plan.hpp"

namespace troupe::actors {

class takeover_roll {
 public:
  /// A rejoined agent runs `member`: the takeover waits for it unless it is back already.
  void wait_for(int32_t member);
  /// `member` rejoined.
  void back(int32_t member);
  /// `member` will not rejoin: it was lost, or its process ended before it joined.
  void forget(int32_t member);
  /// Whether every member a rejoined agent runs is back.
  bool everyone_back() const { return awaited_ == 0; }

  /// Counts the held ranks against `generation` (of `world` ranks) afresh, from every live
  /// member: the newest generation a rejoined member named changed.
  void hold_against(uint64_t generation, int world, const std::vector<member_info>& members);
  /// The generation held ranks are counted against, 0 before hold_against.
  uint64_t generation() const { return generation_; }
  /// A member that holds state came back (`sign` 1) or was lost (-1); `m` is counted when it
  /// holds a rank of generation().
  void holder(const member_info& m, int sign);
  /// Whether a live member holds every rank of generation().
  bool every_rank_held() const;

 private:
  std::unordered_map<int32_t, bool> back_;  // member -> rejoined
  int awaited_ = 0;                         // members of back_ not back yet
  uint64_t generation_ = 0;
  std::vector<int> holders_;  // by rank of generation_: live members holding it
  int ranks_held_ = 0;        // ranks with at least one holder
};

}  // namespace troupe::actors
