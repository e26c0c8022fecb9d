#include "actors/wire/leader_search.hpp"

#include <algorithm>
#include <utility>

namespace troupe::actors::wire {
namespace {

using std::chrono::milliseconds;

// `t + d`, held at the end of time: a search without a deadline may ask with an answer window
// as long as the clock's range, and the end of that window must not wrap into the past.
search_time plus(search_time t, milliseconds d) {
  if (d <= milliseconds(0)) return t;
  const auto room = std::chrono::duration_cast<milliseconds>(search_time::max() - t);
  if (d >= room) return search_time::max();
  return t + d;
}

milliseconds left_until(search_time deadline, search_time now) {
  if (now >= deadline) return milliseconds(0);
  return std::chrono::duration_cast<milliseconds>(deadline - now);
}

bool claims_to_lead(verdict v) {
  return v == verdict::welcomed || v == verdict::refused || v == verdict::told_to_go;
}

}  // namespace

const char* to_string(verdict v) {
  switch (v) {
    case verdict::welcomed:
      return "welcomed";
    case verdict::not_leading:
      return "not leading";
    case verdict::stale:
      return "leads an older epoch";
    case verdict::refused:
      return "refused";
    case verdict::told_to_go:
      return "told to go";
    case verdict::other_job:
      return "belongs to another job";
    case verdict::connection_refused:
      return "connection refused";
    case verdict::no_answer:
      return "no answer";
  }
  return "unknown verdict";
}

const char* to_string(give_up_reason r) {
  switch (r) {
    case give_up_reason::deadline:
      return "no leader before the deadline";
    case give_up_reason::refused:
      return "the leader refused";
    case give_up_reason::told_to_go:
      return "the leader said to go";
    case give_up_reason::other_job:
      return "a coordinator address belongs to another job";
    case give_up_reason::nobody_listens:
      return "the only coordinator refuses connections";
    case give_up_reason::no_endpoints:
      return "no coordinator to ask";
  }
  return "unknown reason";
}

const char* to_string(pacing p) {
  switch (p) {
    case pacing::after_each_try:
      return "after each try";
    case pacing::after_each_round:
      return "after each round";
  }
  return "unknown pacing";
}

search_policy worker_connect_policy() {
  search_policy p;
  p.connect_try = milliseconds(1500);
  // Only the connection counts here: the hello is the next search's (worker_start_policy).
  p.answer_try = milliseconds(0);
  p.answer_floor = milliseconds(0);
  p.first_pause = p.max_pause = milliseconds(100);
  p.stop_on_other_job = true;
  return p;
}

search_policy worker_start_policy() {
  search_policy p;
  p.connect_try = milliseconds(1500);
  p.answer_try = std::chrono::seconds(30);
  p.first_pause = p.max_pause = milliseconds(50);
  p.stop_on_refusal = true;
  return p;
}

search_policy worker_rehome_policy(bool several_coordinators, milliseconds window) {
  search_policy p;
  // A dead coordinator refuses at once and a standby answers within milliseconds: short
  // connection tries let a round over every coordinator take well under a second.
  p.connect_try = milliseconds(250);
  // A cut-off coordinator is silent: a try at it leaves time for the others. Alone, one hello
  // waits for the whole window, since each repeat reaching it after a healed cut would form
  // the generation again.
  p.answer_try =
      several_coordinators ? std::min<milliseconds>(std::chrono::seconds(3), window / 4) : window;
  p.first_pause = p.max_pause = milliseconds(50);
  // A leader in the middle of a takeover may refuse a member it will take a moment later.
  p.stop_on_refusal = false;
  return p;
}

search_policy agent_start_policy() {
  search_policy p;
  p.connect_try = milliseconds(1500);
  p.connect_floor = milliseconds(200);
  p.answer_try = std::chrono::seconds(10);
  p.answer_floor = milliseconds(1000);
  p.first_pause = p.max_pause = milliseconds(100);
  p.stop_on_refusal = true;
  p.ask_each_before_giving_up = true;
  return p;
}

search_policy agent_rehome_policy(milliseconds coordinator_timeout, milliseconds silence_limit) {
  search_policy p = agent_start_policy();
  // The lost leader is likely dead and refuses at once: a round over the others must not wait
  // on it.
  p.connect_try = milliseconds(400);
  // A coordinator that runs answers in milliseconds: a try need not outlast half the silence
  // the agent already allowed, nor a quarter of the time it has to find the leader.
  p.answer_try = std::min<milliseconds>(std::chrono::seconds(3), coordinator_timeout / 4);
  if (silence_limit.count() > 0) p.answer_try = std::min(p.answer_try, silence_limit / 2);
  return p;
}

search_policy agent_rejoin_policy(bool several_coordinators) {
  search_policy p = agent_start_policy();
  // Alone, one hello waits as long as the window allows: a connection that survived the cut
  // delivers it once the link heals. With standbys, each gets its turn.
  p.answer_try = several_coordinators ? milliseconds(3000) : milliseconds::max();
  // The link may stay down for minutes: each try waits longer than the last, up to 5 s, which
  // is also the most a healed link waits for the next try.
  p.first_pause = milliseconds(250);
  p.max_pause = milliseconds(5000);
  p.backoff = 2.0;
  p.lone_refusal_is_final = true;
  return p;
}

leader_search_machine::leader_search_machine(std::vector<std::string> endpoints,
                                             search_policy policy, search_start start)
    : policy_(policy), deadline_(start.deadline), floor_(start.epoch_seen) {
  records_.reserve(endpoints.size());
  for (auto& name : endpoints) records_.push_back(endpoint_record{std::move(name), 0, {}, {}});
  if (!records_.empty()) {
    cursor_ = start.last_leader % records_.size();
    if (start.leader_lost) cursor_ = (cursor_ + 1) % records_.size();
  }
  reuse_next_ = start.connected;
  policy_.backoff = std::max(policy_.backoff, 1.0);  // a pause never shrinks
  policy_.max_pause = std::max(policy_.max_pause, milliseconds(0));
  pause_ = std::clamp(policy_.first_pause, milliseconds(0), policy_.max_pause);
}

std::optional<ask_endpoint> leader_search_machine::asking() const {
  if (!asking_) return std::nullopt;
  return asking_->ask;
}

std::optional<size_t> leader_search_machine::index_of(std::string_view name) const {
  for (size_t i = 0; i < records_.size(); ++i)
    if (records_[i].name == name) return i;
  return std::nullopt;
}

std::vector<std::string> leader_search_machine::asked() const {
  std::vector<std::string> out;
  out.reserve(asked_order_.size());
  for (size_t i : asked_order_) out.push_back(records_[i].name);
  return out;
}

std::string leader_search_machine::summary() const {
  std::string out;
  for (const auto& r : records_) {
    if (!out.empty()) out += "; ";
    out += r.name + ": ";
    if (r.last)
      out += r.detail;
    else
      out += r.tries > 0 ? "no answer yet" : "not asked";
  }
  return out;
}

// At least one try, and with ask_each_before_giving_up one at every endpoint: a search that
// started past its deadline (a slow start-up) still hears each coordinator once.
bool leader_search_machine::may_give_up() const {
  if (tries_ == 0) return false;
  return !policy_.ask_each_before_giving_up || asked_order_.size() >= records_.size();
}

search_action leader_search_machine::finish(search_action outcome) {
  outcome_ = outcome;
  asking_.reset();
  detour_.reset();
  fresh_retry_.reset();
  resume_at_.reset();
  return outcome;
}

search_action leader_search_machine::next(search_time now) {
  if (outcome_) return *outcome_;
  if (records_.empty()) return finish(give_up{give_up_reason::no_endpoints, 0});
  if (asking_) {
    if (now < asking_->until) return wait_until{asking_->until};
    // The caller's own timeouts should have answered by now; a lost answer must not stall the
    // search, so the machine takes the silence as the answer.
    const in_flight silent = *asking_;
    asking_.reset();
    const auto waited = silent.ask.connect_within + silent.ask.answer_within;
    settle(silent,
           reply{verdict::no_answer, 0, std::nullopt, 0,
                 "no answer within " + std::to_string(waited.count()) + " ms"},
           now);
    if (outcome_) return *outcome_;
  }
  const bool past = now >= deadline_;
  // A retry over a new connection and a named leader go first, before any pause: both follow
  // fresh news, not a guess.
  if (fresh_retry_ || detour_) {
    if (past && may_give_up()) return finish(give_up{give_up_reason::deadline, last_asked_});
    if (fresh_retry_) {
      const size_t i = *std::exchange(fresh_retry_, std::nullopt);
      return start_ask(i, ask_kind::fresh_retry, now);
    }
    const size_t i = *std::exchange(detour_, std::nullopt);
    return start_ask(i, ask_kind::detour, now);
  }
  if (resume_at_) {
    if (now < *resume_at_) {
      // Nothing would be asked before the deadline: the search ends at it, not earlier (a
      // caller promises its peers to look for the whole window, and they count it too).
      if (*resume_at_ >= deadline_ && may_give_up()) {
        if (now >= deadline_) return finish(give_up{give_up_reason::deadline, last_asked_});
        return wait_until{deadline_};
      }
      return wait_until{*resume_at_};
    }
    resume_at_.reset();
  }
  if (past && may_give_up()) return finish(give_up{give_up_reason::deadline, last_asked_});
  const size_t i = cursor_;
  cursor_ = (cursor_ + 1) % records_.size();
  return start_ask(i, ask_kind::round, now);
}

search_action leader_search_machine::start_ask(size_t index, ask_kind kind, search_time now) {
  const milliseconds left = left_until(deadline_, now);
  const auto clip = [left](milliseconds most, milliseconds floor) {
    return std::max(floor, std::min(most, left));
  };
  const bool reuse = kind == ask_kind::round && reuse_next_;
  reuse_next_ = false;  // only the very first try may go over the caller's old connection
  ask_endpoint a;
  a.ticket = next_ticket_++;
  a.index = index;
  a.reuse_connection = reuse;
  a.connect_within = reuse ? milliseconds(0) : clip(policy_.connect_try, policy_.connect_floor);
  a.answer_within = clip(reuse ? policy_.connect_try : policy_.answer_try, policy_.answer_floor);
  asking_ = in_flight{a, kind, plus(plus(now, a.connect_within), a.answer_within)};
  auto& rec = records_[index];
  if (rec.tries++ == 0) asked_order_.push_back(index);
  ++tries_;
  last_asked_ = index;
  return a;
}

std::optional<verdict> leader_search_machine::on_answer(uint64_t ticket, reply r, search_time now) {
  if (outcome_ || !asking_ || asking_->ask.ticket != ticket) return std::nullopt;
  const in_flight a = *asking_;
  asking_.reset();
  return settle(a, std::move(r), now);
}

verdict leader_search_machine::settle(const in_flight& a, reply r, search_time now) {
  const size_t i = a.ask.index;
  verdict v = r.what;
  // Leadership epochs only grow: once a leader of epoch e answered (or a standby named one),
  // every leader of an older epoch is deposed, whether it knows it or not, and neither its
  // welcome nor its refusal nor its word that this process was removed may steer it.
  if (claims_to_lead(v) && r.epoch < floor_) {
    const std::string said = r.detail;
    r.detail = "leads epoch " + std::to_string(r.epoch) + ", older than epoch " +
               std::to_string(floor_) + (said.empty() ? "" : " (" + said + ")");
    v = verdict::stale;
  } else if (claims_to_lead(v)) {
    floor_ = r.epoch;
  }
  auto& rec = records_[i];
  rec.last = v;
  rec.detail = r.detail.empty() ? to_string(v) : r.detail;
  if (v != verdict::welcomed) last_answer_ = rec.detail;

  switch (v) {
    case verdict::welcomed:
      finish(leader_found{i, r.epoch});
      return v;
    case verdict::told_to_go:
      finish(give_up{give_up_reason::told_to_go, i});
      return v;
    case verdict::refused:
      if (policy_.stop_on_refusal) {
        finish(give_up{give_up_reason::refused, i});
        return v;
      }
      break;
    case verdict::other_job:
      if (policy_.stop_on_other_job) {
        finish(give_up{give_up_reason::other_job, i});
        return v;
      }
      break;
    case verdict::connection_refused:
      if (policy_.lone_refusal_is_final && records_.size() == 1) {
        finish(give_up{give_up_reason::nobody_listens, i});
        return v;
      }
      break;
    case verdict::not_leading:
      // A standby that names the leader saves a round. Its word is followed once: a named
      // endpoint that names another in turn is not, so two confused standbys cannot keep the
      // search between them without pauses. A name of an epoch already passed is old news.
      if (r.named_leader && *r.named_leader < records_.size() && *r.named_leader != i &&
          a.kind != ask_kind::detour && (r.named_epoch == 0 || r.named_epoch >= floor_)) {
        detour_ = *r.named_leader;
        floor_ = std::max(floor_, r.named_epoch);
      }
      break;
    case verdict::no_answer:
      // A connection made long ago may lead to a process that died since, while another now
      // serves its address: the same endpoint is asked again at once over a new connection.
      if (a.ask.reuse_connection) {
        fresh_retry_ = i;
        return v;
      }
      break;
    case verdict::stale:
      break;
  }
  count_failure(a, now);
  return v;
}

void leader_search_machine::count_failure(const in_flight& a, search_time now) {
  if (a.kind != ask_kind::detour) ++round_fails_;
  const bool owed = policy_.pace == pacing::after_each_try || round_fails_ >= records_.size();
  if (owed) {
    pause_owed_ = true;
    round_fails_ = 0;
  }
  // A named leader is asked before the pause: the pause follows its answer if that fails too.
  if (!pause_owed_ || detour_) return;
  pause_owed_ = false;
  if (pause_.count() > 0) resume_at_ = plus(now, pause_);
  const double grown = static_cast<double>(pause_.count()) * policy_.backoff;
  pause_ = grown >= static_cast<double>(policy_.max_pause.count())
               ? policy_.max_pause
               : milliseconds(static_cast<milliseconds::rep>(grown));
}

verdict verdict_of_connect_error(std::string_view error) {
  if (error.find("belongs to job") != std::string_view::npos) return verdict::other_job;
  if (error.find("Connection refused") != std::string_view::npos)
    return verdict::connection_refused;
  return verdict::no_answer;
}

}  // namespace troupe::actors::wire
