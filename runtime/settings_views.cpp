// What is derived from the settings table rather than kept in it: the settings two configs
// differ in (a resume's check and its log), and the part of a config a worker is welcomed with.

#include <algorithm>
#include <string>
#include <vector>

#include "runtime/settings.hpp"

namespace troupe {

std::vector<setting_change> changed_settings(const train_config& before,
                                             const train_config& after) {
  std::vector<setting_change> out;
  for (const auto& s : settings())
    if (s.get(before) != s.get(after))
      out.push_back({&s, setting_text(s, before), setting_text(s, after)});
  return out;
}

bool read_by_workers(const setting& s) {
  // Each of these is read by the coordinator process alone. Before adding one, look for its
  // uses from the worker's side through every helper of runtime/config.hpp too
  // (session_last_step reads exit_after_step, so that one stays), and run first_hour_test.
  static const std::vector<std::string> coordinator_only = {"etcd.endpoints",
                                                            "etcd.cacert",
                                                            "etcd.cert",
                                                            "etcd.key",
                                                            "etcd.timeout_ms",
                                                            "metrics_host",
                                                            "metrics_port",
                                                            "metrics_rank_labels",
                                                            "progress",
                                                            "resume",
                                                            "max_rollbacks",
                                                            "on_divergence",
                                                            "elastic.straggler_policy",
                                                            "elastic.straggler_factor",
                                                            "elastic.replacement_wait_ms"};
  return std::find(coordinator_only.begin(), coordinator_only.end(), s.key) ==
         coordinator_only.end();
}

nlohmann::json worker_config_json(const train_config& cfg) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& s : settings()) {
    if (!read_by_workers(s)) continue;
    out[nlohmann::json::json_pointer("/" + [&] {
      std::string path = s.key;
      std::replace(path.begin(), path.end(), '.', '/');
      return path;
    }())] = s.get(cfg);
  }
  return out;
}

}  // namespace troupe
