#include "actors/coordinator/job_status.hpp"

#include <algorithm>
#include <limits>

namespace troupe::actors {

void publish_status(monitoring::status_board& board, const job_logic& logic, logic_time now,
                    int64_t epoch) {
  board.set_role("leader", epoch);
  const auto ages = logic.heartbeat_ages(now);
  const auto& scores = logic.straggler_scores();
  std::vector<monitoring::status_rank> rows;
  for (const auto& m : logic.members()) {
    if (!m.live || m.rank < 0) continue;
    monitoring::status_rank r;
    r.rank = m.rank;
    r.member = m.id;
    r.node = m.node;
    r.host = m.host;
    r.pid = m.pid;
    const auto at = static_cast<size_t>(m.rank);
    r.heartbeat_age_s = at < ages.size() ? ages[at] : 0.0;
    r.straggler_score = at < scores.size() ? scores[at] : std::numeric_limits<double>::quiet_NaN();
    rows.push_back(std::move(r));
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  board.set_ranks(logic.generation(), std::move(rows));
}

bool status_publisher::tick(monitoring::status_board& board, const job_logic& logic, logic_time now,
                            int64_t epoch) {
  const shown current{logic.generation(), logic.state(), epoch};
  if (last_ && now - *last_ < period_ && current == shown_) return false;
  publish_status(board, logic, now, epoch);
  last_ = now;
  shown_ = current;
  return true;
}

void note_vote(monitoring::status_board& board, const step_done& vote) {
  if (!vote.ok) return;
  board.note_rank_step(vote.generation, vote.rank, vote.compute_s + vote.comm_s, vote.compute_s);
}

}  // namespace troupe::actors
