#include "actors/coordinator/job/membership.hpp"

#include <algorithm>
#include <utility>

#include "monitoring/events/events.hpp"

namespace troupe::actors {

namespace {

// What a removed member's process is told about its removal.
std::string removed_words(const member_info& m) {
  return "member " + std::to_string(m.id) +
         " was declared lost while this process was cut off or stopped, and the job went on "
         "without it";
}

double seconds_between(logic_time a, logic_time b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string protocol_mismatch(int32_t theirs) {
  return "protocol version " + std::to_string(theirs) + " != coordinator's " +
         std::to_string(protocol_version) + "; run the same troupe build everywhere";
}

// A process of another build, or one that asks after the job is over: `error` says so.
bool refused(int32_t protocol, bool job_over, std::string& error) {
  if (protocol != protocol_version)
    error = protocol_mismatch(protocol);
  else if (job_over)
    error = "the job is over";
  return !error.empty();
}

}  // namespace

membership::membership(const job_params& p)
    : expected_(p.members),
      nodes_(p.nodes),
      max_restarts_(p.max_restarts),
      heartbeat_timeout_(p.heartbeat_timeout),
      coordinator_timeout_(p.coordinator_timeout),
      rejoin_timeout_(p.rejoin_timeout),
      relay_(p.cfg.elastic.relay) {}

void membership::admit_agent(const agent_hello& h, bool job_over, launch_plan& answer,
                             actions& out) {
  answer.generation = generation_;
  if (refused(h.protocol, job_over, answer.error)) return;
  const int node = static_cast<int>(agent_pids_.size());
  int count = h.slots;
  if (node < nodes_ && count == 0) {
    // The first agents share the first members: node i takes its slice.
    const int per = expected_ / nodes_, extra = expected_ % nodes_;
    count = per + (node < extra ? 1 : 0);
  } else if (count <= 0) {
    answer.error = "this job already has its " + std::to_string(nodes_) +
                   " agents; pass --ranks K to add K workers";
    return;
  }
  agent_pids_.push_back(h.pid);
  answer.node = node;
  answer.max_restarts = max_restarts_;
  answer.coordinator_timeout_ms = static_cast<int32_t>(coordinator_timeout_.count());
  answer.heartbeat_timeout_ms = static_cast<int32_t>(heartbeat_timeout_.count());
  answer.rejoin_timeout_ms = static_cast<int32_t>(rejoin_timeout_.count());
  answer.relay = relay_;
  for (int i = 0; i < count; ++i) {
    launched_on_.resize(static_cast<size_t>(next_member_) + 1, -1);
    launched_on_[static_cast<size_t>(next_member_)] = node;
    answer.members.push_back(next_member_++);
  }
  out.push_back(emit_event{events::agent_joined{h.host, h.pid, node, answer.members}});
}

void membership::readmit_agent(const agent_hello& h, bool job_over, launch_plan& answer,
                               actions& out) {
  answer.generation = generation_;
  if (refused(h.protocol, job_over, answer.error)) return;
  // Bounded: a node number or member id is an index here.
  constexpr int32_t most = 1 << 16;
  if (h.node < 0 || h.node >= most || h.members.size() != h.pids.size()) {
    answer.error = "a rejoining agent must name its node (0.." + std::to_string(most - 1) +
                   ") and one pid per member";
    return;
  }
  for (int32_t m : h.members)
    if (m < 0 || m >= most) {
      answer.error = "member " + std::to_string(m) + " is not a valid member id";
      return;
    }
  const auto node = static_cast<size_t>(h.node);
  if (agent_pids_.size() <= node) agent_pids_.resize(node + 1, 0);
  agent_pids_[node] = h.pid;
  for (int32_t m : h.members) {
    launched_on_.resize(std::max(launched_on_.size(), static_cast<size_t>(m) + 1), -1);
    launched_on_[static_cast<size_t>(m)] = h.node;
    next_member_ = std::max(next_member_, m + 1);
  }
  answer.node = h.node;
  // An agent that was cut off stopped its workers: it starts again those of its members that
  // no live process holds (a spare may hold none of them: spares have ids of their own).
  for (int32_t m : h.former_members) {
    if (m < 0 || m >= most) continue;
    const member_info* info = find(m);
    if (info && info->live) continue;
    if (info && info->evicted) continue;
    launched_on_.resize(std::max(launched_on_.size(), static_cast<size_t>(m) + 1), -1);
    launched_on_[static_cast<size_t>(m)] = h.node;
    next_member_ = std::max(next_member_, m + 1);
    answer.members.push_back(m);
  }
  answer.max_restarts = h.restarts_left;
  answer.coordinator_timeout_ms = static_cast<int32_t>(coordinator_timeout_.count());
  answer.heartbeat_timeout_ms = static_cast<int32_t>(heartbeat_timeout_.count());
  answer.rejoin_timeout_ms = static_cast<int32_t>(rejoin_timeout_.count());
  answer.relay = relay_;
  out.push_back(emit_event{events::agent_joined{h.host, h.pid, h.node, h.members}});
}

member_info* membership::admit(const hello& h, bool forming, bool job_over, logic_time now,
                               welcome& answer, actions& out) {
  answer.generation = generation_;
  if (refused(h.protocol, job_over, answer.error)) return nullptr;
  if (h.member < 0) {
    answer.error = "member " + std::to_string(h.member) + " is not a valid member id";
    return nullptr;
  }
  member_info* m = find_mutable(h.member);
  if (m && m->live) {
    answer.error = "member " + std::to_string(h.member) + " already joined (a duplicate worker)";
    return nullptr;
  }
  if (m) {
    count(*m, -1);
  } else {
    slot_of_.emplace(h.member, members_.size());
    members_.push_back(member_info{});
    m = &members_.back();
  }
  *m = member_info{};
  m->id = h.member;
  m->node = h.node;
  m->pid = h.pid;
  m->host = h.host;
  m->transport = h.transport;
  m->last_heartbeat = now;
  // A member that joins a running job waits idle for the next generation; the current one
  // (training, or being formed) does not wait for it.
  m->reported = m->reconfigured = !forming;
  count(*m, 1);
  answer.heartbeat_interval_ms =
      static_cast<int32_t>(heartbeat_interval(heartbeat_timeout_).count());
  out.push_back(emit_event{events::rank_joined{.member = h.member,
                                               .rank = h.member,
                                               .pid = h.pid,
                                               .host = h.host,
                                               .node = h.node,
                                               .generation = generation_}});
  return m;
}

std::optional<membership::lost_member> membership::lose(int32_t member, loss_cause cause,
                                                        const std::string& why, int64_t committed,
                                                        actions& out) {
  member_info* m = find_mutable(member);
  if (!m || !m->live) return std::nullopt;
  count(*m, -1);
  m->live = false;
  m->evicted = cause == loss_cause::straggler;
  const lost_member lost{m->rank, m->node};
  m->rank = -1;
  count(*m, 1);
  if (lost.rank >= 0 && static_cast<size_t>(lost.rank) < member_of_rank_.size() &&
      member_of_rank_[static_cast<size_t>(lost.rank)] == member)
    member_of_rank_[static_cast<size_t>(lost.rank)] = -1;
  out.push_back(emit_event{events::rank_lost{.rank = lost.rank,
                                             .member = member,
                                             .node = m->node,
                                             .pid = m->pid,
                                             .cause = to_string(cause),
                                             .reason = why,
                                             .step = committed,
                                             .generation = generation_}});
  return lost;
}

void membership::record_heartbeat(const heartbeat& h, logic_time now, actions& out) {
  member_info* m = find_mutable(h.member);
  if (!m || !m->live) {
    // A process of a member declared lost that speaks again (its link healed, or it woke from
    // a SIGSTOP): its word no longer counts. An evicted straggler is told to go; any other is
    // told it was removed, and its agent starts the member again (the job grows back).
    stale("heartbeat", h.member, h.generation, out);
    if (m)
      out.push_back(send_abort{
          h.member, abort_generation{generation_,
                                     m->evicted ? evicted_reason("this member was evicted")
                                                : removed_reason(removed_words(*m)),
                                     true,
                                     {}}});
    return;
  }
  m->last_heartbeat = now;
}

std::string membership::rejoin_refusal(int32_t member) const {
  const member_info* m = find(member);
  if (m && m->live) return "";
  if (m && m->evicted) return evicted_reason("this member was evicted");
  if (!m)
    return removed_reason("member " + std::to_string(member) +
                          " is not one this coordinator knows (it joined another leadership)");
  return removed_reason(removed_words(*m));
}

void membership::restart_heartbeat_clocks(logic_time now) {
  for (auto& m : members_)
    if (m.live) m.last_heartbeat = std::max(m.last_heartbeat, now);
}

int32_t membership::launched_on(int32_t member) const {
  if (member < 0 || static_cast<size_t>(member) >= launched_on_.size()) return -1;
  return launched_on_[static_cast<size_t>(member)];
}

std::vector<std::pair<int32_t, std::string>> membership::silent(logic_time now) const {
  std::vector<std::pair<int32_t, std::string>> out;
  for (const auto& m : members_) {
    if (!m.live || now - m.last_heartbeat <= heartbeat_timeout_) continue;
    out.emplace_back(m.id, "no heartbeat for " +
                               std::to_string(seconds_between(m.last_heartbeat, now)).substr(0, 4) +
                               " s (timeout " + std::to_string(heartbeat_timeout_.count()) +
                               " ms)");
  }
  return out;
}

std::vector<double> membership::heartbeat_ages(logic_time now, int world) const {
  std::vector<double> ages(static_cast<size_t>(world), 0.0);
  for (const auto& m : members_)
    if (m.live && m.rank >= 0 && m.rank < world)
      ages[static_cast<size_t>(m.rank)] = seconds_between(m.last_heartbeat, now);
  return ages;
}

bool membership::current_process(int32_t member, int32_t pid) const {
  const member_info* m = find(member);
  return m && m->pid == pid;
}

std::vector<int32_t> membership::fault_victims(const chaos::fault& f, int world) const {
  std::vector<int32_t> pids;
  if (f.target == chaos::fault_target::rank) {
    // A random schedule may name a rank the shrunken world no longer has.
    const int rank = f.id < world ? f.id : f.id % std::max(1, world);
    for (const auto& m : members_)
      if (m.live && m.rank == rank) pids.push_back(m.pid);
  } else if (f.target == chaos::fault_target::node) {
    if (f.id >= 0 && static_cast<size_t>(f.id) < agent_pids_.size())
      pids.push_back(agent_pids_[static_cast<size_t>(f.id)]);
    for (const auto& m : members_)
      if (m.live && m.node == f.id) pids.push_back(m.pid);
  }
  return pids;
}

void membership::stale(const std::string& what, int32_t member, uint64_t message_generation,
                       actions& out) {
  ++stale_;
  // A recovery of a large job meets a late vote from nearly every member: the first few per
  // generation are logged, the rest only counted (stale_messages()).
  if (stale_logged_generation_ != generation_) {
    stale_logged_generation_ = generation_;
    stale_logged_ = 0;
  }
  if (stale_logged_++ < max_stale_events_per_generation)
    out.push_back(emit_event{events::stale_message{what, member, message_generation, generation_}});
}

void membership::abort_live(const std::string& reason, actions& out) {
  for (auto& m : members_) {
    if (!m.live) continue;
    m.reported = m.reconfigured = false;
    out.push_back(send_abort{m.id, abort_generation{generation_, reason, false, {}}});
  }
  recount();
}

void membership::all_reported() {
  for (auto& m : members_) m.reported = true;
  recount();
}

void membership::assume_reports(int64_t committed) {
  for (auto& m : members_) {
    if (!m.live) continue;
    m.reported = true;
    const bool placed = m.rank >= 0;
    m.held_generation = placed ? generation_ - 1 : 0;
    m.held_rank = placed ? m.rank : -1;
    m.held_step = placed ? committed : -1;
  }
  recount();
}

bool membership::report(const state_report& r) {
  member_info* m = find_mutable(r.member);
  if (!m || m->reported) return false;  // a duplicate, or a member that joined after the abort
  count(*m, -1);
  m->reported = true;
  m->held_generation = r.held_generation;
  m->held_rank = r.held_rank;
  m->held_step = r.held_step;
  count(*m, 1);
  return true;
}

void membership::set_held(int32_t member, uint64_t generation, int32_t rank, int64_t step) {
  member_info* m = find_mutable(member);
  if (!m) return;
  m->held_generation = generation;
  m->held_rank = rank;
  m->held_step = step;
}

void membership::place(const restore_plan& plan) {
  for (auto& m : members_) {
    m.rank = -1;
    m.reconfigured = false;
  }
  for (size_t r = 0; r < plan.member_of_rank.size(); ++r)
    if (auto* m = find_mutable(plan.member_of_rank[r])) m->rank = static_cast<int32_t>(r);
  // A member named for two ranks keeps the last; a rank whose member is gone has none.
  member_of_rank_.assign(plan.member_of_rank.size(), -1);
  for (const auto& m : members_)
    if (m.live && m.rank >= 0) member_of_rank_[static_cast<size_t>(m.rank)] = m.id;
  recount();
}

void membership::mark_reconfigured(int32_t member) {
  member_info* m = find_mutable(member);
  if (!m) return;
  count(*m, -1);
  m->reconfigured = true;
  count(*m, 1);
}

const member_info* membership::first_unready() const {
  if (unreported_ == 0 && unreconfigured_ == 0) return nullptr;
  for (const auto& m : members_)
    if (m.live && !(m.reported && m.reconfigured)) return &m;
  return nullptr;
}

bool membership::ranks_share_one_host() const {
  std::optional<std::string> host;
  for (const auto& m : members_) {
    if (!m.live || m.rank < 0) continue;
    const auto nl = m.transport.find('\n');
    if (nl == std::string::npos) return false;
    const std::string request = m.transport.substr(0, nl), where = m.transport.substr(nl + 1);
    if ((request != "auto" && request != "shm") || (host && *host != where)) return false;
    host = where;
  }
  return host.has_value();
}

void membership::stop_all(int exit_code, const std::string& message, actions& out) const {
  for (const auto& m : members_) {
    if (!m.live) continue;
    if (exit_code != 0)
      out.push_back(send_abort{m.id, abort_generation{generation_, message, true, {}}});
    out.push_back(send_stop{m.id});
  }
}

const member_info* membership::find(int32_t member) const {
  const auto it = slot_of_.find(member);
  return it == slot_of_.end() ? nullptr : &members_[it->second];
}

member_info* membership::find_mutable(int32_t member) {
  return const_cast<member_info*>(std::as_const(*this).find(member));
}

int32_t membership::member_of_rank(int32_t rank) const {
  if (rank < 0 || static_cast<size_t>(rank) >= member_of_rank_.size()) return -1;
  return member_of_rank_[static_cast<size_t>(rank)];
}

void membership::count(const member_info& m, int sign) {
  if (!m.live) return;
  live_ += sign;
  if (m.rank < 0) idle_ += sign;
  if (!m.reported) unreported_ += sign;
  if (!m.reconfigured) unreconfigured_ += sign;
  if (m.id >= 0 && m.id < expected_) live_first_ += sign;
}

void membership::recount() {
  live_ = idle_ = unreported_ = unreconfigured_ = live_first_ = 0;
  for (const auto& m : members_) count(m, 1);
}

std::vector<member_info> membership::live_members() const {
  std::vector<member_info> live;
  for (const auto& m : members_)
    if (m.live) live.push_back(m);
  return live;
}

}  // namespace troupe::actors
