// A caller-owned registry of Prometheus counters, gauges and histograms, rendered as text
// exposition format 0.0.4. Storage, families and the text writer are prometheus-cpp's (core
// only; its civetweb exposer is not used: monitoring/http_server.* serves the text). What this
// layer adds is troupe's: the naming and lint rules checked at registration, labels validated
// and normalised per call, histogram series names kept apart, NaN observations counted in
// +Inf, and a scrape in a fixed order (families by name, series by labels) that also lists the
// families that have no series yet.
//
// prometheus-cpp stays out of this header (only declared), so callers need not see it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace troupe::monitoring {

/// Label name/value pairs. Order does not matter: a family normalises a set by sorting it by
/// name, so {a="1",b="2"} and {b="2",a="1"} address the same series.
using label_set = std::vector<std::pair<std::string, std::string>>;

/// Thrown for a name, label or bucket layout that Prometheus would reject or misread, and for
/// re-registering a name with a different kind, constant labels or buckets.
class metrics_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// A monotonically increasing value (events, bytes, steps). Lock-free. Made by a family.
class counter {
 public:
  explicit counter(prometheus::Counter& impl) : impl_(&impl) {}
  counter(const counter&) = delete;
  counter& operator=(const counter&) = delete;

  /// Adds `amount` (default 1); throws metrics_error if it is negative or NaN, because a
  /// counter that goes down reads as a process restart to Prometheus' rate().
  void inc(double amount = 1.0);
  /// The current value.
  [[nodiscard]] double value() const;

 private:
  prometheus::Counter* impl_;
};

/// A value that goes up and down (loss, world size, queue depth). Lock-free. Made by a family.
class gauge {
 public:
  explicit gauge(prometheus::Gauge& impl) : impl_(&impl) {}
  gauge(const gauge&) = delete;
  gauge& operator=(const gauge&) = delete;

  /// Replaces the value.
  void set(double v);
  /// Adds `amount` (default 1).
  void inc(double amount = 1.0);
  /// Subtracts `amount` (default 1).
  void dec(double amount = 1.0);
  /// The current value.
  [[nodiscard]] double value() const;

 private:
  prometheus::Gauge* impl_;
};

/// A distribution of observations over fixed upper bounds (step time, message latency).
/// Made by a family.
class histogram {
 public:
  /// A consistent copy of the histogram: bucket counts are cumulative, the last one is +Inf.
  struct snapshot {
    std::vector<double> upper_bounds;       ///< finite bounds, ascending; +Inf is implied
    std::vector<std::uint64_t> cumulative;  ///< upper_bounds.size() + 1 entries
    double sum = 0.0;
    std::uint64_t count = 0;
  };

  /// `finite_bounds` is the number of bounds `impl` was made with (+Inf not counted).
  histogram(prometheus::Histogram& impl, std::size_t finite_bounds)
      : impl_(&impl), finite_bounds_(finite_bounds) {}
  histogram(const histogram&) = delete;
  histogram& operator=(const histogram&) = delete;

  /// Records one observation in the first bucket whose bound is >= v; NaN is counted in +Inf
  /// (as the Go client does). A short lock inside, so that a scrape never sees _count disagree
  /// with the +Inf bucket.
  void observe(double v);
  /// A consistent copy taken under that lock.
  [[nodiscard]] snapshot take_snapshot() const;

 private:
  prometheus::Histogram* impl_;
  std::size_t finite_bounds_;
};

/// Bucket helpers. Both throw metrics_error on arguments that cannot make valid buckets.
/// `count` bounds start, start+width, ...
[[nodiscard]] std::vector<double> linear_buckets(double start, double width, int count);
/// `count` bounds start, start*factor, ...
[[nodiscard]] std::vector<double> exponential_buckets(double start, double factor, int count);
/// The Prometheus client default: 5 ms to 10 s, for latencies in seconds.
[[nodiscard]] std::vector<double> default_buckets();

namespace detail {
enum class metric_kind { counter, gauge, histogram };

/// What the registry needs from a family of any kind to register and render it.
class family_base {
 public:
  virtual ~family_base() = default;
  family_base(const family_base&) = delete;
  family_base& operator=(const family_base&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const std::string& help() const { return help_; }
  [[nodiscard]] const label_set& const_labels() const { return const_labels_; }
  [[nodiscard]] metric_kind kind() const { return kind_; }

 protected:
  family_base(std::string name, std::string help, label_set const_labels, metric_kind kind);

  std::string name_;
  std::string help_;
  label_set const_labels_;  // sorted by name
  metric_kind kind_;
};

/// The prometheus-cpp type behind each troupe metric type.
template <class Metric>
struct backend_of;
template <>
struct backend_of<counter> {
  using type = prometheus::Counter;
};
template <>
struct backend_of<gauge> {
  using type = prometheus::Gauge;
};
template <>
struct backend_of<histogram> {
  using type = prometheus::Histogram;
};
}  // namespace detail

/// All series of one metric name that differ only by their variable labels. `Metric` is
/// counter, gauge or histogram. Thread-safe; returned references stay valid as long as the
/// registry that owns the family.
template <class Metric>
class family final : public detail::family_base {
 public:
  using backend_type = prometheus::Family<typename detail::backend_of<Metric>::type>;

