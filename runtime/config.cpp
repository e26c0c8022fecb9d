#include "runtime/config.hpp"

#include <charconv>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

namespace troupe {
namespace {

using json = nlohmann::json;

// One table of every field: its dotted name and how to read and write it. The config
// file, the command line and to_json all go through this table, so a knob is declared
// once.
struct field {
  std::string name;
  std::function<void(train_config&, const json&)> set;
  std::function<json(const train_config&)> get;
};

template <class T>
T parse_number(const std::string& name, const json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_string()) {
      auto s = v.get<std::string>();
      if (s == "true" || s == "1" || s == "yes") return true;
      if (s == "false" || s == "0" || s == "no") return false;
    }
    throw config_error("config: '" + name + "' must be true or false, got " + v.dump());
  } else if constexpr (std::is_integral_v<T>) {
    if (v.is_number_integer()) {
      auto x = v.get<int64_t>();
      if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (x > 0 &&
           static_cast<uint64_t>(x) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
        throw config_error("config: '" + name + "' is out of range: " + v.dump());
      return static_cast<T>(x);
    }
    if (v.is_string()) {
      auto s = v.get<std::string>();
      T x{};
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (ec == std::errc() && end == s.data() + s.size()) return x;
    }
    throw config_error("config: '" + name + "' must be an integer, got " + v.dump());
  } else {
    if (v.is_number()) return v.get<T>();
    if (v.is_string()) {
      auto s = v.get<std::string>();
      try {
        size_t used = 0;
        double x = std::stod(s, &used);
        if (used == s.size()) return static_cast<T>(x);
      } catch (const std::exception&) {
      }
    }
    throw config_error("config: '" + name + "' must be a number, got " + v.dump());
  }
}

template <class T>
field make_field(std::string name, T train_config::*member) {
  return {name,
          [name, member](train_config& c, const json& v) { c.*member = parse_number<T>(name, v); },
          [member](const train_config& c) { return json(c.*member); }};
}
template <class S, class T>
field make_field(std::string name, S train_config::*section, T S::*member) {
  return {name,
          [name, section, member](train_config& c, const json& v) {
            (c.*section).*member = parse_number<T>(name, v);
          },
          [section, member](const train_config& c) { return json((c.*section).*member); }};
}
template <class S>
field section_string_field(std::string name, S train_config::*section, std::string S::*member) {
  return {name,
          [name, section, member](train_config& c, const json& v) {
            if (!v.is_string())
              throw config_error("config: '" + name + "' must be a string, got " + v.dump());
            (c.*section).*member = v.get<std::string>();
          },
          [section, member](const train_config& c) { return json((c.*section).*member); }};
}
// The fault list: an array of specs in a config file, one spec per --fault (appended).
field faults_field() {
  const std::string name = "elastic.faults";
  return {name,
          [name](train_config& c, const json& v) {
            auto add = [&](const json& item) {
              if (!item.is_string())
                throw config_error("config: '" + name + "' must hold strings, got " + item.dump());
              const auto spec = item.get<std::string>();
              if (spec.find(';') != std::string::npos)
                throw config_error("config: '" + name + "': a fault spec has no ';', got '" + spec +
                                   "'");
              if (!spec.empty()) c.elastic.faults += (c.elastic.faults.empty() ? "" : ";") + spec;
            };
            if (v.is_array()) {
              c.elastic.faults.clear();
              for (const auto& item : v) add(item);
            } else {
              add(v);
            }
          },
          [](const train_config& c) {
            json out = json::array();
            size_t start = 0;
            while (start < c.elastic.faults.size()) {
              auto end = c.elastic.faults.find(';', start);
              if (end == std::string::npos) end = c.elastic.faults.size();
              out.push_back(c.elastic.faults.substr(start, end - start));
              start = end + 1;
            }
            return out;
          }};
}

field string_field(std::string name, std::string train_config::*member) {
  return {name,
          [name, member](train_config& c, const json& v) {
            if (!v.is_string())
              throw config_error("config: '" + name + "' must be a string, got " + v.dump());
            c.*member = v.get<std::string>();
          },
          [member](const train_config& c) { return json(c.*member); }};
}

const std::vector<field>& fields() {
  static const std::vector<field> table = {
      make_field("model.n_layer", &train_config::model, &model_config::n_layer),
      make_field("model.n_head", &train_config::model, &model_config::n_head),
      make_field("model.d_model", &train_config::model, &model_config::d_model),
      make_field("model.context", &train_config::model, &model_config::context),
      make_field("model.vocab", &train_config::model, &model_config::vocab),
      make_field("model.experts", &train_config::model, &model_config::experts),
      make_field("model.top_k", &train_config::model, &model_config::top_k),
      make_field("model.capacity_factor", &train_config::model, &model_config::capacity_factor),
      make_field("model.aux_loss_coef", &train_config::model, &model_config::aux_loss_coef),
      make_field("parallel.tp", &train_config::parallel, &parallel_config::tp),
      make_field("parallel.pp", &train_config::parallel, &parallel_config::pp),
      make_field("parallel.ep", &train_config::parallel, &parallel_config::ep),
      make_field("parallel.micro_batches", &train_config::parallel,
                 &parallel_config::micro_batches),
      make_field("parallel.zero", &train_config::parallel, &parallel_config::zero),
      section_string_field("parallel.schedule", &train_config::parallel,
                           &parallel_config::schedule),
      make_field("elastic.nodes", &train_config::elastic, &elastic_config::nodes),
      make_field("elastic.min_ranks", &train_config::elastic, &elastic_config::min_ranks),
      make_field("elastic.max_ranks", &train_config::elastic, &elastic_config::max_ranks),
      make_field("elastic.spares", &train_config::elastic, &elastic_config::spares),
      make_field("elastic.max_restarts", &train_config::elastic, &elastic_config::max_restarts),
      make_field("elastic.heartbeat_timeout_ms", &train_config::elastic,
                 &elastic_config::heartbeat_timeout_ms),
      section_string_field("elastic.straggler_policy", &train_config::elastic,
                           &elastic_config::straggler_policy),
      faults_field(),
      make_field("optim.lr", &train_config::optim, &optim_config::lr),
      make_field("optim.min_lr_ratio", &train_config::optim, &optim_config::min_lr_ratio),
      make_field("optim.warmup_steps", &train_config::optim, &optim_config::warmup_steps),
      make_field("optim.weight_decay", &train_config::optim, &optim_config::weight_decay),
      make_field("optim.beta1", &train_config::optim, &optim_config::beta1),
      make_field("optim.beta2", &train_config::optim, &optim_config::beta2),
      make_field("optim.eps", &train_config::optim, &optim_config::eps),
      make_field("optim.grad_clip", &train_config::optim, &optim_config::grad_clip),
      section_string_field("optim.freeze", &train_config::optim, &optim_config::freeze),
      make_field("world", &train_config::world),
      make_field("steps", &train_config::steps),
      make_field("batch", &train_config::batch),
      make_field("micro_batch", &train_config::micro_batch),
      make_field("seed", &train_config::seed),
      string_field("data", &train_config::data),
      make_field("val_fraction", &train_config::val_fraction),
      make_field("eval_every", &train_config::eval_every),
      make_field("eval_batches", &train_config::eval_batches),
      string_field("run_dir", &train_config::run_dir),
      make_field("resume", &train_config::resume),
      make_field("checkpoint_every", &train_config::checkpoint_every),
      make_field("exit_after_step", &train_config::exit_after_step),
      make_field("checkpoint_async", &train_config::checkpoint_async),
      string_field("checkpoint_overlap", &train_config::checkpoint_overlap),
      make_field("checkpoint_chunk_kib", &train_config::checkpoint_chunk_kib),
      make_field("keep_last", &train_config::keep_last),
      make_field("keep_every", &train_config::keep_every),
      make_field("replicate_checkpoints", &train_config::replicate_checkpoints),
      make_field("metrics_port", &train_config::metrics_port),
      string_field("metrics_host", &train_config::metrics_host),
      make_field("blas_threads", &train_config::blas_threads),
      make_field("step_timeout_ms", &train_config::step_timeout_ms),
      make_field("bucket_bytes", &train_config::bucket_bytes),
      make_field("progress", &train_config::progress),
      string_field("on_divergence", &train_config::on_divergence),
      make_field("max_rollbacks", &train_config::max_rollbacks),
  };
  return table;
}

const field* find_field(const std::string& name) {
  for (const auto& f : fields())
    if (f.name == name) return &f;
  return nullptr;
}

std::string known_names() {
  std::string out;
  for (const auto& f : fields()) out += (out.empty() ? "" : ", ") + f.name;
  return out;
}

void apply_object(train_config& cfg, const json& obj, const std::string& prefix) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (it.value().is_object() && !find_field(name)) {
      apply_object(cfg, it.value(), name);
      continue;
    }
    const field* f = find_field(name);
    if (!f) throw config_error("config: unknown key '" + name + "'; known keys: " + known_names());
    f->set(cfg, it.value());
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw config_error(message);
}

}  // namespace

