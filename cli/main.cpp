// `troupe`: one binary for every role of a job (run, coordinator, agent, worker).

#include <openssl/crypto.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actors/agent/node_supervisor.hpp"
#include "actors/wire/connect.hpp"
#include "actors/wire/node_address.hpp"
#include "actors/worker/rank.hpp"
#include "bench/comm_bench.hpp"
#include "cli/bench_control_plane.hpp"
#include "cli/ckpt_tool.hpp"
#include "cli/command_line.hpp"
#include "cli/eval_tool.hpp"
#include "cli/options.hpp"
#include "cli/report.hpp"
#include "cli/sample_tool.hpp"
#include "cli/scheduler.hpp"
#include "cli/status_tool.hpp"
#include "cli/tokenize_tool.hpp"
#include "coordinator/job_runner.hpp"
#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/preflight.hpp"
#include "runtime/sys/descriptors.hpp"
#include "runtime/sys/printable.hpp"

namespace {

using troupe::cli::usage_error;

int parse_count(const std::string& command, const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    int x = std::stoi(v, &used);
    if (used != v.size() || x < 0) throw std::invalid_argument(flag);
    return x;
  } catch (const std::exception&) {
    throw usage_error("troupe " + command + ": " + flag + " must be a non-negative integer, got '" +
                      v + "'");
  }
}

// --log-level for this process and, through the environment, every process it starts.
void apply_log_level(const std::string& command, const std::string& text) {
  const auto lvl = troupe::monitoring::parse_level(text);
  if (!lvl)
    throw usage_error("troupe " + command +
                      ": --log-level must be debug, info, warn or error, got '" + text + "'");
  troupe::monitoring::set_log_threshold(*lvl);
  ::setenv("TROUPE_LOG_LEVEL", std::string(troupe::monitoring::level_name(*lvl)).c_str(), 1);
}

