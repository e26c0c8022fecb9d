#include "actors/worker/state_transfer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::actors {
namespace {

// The regions' sizes in bytes and the number of counters, so a receiver checks them before a
// byte of state lands.
std::vector<uint64_t> header_of(const state_view& s) {
  std::vector<uint64_t> h{s.regions.size()};
  for (const auto& r : s.regions) h.push_back(r.bytes.size());
  h.push_back(s.counters.size());
  return h;
}

// The GPT's buffers as a state: one f32 region per buffer and AdamW's step count.
state_view view_of(const strategies::local_state& s) {
  state_view v;
  for (const auto& b : s.buffers) {
    state_region r;
    r.bytes = std::as_writable_bytes(b);
    v.regions.push_back(std::move(r));
  }
  if (s.adam_t) v.counters.push_back({"adam_t", s.adam_t});
  return v;
}

// The communicator a transfer uses and the peer's index in it.
struct channel {
  std::unique_ptr<comm::communicator> owned;
  comm::communicator* comm = nullptr;
  int peer = 0;
};

channel open_channel(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                     bool sender, const shared_group& via) {
  channel c;
  const auto at = [&](int rank) {
    const auto it = std::find(via.ranks.begin(), via.ranks.end(), rank);
    return it == via.ranks.end() ? -1 : static_cast<int>(it - via.ranks.begin());
  };
  if (via.comm && at(from) >= 0 && at(to) >= 0) {
    c.comm = via.comm;
    c.peer = at(sender ? to : from);
    return c;
  }
  const std::string group = "state." + std::to_string(from) + "to" + std::to_string(to);
  c.owned = connect({generation, group, sender ? 0 : 1, 2});
  c.comm = c.owned.get();
  c.peer = sender ? 1 : 0;
  return c;
}

constexpr uint32_t header_tag = 1, step_tag = 2, first_buffer_tag = 16;

}  // namespace

void copy_state(const strategies::local_state& from, const strategies::local_state& to) {
  if (!from.adam_t || !to.adam_t || header_of(view_of(from)) != header_of(view_of(to)))
    throw std::runtime_error(
        "the state to keep has other shapes than the new generation's (a layout mismatch)");
  for (size_t i = 0; i < from.buffers.size(); ++i)
    std::copy(from.buffers[i].begin(), from.buffers[i].end(), to.buffers[i].begin());
  *to.adam_t = *from.adam_t;
}

uint64_t send_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                    const state_view& state, const comm::op_options& opts,
                    const shared_group& via) {
  const channel ch = open_channel(connect, generation, from, to, true, via);
  auto* c = ch.comm;
  const int peer = ch.peer;
  const auto header = header_of(state);
  const uint64_t count = header.size();
  c->send(&count, sizeof count, peer, header_tag, opts);
  c->send(header.data(), header.size() * sizeof(uint64_t), peer, header_tag, opts);
  for (size_t i = 0; i < state.regions.size(); ++i)
    c->send(state.regions[i].bytes.data(), state.regions[i].bytes.size(), peer,
            first_buffer_tag + static_cast<uint32_t>(i), opts);
  std::vector<int64_t> counters;
  for (const auto& k : state.counters) counters.push_back(*k.value);
  if (!counters.empty())
    c->send(counters.data(), counters.size() * sizeof(int64_t), peer, step_tag, opts);
  return state.bytes();
}

uint64_t receive_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                       const state_view& state, const comm::op_options& opts,
                       const shared_group& via) {
  const channel ch = open_channel(connect, generation, from, to, false, via);
  auto* c = ch.comm;
  const int peer = ch.peer;
  uint64_t count = 0;
  c->recv(&count, sizeof count, peer, header_tag, opts);
  const auto mine = header_of(state);
  if (count != mine.size())
    throw std::runtime_error("rank " + std::to_string(from) + " sends " + std::to_string(count) +
                             " header entries; this rank expects " + std::to_string(mine.size()));
  std::vector<uint64_t> header(count);
  c->recv(header.data(), header.size() * sizeof(uint64_t), peer, header_tag, opts);
  if (header != mine)
    throw std::runtime_error(
        "rank " + std::to_string(from) +
        "'s state has other buffer sizes than this rank's place needs (a layout mismatch)");
  for (size_t i = 0; i < state.regions.size(); ++i)
    c->recv(state.regions[i].bytes.data(), state.regions[i].bytes.size(), peer,
            first_buffer_tag + static_cast<uint32_t>(i), opts);
  std::vector<int64_t> counters(state.counters.size());
  if (!counters.empty())
    c->recv(counters.data(), counters.size() * sizeof(int64_t), peer, step_tag, opts);
  for (size_t i = 0; i < counters.size(); ++i) *state.counters[i].value = counters[i];
  return state.bytes();
}

uint64_t send_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                    const strategies::local_state& state, const comm::op_options& opts,
                    const shared_group& via) {
  return send_state(connect, generation, from, to, view_of(state), opts, via);
}

uint64_t receive_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                       const strategies::local_state& state, const comm::op_options& opts,
                       const shared_group& via) {
  return receive_state(connect, generation, from, to, view_of(state), opts, via);
}

}  // namespace troupe::actors
