#pragma once
// The table of a job's settings: each one declared once, with its config key, its flag, its
// default (train_config's), its bounds, its help and whether a resumed job may change it. The
// command line, `--help`, the config file, validation, `--print-config`, the resume check and
// the README's option list all read this table.

#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/config.hpp"

namespace troupe {

/// What the table says of a setting besides its key and accessors, in the order a table row
/// gives it.
struct setting_about {
  std::string flag;        ///< the command line's name ("--layers"); "" = none (set by troupe)
  std::string value_name;  ///< placeholder in help ("N"); empty for a switch (no value)
  std::string group;       ///< the help section it is listed under
  /// A resumed job may give it another value (how or how long to run); the others shape
  /// the math and must match the checkpoint's.
  bool resumable = false;
  std::string help;
  /// Bounds checked by validate() ("must be in lo..hi"); NaN: none. Bounds that depend on
  /// another setting (micro_batch <= batch) are validate()'s own.
  double lo = std::numeric_limits<double>::quiet_NaN();
  double hi = std::numeric_limits<double>::quiet_NaN();
  std::string bound_note = "";            ///< said after the range: " (0 = off)"
  std::vector<std::string> choices = {};  ///< for a string: its allowed values
  bool lo_open = false;                   ///< for a real number: (lo, ...
  bool hi_open = false;                   ///< ... hi)
  bool switch_sets = true;                ///< what a switch sets (a `--no-...` switch sets false)
};

struct setting : setting_about {
  std::string key;  ///< the config file's dotted name ("model.n_layer"), also --set KEY=V
  std::function<void(train_config&, const nlohmann::json&)> set;
  std::function<nlohmann::json(const train_config&)> get;

  bool is_switch() const { return value_name.empty(); }
};

/// A value as an error message quotes it: JSON text, cut short.
std::string quoted_value(const nlohmann::json& v);

/// Every setting, in the order `--help` lists them.
const std::vector<setting>& settings();
/// By config key or by flag; nullptr when there is none.
const setting* find_setting(const std::string& key);
const setting* find_setting_by_flag(const std::string& flag);
/// The help sections, in order.
const std::vector<std::string>& setting_groups();

/// A setting's value as text, the way a flag takes it ("0.003", "1f1b"; a list comma-separated).
std::string setting_text(const setting& s, const train_config& cfg);

/// One setting whose value differs between two configs, as text.
struct setting_change {
  const setting* what;
  std::string before, after;
};
/// The settings whose values differ between `before` and `after`, in the table's order.
std::vector<setting_change> changed_settings(const train_config& before, const train_config& after);

/// Whether a worker reads the setting. The ones it does not (etcd and its credentials, the
/// metrics endpoint, how the coordinator reacts to stragglers and divergences, how a session
/// starts) stay with the coordinator: a worker's welcome carries only the others.
bool read_by_workers(const setting& s);
/// The config a worker is welcomed with: every setting it reads, nothing else (a setting left
/// out keeps its default in the worker's train_config, which no worker code looks at).
nlohmann::json worker_config_json(const train_config& cfg);

}  // namespace troupe
