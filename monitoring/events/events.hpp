#pragma once
// The job's events as types: one struct per kind, each naming its "event" string and its fields
// once, next to the members. The serialiser and the parser walk that one list, so the metrics,
// the console and the progress line read fields by name in C++ and a renamed field fails to
// compile (or fails events_test) instead of exporting 0.
//
// Every struct has:
//   static constexpr std::string_view name;   its "event" string
//   template <class S, class F> static void fields(S& e, F&& f);
//       calls f("json_name", e.member) for every field, in events.jsonl order.
// A std::optional member is left out of the object when empty; a nullable one is written as
// null.

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "monitoring/events/event_field.hpp"
#include "monitoring/events/event_kinds_checkpoint.hpp"
#include "monitoring/events/event_kinds_members.hpp"
#include "monitoring/events/event_kinds_training.hpp"

namespace troupe::events {

/// A kind this build has no struct for, read back from a file (a newer troupe's log): kept as
/// its object, "event" included. Nothing this build emits is untyped.
struct untyped {
  nlohmann::json object;
  friend bool operator==(const untyped&, const untyped&) = default;
};

/// One event of a job.
using job_event =
    std::variant<state, step, generation, transport, rank_lost, stale_message, checkpoint,
                 checkpoint_failed, checkpoint_abandoned, checkpoint_gc, checkpoint_gc_failed,
                 diverged, validation, job_ended, checkpoint_skipped, interrupted, preempted,
                 worker_exited, agent_lost, agent_joined, rank_joined, connect_failed, restored,
                 training_started, straggler, memory, replacement_wait, fault, expert_load,
                 expert_load_rejected, job_start, checkpoint_fallback, resume, leader, goodput,
                 etcd_state_lost, memory_summary, restored_summary, untyped>;

/// The "event" string of `e` ("" for an untyped object without one).
[[nodiscard]] std::string kind(const job_event& e);

/// `e` as its events.jsonl object, without "ts" and "unix_ms" (monitoring::event_log adds them).
[[nodiscard]] nlohmann::json to_json(const job_event& e);

/// The event that `object` (one events.jsonl object, or to_json's) holds: an untyped one for
/// a kind with no struct. Throws nlohmann::json::exception when a typed kind lacks a field or
/// holds one of the wrong type.
[[nodiscard]] job_event from_json(const nlohmann::json& object);

namespace detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_nullable : std::false_type {};
template <class T>
struct is_nullable<nullable<T>> : std::true_type {};
}  // namespace detail

/// The fields of a T read from `object` ("event" is not looked at): for a kind whose fields
/// another module spells (chaos::to_json for a fault). An optional field may be absent (or
/// null), a nullable one null; every other one must be there, so a renamed field throws
/// nlohmann::json::exception instead of reading as 0.
template <class T>
[[nodiscard]] T read_fields(const nlohmann::json& object) {
  T e;
  T::fields(e, [&object](const char* name, auto& member) {
    using M = std::remove_reference_t<decltype(member)>;
    if constexpr (detail::is_optional<M>::value) {
      if (auto it = object.find(name); it != object.end() && !it->is_null())
        member = it->template get<typename M::value_type>();
    } else if constexpr (detail::is_nullable<M>::value) {
      const nlohmann::json& v = object.at(name);
      if (!v.is_null()) member.value = v.template get<typename decltype(M::value)::value_type>();
    } else {
      object.at(name).get_to(member);
    }
  });
  return e;
}

/// Visits with a set of lambdas: std::visit(overloaded{[](const step&) {...}, ...}, e).
template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

}  // namespace troupe::events