void load_config_file(const std::string& path, train_config& cfg) {
  std::ifstream in(path);
  if (!in)
    throw config_error("config: cannot open config file '" + path + "'; check the --config path");
  json doc;
  try {
    doc = json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw config_error("config: '" + path + "' is not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object()) throw config_error("config: '" + path + "' must hold a JSON object");
  apply_object(cfg, doc, "");
}

void set_config_field(train_config& cfg, const std::string& name, const std::string& value) {
  const field* f = find_field(name);
  if (!f) throw config_error("config: unknown setting '" + name + "'; known: " + known_names());
  f->set(cfg, json(value));
}

void validate(const train_config& c) {
  const auto& m = c.model;
  require(m.n_layer >= 1, "config: model.n_layer must be >= 1");
  require(m.n_head >= 1, "config: model.n_head must be >= 1");
  require(m.d_model >= 1, "config: model.d_model must be >= 1");
  require(m.d_model % m.n_head == 0,
          "config: model.n_head (" + std::to_string(m.n_head) + ") must divide model.d_model (" +
              std::to_string(m.d_model) + "); pick a head count that divides it");
  require(m.context >= 2, "config: model.context must be >= 2");
  require(m.vocab == 256, "config: model.vocab must be 256 (the model reads bytes)");
  require(m.experts >= 0, "config: model.experts must be >= 0 (0 = dense MLP)");
  require(m.top_k == 1 || m.top_k == 2, "config: model.top_k must be 1 or 2");
  require(m.experts == 0 || m.top_k <= m.experts,
          "config: model.top_k must not exceed model.experts");
  require(m.capacity_factor > 0, "config: model.capacity_factor must be > 0");
  require(m.aux_loss_coef >= 0, "config: model.aux_loss_coef must be >= 0");
  const auto& p = c.parallel;
  require(p.tp >= 1 && p.pp >= 1 && p.ep >= 1,
          "config: parallel.tp, parallel.pp and parallel.ep must be >= 1");
  require(p.schedule == "gpipe" || p.schedule == "1f1b",
          "config: parallel.schedule must be gpipe or 1f1b");
  require(p.zero == 0 || p.zero == 1, "config: parallel.zero must be 0 or 1");
  require(p.micro_batches >= 0, "config: parallel.micro_batches must be >= 0");
  require(c.world >= 1 && c.world <= 256, "config: world must be between 1 and 256");
  require(c.steps >= 1, "config: steps must be >= 1");
  require(c.batch >= 1, "config: batch must be >= 1");
  require(c.micro_batch >= 1, "config: micro_batch must be >= 1");
  require(c.batch % c.micro_batch == 0, "config: batch (" + std::to_string(c.batch) +
                                            ") must be a multiple of micro_batch (" +
                                            std::to_string(c.micro_batch) + ")");
  const int micro_batches = c.batch / c.micro_batch;
  // With model parallelism fixed by the user the layout planner checks the data-parallel
  // share; for plain data parallelism every rank is a replica, so say it here in its terms.
  require(p.tp > 1 || p.pp > 1 || micro_batches % c.world == 0,
          "config: world (" + std::to_string(c.world) + ") must divide the " +
              std::to_string(micro_batches) + " micro-batches of a step (batch " +
              std::to_string(c.batch) + " / micro_batch " + std::to_string(c.micro_batch) +
              "); use --world " + std::to_string(micro_batches) +
              " or fewer that divides it, or change batch/micro_batch");
  require(c.val_fraction > 0 && c.val_fraction < 0.5, "config: val_fraction must be in (0, 0.5)");
  require(c.eval_every >= 0, "config: eval_every must be >= 0");
  require(c.eval_batches >= 1, "config: eval_batches must be >= 1");
  require(!c.run_dir.empty(), "config: run_dir must not be empty");
  require(c.checkpoint_every >= 0, "config: checkpoint_every must be >= 0 (0 = only at the end)");
  require(c.checkpoint_overlap == "wait" || c.checkpoint_overlap == "skip",
          "config: checkpoint_overlap (--checkpoint-overlap) must be wait or skip, got '" +
              c.checkpoint_overlap + "'");
  require(c.checkpoint_chunk_kib >= 4 && c.checkpoint_chunk_kib <= 262144,
          "config: checkpoint_chunk_kib (--checkpoint-chunk-kib) must be in 4..262144, got " +
              std::to_string(c.checkpoint_chunk_kib));
  require(c.keep_last >= 0, "config: keep_last (--keep-last) must be >= 0 (0 = keep all)");
  require(c.keep_every >= 0, "config: keep_every (--keep-every) must be >= 0 (0 = off)");
  require(!c.replicate_checkpoints || c.elastic.nodes >= 2,
          "config: replicate_checkpoints (--replicate-checkpoints) holds each rank's checkpoint in "
          "the memory of a rank on another node, so it needs --nodes 2 or more");
  require(c.exit_after_step >= 0 && c.exit_after_step <= c.steps,
          "config: exit_after_step must be in 0..steps (0 = off)");
  require(c.metrics_port >= 0 && c.metrics_port <= 65535,
          "config: metrics_port must be in 0..65535 (0 = off)");
  require(c.blas_threads >= 1, "config: blas_threads must be >= 1");
  require(c.step_timeout_ms >= 100, "config: step_timeout_ms must be >= 100");
  require(c.bucket_bytes >= 1024, "config: bucket_bytes must be >= 1024");
  require(c.on_divergence == "stop" || c.on_divergence == "rollback",
          "config: on_divergence (--on-divergence) must be stop or rollback, got '" +
              c.on_divergence + "'");
  require(c.max_rollbacks >= 0 && c.max_rollbacks <= 1000,
          "config: max_rollbacks (--max-rollbacks) must be in 0..1000, got " +
              std::to_string(c.max_rollbacks));
  const auto& e = c.elastic;
  require(e.max_restarts >= 0 && e.max_restarts <= 1000000,
          "config: elastic.max_restarts (--max-restarts) must be in 0..1000000, got " +
              std::to_string(e.max_restarts));
  require(e.spares >= 0 && e.spares <= 256,
          "config: elastic.spares (--spares) must be in 0..256, got " + std::to_string(e.spares));
  require(e.nodes >= 1 && e.nodes <= c.world + e.spares,
          "config: elastic.nodes (--nodes) must be in 1..world+spares (" +
              std::to_string(c.world + e.spares) + "), got " + std::to_string(e.nodes));
  require(e.min_ranks >= 1 && e.min_ranks <= c.world,
          "config: elastic.min_ranks (--min-ranks) must be in 1..world (" +
              std::to_string(c.world) + "), got " + std::to_string(e.min_ranks));
  require(e.max_ranks == 0 || (e.max_ranks >= c.world && e.max_ranks <= 256),
          "config: elastic.max_ranks (--max-ranks) must be 0 (= world) or in world..256, got " +
              std::to_string(e.max_ranks));
  require(e.heartbeat_timeout_ms >= 100 && e.heartbeat_timeout_ms <= 3600000,
          "config: elastic.heartbeat_timeout_ms (--heartbeat-timeout-ms) must be in 100..3600000, "
          "got " +
              std::to_string(e.heartbeat_timeout_ms));
  require(e.straggler_policy == "warn" || e.straggler_policy == "rebalance" ||
              e.straggler_policy == "evict",
          "config: elastic.straggler_policy (--straggler-policy) must be warn, rebalance or evict, "
          "got '" +
              e.straggler_policy + "'");
}

std::string to_json(const train_config& cfg) {
  json out = json::object();
  for (const auto& f : fields()) {
    auto dot = f.name.find('.');
    if (dot == std::string::npos)
      out[f.name] = f.get(cfg);
    else
      out[f.name.substr(0, dot)][f.name.substr(dot + 1)] = f.get(cfg);
  }
  return out.dump();
}

train_config config_from_json(const std::string& text) {
  train_config cfg;
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::parse_error& e) {
    throw config_error(std::string("config: malformed config JSON (") + e.what() + ")");
  }
  apply_object(cfg, doc, "");
  return cfg;
}

}  // namespace troupe
