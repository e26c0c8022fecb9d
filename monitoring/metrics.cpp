#include "monitoring/metrics.hpp"

#include <prometheus/check_names.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>
#include <type_traits>

namespace troupe::monitoring {

namespace {

// prometheus::TextSerializer writes doubles with this many significant digits (1.0.1:
// max_digits10 - 1), le labels included.
constexpr int exposition_digits = std::numeric_limits<double>::max_digits10 - 1;

// An error message from its parts: thrown from loops, where a chain of + allocates once per
// part (clang-tidy's performance-inefficient-string-concatenation).
std::string joined(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view part : parts) out += part;
  return out;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

template <class Metric>
constexpr detail::metric_kind kind_of() {
  if constexpr (std::is_same_v<Metric, counter>) {
    return detail::metric_kind::counter;
  } else if constexpr (std::is_same_v<Metric, gauge>) {
    return detail::metric_kind::gauge;
  } else {
    return detail::metric_kind::histogram;
  }
}

const char* kind_name(detail::metric_kind kind) {
  switch (kind) {
    case detail::metric_kind::counter:
      return "counter";
    case detail::metric_kind::gauge:
      return "gauge";
    case detail::metric_kind::histogram:
      return "histogram";
  }
  return "metric";
}

prometheus::MetricType type_of(detail::metric_kind kind) {
  switch (kind) {
    case detail::metric_kind::counter:
      return prometheus::MetricType::Counter;
    case detail::metric_kind::gauge:
      return prometheus::MetricType::Gauge;
    case detail::metric_kind::histogram:
      return prometheus::MetricType::Histogram;
  }
  return prometheus::MetricType::Untyped;
}

// The sample names a family writes; two families must not share any, or a scrape would mix
// their series. prometheus-cpp only keeps family names apart.
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
// constant labels for variable ones) may not appear. Checked here, before prometheus-cpp sees
// the labels: it would take a repeated name as the last value given, and its own checks
// throw a bare std::invalid_argument that names neither the metric nor the label.
label_set normalise_labels(const std::string& metric, label_set labels,
                           const label_set& reserved_labels, bool is_histogram) {
  std::sort(labels.begin(), labels.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const std::string& label = labels[i].first;
    validate_label_name(metric, label);
    if (i > 0 && labels[i - 1].first == label) {
      throw metrics_error(joined({"label '", label, "' appears twice on metric '", metric, "'"}));
    }
    if (is_histogram && label == "le") {
      throw metrics_error("label 'le' on histogram '" + metric + "' is reserved for bucket bounds");
    }
    for (const auto& [reserved, value] : reserved_labels) {
      if (reserved == label) {
        throw metrics_error(joined({"label '", label, "' on metric '", metric,
                                    "' repeats one of the family's constant labels"}));
      }
    }
  }
  return labels;
}

prometheus::Labels to_backend_labels(const label_set& labels) {
  return prometheus::Labels(labels.begin(), labels.end());
}

// A bound as it reads back from the le label the serializer writes for it.
double as_exposed(double bound) {
  char buf[64];
  const auto written =
      std::to_chars(buf, buf + sizeof buf, bound, std::chars_format::general, exposition_digits);
  double read = bound;
  std::from_chars(buf, written.ptr, read);
  return read;
}

// Finite and strictly ascending once written out: two bounds that only differ past the 16th
// digit would give two buckets with the same le label, which Prometheus refuses as a
// duplicate series (the whole scrape fails).
std::vector<double> exposed_buckets(const std::string& metric, std::vector<double> upper_bounds) {
  if (upper_bounds.empty()) {
    throw metrics_error("histogram '" + metric + "' needs at least one finite bucket bound");
  }
  for (std::size_t i = 0; i < upper_bounds.size(); ++i) {
    if (!std::isfinite(upper_bounds[i])) {
      throw metrics_error("histogram '" + metric +
                          "' has a non-finite bucket bound; +Inf is added automatically");
    }
    upper_bounds[i] = as_exposed(upper_bounds[i]);
    if (i > 0 && !(upper_bounds[i - 1] < upper_bounds[i])) {
      throw metrics_error("histogram '" + metric +
                          "' bucket bounds must be strictly ascending, also when written with " +
                          std::to_string(exposition_digits) + " significant digits");
    }
  }
  return upper_bounds;
}

// The backend family, under the same name, help and constant labels.
template <class Metric>
typename family<Metric>::backend_type& register_backend(prometheus::Registry& registry,
                                                        const std::string& name,
                                                        const std::string& help,
                                                        const label_set& const_labels) {
  auto build = [&](auto builder) -> typename family<Metric>::backend_type& {
    return builder.Name(name).Help(help).Labels(to_backend_labels(const_labels)).Register(registry);
  };
  if constexpr (std::is_same_v<Metric, counter>) {
    return build(prometheus::BuildCounter());
  } else if constexpr (std::is_same_v<Metric, gauge>) {
    return build(prometheus::BuildGauge());
  } else {
    return build(prometheus::BuildHistogram());
  }
}

// The text format escapes backslash and newline in HELP; TextSerializer 1.0.1 writes the help
// as given, so a newline in it would end the line early.
std::string escape_help(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// ---- free helpers ----

bool is_valid_metric_name(std::string_view name) {
  return prometheus::CheckMetricName(std::string(name));
}

bool is_valid_label_name(std::string_view name) {
  return prometheus::CheckLabelName(std::string(name));
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
  // prometheus::Counter ignores a negative amount silently and takes NaN; both are bugs of
  // the caller that should show.
  if (!(amount >= 0)) {
    throw metrics_error("a counter can only go up; use a gauge for values that decrease");
  }
  impl_->Increment(amount);
}

double counter::value() const { return impl_->Value(); }

void gauge::set(double v) { impl_->Set(v); }
void gauge::inc(double amount) { impl_->Increment(amount); }
void gauge::dec(double amount) { impl_->Decrement(amount); }
double gauge::value() const { return impl_->Value(); }

void histogram::observe(double v) {
  if (std::isnan(v)) {
    // prometheus::Histogram finds the bucket with lower_bound, which puts NaN in the first
    // one; counted in +Inf instead, with the NaN still in _sum.
    std::vector<double> increments(finite_bounds_ + 1, 0.0);
    increments.back() = 1.0;
    impl_->ObserveMultiple(increments, v);
    return;
  }
  impl_->Observe(v);
}

histogram::snapshot histogram::take_snapshot() const {
  const prometheus::ClientMetric::Histogram collected = impl_->Collect().histogram;
  snapshot snap;
  for (const auto& bucket : collected.bucket) {
    if (std::isfinite(bucket.upper_bound)) snap.upper_bounds.push_back(bucket.upper_bound);
    snap.cumulative.push_back(bucket.cumulative_count);
  }
  snap.sum = collected.sample_sum;
  snap.count = collected.sample_count;
  return snap;
}

// ---- families ----

namespace detail {
family_base::family_base(std::string name, std::string help, label_set const_labels,
                         metric_kind kind)
    : name_(std::move(name)),
      help_(std::move(help)),
      const_labels_(std::move(const_labels)),
      kind_(kind) {}
}  // namespace detail

template <class Metric>
family<Metric>::family(std::string name, std::string help, label_set const_labels,
                       std::vector<double> upper_bounds, backend_type& backend)
    : detail::family_base(std::move(name), std::move(help), std::move(const_labels),
                          kind_of<Metric>()),
      upper_bounds_(std::move(upper_bounds)),
      backend_(&backend) {}

template <class Metric>
Metric& family<Metric>::with(const label_set& labels) {
  label_set key = normalise_labels(name_, labels, const_labels_, std::is_same_v<Metric, histogram>);
  std::lock_guard lock(mutex_);
  auto it = children_.find(key);
  if (it == children_.end()) {
    child made{};
    if constexpr (std::is_same_v<Metric, histogram>) {
      made.backend = &backend_->Add(to_backend_labels(key), upper_bounds_);
      made.metric = std::make_unique<histogram>(*made.backend, upper_bounds_.size());
    } else {
      made.backend = &backend_->Add(to_backend_labels(key));
      made.metric = std::make_unique<Metric>(*made.backend);
    }
    it = children_.emplace(std::move(key), std::move(made)).first;
  }
  return *it->second.metric;
}

template <class Metric>
void family<Metric>::retain_only(const std::vector<label_set>& keep) {
  std::set<label_set> kept;
  for (const label_set& labels : keep)
    kept.insert(normalise_labels(name_, labels, const_labels_, std::is_same_v<Metric, histogram>));
  std::lock_guard lock(mutex_);
  for (auto it = children_.begin(); it != children_.end();) {
    if (kept.contains(it->first)) {
      ++it;
    } else {
      backend_->Remove(it->second.backend);
      it = children_.erase(it);
    }
  }
}

template class family<counter>;
template class family<gauge>;
template class family<histogram>;

// ---- registry ----

metrics_registry::metrics_registry()
    // Throw, not Merge: this class decides when a name may be registered again (same kind,
    // labels and buckets); the backend then never sees a name twice, and a slip would show.
    : backend_(
          std::make_unique<prometheus::Registry>(prometheus::Registry::InsertBehavior::Throw)) {}

metrics_registry::~metrics_registry() = default;

template <class Metric>
family<Metric>& metrics_registry::add_family(const std::string& name, const std::string& help,
                                             std::vector<double> upper_bounds,
                                             const label_set& const_labels) {
  constexpr bool is_histogram = std::is_same_v<Metric, histogram>;
  constexpr detail::metric_kind kind = kind_of<Metric>();
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
      throw metrics_error(std::string(kind_name(kind)) + " '" + name +
                          "' must not end in \"_total\": that suffix marks counters");
    }
  }
  if constexpr (is_histogram) upper_bounds = exposed_buckets(name, std::move(upper_bounds));
  label_set normal_const = normalise_labels(name, const_labels, {}, is_histogram);

