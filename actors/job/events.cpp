// events: each kind's fields named once (fields()), walked by both the writer and the reader.
#include "actors/job/events.hpp"

#include <type_traits>

namespace troupe::actors::events {
namespace {

using nlohmann::json;

// Each struct's "event" string and its fields in events.jsonl order. `f(name, member)` is
// called for every field, so to_json and from_json cannot disagree on a name.
template <class S, class F>
void fields(S& e, F&& f) {
  using T = std::remove_const_t<S>;
  if constexpr (std::is_same_v<T, state>) {
    f("from", e.from), f("to", e.to), f("value", e.value), f("generation", e.generation);
    f("step", e.step), f("reason", e.reason);
  } else if constexpr (std::is_same_v<T, step>) {
    f("step", e.step), f("loss", e.loss), f("lr", e.lr), f("tokens", e.tokens);
    f("tokens_per_s", e.tokens_per_s), f("world", e.world), f("generation", e.generation);
    f("step_s", e.step_s), f("compute_s", e.compute_s), f("comm_s", e.comm_s);
    f("control_s", e.control_s), f("peer_wait_s", e.peer_wait_s);
    f("total_steps", e.total_steps);
  } else if constexpr (std::is_same_v<T, generation>) {
    f("number", e.number), f("world", e.world), f("spares", e.spares), f("plan", e.plan);
    f("reason", e.reason), f("cause", e.cause), f("start_step", e.start_step);
    f("planned_with_abort", e.planned_with_abort), f("shrunk", e.shrunk);
    f("recovery_s", e.recovery_s);
  } else if constexpr (std::is_same_v<T, rank_lost>) {
    f("rank", e.rank), f("member", e.member), f("node", e.node), f("pid", e.pid);
    f("cause", e.cause), f("reason", e.reason), f("step", e.step);
    f("generation", e.generation);
  } else if constexpr (std::is_same_v<T, stale_message>) {
    f("message", e.message), f("member", e.member);
    f("message_generation", e.message_generation), f("generation", e.generation);
  } else if constexpr (std::is_same_v<T, checkpoint>) {
    f("step", e.step), f("path", e.path), f("generation", e.generation);
    f("bytes_written", e.bytes_written), f("bytes_deduplicated", e.bytes_deduplicated);
    f("stall_s", e.stall_s), f("write_s", e.write_s);
    f("snapshot_buffer_bytes", e.snapshot_buffer_bytes);
    f("replicated_bytes", e.replicated_bytes), f("replaces", e.replaces);
  } else if constexpr (std::is_same_v<T, checkpoint_failed>) {
    f("step", e.step), f("ranks_failed", e.ranks_failed), f("error", e.error);
  } else if constexpr (std::is_same_v<T, checkpoint_abandoned>) {
    f("step", e.step), f("generation", e.generation), f("ranks_reported", e.ranks_reported);
    f("world", e.world), f("reason", e.reason), f("retake_from", e.retake_from);
    f("then", e.then);
  } else if constexpr (std::is_same_v<T, checkpoint_gc_failed>) {
    f("error", e.error);
  } else if constexpr (std::is_same_v<T, diverged>) {
    f("step", e.step), f("generation", e.generation), f("what", e.what);
    f("policy", e.policy), f("action", e.action), f("rollbacks", e.rollbacks);
    f("max_rollbacks", e.max_rollbacks), f("committed_step", e.committed_step);
    f("skipped_steps", e.skipped_steps);
  } else if constexpr (std::is_same_v<T, validation>) {
    f("step", e.step), f("val_loss", e.val_loss), f("generation", e.generation);
  } else if constexpr (std::is_same_v<T, checkpoint_skipped>) {
    f("step", e.step), f("reason", e.reason);
  } else if constexpr (std::is_same_v<T, interrupted>) {
    f("step", e.step), f("generation", e.generation);
  } else if constexpr (std::is_same_v<T, preempted>) {
    f("step", e.step), f("generation", e.generation), f("state", e.state);
  } else if constexpr (std::is_same_v<T, worker_exited>) {
    f("member", e.member), f("pid", e.pid), f("exit_code", e.exit_code), f("signal", e.signal);
  } else if constexpr (std::is_same_v<T, agent_lost>) {
    f("reason", e.reason);
  } else if constexpr (std::is_same_v<T, job_ended>) {
    f("exit_code", e.exit_code), f("message", e.message), f("step", e.step);
    f("generation", e.generation);
  }
}

template <class T>
constexpr const char* name_of() {
  if constexpr (std::is_same_v<T, state>) return "state";
  if constexpr (std::is_same_v<T, step>) return "step";
  if constexpr (std::is_same_v<T, generation>) return "generation";
  if constexpr (std::is_same_v<T, rank_lost>) return "rank_lost";
  if constexpr (std::is_same_v<T, stale_message>) return "stale_message";
  if constexpr (std::is_same_v<T, checkpoint>) return "checkpoint";
  if constexpr (std::is_same_v<T, checkpoint_failed>) return "checkpoint_failed";
  if constexpr (std::is_same_v<T, checkpoint_abandoned>) return "checkpoint_abandoned";
  if constexpr (std::is_same_v<T, checkpoint_gc_failed>) return "checkpoint_gc_failed";
  if constexpr (std::is_same_v<T, diverged>) return "diverged";
  if constexpr (std::is_same_v<T, validation>) return "validation";
  if constexpr (std::is_same_v<T, checkpoint_skipped>) return "checkpoint_skipped";
  if constexpr (std::is_same_v<T, interrupted>) return "interrupted";
  if constexpr (std::is_same_v<T, preempted>) return "preempted";
  if constexpr (std::is_same_v<T, worker_exited>) return "worker_exited";
  if constexpr (std::is_same_v<T, agent_lost>) return "agent_lost";
  return "";
}

template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

// Reads every field of a T from `j` (optional fields may be absent).
template <class T>
T read(const json& j) {
  T e;
  fields(e, [&j](const char* name, auto& member) {
    using M = std::remove_reference_t<decltype(member)>;
    if constexpr (is_optional<M>::value) {
      if (auto it = j.find(name); it != j.end() && !it->is_null())
        member = it->template get<typename M::value_type>();
    } else {
      j.at(name).get_to(member);
    }
  });
  return e;
}

}  // namespace

std::string kind(const job_event& e) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, job_ended>)
          return x.exit_code == 0 ? "job_done" : "job_failed";
        else if constexpr (std::is_same_v<T, untyped>)
          return x.fields.is_object() ? x.fields.value("event", std::string()) : std::string();
        else
          return name_of<T>();
      },
      e);
}

json to_json(const job_event& e) {
  if (const auto* u = std::get_if<untyped>(&e)) return u->fields;
  json j = {{"event", kind(e)}};
  std::visit(
      [&j](const auto& x) {
        fields(x, [&j](const char* name, const auto& member) {
          using M = std::decay_t<decltype(member)>;
          if constexpr (is_optional<M>::value) {
            if (member) j[name] = *member;
          } else {
            j[name] = member;
          }
        });
      },
      e);
  return j;
}

job_event from_json(const json& j) {
  const std::string what = j.is_object() ? j.value("event", std::string()) : std::string();
  if (what == "job_done" || what == "job_failed") return read<job_ended>(j);
  job_event out = untyped{j};
  // Tries each typed alternative in turn; the one whose name matches reads the object.
  auto try_kind = [&]<class T>() {
    if constexpr (!std::is_same_v<T, job_ended> && !std::is_same_v<T, untyped>)
      if (what == name_of<T>()) out = read<T>(j);
  };
  [&]<size_t... I>(std::index_sequence<I...>) {
    (try_kind.template operator()<std::variant_alternative_t<I, job_event>>(), ...);
  }
  (std::make_index_sequence<std::variant_size_v<job_event>>{});
  return out;
}

}  // namespace troupe::actors::events