// Parses `--coordinator HOST:PORT` and `--join-token FILE` (both), `--iface NAME` or
// `--advertise ADDR` (both commands; without them the environment) into `advertise`, checked
// against this host, `--member M` and `--node N` (workers), `--ranks K` and `--run-dir DIR`
// (agents: with `scheduled`, what the options leave out comes from the scheduler's
// environment and the run directory, cli/scheduler.hpp). The join token is loaded at once:
// this process's credentials.
void parse_member_args(const std::string& command, const std::vector<std::string>& args,
                       std::string& host, uint16_t& port, std::string& advertise, int* rank,
                       std::vector<troupe::actors::endpoint>& coordinators, int* node = nullptr,
                       int* ranks = nullptr, bool* standby = nullptr,
                       troupe::cli::agent_plan* scheduled = nullptr) {
  troupe::cli::command_line cl("troupe " + command);
  for (const char* v : {"--coordinator", "--join-token", "--iface", "--advertise", "--log-level"})
    cl.value(v);
  if (scheduled) cl.value("--run-dir");
  if (rank) cl.value("--member,--rank");
  if (node) cl.value("--node");
  if (ranks) cl.value("--ranks");
  if (standby) cl.flag("--standby");
  cl.parse(args);
  bool have_endpoint = false;
  std::string token_path, iface_flag, advertise_flag, coordinator_text, run_dir_flag;
  for (const auto& [a, v] : cl.given()) {
    if (a == "--coordinator") {
      // Several: the job's coordinators, one leading and the others standing by (takeover).
      if (!troupe::actors::parse_endpoints(v, coordinators))
        throw usage_error("troupe " + command +
                          ": --coordinator must be HOST:PORT (or a comma-separated list of "
                          "them), got '" +
                          v + "'");
      host = coordinators.front().host;
      port = coordinators.front().port;
      have_endpoint = true;
      coordinator_text = v;
    } else if (a == "--run-dir") {
      run_dir_flag = v;
      if (run_dir_flag.empty())
        throw usage_error(
            "troupe agent: --run-dir must name the job's run directory, got an "
            "empty value");
    } else if (a == "--join-token") {
      token_path = v;
      if (token_path.empty())
        throw usage_error("troupe " + command +
                          ": --join-token must name the job's join token file, got an empty "
                          "value");
      troupe::check_path_length(token_path, "join token", "--join-token");
    } else if (a == "--iface" || a == "--advertise") {
      std::string& into = a == "--iface" ? iface_flag : advertise_flag;
      into = v;
      if (into.empty())
        throw usage_error("troupe " + command + ": " + a + " needs " +
                          (a == "--iface" ? "an interface name" : "an address") +
                          ", got an empty value");
    } else if (a == "--member") {
      *rank = parse_count(command, a, v);
    } else if (a == "--node") {
      *node = parse_count(command, a, v);
    } else if (a == "--standby") {
      *standby = true;
    } else if (a == "--ranks") {
      *ranks = parse_count(command, a, v);
      if (*ranks < 1) throw usage_error("troupe agent: --ranks must be at least 1");
    } else if (a == "--log-level") {
      apply_log_level(command, v);
    }
  }
  if (scheduled) {  // agents: the scheduler's environment where the options are silent
    // The scheduler's environment names one coordinator; a list given here is kept whole.
    const std::string first = coordinators.empty() ? coordinator_text
                                                   : coordinators.front().host + ":" +
                                                         std::to_string(coordinators.front().port);
    *scheduled =
        troupe::cli::plan_agent(first, token_path, run_dir_flag, troupe::process_environment());
    if (scheduled->idle) return;
    host = scheduled->host;
    port = scheduled->port;
    if (coordinators.size() <= 1) coordinators = {{host, port}};
    token_path = scheduled->token_path;
    have_endpoint = true;
  }
  if (!have_endpoint)
    throw usage_error("troupe " + command + ": --coordinator HOST:PORT is required");
  if (standby && *standby && rank && *rank >= 0)
    throw usage_error("troupe worker: --member and --standby exclude each other");
  if (rank && *rank < 0 && !(standby && *standby))
    throw usage_error("troupe worker: --member M (or --standby) is required");
  if (token_path.empty())
    throw usage_error("troupe " + command +
                      ": --join-token FILE is required (the coordinator writes it to "
                      "RUN_DIR/join.token; copy it to this machine with mode 0600)");
  try {
    troupe::auth::set_process_credentials(troupe::auth::load_join_token(token_path));
  } catch (const troupe::auth::credentials_error& e) {
    throw usage_error("troupe " + command + ": " + e.what());
  }
  // Honoured or refused here, before anything starts; never reinterpreted later.
  try {
    advertise = troupe::actors::resolve_node_address(
        troupe::actors::choose_node_address(iface_flag, advertise_flag));
  } catch (const troupe::actors::node_address_error& e) {
    throw usage_error("troupe " + command + ": " + e.what());
  }
}

// The limit on open files against what this process and those it starts (they inherit it)
// need: main raised it to the hard limit at start; that raise is said when the job needs it,
// and a limit that stays too low is refused at once (exit 2), not found out when workers
// cannot connect and the job waits for them.
void require_descriptors(long needed, long soft_at_start, const std::string& who) {
  const auto now = troupe::sys::read_descriptor_limits();
  troupe::check_descriptor_limit(needed, now.soft, now.hard, who);
  if (soft_at_start < needed)
    std::fprintf(stderr,
                 "troupe: raised the limit on open files (RLIMIT_NOFILE) from %ld to %ld, the "
                 "hard limit: %s needs up to %ld\n",
                 soft_at_start, now.soft, who.c_str(), needed);
}

// What an agent or a worker needs before it knows the job: that of the smallest job (one
// rank). A worker checks its job's own need once the coordinator sends the config.
long smallest_job_descriptors() {
  troupe::train_config one;
  one.world = 1;
  return std::max(troupe::descriptors_needed(one, troupe::process_role::agent),
                  troupe::descriptors_needed(one, troupe::process_role::worker));
}

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

