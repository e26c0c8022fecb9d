#pragma once
// What an event's field can be beyond a plain value (monitoring/events/events.hpp).

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

namespace troupe::events {

/// A field that events.jsonl holds as null when there is no value (std::optional fields are
/// left out instead): readers test it with `is None`, not with `in`.
template <class T>
struct nullable {
  std::optional<T> value;
  friend bool operator==(const nullable&, const nullable&) = default;
};

/// A figure over the ranks of a summary event, held as {"min", "median", "max"}; the median of
/// an even count is the lower of the two middle values, so a whole figure stays whole.
template <class T>
struct spread {
  T min{};
  T median{};
  T max{};
  friend bool operator==(const spread&, const spread&) = default;
};

/// The spread of `values` (none: all zero).
template <class T>
spread<T> spread_of(std::vector<T> values) {
  if (values.empty()) return {};
  const auto middle = values.begin() + static_cast<std::ptrdiff_t>((values.size() - 1) / 2);
  std::nth_element(values.begin(), middle, values.end());
  const T median = *middle;
  const auto [min, max] = std::minmax_element(values.begin(), values.end());
  return {*min, median, *max};
}

template <class T>
void to_json(nlohmann::json& j, const spread<T>& s) {
  j = {{"min", s.min}, {"median", s.median}, {"max", s.max}};
}

// Every part must be there: a summary written by another spelling is not read as zeros.
template <class T>
void from_json(const nlohmann::json& j, spread<T>& s) {
  j.at("min").get_to(s.min);
  j.at("median").get_to(s.median);
  j.at("max").get_to(s.max);
}

}  // namespace troupe::events
