#include "monitoring/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>
#include <type_traits>

namespace troupe::monitoring {

namespace {

bool is_name_start(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}

bool is_name_char(char c, bool allow_colon) {
  return is_name_start(c, allow_colon) || (c >= '0' && c <= '9');
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

template <class Metric>
constexpr const char* kind_name() {
  if constexpr (std::is_same_v<Metric, counter>) {
    return "counter";
  } else if constexpr (std::is_same_v<Metric, gauge>) {
    return "gauge";
  } else {
    return "histogram";
  }
}

// The sample names a family writes; two families must not share any, or a scrape would mix
// their series.
std::vector<std::string> series_names(const std::string& name, bool is_histogram) {
  if (!is_histogram) return {name};
  return {name + "_bucket", name + "_sum", name + "_count"};
}

void validate_metric_name(const std::string& name) {
  if (!is_valid_metric_name(name)) {
    throw metrics_error("metric name '" + name +
                        "' is invalid: it must match [a-zA-Z_:][a-zA-Z0-9_:]* and must not "
                        "start with \"__\" (reserved by Prometheus)");
  }
}

void validate_label_name(const std::string& metric, const std::string& label) {
  if (!is_valid_label_name(label)) {
    throw metrics_error("label name '" + label + "' on metric '" + metric +
                        "' is invalid: it must match [a-zA-Z_][a-zA-Z0-9_]* and must not start "
                        "with \"__\" (reserved by Prometheus)");
  }
}

// Sorts by name and rejects bad or repeated names; `reserved` names (le for histograms, the
// constant labels for variable ones) may not appear.
label_set normalise_labels(const std::string& metric, label_set labels,
                           const label_set& reserved_labels, bool is_histogram) {
  std::sort(labels.begin(), labels.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const std::string& label = labels[i].first;
    validate_label_name(metric, label);
    if (i > 0 && labels[i - 1].first == label) {
      throw metrics_error("label '" + label + "' appears twice on metric '" + metric + "'");
    }
    if (is_histogram && label == "le") {
      throw metrics_error("label 'le' on histogram '" + metric + "' is reserved for bucket bounds");
    }
    for (const auto& [reserved, value] : reserved_labels) {
      if (reserved == label) {
        throw metrics_error("label '" + label + "' on metric '" + metric +
                            "' repeats one of the family's constant labels");
      }
    }
  }
  return labels;
}

void validate_buckets(const std::string& metric, const std::vector<double>& upper_bounds) {
  if (upper_bounds.empty()) {
    throw metrics_error("histogram '" + metric + "' needs at least one finite bucket bound");
  }
  for (std::size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      throw metrics_error("histogram '" + metric +
                          "' has a non-finite bucket bound; +Inf is added automatically");
    }
    if (i > 0 && !(upper_bounds[i - 1] < upper_bounds[i])) {
      throw metrics_error("histogram '" + metric + "' bucket bounds must be strictly ascending");
    }
  }
}

void append_escaped_help(std::string& out, std::string_view help) {
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
}

void append_label(std::string& out, bool& first, std::string_view name, std::string_view value) {
  out += first ? '{' : ',';
  first = false;
  out += name;
  out += "=\"";
  out += escape_label_value(value);
  out += '"';
}

// One sample line: name{const...,variable...[,le="..."]} value
void append_sample(std::string& out, std::string_view name, const label_set& const_labels,
                   const label_set& labels, const std::string* le, double value) {
  out += name;
  bool first = true;
  for (const auto& [k, v] : const_labels) append_label(out, first, k, v);
  for (const auto& [k, v] : labels) append_label(out, first, k, v);
  if (le != nullptr) append_label(out, first, "le", *le);
  if (!first) out += '}';
  out += ' ';
  out += format_sample_value(value);
  out += '\n';
}

void render_one(std::string& out, const std::string& name, const label_set& const_labels,
                const label_set& labels, const counter& c) {
  append_sample(out, name, const_labels, labels, nullptr, c.value());
}

void render_one(std::string& out, const std::string& name, const label_set& const_labels,
                const label_set& labels, const gauge& g) {
  append_sample(out, name, const_labels, labels, nullptr, g.value());
}

void render_one(std::string& out, const std::string& name, const label_set& const_labels,
                const label_set& labels, const histogram& h) {
  const histogram::snapshot snap = h.take_snapshot();
  const std::string bucket_name = name + "_bucket";
  for (std::size_t i = 0; i < snap.cumulative.size(); ++i) {
    const std::string le =
        i < snap.upper_bounds.size() ? format_sample_value(snap.upper_bounds[i]) : "+Inf";
    append_sample(out, bucket_name, const_labels, labels, &le,
                  static_cast<double>(snap.cumulative[i]));
  }
  append_sample(out, name + "_sum", const_labels, labels, nullptr, snap.sum);
  append_sample(out, name + "_count", const_labels, labels, nullptr,
                static_cast<double>(snap.count));
}

}  // namespace

// ---- free helpers ----

bool is_valid_metric_name(std::string_view name) {
  if (name.empty() || !is_name_start(name[0], true)) return false;
  if (name.substr(0, 2) == "__") return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return is_name_char(c, true); });
}