int dispatch(int argc, char** argv, long soft_descriptors_at_start) {
  if (argc < 2) {
    std::fputs(troupe::cli::main_help().c_str(), stderr);
    return 2;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (command == "--help" || command == "-h" || (command == "help" && args.empty())) {
    std::fputs(troupe::cli::main_help().c_str(), stdout);
    return 0;
  }
  if (command == "help" && !args.empty()) {
    if (args[0] == "options") {
      std::fputs(troupe::cli::job_options_help().c_str(), stdout);
      return 0;
    }
    throw usage_error(
        "troupe help: say `troupe help`, `troupe help options` or `troupe COMMAND "
        "--help`; got '" +
        args[0] + "'");
  }
  if (command == "--version") {
    std::puts("troupe " TROUPE_VERSION);  // as troupe_build_info{version} says it
    return 0;
  }
  if (command == "run" || command == "coordinator") {
    bool coordinator_only = command == "coordinator";
    auto opts = troupe::cli::parse_job_options(args, coordinator_only);
    if (opts.help) {
      std::fputs(
          (coordinator_only ? troupe::cli::coordinator_help() : troupe::cli::run_help()).c_str(),
          stdout);
      return 0;
    }
    if (!opts.log_level.empty()) apply_log_level(command, opts.log_level);
    if (opts.print_config) {
      std::fputs((troupe::to_config_file(opts.cfg).dump(2) + "\n").c_str(), stdout);
      return 0;
    }
    const auto& cfg = opts.cfg;
    using troupe::process_role;
    long needed = troupe::descriptors_needed(cfg, process_role::coordinator);
    if (const char* sim = std::getenv("TROUPE_SIMULATED_CONNECTIONS"); sim && coordinator_only) {
      // `troupe bench control-plane` starts this coordinator for simulated members that share
      // connections (one per simulated node): what it holds follows those, not the ranks.
      auto shape = cfg;
      shape.world = std::max(1, std::atoi(sim));
      shape.elastic.spares = 0;
      needed = troupe::descriptors_needed(shape, process_role::coordinator);
    }
    if (!coordinator_only)  // its agents and workers run here too, with the same limit
      needed = std::max({needed, troupe::descriptors_needed(cfg, process_role::agent),
                         troupe::descriptors_needed(cfg, process_role::worker)});
    require_descriptors(
        needed, soft_descriptors_at_start,
        (coordinator_only ? "the coordinator of this job (world " : "this job (world ") +
            std::to_string(cfg.world) +
            (cfg.elastic.spares > 0 ? ", " + std::to_string(cfg.elastic.spares) + " spares)"
                                    : ")"));
    return troupe::coordinator::run_job(opts, !coordinator_only);
  }
  if (command == "bench") {
    if (args.empty() || args[0] == "--help" || args[0] == "-h") {
      std::fputs(troupe::cli::bench_help().c_str(), args.empty() ? stderr : stdout);
      return args.empty() ? 2 : 0;
    }
    if (args[0] == "comm") {
      if (wants_help(args)) {
        std::fputs(troupe::cli::bench_help().c_str(), stdout);
        return 0;
      }
      // Tokenised here (`--opt=value` too); the benchmark checks the values.
      troupe::cli::command_line cl("troupe bench comm");
      for (const char* v :
           {"--ranks", "--ops", "--min-bytes", "--max-bytes", "--batches", "--batch-seconds",
            "--transport", "--nodes", "--node", "--serve-store", "--store", "--bind"})
        cl.value(v);
      cl.parse({args.begin() + 1, args.end()});
      std::vector<std::string> options;
      for (const auto& [flag, value] : cl.given()) {
        options.push_back(flag);
        options.push_back(value);
      }
      return troupe::bench::run_comm_bench(options);
    }
    if (args[0] == "control-plane") {
      if (wants_help(args)) {
        std::fputs(troupe::cli::bench_help().c_str(), stdout);
        return 0;
      }
      return troupe::cli::run_control_plane_bench({args.begin() + 1, args.end()});
    }
    throw usage_error("troupe bench: unknown benchmark '" + args[0] +
                      "'; benchmarks: comm, control-plane");
  }
  if (command == "agent") {
    if (wants_help(args)) {
      std::fputs(troupe::cli::agent_help().c_str(), stdout);
      return 0;
    }
    troupe::actors::agent_args a;
    troupe::cli::agent_plan scheduled;
    // `troupe agent ... -- PROGRAM ARGS`: its workers run the job's program (troupe run passes
    // it on); without it, `troupe worker`.
    std::vector<std::string> own = args;
    if (const auto dash = std::find(args.begin(), args.end(), "--"); dash != args.end()) {
      own.assign(args.begin(), dash);
      a.program.assign(dash + 1, args.end());
      if (a.program.empty() || a.program.front().empty())
        throw usage_error("troupe agent: `--` must be followed by the workers' program");
    }
    parse_member_args(command, own, a.coordinator_host, a.coordinator_port, a.advertise, nullptr,
                      a.coordinators, nullptr, &a.ranks, nullptr, &scheduled);
    if (!scheduled.words.empty())
      std::fprintf(stderr, "troupe agent: %s\n",
                   troupe::sys::printable_lines(scheduled.words).c_str());
    if (scheduled.idle) return 0;
    a.preempt_on_signals = scheduled.under_slurm;
    require_descriptors(smallest_job_descriptors(), soft_descriptors_at_start,
                        "an agent with its workers");
    return troupe::actors::run_agent(a);
  }
  if (command == "worker") {
    if (wants_help(args)) {
      std::fputs(troupe::cli::worker_help().c_str(), stdout);
      return 0;
    }
    troupe::actors::worker_args w;
    troupe::cli::guard_worker_signals(troupe::process_environment());
    parse_member_args(command, args, w.coordinator_host, w.coordinator_port, w.advertise, &w.member,
                      w.coordinators, &w.node, nullptr, &w.standby);
    require_descriptors(smallest_job_descriptors(), soft_descriptors_at_start, "a worker");
    const int code = troupe::actors::run_worker(w);
    // The rank thread is one of CAF's detached threads: it may still be exiting now, so the
    // worker ends without running static destructors or atexit handlers under it.
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(code);
  }
  if (command == "ckpt") return troupe::cli::run_ckpt_tool(args);
  if (command == "report") {
    if (wants_help(args)) {
      std::fputs(troupe::cli::report_help().c_str(), stdout);
      return 0;
    }
    return troupe::cli::run_report(args);
  }
  if (command == "status" || command == "top") {
    if (wants_help(args)) {
      std::fputs((command == "top" ? troupe::cli::top_help() : troupe::cli::status_help()).c_str(),
                 stdout);
      return 0;
    }
    return troupe::cli::run_status_tool(args, command == "top");
  }
  if (command == "tokenize") {
    if (wants_help(args)) {
      std::fputs(troupe::cli::tokenize_help().c_str(), stdout);
      return 0;
    }
    return troupe::cli::run_tokenize(args);
  }
  if (command == "sample" || command == "eval") {
    if (wants_help(args)) {
      std::fputs(
          (command == "sample" ? troupe::cli::sample_help() : troupe::cli::eval_help()).c_str(),
          stdout);
      return 0;
    }
    return command == "sample" ? troupe::cli::run_sample(args) : troupe::cli::run_eval(args);
  }
  throw usage_error("troupe: unknown command '" + command +
                    "'; commands: run, coordinator, agent, worker, bench, ckpt, report, status, "
                    "top, tokenize, sample, eval");
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything touches OpenSSL: no cleanup of it at exit. CAF's detached actor threads (a
  // worker's rank thread) may still be unwinding when main returns, and OpenSSL's atexit
  // cleanup freed their thread-local state under them (a double free: glibc's "corrupted
  // size vs. prev_size" in a removed worker's exit, found with AddressSanitizer). The
  // process's memory goes back to the system anyway.
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr);
  // A peer that hangs up mid-write must cost one connection, not the process: OpenSSL writes
  // its alerts with plain write(), which raises SIGPIPE on a closed socket.
  std::signal(SIGPIPE, SIG_IGN);
  // Room for every listener's clients and, above them, a reserve that no client can take:
  // checkpoints and the data plane must always be able to open what they need.
  const long soft_descriptors_at_start = troupe::sys::read_descriptor_limits().soft;
  troupe::sys::raise_descriptor_limit();
  // Errors quote what the user or a run directory gave (paths, file content): one escaping,
  // line by line, before the console sees them.
  const auto shown = [](const char* what) { return troupe::sys::printable_lines(what); };
  try {
    return dispatch(argc, argv, soft_descriptors_at_start);
  } catch (const troupe::cli::usage_error& e) {
    std::fprintf(stderr, "%s\n", shown(e.what()).c_str());
    return 2;
  } catch (const troupe::config_error& e) {
    std::fprintf(stderr, "troupe: %s\n", shown(e.what()).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: error: %s\n", shown(e.what()).c_str());
    return 1;
  }
}
