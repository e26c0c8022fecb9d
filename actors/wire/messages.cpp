#include "actors/wire/messages.hpp"

#include <caf/io/middleman.hpp>
#include <chrono>
#include <cmath>
#include <limits>

#include "runtime/auth/credentials.hpp"

namespace troupe::actors {

int8_t wire_encode(double& x) {
  value_class c = value_class::finite;
  if (std::isnan(x))
    c = value_class::nan;
  else if (std::isinf(x))
    c = x > 0 ? value_class::plus_inf : value_class::minus_inf;
  if (c != value_class::finite) x = 0;
  return static_cast<int8_t>(c);
}

double wire_decode(double x, int8_t c) {
  switch (static_cast<value_class>(c)) {
    case value_class::finite:
      return x;
    case value_class::nan:
      return std::numeric_limits<double>::quiet_NaN();
    case value_class::plus_inf:
      return std::numeric_limits<double>::infinity();
    case value_class::minus_inf:
      return -std::numeric_limits<double>::infinity();
  }
  return std::numeric_limits<double>::quiet_NaN();  // a class this build does not know
}

const char* to_string(state_source s) {
  switch (s) {
    case state_source::init:
      return "init";
    case state_source::checkpoint:
      return "checkpoint";
    case state_source::self:
      return "self";
    case state_source::peer:
      return "peer";
    case state_source::none:
      return "none";
  }
  return "unknown";
}

system_config::system_config() {
  add_message_type<hello>("troupe::hello");
  add_message_type<welcome>("troupe::welcome");
  add_message_type<agent_hello>("troupe::agent_hello");
  add_message_type<launch_plan>("troupe::launch_plan");
  add_message_type<step_done>("troupe::step_done");
  add_message_type<commit>("troupe::commit");
  add_message_type<abort_generation>("troupe::abort_generation");
  add_message_type<shard_written>("troupe::shard_written");
  add_message_type<eval_done>("troupe::eval_done");
  add_message_type<expert_load_report>("troupe::expert_load_report");
  add_message_type<worker_exited>("troupe::worker_exited");
  add_message_type<pipe_notice>("troupe::pipe_notice");
  add_message_type<job_result>("troupe::job_result");
  add_message_type<reconfigure>("troupe::reconfigure");
  add_message_type<state_report>("troupe::state_report");
  add_message_type<reconfigured>("troupe::reconfigured");
  add_message_type<heartbeat>("troupe::heartbeat");
  add_message_type<node_beats>("troupe::node_beats");
  add_message_type<node_votes>("troupe::node_votes");
  add_message_type<node_commit>("troupe::node_commit");
  // Heartbeats off means a frozen (SIGSTOPped, partitioned) peer is never noticed;
  // both settings must be non-zero for the middleman to check.
  set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
  set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(10)});
  // A handful of threads is plenty for a control plane, and the training threads
  // need the cores.
  set("scheduler.max-threads", size_t{2});
  // The work-stealing scheduler polls for work in a busy loop before it sleeps; on a
  // machine whose cores run the training threads that spin steals compute (measured: a
  // 1-rank step went from 86 ms to 127 ms). The sharing policy waits on a condition
  // variable instead, and a control plane's message rate does not need more.
  set("scheduler.policy", caf::atom("sharing"));
  // With no deserialisation workers the middleman's own thread decodes each message and
  // hands it to its receiver: one thread hop fewer on each side of a vote/commit round trip
  // (measured: 0.40 -> 0.31 ms idle, 0.77 -> 0.61 ms under training load).
  set("middleman.workers", size_t{0});
  // A process of another build is refused by name in CAF's own handshake.
  set("middleman.app-identifiers",
      std::vector<std::string>{"troupe-protocol-" + std::to_string(protocol_version)});
}

system_config& system_config::use_network() {
  load<caf::io::middleman>();
  return *this;
}

}  // namespace troupe::actors