bool is_valid_label_name(std::string_view name) {
  if (name.empty() || !is_name_start(name[0], false)) return false;
  if (name.substr(0, 2) == "__") return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return is_name_char(c, false); });
}

std::string format_sample_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Whole numbers (every counter, most gauges) print without an exponent while they are
  // exactly representable, which keeps the text readable and comparable in tests.
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<long long>(v));
  }
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, result.ptr);
}

std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::vector<double> linear_buckets(double start, double width, int count) {
  if (count < 1 || !(width > 0) || !std::isfinite(start) || !std::isfinite(width)) {
    throw metrics_error("linear_buckets needs count >= 1, a finite start and a positive width");
  }
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) out.push_back(start + width * i);
  return out;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  if (count < 1 || !(start > 0) || !(factor > 1) || !std::isfinite(start) ||
      !std::isfinite(factor)) {
    throw metrics_error("exponential_buckets needs count >= 1, start > 0 and factor > 1");
  }
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(count));
  double bound = start;
  for (int i = 0; i < count; ++i, bound *= factor) out.push_back(bound);
  return out;
}

std::vector<double> default_buckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

// ---- metrics ----

void counter::inc(double amount) {
  if (!(amount >= 0)) {
    throw metrics_error("a counter can only go up; use a gauge for values that decrease");
  }
  value_.fetch_add(amount, std::memory_order_relaxed);
}

histogram::histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void histogram::observe(double v) {
  // le means "less than or equal", so v lands in the first bucket whose bound is >= v. NaN
  // goes to +Inf, as in the Go client; lower_bound alone would put it in the first bucket.
  std::size_t bucket = upper_bounds_.size();
  if (!std::isnan(v)) {
    const auto it = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v);
    bucket = static_cast<std::size_t>(it - upper_bounds_.begin());
  }
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += v;
  ++count_;
}

histogram::snapshot histogram::take_snapshot() const {
  snapshot snap;
  snap.upper_bounds = upper_bounds_;
  snap.cumulative.resize(counts_.size());
  std::lock_guard lock(mutex_);
  std::uint64_t running = 0;
  for (std::size_t i = 0; i < counts_.size(); ++i) {
    running += counts_[i];
    snap.cumulative[i] = running;
  }
  snap.sum = sum_;
  snap.count = count_;
  return snap;
}

// ---- families ----

namespace detail {
family_base::family_base(std::string name, std::string help, label_set const_labels)
    : name_(std::move(name)), help_(std::move(help)), const_labels_(std::move(const_labels)) {}
}  // namespace detail

template <class Metric>
family<Metric>::family(std::string name, std::string help, label_set const_labels,
                       std::vector<double> upper_bounds)
    : detail::family_base(std::move(name), std::move(help), std::move(const_labels)),
      upper_bounds_(std::move(upper_bounds)) {}

template <class Metric>
Metric& family<Metric>::with(const label_set& labels) {
  label_set key = normalise_labels(name_, labels, const_labels_, std::is_same_v<Metric, histogram>);
  std::lock_guard lock(mutex_);
  auto it = children_.find(key);
  if (it == children_.end()) {
    std::unique_ptr<Metric> metric;
    if constexpr (std::is_same_v<Metric, histogram>) {
      metric = std::make_unique<histogram>(upper_bounds_);
    } else {
      metric = std::make_unique<Metric>();
    }
    it = children_.emplace(std::move(key), std::move(metric)).first;
  }
  return *it->second;
}

template <class Metric>
void family<Metric>::retain_only(const std::vector<label_set>& keep) {
  std::set<label_set> kept;
  for (const label_set& labels : keep)
    kept.insert(normalise_labels(name_, labels, const_labels_, std::is_same_v<Metric, histogram>));
  std::lock_guard lock(mutex_);
  std::erase_if(children_, [&](const auto& child) { return !kept.contains(child.first); });
}

