#pragma once
// Bugs the fuzz targets found in checkpoint/ that are reported but not fixed yet. Each has a
// reproducer in fuzz/findings/ (see fuzz/findings/README.md). By default the targets step
// around exactly these inputs, so that fuzzing goes on looking for new bugs and the ctest
// smoke run stays green; TROUPE_FUZZ_STRICT=1 turns that off, e.g. to check a fix:
//
//   TROUPE_FUZZ_STRICT=1 build-fuzz/manifest_fuzz fuzz/findings/manifest-*
//
// Once a bug is fixed, delete its predicate here and its use in the target.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

namespace troupe::fuzz {

/// TROUPE_FUZZ_STRICT=1 in the environment: every known finding fails again.
inline bool strict() {
  static const bool value = [] {
    const char* v = std::getenv("TROUPE_FUZZ_STRICT");
    return v != nullptr && *v != '\0' && std::string_view(v) != "0";
  }();
  return value;
}

/// An upper bound on the nesting depth of JSON text (brackets inside strings count too).
inline size_t naive_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  for (const char c : text) {
    if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Finding manifest-deep-nesting: from_json seals the parsed document with a recursive
/// dump(), so a manifest nested some thousands deep (10000 under ASan, about a million in a
/// release build) overflows the stack. Inputs that might nest that deep are skipped.
inline bool deep_nesting(std::string_view text) { return naive_depth(text) > 1000; }

/// Finding manifest-number-overflow: from_json catches only parse_error, so a number too
/// large for a double (1e400) escapes as nlohmann::json::out_of_range (406).
inline bool number_overflow(const nlohmann::json::exception& e) { return e.id == 406; }

/// Finding manifest-tensor-shape-overflow: as_matrix multiplies the trailing dimensions of
/// a tensor in int64_t; a format 2 tensor whose numel fits global_numel (up to 2^64 - 1) can
/// still overflow it (signed overflow in validate_v2). True for a document holding such a
/// tensor.
template <class Json>
bool tensor_shape_overflow(const Json& doc) {
  if (!doc.is_object()) return false;
  const auto tensors = doc.find("tensors");
  if (tensors == doc.end() || !tensors->is_array()) return false;
  for (const auto& t : *tensors) {
    if (!t.is_object()) continue;
    const auto shape = t.find("shape");
    if (shape == t.end() || !shape->is_array()) continue;
    long double cols = 1;  // the product of the trailing dimensions
    for (size_t i = 1; i < shape->size(); ++i) {
      const auto& d = (*shape)[i];
      if (d.is_number()) cols *= std::fabs(d.template get<long double>());
      if (cols > 9.2e18L) return true;  // an intermediate product overflows as well
    }
  }
  return false;
}

/// Finding manifest-chunk-count-wrap: validate_v2 computes a piece's chunk count as
/// (numel + chunk_floats - 1) / chunk_floats in size_t, which wraps for a chunk_floats near
/// 2^64 and accepts a piece that lists no chunks (restore_into then reads p.chunks[0]).
inline bool chunk_count_wrap(size_t numel, size_t chunk_floats) {
  return numel > 0 && chunk_floats > SIZE_MAX - (numel - 1);
}

/// Finding pieces-float-cast-overflow: decode_pieces reads its integers with get<int>() /
/// get<int64_t>(), which converts a JSON float out of their range with undefined behaviour.
/// True when the text holds a number with a fraction or exponent of magnitude >= 2^31.
inline bool float_out_of_int_range(std::string_view text) {
  bool found = false;
  const nlohmann::json::parser_callback_t look = [&found](int, nlohmann::json::parse_event_t event,
                                                          nlohmann::json& value) {
    if (event == nlohmann::json::parse_event_t::value && value.is_number_float() &&
        !(std::fabs(value.get<double>()) < 2147483648.0)) {
      found = true;
    }
    return true;
  };
  (void)nlohmann::json::parse(text.begin(), text.end(), look, /*allow_exceptions=*/false);
  return found;
}

}  // namespace troupe::fuzz
