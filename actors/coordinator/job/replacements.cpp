#include "actors/coordinator/job/replacements.hpp"

#include <algorithm>

namespace troupe::actors {

replacements::replacements(const job_params& p)
    : replan_(p),
      wait_(p.replacement_wait),
      max_restarts_(p.max_restarts),
      shrink_groups_(p.shrink_groups),
      zero_(p.cfg.parallel.zero) {}

void replacements::member_lost(int node, loss_cause cause, logic_time now) {
  const bool crashed = cause == loss_cause::exit || cause == loss_cause::connection;
  const bool agent_alive =
      std::find(lost_nodes_.begin(), lost_nodes_.end(), node) == lost_nodes_.end();
  if (crashed && agent_alive && wait_.count() > 0 && restarts_used_[node] < max_restarts_) {
    ++restarts_used_[node];
    ++awaited_[node];
    deadline_ = now + wait_;
  }
}

void replacements::rejoined(int node) {
  if (auto it = awaited_.find(node); it != awaited_.end() && it->second > 0) --it->second;
}

void replacements::agent_lost(int node) {
  if (std::find(lost_nodes_.begin(), lost_nodes_.end(), node) == lost_nodes_.end())
    lost_nodes_.push_back(node);
  awaited_.erase(node);
}

int replacements::awaited() const {
  int n = 0;
  for (const auto& [node, count] : awaited_) n += count;
  return n;
}

bool replacements::waiting_adds_ranks(const strategies::layout_plan& plan, int live) const {
  return replan_.world_for(plan, live + awaited()) > replan_.world_for(plan, live);
}

bool replacements::worth_waiting(const strategies::layout_plan& plan, int live,
                                 logic_time now) const {
  // An idle spare already fills the place: the restarted worker becomes the next spare.
  return awaited() > 0 && now < deadline_ && waiting_adds_ranks(plan, live);
}

void replacements::hold(uint64_t generation, logic_time now, actions& out) {
  if (!held_)
    out.push_back(emit_event{events::replacement_wait{
        .generation = generation,
        .workers = awaited(),
        .wait_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - now).count()}});
  held_ = true;
}

void replacements::planned() {
  held_ = false;
  awaited_.clear();
}

bool replacements::grow_wanted(const strategies::layout_plan& plan, int live, int idle) const {
  if (idle == 0) return false;
  return replan_.world_for(plan, live) > plan.shape.world();
}

std::vector<int32_t> replacements::shrink_kept(const strategies::layout& before,
                                               bool before_one_host, const generation_plan& now,
                                               const membership& members) const {
  const auto plain_dp = [](const strategies::layout& l) {
    return l.tp == 1 && l.pp == 1 && l.ep == 1;
  };
  if (!shrink_groups_ || !before_one_host || !now.one_host() || !plain_dp(before) ||
      !plain_dp(now.plan().shape) || zero_ > 0)
    return {};
  const auto& restore = now.restore();
  std::vector<int32_t> kept;
  for (size_t r = 0; r < restore.member_of_rank.size(); ++r) {
    const member_info* m = members.find(restore.member_of_rank[r]);
    // Every new rank must be an old one that keeps its own state: a newcomer or a rank
    // restored otherwise needs a connect (and the old group has no place for it).
    if (!m || restore.source[r] != state_source::self || m->held_rank < 0 ||
        m->held_generation != members.generation() - 1)
      return {};
    kept.push_back(m->held_rank);
  }
  return kept;
}

}  // namespace troupe::actors