template <class Metric>
void family<Metric>::render(std::string& out) const {
  out += "# HELP ";
  out += name_;
  out += ' ';
  append_escaped_help(out, help_);
  out += "\n# TYPE ";
  out += name_;
  out += ' ';
  out += kind_name<Metric>();
  out += '\n';
  std::lock_guard lock(mutex_);
  for (const auto& [labels, metric] : children_) {
    render_one(out, name_, const_labels_, labels, *metric);
  }
}

template class family<counter>;
template class family<gauge>;
template class family<histogram>;

// ---- registry ----

template <class Metric>
family<Metric>& metrics_registry::add_family(const std::string& name, const std::string& help,
                                             std::vector<double> upper_bounds,
                                             const label_set& const_labels) {
  constexpr bool is_histogram = std::is_same_v<Metric, histogram>;
  validate_metric_name(name);
  if (help.empty()) {
    throw metrics_error("metric '" + name + "' needs help text (promtool rejects metrics without)");
  }
  if constexpr (std::is_same_v<Metric, counter>) {
    if (!ends_with(name, "_total")) {
      throw metrics_error("counter '" + name +
                          "' must end in \"_total\" (Prometheus convention, "
                          "checked by promtool); e.g. '" +
                          name + "_total'");
    }
  } else {
    if (ends_with(name, "_total")) {
      throw metrics_error(std::string(kind_name<Metric>()) + " '" + name +
                          "' must not end in \"_total\": that suffix marks counters");
    }
  }
  if constexpr (is_histogram) validate_buckets(name, upper_bounds);
  label_set normal_const = normalise_labels(name, const_labels, {}, is_histogram);

  std::lock_guard lock(mutex_);
  if (auto it = families_.find(name); it != families_.end()) {
    auto* existing = dynamic_cast<family<Metric>*>(it->second.get());
    if (existing == nullptr) {
      throw metrics_error("metric '" + name + "' is already registered as another kind than " +
                          kind_name<Metric>());
    }
    if (existing->const_labels() != normal_const || existing->upper_bounds() != upper_bounds) {
      throw metrics_error("metric '" + name +
                          "' is already registered with other constant labels or buckets");
    }
    return *existing;
  }
  const std::vector<std::string> mine = series_names(name, is_histogram);
  for (const auto& [other_name, other] : families_) {
    const bool other_is_histogram = dynamic_cast<const histogram_family*>(other.get()) != nullptr;
    for (const std::string& theirs : series_names(other_name, other_is_histogram)) {
      if (std::find(mine.begin(), mine.end(), theirs) != mine.end()) {
        throw metrics_error("metric '" + name + "' would write series '" + theirs +
                            "', which metric '" + other_name + "' already writes");
      }
    }
  }
  auto fam = std::make_unique<family<Metric>>(name, help, std::move(normal_const),
                                              std::move(upper_bounds));
  family<Metric>& ref = *fam;
  families_.emplace(name, std::move(fam));
  return ref;
}

counter_family& metrics_registry::add_counter_family(const std::string& name,
                                                     const std::string& help,
                                                     const label_set& const_labels) {
  return add_family<counter>(name, help, {}, const_labels);
}

gauge_family& metrics_registry::add_gauge_family(const std::string& name, const std::string& help,
                                                 const label_set& const_labels) {
  return add_family<gauge>(name, help, {}, const_labels);
}

histogram_family& metrics_registry::add_histogram_family(const std::string& name,
                                                         const std::string& help,
                                                         std::vector<double> upper_bounds,
                                                         const label_set& const_labels) {
  return add_family<histogram>(name, help, std::move(upper_bounds), const_labels);
}

counter& metrics_registry::add_counter(const std::string& name, const std::string& help,
                                       const label_set& const_labels) {
  return add_counter_family(name, help, const_labels).with({});
}

gauge& metrics_registry::add_gauge(const std::string& name, const std::string& help,
                                   const label_set& const_labels) {
  return add_gauge_family(name, help, const_labels).with({});
}

histogram& metrics_registry::add_histogram(const std::string& name, const std::string& help,
                                           std::vector<double> upper_bounds,
                                           const label_set& const_labels) {
  return add_histogram_family(name, help, std::move(upper_bounds), const_labels).with({});
}

std::string metrics_registry::render_prometheus() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [name, fam] : families_) fam->render(out);
  return out;
}

}  // namespace troupe::monitoring