  std::lock_guard lock(mutex_);
  if (auto it = families_.find(name); it != families_.end()) {
    auto* existing = dynamic_cast<family<Metric>*>(it->second.get());
    if (existing == nullptr) {
      throw metrics_error("metric '" + name + "' is already registered as another kind than " +
                          kind_name(kind));
    }
    if (existing->const_labels() != normal_const || existing->upper_bounds() != upper_bounds) {
      throw metrics_error("metric '" + name +
                          "' is already registered with other constant labels or buckets");
    }
    return *existing;
  }
  const std::vector<std::string> mine = series_names(name, is_histogram);
  for (const auto& [other_name, other] : families_) {
    const bool other_is_histogram = other->kind() == detail::metric_kind::histogram;
    for (const std::string& theirs : series_names(other_name, other_is_histogram)) {
      if (std::find(mine.begin(), mine.end(), theirs) != mine.end()) {
        throw metrics_error(joined({"metric '", name, "' would write series '", theirs,
                                    "', which metric '", other_name, "' already writes"}));
      }
    }
  }

  typename family<Metric>::backend_type* backend = nullptr;
  try {
    backend = &register_backend<Metric>(*backend_, name, help, normal_const);
  } catch (const std::invalid_argument& e) {
    // Not expected after the checks above; kept as metrics_error so callers catch one type.
    throw metrics_error("metric '" + name + "': prometheus-cpp refused it: " + e.what());
  }
  auto fam = std::make_unique<family<Metric>>(name, help, std::move(normal_const),
                                              std::move(upper_bounds), *backend);
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
  std::lock_guard lock(mutex_);
  // The backend lists families by kind and series in hash order, and leaves out a family
  // without series; a scrape here is in a fixed order (families by name, series by labels) and
  // shows every family's HELP and TYPE, as readers of the exposition rely on.
  std::vector<prometheus::MetricFamily> collected = backend_->Collect();
  std::map<std::string, prometheus::MetricFamily*> by_name;
  for (prometheus::MetricFamily& f : collected) by_name.emplace(f.name, &f);

  std::vector<prometheus::MetricFamily> ordered;
  ordered.reserve(families_.size());
  for (const auto& [name, fam] : families_) {
    prometheus::MetricFamily out;
    if (auto it = by_name.find(name); it != by_name.end()) {
      out = std::move(*it->second);
    } else {
      out.name = name;
      out.type = type_of(fam->kind());
    }
    out.help = escape_help(fam->help());
    std::sort(out.metric.begin(), out.metric.end(),
              [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) {
                return a.label < b.label;
              });
    ordered.push_back(std::move(out));
  }
  std::ostringstream text;
  prometheus::TextSerializer().Serialize(text, ordered);
  return std::move(text).str();
}

}  // namespace troupe::monitoring
