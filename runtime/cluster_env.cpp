#include "runtime/cluster_env.hpp"

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "runtime/config.hpp"

namespace troupe {
namespace {

// A count in a variable: digits only, within int.
std::optional<int> count_of(const env_reader& env, const std::string& name, bool required) {
  const auto v = env(name);
  if (!v || v->empty()) {
    if (required)
      throw usage_error("the Slurm environment: " + name +
                        " is not set, but SLURM_JOB_ID is; is this a Slurm job?");
    return std::nullopt;
  }
  const bool digits = v->size() <= 9 && v->find_first_not_of("0123456789") == std::string::npos;
  if (!digits)
    throw usage_error("the Slurm environment: " + name + " must be a non-negative number, got '" +
                      *v + "'");
  return std::stoi(*v);
}

std::vector<std::string> split_top_level(const std::string& expr, const std::string& what) {
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : expr) {
    if (c == '[') ++depth;
    if (c == ']' && --depth < 0) break;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
      continue;
    }
    cur += c;
  }
  if (depth != 0)
    throw usage_error("the Slurm environment: " + what + " has unbalanced brackets: '" + expr +
                      "'");
  parts.push_back(cur);
  return parts;
}

// One name with bracket groups, expanded left to right ("a[1-2]b[3,5]": a1b3 a1b5 a2b3 a2b5).
void expand_one(const std::string& name, const std::string& what, const std::string& expr,
                std::vector<std::string>& out) {
  const auto bad = [&](const std::string& why) {
    return usage_error("the Slurm environment: " + what + " is not a Slurm hostlist (" + why +
                       "): '" + expr + "'");
  };
  const size_t open = name.find('[');
  if (open == std::string::npos) {
    if (name.empty()) throw bad("an empty host name");
    if (name.find(']') != std::string::npos) throw bad("']' without '['");
    out.push_back(name);
    return;
  }
  const size_t close = name.find(']', open);
  if (close == std::string::npos) throw bad("'[' without ']'");
  const std::string prefix = name.substr(0, open), rest = name.substr(close + 1);
  const std::string body = name.substr(open + 1, close - open - 1);
  if (body.empty()) throw bad("an empty range");
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    const std::string range = body.substr(start, comma - start);
    const size_t dash = range.find('-');
    const std::string lo = range.substr(0, dash);
    const std::string hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    const auto is_number = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
    };
    if (!is_number(lo) || !is_number(hi)) throw bad("range '" + range + "'");
    const long a = std::stol(lo), b = std::stol(hi);
    if (b < a) throw bad("range '" + range + "' runs backwards");
    if (b - a > 65535) throw bad("range '" + range + "' is too long");
    const size_t width = lo.size();  // "07-10": 07 08 09 10
    for (long i = a; i <= b; ++i) {
      std::string n = std::to_string(i);
      if (n.size() < width) n.insert(0, width - n.size(), '0');
      expand_one(prefix + n + rest, what, expr, out);
      if (out.size() > 100000) throw bad("more than 100000 hosts");
    }
    start = comma + 1;
  }
}

}  // namespace

env_reader process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

env_reader environment_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::vector<std::string> expand_hostlist(const std::string& expr, const std::string& what) {
  std::vector<std::string> out;
  if (expr.empty()) return out;
  for (const auto& part : split_top_level(expr, what)) expand_one(part, what, expr, out);
  return out;
}

