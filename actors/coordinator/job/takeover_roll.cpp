#include "actors/coordinator/job/takeover_roll.hpp"

#include <algorithm>

namespace troupe::actors {

void takeover_roll::wait_for(int32_t member) {
  if (back_.try_emplace(member, false).second) ++awaited_;
}

void takeover_roll::back(int32_t member) {
  auto [it, added] = back_.try_emplace(member, true);
  if (!added && !it->second) {
    it->second = true;
    --awaited_;
  }
}

void takeover_roll::forget(int32_t member) {
  const auto it = back_.find(member);
  if (it == back_.end()) return;
  if (!it->second) --awaited_;
  back_.erase(it);
}

void takeover_roll::hold_against(uint64_t generation, int world,
                                 const std::vector<member_info>& members) {
  generation_ = generation;
  holders_.assign(static_cast<size_t>(std::max(0, world)), 0);
  ranks_held_ = 0;
  for (const auto& m : members)
    if (m.live) holder(m, 1);
}

void takeover_roll::holder(const member_info& m, int sign) {
  if (generation_ == 0 || m.held_generation != generation_ || m.held_rank < 0 ||
      static_cast<size_t>(m.held_rank) >= holders_.size())
    return;
  int& n = holders_[static_cast<size_t>(m.held_rank)];
  if (sign > 0 && n++ == 0) ++ranks_held_;
  if (sign < 0 && n > 0 && --n == 0) --ranks_held_;
}

bool takeover_roll::every_rank_held() const {
  return generation_ != 0 && ranks_held_ == static_cast<int>(holders_.size());
}

}  // namespace troupe::actors
