// events: the writer and the reader both walk each struct's fields(), so they cannot disagree
// on a name; this file knows nothing of any particular kind but job_ended's two names.
#include "monitoring/events/events.hpp"

#include <type_traits>
#include <utility>

namespace troupe::events {
namespace {

using nlohmann::json;

using detail::is_nullable;
using detail::is_optional;

template <class T>
constexpr bool is_typed = !std::is_same_v<T, untyped>;

// Whether `what` names kind T; job_ended answers to both of its names.
template <class T>
bool named(const std::string& what) {
  if constexpr (requires { T::failed_name; })
    if (what == T::failed_name) return true;
  return what == T::name;
}

}  // namespace

std::string kind(const job_event& e) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (!is_typed<T>)
          return x.object.is_object() ? x.object.value("event", std::string()) : std::string();
        else if constexpr (requires { x.event_name(); })
          return std::string(x.event_name());
        else
          return std::string(T::name);
      },
      e);
}

json to_json(const job_event& e) {
  if (const auto* u = std::get_if<untyped>(&e)) return u->object;
  json j = {{"event", kind(e)}};
  std::visit(
      [&j](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (is_typed<T>)
          T::fields(x, [&j](const char* name, const auto& member) {
            using M = std::decay_t<decltype(member)>;
            if constexpr (is_optional<M>::value) {
              if (member) j[name] = *member;
            } else if constexpr (is_nullable<M>::value) {
              j[name] = member.value ? json(*member.value) : json(nullptr);
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
  job_event out = untyped{j};
  // Each typed alternative in turn; the one the name matches reads the object.
  auto try_kind = [&]<class T>() {
    if constexpr (is_typed<T>)
      if (named<T>(what)) out = read_fields<T>(j);
  };
  [&]<size_t... I>(std::index_sequence<I...>) {
    (try_kind.template operator()<std::variant_alternative_t<I, job_event>>(), ...);
  }
  (std::make_index_sequence<std::variant_size_v<job_event>>{});
  return out;
}

}  // namespace troupe::events
