#pragma once
// What an event's field can be beyond a plain value (monitoring/events/events.hpp).

#include <optional>

namespace troupe::events {

/// A field that events.jsonl holds as null when there is no value (std::optional fields are
/// left out instead): readers test it with `is None`, not with `in`.
template <class T>
struct nullable {
  std::optional<T> value;
  friend bool operator==(const nullable&, const nullable&) = default;
};

}  // namespace troupe::events
