#include "actors/coordinator/expert_group.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "monitoring/events/events.hpp"

namespace troupe::actors {

std::optional<expert_load_report> expert_load_tally::add(const expert_load_report& r) {
  const auto blocks = static_cast<size_t>(setup_.blocks),
             experts = static_cast<size_t>(setup_.experts);
  if (r.blocks != setup_.blocks || r.experts != setup_.experts ||
      r.tokens.size() != blocks * experts || r.dropped.size() != blocks)
    throw std::invalid_argument(
        "expert load report of rank " + std::to_string(r.rank) + " for step " +
        std::to_string(r.step) + " has " + std::to_string(r.blocks) + " blocks x " +
        std::to_string(r.experts) + " experts; the job has " + std::to_string(setup_.blocks) +
        " x " + std::to_string(setup_.experts));
  // Reports of an older generation can no longer complete: their generation was aborted.
  while (!pending_.empty() && pending_.begin()->first.first < r.generation)
    pending_.erase(pending_.begin());
  const auto key = std::make_pair(r.generation, r.step);
  auto it = pending_.find(key);
  if (it == pending_.end()) {
    expert_load_report sum = r;
    sum.rank = -1;
    it = pending_.emplace(key, std::make_pair(1, std::move(sum))).first;
  } else {
    auto& sum = it->second.second;
    for (size_t i = 0; i < sum.tokens.size(); ++i) sum.tokens[i] += r.tokens[i];
    for (size_t i = 0; i < sum.dropped.size(); ++i) sum.dropped[i] += r.dropped[i];
    ++it->second.first;
  }
  if (it->second.first < setup_.reports_per_step) return std::nullopt;
  expert_load_report done = std::move(it->second.second);
  pending_.erase(it);
  // Steps of this generation before the one just completed will not complete either.
  while (!pending_.empty() && pending_.begin()->first < key) pending_.erase(pending_.begin());
  return done;
}

namespace {

struct expert_group_state {
  std::optional<expert_load_tally> tally;
  expert_group_setup setup;
  expert_load_report latest;
  std::vector<monitoring::counter*> tokens_total;   // [block * experts]
  std::vector<monitoring::gauge*> step_tokens;      // [block * experts]
  std::vector<monitoring::counter*> dropped_total;  // [block]
  static inline const char* name = "expert_group";
};

using self_ptr = caf::stateful_actor<expert_group_state>*;

void publish(self_ptr self, const expert_load_report& r) {
  auto& st = self->state;
  const auto E = static_cast<size_t>(r.experts);
  for (size_t i = 0; i < r.tokens.size() && i < st.tokens_total.size(); ++i) {
    st.tokens_total[i]->inc(static_cast<double>(r.tokens[i]));
    st.step_tokens[i]->set(static_cast<double>(r.tokens[i]));
  }
  for (size_t b = 0; b < r.dropped.size() && b < st.dropped_total.size(); ++b)
    st.dropped_total[b]->inc(static_cast<double>(r.dropped[b]));
  if (!st.setup.events) return;
  events::expert_load load{.step = r.step,
                           .generation = r.generation,
                           .experts = r.experts,
                           .top_k = st.setup.top_k,
                           .tokens = {},
                           .dropped = r.dropped};
  for (size_t b = 0; b < r.dropped.size(); ++b)
    load.tokens.emplace_back(r.tokens.begin() + static_cast<std::ptrdiff_t>(b * E),
                             r.tokens.begin() + static_cast<std::ptrdiff_t>((b + 1) * E));
  st.setup.events->write(events::to_json(load));
}

caf::behavior expert_group(self_ptr self, expert_group_setup setup) {
  auto& st = self->state;
  st.setup = setup;
  st.tally.emplace(setup);
  st.latest.step = -1;
  st.latest.rank = -1;
  st.latest.blocks = setup.blocks;
  st.latest.experts = setup.experts;
  if (setup.metrics) {
    auto& tokens = setup.metrics->add_counter_family(
        "troupe_expert_tokens_total",
        "Tokens routed to each expert of each MoE block (every top_k choice, before capacity)");
    auto& step = setup.metrics->add_gauge_family(
        "troupe_expert_step_tokens",
        "Tokens routed to each expert of each MoE block in the last step");
    auto& dropped = setup.metrics->add_counter_family(
        "troupe_expert_dropped_total", "Expert choices of each MoE block dropped by capacity");
    for (int b = 0; b < setup.blocks; ++b) {
      for (int e = 0; e < setup.experts; ++e) {
        const monitoring::label_set labels{{"block", std::to_string(b)},
                                           {"expert", std::to_string(e)}};
        st.tokens_total.push_back(&tokens.with(labels));
        st.step_tokens.push_back(&step.with(labels));
      }
      st.dropped_total.push_back(&dropped.with({{"block", std::to_string(b)}}));
    }
  }
  // Linked to the job supervisor: end with it, whatever the reason (a normal exit would
  // otherwise leave this actor alive and keep the actor system from shutting down).
  self->set_exit_handler([=](caf::exit_msg& m) { self->quit(m.reason); });
  return {
      [=](const expert_load_report& r) {
        try {
          if (auto done = self->state.tally->add(r)) {
            self->state.latest = *done;
            publish(self, *done);
          }
        } catch (const std::exception& e) {
          if (self->state.setup.events)
            self->state.setup.events->write(
                events::to_json(events::expert_load_rejected{r.rank, e.what()}));
        }
      },
      [=](caf::get_atom) { return self->state.latest; },
  };
}

}  // namespace

caf::actor spawn_expert_group(caf::local_actor* parent, expert_group_setup setup) {
  return parent->spawn<caf::linked>(expert_group, std::move(setup));
}

}  // namespace troupe::actors