std::optional<slurm_env> read_slurm_env(const env_reader& env) {
  const auto id = env("SLURM_JOB_ID");
  if (!id || id->empty()) return std::nullopt;
  slurm_env s;
  s.job_id = *id;
  if (s.job_id.find_first_not_of("0123456789_") != std::string::npos || s.job_id.size() > 32)
    throw usage_error("the Slurm environment: SLURM_JOB_ID must be a job id, got '" + s.job_id +
                      "'");
  s.restart_count = count_of(env, "SLURM_RESTART_COUNT", false).value_or(0);
  if (auto list = env("SLURM_JOB_NODELIST"))
    s.job_nodes = expand_hostlist(*list, "SLURM_JOB_NODELIST");
  s.job_num_nodes =
      count_of(env, "SLURM_JOB_NUM_NODES", false).value_or(static_cast<int>(s.job_nodes.size()));
  if (!s.job_nodes.empty() && s.job_num_nodes != static_cast<int>(s.job_nodes.size()))
    throw usage_error("the Slurm environment: SLURM_JOB_NUM_NODES is " +
                      std::to_string(s.job_num_nodes) + " but SLURM_JOB_NODELIST names " +
                      std::to_string(s.job_nodes.size()) + " nodes");
  // "2(x3)" or "2,1" (uneven) is not one number: no per-node count to use then.
  if (auto tpn = env("SLURM_NTASKS_PER_NODE");
      tpn && !tpn->empty() && tpn->find_first_not_of("0123456789") == std::string::npos)
    s.tasks_per_node = count_of(env, "SLURM_NTASKS_PER_NODE", false).value_or(0);
  s.node_name = env("SLURMD_NODENAME").value_or("");
  if (auto step = env("SLURM_STEP_ID"); step && !step->empty()) {
    s.in_step = true;
    s.node_id = *count_of(env, "SLURM_NODEID", true);
    s.local_id = *count_of(env, "SLURM_LOCALID", true);
    if (auto list = env("SLURM_STEP_NODELIST"))
      s.step_nodes = expand_hostlist(*list, "SLURM_STEP_NODELIST");
    s.step_num_nodes = count_of(env, "SLURM_STEP_NUM_NODES", false)
                           .value_or(count_of(env, "SLURM_NNODES", false)
                                         .value_or(static_cast<int>(s.step_nodes.size())));
    if (s.step_num_nodes > 0 && s.node_id >= s.step_num_nodes)
      throw usage_error("the Slurm environment: SLURM_NODEID " + std::to_string(s.node_id) +
                        " is not below the step's " + std::to_string(s.step_num_nodes) + " nodes");
  }
  return s;
}

std::optional<int> read_completion_index(const env_reader& env) {
  const auto v = env("JOB_COMPLETION_INDEX");
  if (!v || v->empty()) return std::nullopt;
  if (v->size() > 9 || v->find_first_not_of("0123456789") != std::string::npos)
    throw usage_error(
        "the Kubernetes environment: JOB_COMPLETION_INDEX must be a non-negative "
        "number (an Indexed Job's pod index), got '" +
        *v + "'");
  return std::stoi(*v);
}

std::string to_json(const rendezvous& r) {
  return nlohmann::json{{"job", r.job},   {"host", r.host},   {"port", r.port},
                        {"node", r.node}, {"nodes", r.nodes}, {"pid", r.pid}}
             .dump() +
         "\n";
}

rendezvous parse_rendezvous(const std::string& text) {
  if (text.size() > 4096) throw std::runtime_error("larger than 4 KiB");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("not JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw std::runtime_error("not a JSON object");
  const auto field = [&](const char* name, bool number) -> const nlohmann::json& {
    if (!j.contains(name)) throw std::runtime_error(std::string("no \"") + name + "\"");
    const auto& v = j.at(name);
    if (number ? !v.is_number_integer() : !v.is_string())
      throw std::runtime_error(std::string("\"") + name + "\" is not " +
                               (number ? "an integer" : "a string"));
    return v;
  };
  rendezvous r;
  r.job = field("job", false).get<std::string>();
  r.host = field("host", false).get<std::string>();
  const auto port = field("port", true).get<int64_t>();
  if (port < 1 || port > 65535) throw std::runtime_error("\"port\" is not in 1..65535");
  r.port = static_cast<uint16_t>(port);
  r.node = field("node", false).get<std::string>();
  r.nodes = static_cast<int>(field("nodes", true).get<int64_t>());
  r.pid = field("pid", true).get<int64_t>();
  if (r.host.empty()) throw std::runtime_error("\"host\" is empty");
  return r;
}

}  // namespace troupe
