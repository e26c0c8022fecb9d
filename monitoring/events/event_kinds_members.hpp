#pragma once
// The job's event kinds of one topic (members and agents: joins, losses, stale messages, connect
// failures, replacements, stragglers and injected faults); see monitoring/events/events.hpp
// for what every struct has and how they are written and read.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "monitoring/events/event_field.hpp"

namespace troupe::events {

/// A member died or was declared lost ("rank_lost").
struct rank_lost {
  static constexpr std::string_view name = "rank_lost";
  int32_t rank = -1;
  int32_t member = -1;
  int32_t node = -1;
  int64_t pid = 0;
  std::string cause;  ///< to_string(loss_cause)
  std::string reason;
  int64_t step = 0;
  uint64_t generation = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("rank", e.rank);
    f("member", e.member);
    f("node", e.node);
    f("pid", e.pid);
    f("cause", e.cause);
    f("reason", e.reason);
    f("step", e.step);
    f("generation", e.generation);
  }
  friend bool operator==(const rank_lost&, const rank_lost&) = default;
};

/// A message of an older generation was dropped ("stale_message").
struct stale_message {
  static constexpr std::string_view name = "stale_message";
  std::string message;
  int32_t member = -1;
  uint64_t message_generation = 0;
  uint64_t generation = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("message", e.message);
    f("member", e.member);
    f("message_generation", e.message_generation);
    f("generation", e.generation);
  }
  friend bool operator==(const stale_message&, const stale_message&) = default;
};

/// An agent reported one of its workers' exit ("worker_exited").
struct worker_exited {
  static constexpr std::string_view name = "worker_exited";
  int32_t member = -1;
  int32_t pid = 0;
  int exit_code = 0;
  int signal = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("member", e.member);
    f("pid", e.pid);
    f("exit_code", e.exit_code);
    f("signal", e.signal);
  }
  friend bool operator==(const worker_exited&, const worker_exited&) = default;
};

/// The connection to an agent was lost ("agent_lost").
struct agent_lost {
  static constexpr std::string_view name = "agent_lost";
  std::string reason;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("reason", e.reason);
  }
  friend bool operator==(const agent_lost&, const agent_lost&) = default;
};

/// An agent joined and was given members to start ("agent_joined").
struct agent_joined {
  static constexpr std::string_view name = "agent_joined";
  std::string host;
  int32_t pid = 0;
  int32_t node = 0;
  std::vector<int32_t> members;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("host", e.host);
    f("pid", e.pid);
    f("node", e.node);
    f("members", e.members);
  }
  friend bool operator==(const agent_joined&, const agent_joined&) = default;
};

/// This coordinator won the job's etcd election and leads it ("leader"). The epoch is the
/// leader key's create_revision: a later leadership always carries a larger one, so a reader
/// of several coordinators' logs can tell which decisions came from the newer leader.
struct leader {
  static constexpr std::string_view name = "leader";
  int64_t epoch = 0;
  std::string id;       ///< host:pid of the coordinator
  std::string address;  ///< where it serves the job (host:port)
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("epoch", e.epoch);
    f("id", e.id);
    f("address", e.address);
  }
  friend bool operator==(const leader&, const leader&) = default;
};

/// The coordinator that took the job over found no state of this run in etcd
/// ("etcd_state_lost"): its keys deleted, lost with etcd's data, unreadable, or another run's.
/// It took the job over from what the run directory (LATEST) and the members hold instead,
/// never from step 0, and wrote the state again.
struct etcd_state_lost {
  static constexpr std::string_view name = "etcd_state_lost";
  std::string reason;
  int64_t checkpoint_step = -1;  ///< the newest committed checkpoint (LATEST); -1 = none
  int64_t epoch = 0;             ///< this coordinator's leadership epoch
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("reason", e.reason);
    f("checkpoint_step", e.checkpoint_step);
    f("epoch", e.epoch);
  }
  friend bool operator==(const etcd_state_lost&, const etcd_state_lost&) = default;
};

/// A worker was admitted ("rank_joined"); "rank" repeats the member id, as it always has.
struct rank_joined {
  static constexpr std::string_view name = "rank_joined";
  int32_t member = -1;
  int32_t rank = -1;
  int32_t pid = 0;
  std::string host;
  int32_t node = 0;
  uint64_t generation = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("member", e.member);
    f("rank", e.rank);
    f("pid", e.pid);
    f("host", e.host);
    f("node", e.node);
    f("generation", e.generation);
  }
  friend bool operator==(const rank_joined&, const rank_joined&) = default;
};

/// A member could not connect its generation's groups ("connect_failed").
struct connect_failed {
  static constexpr std::string_view name = "connect_failed";
  uint64_t generation = 0;
  int32_t member = -1;
  int32_t rank = -1;
  std::string cause;    ///< the class of comm::connect_error::cause()
  std::string address;  ///< the rest of it
  std::string error;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("generation", e.generation);
    f("member", e.member);
    f("rank", e.rank);
    f("cause", e.cause);
    f("address", e.address);
    f("error", e.error);
  }
  friend bool operator==(const connect_failed&, const connect_failed&) = default;
};

/// A rank was found slow ("straggler"), once per generation.
struct straggler {
  static constexpr std::string_view name = "straggler";
  int rank = -1;
  int32_t member = -1;
  double factor = 0;
  uint64_t generation = 0;
  int64_t step = 0;
  std::string policy;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("rank", e.rank);
    f("member", e.member);
    f("factor", e.factor);
    f("generation", e.generation);
    f("step", e.step);
    f("policy", e.policy);
  }
  friend bool operator==(const straggler&, const straggler&) = default;
};

/// A generation waits for restarted workers before it forms ("replacement_wait").
struct replacement_wait {
  static constexpr std::string_view name = "replacement_wait";
  uint64_t generation = 0;
  int workers = 0;
  int64_t wait_ms = 0;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("generation", e.generation);
    f("workers", e.workers);
    f("wait_ms", e.wait_ms);
  }
  friend bool operator==(const replacement_wait&, const replacement_wait&) = default;
};

/// An injected fault fired, or a stopped process was continued ("fault"). A continue names
/// only "what" and "pids"; the other fields are chaos::to_json's of the fault.
struct fault {
  static constexpr std::string_view name = "fault";
  std::string what;  ///< kill, stop, slow, diverge, or continue
  std::optional<std::string> target;
  std::optional<int> id;
  std::optional<int64_t> step;
  std::optional<int64_t> for_ms;
  std::optional<double> factor;
  std::optional<int> commits;  ///< kill:coordinator mid-commit: the commits it sent first
  std::optional<std::string> spec;
  std::vector<int32_t> pids;
  template <class S, class F>
  static void fields(S& e, F&& f) {
    f("what", e.what);
    f("target", e.target);
    f("id", e.id);
    f("step", e.step);
    f("for_ms", e.for_ms);
    f("factor", e.factor);
    f("commits", e.commits);
    f("spec", e.spec);
    f("pids", e.pids);
  }
  friend bool operator==(const fault&, const fault&) = default;
};

}  // namespace troupe::events
