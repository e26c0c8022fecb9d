// A caller-owned registry of Prometheus counters, gauges and histograms, rendered as text
// exposition format 0.0.4.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

/// A monotonically increasing value (events, bytes, steps). Lock-free.
class counter {
 public:
  /// Adds `amount` (default 1); throws metrics_error if it is negative or NaN, because a
  /// counter that goes down reads as a process restart to Prometheus' rate().
  void inc(double amount = 1.0);
  /// The current value.
  [[nodiscard]] double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// A value that goes up and down (loss, world size, queue depth). Lock-free.
class gauge {
 public:
  /// Replaces the value.
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  /// Adds `amount` (default 1).
  void inc(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  /// Subtracts `amount` (default 1).
  void dec(double amount = 1.0) { value_.fetch_sub(amount, std::memory_order_relaxed); }
  /// The current value.
  [[nodiscard]] double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

/// A distribution of observations over fixed upper bounds (step time, message latency).
class histogram {
 public:
  /// A consistent copy of the histogram: bucket counts are cumulative, the last one is +Inf.
  struct snapshot {
    std::vector<double> upper_bounds;       ///< finite bounds, ascending; +Inf is implied
    std::vector<std::uint64_t> cumulative;  ///< upper_bounds.size() + 1 entries
    double sum = 0.0;
    std::uint64_t count = 0;
  };

  /// `upper_bounds` must already be validated (finite, strictly ascending).
  explicit histogram(std::vector<double> upper_bounds);

  /// Records one observation. A short lock, so that a scrape never sees _count disagree with
  /// the +Inf bucket; one observation per training step makes contention irrelevant.
  void observe(double v);
  /// A consistent copy taken under the lock.
  [[nodiscard]] snapshot take_snapshot() const;

 private:
  std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<std::uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0.0;
  std::uint64_t count_ = 0;
};

/// Bucket helpers. Both throw metrics_error on arguments that cannot make valid buckets.
/// `count` bounds start, start+width, ...
[[nodiscard]] std::vector<double> linear_buckets(double start, double width, int count);
/// `count` bounds start, start*factor, ...
[[nodiscard]] std::vector<double> exponential_buckets(double start, double factor, int count);
/// The Prometheus client default: 5 ms to 10 s, for latencies in seconds.
[[nodiscard]] std::vector<double> default_buckets();

namespace detail {
/// What render_prometheus needs from a family of any kind.
class family_base {
 public:
  virtual ~family_base() = default;
  family_base(const family_base&) = delete;
  family_base& operator=(const family_base&) = delete;

  [[nodiscard]] const std::string& name() const { return name_; }
  [[nodiscard]] const label_set& const_labels() const { return const_labels_; }
  /// Appends HELP, TYPE and every series to `out`.
  virtual void render(std::string& out) const = 0;

 protected:
  family_base(std::string name, std::string help, label_set const_labels);

  std::string name_;
  std::string help_;
  label_set const_labels_;  // sorted by name
};
}  // namespace detail

/// All series of one metric name that differ only by their variable labels. `Metric` is
/// counter, gauge or histogram. Thread-safe; returned references stay valid as long as the
/// registry that owns the family.
template <class Metric>
class family final : public detail::family_base {
 public:
  family(std::string name, std::string help, label_set const_labels,
         std::vector<double> upper_bounds);

  /// The series with these variable labels, created (at zero) on first use. Throws
  /// metrics_error on an invalid or reserved label name, or one that repeats a constant label.
  Metric& with(const label_set& labels);
  /// Drops every series whose variable labels are not in `keep` (a lost rank's gauge must not
  /// go on saying its last value). References to a dropped series must not be used again.
  void retain_only(const std::vector<label_set>& keep);
  /// Bucket bounds (histogram families only; empty otherwise).
  [[nodiscard]] const std::vector<double>& upper_bounds() const { return upper_bounds_; }

  void render(std::string& out) const override;

 private:
  std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::map<label_set, std::unique_ptr<Metric>> children_;  // key sorted by label name
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
  metrics_registry() = default;
  metrics_registry(const metrics_registry&) = delete;
  metrics_registry& operator=(const metrics_registry&) = delete;

  /// A counter family whose series all carry `const_labels`.
  counter_family& add_counter_family(const std::string& name, const std::string& help,
                                     const label_set& const_labels = {});
  /// A gauge family whose series all carry `const_labels`.
  gauge_family& add_gauge_family(const std::string& name, const std::string& help,
                                 const label_set& const_labels = {});
  /// A histogram family; `upper_bounds` must be finite and strictly ascending (+Inf is added).
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

  /// Every family in name order, in text exposition format 0.0.4.
  [[nodiscard]] std::string render_prometheus() const;

 private:
  template <class Metric>
  family<Metric>& add_family(const std::string& name, const std::string& help,
                             std::vector<double> upper_bounds, const label_set& const_labels);

  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<detail::family_base>> families_;
};

/// Whether `name` is a valid Prometheus metric name (syntax only).
[[nodiscard]] bool is_valid_metric_name(std::string_view name);
/// Whether `name` is a valid Prometheus label name (syntax only, "__" prefix rejected).
[[nodiscard]] bool is_valid_label_name(std::string_view name);
/// A sample value as Prometheus parses it: shortest round-trip decimal, "+Inf", "-Inf", "NaN".
[[nodiscard]] std::string format_sample_value(double v);
/// A label value escaped for the text format (backslash, double quote, newline).
[[nodiscard]] std::string escape_label_value(std::string_view v);

}  // namespace troupe::monitoring
