#include "cli/bench_control_plane.hpp"

#include <stdexcept>

#include "bench/control_plane/control_plane_bench.hpp"
#include "cli/command_line.hpp"

namespace troupe::cli {

int run_control_plane_bench(const std::vector<std::string>& args) {
  command_line cl("troupe bench control-plane");
  for (const char* v : {"--members",
                        "--first-member",
                        "--steps",
                        "--step-ms",
                        "--jitter-ms",
                        "--members-per-node",
                        "--lose",
                        "--lose-at",
                        "--lose-percent",
                        "--lose-percent-at",
                        "--straggler",
                        "--checkpoint-every",
                        "--heartbeat-timeout-ms",
                        "--connect-threads",
                        "--hello-timeout-s",
                        "--coordinator",
                        "--join-token",
                        "--run-dir",
                        "--vote-window-ms",
                        "--d-model"})
    cl.value(v);
  cl.flag("--json");
  cl.flag("--aggregate");
  cl.flag("--etcd");
  cl.parse(args);
  bench::control_plane::bench_options o;
  auto integer = [&](const char* flag, int64_t lo, int64_t hi, auto& into) {
    if (auto v = cl.last(flag))
      into = static_cast<std::remove_reference_t<decltype(into)>>(cl.integer(flag, *v, lo, hi));
  };
  auto number = [&](const char* flag, double lo, double hi, double& into) {
    auto v = cl.last(flag);
    if (!v) return;
    size_t used = 0;
    double x = 0;
    try {
      x = std::stod(*v, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != v->size() || !(x >= lo && x <= hi))
      throw cl.error(std::string(flag) + " must be a number in " + std::to_string(lo) + ".." +
                     std::to_string(hi) + ", got '" + *v + "'");
    into = x;
  };
  if (!cl.has("--members")) throw cl.error("--members N is required");
  integer("--members", 1, 1 << 20, o.members);
  integer("--first-member", 0, 1 << 20, o.first_member);
  integer("--steps", 4, 1000000, o.steps);
  integer("--step-ms", 0, 600000, o.step_ms);
  integer("--jitter-ms", 0, 600000, o.jitter_ms);
  integer("--members-per-node", 1, 1 << 20, o.members_per_node);
  integer("--lose", 0, 1 << 20, o.lose);
  integer("--lose-at", 1, 1000000, o.lose_at);
  number("--lose-percent", 0, 99, o.lose_percent);
  integer("--lose-percent-at", 1, 1000000, o.lose_percent_at);
  number("--straggler", 1, 1000, o.straggler);
  integer("--checkpoint-every", 0, 1000000, o.checkpoint_every);
  integer("--heartbeat-timeout-ms", 100, 3600000, o.heartbeat_timeout_ms);
  integer("--d-model", 8, 1024, o.d_model);
  integer("--connect-threads", 1, 256, o.connect_threads);
  integer("--hello-timeout-s", 1, 86400, o.hello_timeout_s);
  o.coordinator = cl.last("--coordinator").value_or("");
  o.join_token = cl.last("--join-token").value_or("");
  o.run_dir = cl.last("--run-dir").value_or("");
  o.json = cl.has("--json");
  o.aggregate = cl.has("--aggregate");
  o.etcd = cl.has("--etcd");
  integer("--vote-window-ms", 1, 600000, o.vote_window_ms);
  if (cl.has("--vote-window-ms") && !o.aggregate)
    throw cl.error("--vote-window-ms is a relay's setting: it needs --aggregate");
  try {
    return bench::control_plane::run_control_plane_bench(o);
  } catch (const std::invalid_argument& e) {
    throw cl.error(e.what());
  }
}

}  // namespace troupe::cli
