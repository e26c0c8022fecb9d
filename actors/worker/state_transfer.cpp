#include "actors/worker/state_transfer.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::actors {
namespace {

// The buffers' sizes, so a receiver checks them before a byte of state lands.
std::vector<uint64_t> header_of(const strategies::local_state& s) {
  std::vector<uint64_t> h{s.buffers.size()};
  for (const auto& b : s.buffers) h.push_back(b.size());
  return h;
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
  if (header_of(from) != header_of(to) || !from.adam_t || !to.adam_t)
    throw std::runtime_error(
        "the state to keep has other shapes than the new generation's (a layout mismatch)");
  for (size_t i = 0; i < from.buffers.size(); ++i)
    std::copy(from.buffers[i].begin(), from.buffers[i].end(), to.buffers[i].begin());
  *to.adam_t = *from.adam_t;
}

uint64_t send_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                    const strategies::local_state& state, const comm::op_options& opts,
                    const shared_group& via) {
  const channel ch = open_channel(connect, generation, from, to, true, via);
  auto* c = ch.comm;
  const int peer = ch.peer;
  const auto header = header_of(state);
  const uint64_t count = header.size();
  c->send(&count, sizeof count, peer, header_tag, opts);
  c->send(header.data(), header.size() * sizeof(uint64_t), peer, header_tag, opts);
  for (size_t i = 0; i < state.buffers.size(); ++i)
    c->send(state.buffers[i].data(), state.buffers[i].size_bytes(), peer,
            first_buffer_tag + static_cast<uint32_t>(i), opts);
  c->send(state.adam_t, sizeof(int64_t), peer, step_tag, opts);
  return state.bytes();
}

uint64_t receive_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                       const strategies::local_state& state, const comm::op_options& opts,
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
  for (size_t i = 0; i < state.buffers.size(); ++i)
    c->recv(state.buffers[i].data(), state.buffers[i].size_bytes(), peer,
            first_buffer_tag + static_cast<uint32_t>(i), opts);
  c->recv(state.adam_t, sizeof(int64_t), peer, step_tag, opts);
  return state.bytes();
}

}  // namespace troupe::actors
