#include "actors/worker/state_transfer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/wire/state_table.hpp"

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

constexpr uint32_t header_tag = 1, step_tag = 2, table_tag = 3, first_buffer_tag = 16;

// A table and its extras are bounded: a peer's header is input like any other.
constexpr uint64_t max_table_bytes = uint64_t{64} << 20;

void send_text(comm::communicator& c, int peer, const std::string& text,
               const comm::op_options& opts) {
  const uint64_t n = text.size();
  c.send(&n, sizeof n, peer, table_tag, opts);
  if (n > 0) c.send(text.data(), text.size(), peer, table_tag, opts);
}

std::string receive_text(comm::communicator& c, int peer, int from, const comm::op_options& opts) {
  uint64_t n = 0;
  c.recv(&n, sizeof n, peer, table_tag, opts);
  if (n > max_table_bytes)
    throw std::runtime_error("rank " + std::to_string(from) + " announces a state table of " +
                             std::to_string(n) + " bytes, more than the 64 MiB allowed");
  std::string text(n, '\0');
  if (n > 0) c.recv(text.data(), text.size(), peer, table_tag, opts);
  return text;
}

}  // namespace

void copy_state(const strategies::local_state& from, const strategies::local_state& to) {
  if (!from.adam_t || !to.adam_t || header_of(view_of(from)) != header_of(view_of(to)))
    throw std::runtime_error(
        "the state to keep has other shapes than the new generation's (a layout mismatch)");
  for (size_t i = 0; i < from.buffers.size(); ++i)
    std::copy(from.buffers[i].begin(), from.buffers[i].end(), to.buffers[i].begin());
  *to.adam_t = *from.adam_t;
}

namespace {

uint64_t send_over(const channel& ch, const state_view& state, const comm::op_options& opts) {
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

uint64_t receive_over(const channel& ch, int from, const state_view& state,
                      const comm::op_options& opts) {
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

}  // namespace

uint64_t send_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                    const state_view& state, const comm::op_options& opts,
                    const shared_group& via) {
  return send_over(open_channel(connect, generation, from, to, true, via), state, opts);
}

uint64_t receive_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                       const state_view& state, const comm::op_options& opts,
                       const shared_group& via) {
  return receive_over(open_channel(connect, generation, from, to, false, via), from, state, opts);
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

uint64_t send_workload_state(const strategies::connect_fn& connect, uint64_t generation, int from,
                             int to, workload_generation& state, const comm::op_options& opts,
                             const shared_group& via) {
  const state_view view = state.state();
  const channel ch = open_channel(connect, generation, from, to, true, via);
  send_text(*ch.comm, ch.peer, encode_state_table(view.tensors, view.extras_json), opts);
  return send_over(ch, view, opts);
}

uint64_t receive_workload_state(const strategies::connect_fn& connect, uint64_t generation,
                                int from, int to, workload_generation& state,
                                const comm::op_options& opts, const shared_group& via) {
  const channel ch = open_channel(connect, generation, from, to, false, via);
  const std::string text = receive_text(*ch.comm, ch.peer, from, opts);
  state_table table;
  try {
    table = decode_state_table(text);
  } catch (const std::exception& e) {
    throw std::runtime_error("rank " + std::to_string(from) + " sent " + e.what());
  }
  state.begin_restore(table.tensors, table.extras_json);
  try {
    const uint64_t bytes = receive_over(ch, from, state.state(), opts);
    state.end_restore();
    return bytes;
  } catch (...) {
    state.cancel_restore();
    throw;
  }
}

}  // namespace troupe::actors