  /// Made by metrics_registry, which has validated everything and registered `backend`.
  family(std::string name, std::string help, label_set const_labels,
         std::vector<double> upper_bounds, backend_type& backend);

  /// The series with these variable labels, created (at zero) on first use. Throws
  /// metrics_error on an invalid or reserved label name, or one that repeats a constant label.
  Metric& with(const label_set& labels);
  /// Drops every series whose variable labels are not in `keep` (a lost rank's gauge must not
  /// go on saying its last value). References to a dropped series must not be used again.
  void retain_only(const std::vector<label_set>& keep);
  /// Bucket bounds as exposed (histogram families only; empty otherwise).
  [[nodiscard]] const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  // The backend's series beside troupe's handle on it, which retain_only removes together.
  struct child {
    std::unique_ptr<Metric> metric;
    typename detail::backend_of<Metric>::type* backend;
  };

  std::vector<double> upper_bounds_;
  backend_type* backend_;
  mutable std::mutex mutex_;
  std::map<label_set, child> children_;  // key sorted by label name
};

using counter_family = family<counter>;
using gauge_family = family<gauge>;
using histogram_family = family<histogram>;

/// Owns metric families and renders them. Not a singleton: each process part (coordinator,
/// worker) owns one and hands it to a metrics_server. Registering a name that already exists
/// with the same kind, constant labels (and buckets) returns the existing family, so two
/// components can ask for the same metric; anything else with that name throws metrics_error.
///
/// Naming rules enforced (those of Prometheus, plus promtool's two lints that would fail a
/// check): names match [a-zA-Z_:][a-zA-Z0-9_:]* and do not start with "__"; label names match
/// [a-zA-Z_][a-zA-Z0-9_]* and do not start with "__"; help text is not empty; counter names end
/// in "_total" and other names do not; a histogram's "le" label and its _bucket/_sum/_count
/// series names are reserved.
class metrics_registry {
 public:
  metrics_registry();
  ~metrics_registry();
  metrics_registry(const metrics_registry&) = delete;
  metrics_registry& operator=(const metrics_registry&) = delete;

  /// A counter family whose series all carry `const_labels`.
  counter_family& add_counter_family(const std::string& name, const std::string& help,
                                     const label_set& const_labels = {});
  /// A gauge family whose series all carry `const_labels`.
  gauge_family& add_gauge_family(const std::string& name, const std::string& help,
                                 const label_set& const_labels = {});
  /// A histogram family; `upper_bounds` must be finite and strictly ascending (+Inf is added).
  /// Each bound is kept as the exposition writes it (16 significant digits), so that a bucket
  /// counts exactly what its le label says; bounds that would read alike are rejected.
  histogram_family& add_histogram_family(const std::string& name, const std::string& help,
                                         std::vector<double> upper_bounds,
                                         const label_set& const_labels = {});

  /// Shorthands: the family's series without variable labels, exported at zero at once.
  counter& add_counter(const std::string& name, const std::string& help,
                       const label_set& const_labels = {});
  gauge& add_gauge(const std::string& name, const std::string& help,
                   const label_set& const_labels = {});
  histogram& add_histogram(const std::string& name, const std::string& help,
                           std::vector<double> upper_bounds, const label_set& const_labels = {});

  /// Every family in name order (its series in label order), in text exposition format 0.0.4.
  /// A family without series still has its HELP and TYPE lines.
  [[nodiscard]] std::string render_prometheus() const;

 private:
  template <class Metric>
  family<Metric>& add_family(const std::string& name, const std::string& help,
                             std::vector<double> upper_bounds, const label_set& const_labels);

  mutable std::mutex mutex_;
  std::unique_ptr<prometheus::Registry> backend_;
  std::map<std::string, std::unique_ptr<detail::family_base>> families_;
};

/// Whether `name` is a valid Prometheus metric name (syntax only).
[[nodiscard]] bool is_valid_metric_name(std::string_view name);
/// Whether `name` is a valid Prometheus label name (syntax only, "__" prefix rejected).
[[nodiscard]] bool is_valid_label_name(std::string_view name);

}  // namespace troupe::monitoring
