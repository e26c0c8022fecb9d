#include "runtime/settings.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace troupe {
namespace {

using json = nlohmann::json;

// How one setting is read from and written to a train_config: its key, and two accessors.
struct accessors {
  std::string key;
  std::function<void(train_config&, const json&)> set;
  std::function<json(const train_config&)> get;
};

// A value as a message quotes it: JSON text, cut short so a huge value cannot flood the console.
std::string shown(const json& v) {
  if (v.is_string() && v.get_ref<const std::string&>().empty()) return "an empty value";
  std::string s = v.dump();
  if (s.size() > 64) s = s.substr(0, 60) + "...";
  return s;
}

// Numbers are read strictly: the whole text and nothing else (no blanks, no trailing
// characters, no "nan" or "inf"), and an integer that does not fit its field is out of range,
// never wrapped. A JSON integer is range-checked the same way.
template <class T>
T parse_number(const std::string& name, const json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
    if (v.is_string()) {
      auto s = v.get<std::string>();
      if (s == "true" || s == "1" || s == "yes") return true;
      if (s == "false" || s == "0" || s == "no") return false;
    }
    throw config_error("config: '" + name + "' must be true or false, got " + shown(v));
  } else if constexpr (std::is_integral_v<T>) {
    const std::string range = std::to_string(std::numeric_limits<T>::min()) + ".." +
                              std::to_string(std::numeric_limits<T>::max());
    const auto out_of_range = [&] {
      return config_error("config: '" + name + "' is out of range: it must be an integer in " +
                          range + ", got " + shown(v));
    };
    if (v.is_number_unsigned()) {
      const auto x = v.get<uint64_t>();
      if (x > static_cast<uint64_t>(std::numeric_limits<T>::max())) throw out_of_range();
      return static_cast<T>(x);
    }
    if (v.is_number_integer()) {
      const auto x = v.get<int64_t>();
      if (x < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
          (x > 0 &&
           static_cast<uint64_t>(x) > static_cast<uint64_t>(std::numeric_limits<T>::max())))
        throw out_of_range();
      return static_cast<T>(x);
    }
    if (v.is_string()) {
      const auto& s = v.get_ref<const std::string&>();
      const char* first = s.data();
      const char* last = s.data() + s.size();
      T x{};
      auto [end, ec] = std::from_chars(first, last, x);
      if (ec == std::errc() && end == last) return x;
      if (ec == std::errc::result_out_of_range && end == last) throw out_of_range();
      // "2e9" or "1e30": a number, but not an integer's text.
      double d = 0;
      auto [dend, dec] = std::from_chars(first, last, d);
      if (!s.empty() && dend == last &&
          (dec == std::errc::result_out_of_range || (dec == std::errc() && std::isfinite(d)))) {
        if (dec == std::errc::result_out_of_range ||
            (d == std::floor(d) && (d < static_cast<double>(std::numeric_limits<T>::min()) ||
                                    d > static_cast<double>(std::numeric_limits<T>::max()))))
          throw out_of_range();
        throw config_error("config: '" + name + "' must be an integer in " + range +
                           " written as digits, got " + shown(v));
      }
    }
    throw config_error("config: '" + name + "' must be an integer (" + range + "), got " +
                       shown(v));
  } else {
    double x = 0;
    bool parsed = false;
    if (v.is_number()) {
      x = v.get<double>();
      parsed = true;
    } else if (v.is_string()) {
      const auto& s = v.get_ref<const std::string&>();
      auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
      if (end == s.data() + s.size() && !s.empty()) {
        if (ec == std::errc::result_out_of_range)
          throw config_error("config: '" + name + "' must be a finite number, got " + shown(v) +
                             ", which is out of range for a double");
        parsed = ec == std::errc();
      }
    }
    if (parsed && std::isfinite(x)) return static_cast<T>(x);
    throw config_error("config: '" + name + "' must be a finite number, got " + shown(v));
  }
}

template <class T>
accessors make_field(std::string name, T train_config::*member) {
  return {name,
          [name, member](train_config& c, const json& v) { c.*member = parse_number<T>(name, v); },
          [member](const train_config& c) { return json(c.*member); }};
}
template <class S, class T>
accessors make_field(std::string name, S train_config::*section, T S::*member) {
  return {name,
          [name, section, member](train_config& c, const json& v) {
            (c.*section).*member = parse_number<T>(name, v);
          },
          [section, member](const train_config& c) { return json((c.*section).*member); }};
}
template <class S>
accessors section_string_field(std::string name, S train_config::*section, std::string S::*member) {
  return {name,
          [name, section, member](train_config& c, const json& v) {
            if (!v.is_string())
              throw config_error("config: '" + name + "' must be a string, got " + shown(v));
            (c.*section).*member = v.get<std::string>();
          },
          [section, member](const train_config& c) { return json((c.*section).*member); }};
}
// The user's worker program: an array of strings (the argv after `troupe run ... --`).
accessors command_field() {
  const std::string name = "workload.command";
  return {
      name,
      [name](train_config& c, const json& v) {
        if (!v.is_array())
          throw config_error("config: '" + name + "' must be an array of strings, got " + shown(v));
        std::vector<std::string> argv;
        for (const auto& item : v) {
          if (!item.is_string())
            throw config_error("config: '" + name + "' must hold strings, got " + shown(item));
          argv.push_back(item.get<std::string>());
        }
        if (!argv.empty() && argv.front().empty())
          throw config_error("config: '" + name + "' names an empty program");
        c.workload_command = std::move(argv);
      },
      [](const train_config& c) { return json(c.workload_command); }};
}
// The fault list: an array of specs in a config file, one spec per --fault (appended).
accessors faults_field() {
  const std::string name = "elastic.faults";
  return {name,
          [name](train_config& c, const json& v) {
            auto add = [&](const json& item) {
              if (!item.is_string())
                throw config_error("config: '" + name + "' must hold strings, got " + shown(item));
              const auto spec = item.get<std::string>();
              if (spec.empty())
                throw config_error("config: '" + name +
                                   "' holds an empty fault spec; give one such as "
                                   "kill:rank=1:step=8, or leave it out");
              if (spec.find(';') != std::string::npos)
                throw config_error("config: '" + name + "': a fault spec has no ';', got '" + spec +
                                   "'");
              c.elastic.faults += (c.elastic.faults.empty() ? "" : ";") + spec;
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

accessors string_field(const std::string& name, std::string train_config::*member) {
  return {name,
          [name, member](train_config& c, const json& v) {
            if (!v.is_string())
              throw config_error("config: '" + name + "' must be a string, got " + shown(v));
            c.*member = v.get<std::string>();
          },
          [member](const train_config& c) { return json(c.*member); }};
}

using about = setting_about;

setting make(accessors a, about m) {
  setting s;
  static_cast<setting_about&>(s) = std::move(m);
  s.key = std::move(a.key);
  s.set = std::move(a.set);
  s.get = std::move(a.get);
  return s;
}

// Help sections, in the order --help lists them.
const char* const g_model = "model";
const char* const g_train = "training";
const char* const g_layout = "parallel layout";
const char* const g_ckpt = "run directory and checkpoints";
const char* const g_elastic =
    "elastic recovery (a lost rank is replaced in place; the job goes on)";
const char* const g_safety = "faults, divergence and deadlines";
const char* const g_etcd =
    "coordinator leadership through etcd (one coordinator leads; standbys take over)";
const char* const g_out = "metrics and output";

constexpr bool may_change = true;    // a resumed job may give it another value
constexpr bool shapes_math = false;  // it must match the checkpoint's
constexpr double big = 1e9;          // "no practical limit" for counts of steps

std::vector<setting> build_table() {
  using tc = train_config;
  std::vector<setting> t;
  auto add = [&](accessors a, about m) { t.push_back(make(std::move(a), std::move(m))); };
  // ---- model
  add(make_field("model.n_layer", &tc::model, &model_config::n_layer),
      {"--layers", "N", g_model, shapes_math, "transformer blocks (default 4)", 1, 1024});
  add(make_field("model.n_head", &tc::model, &model_config::n_head),
      {"--heads", "N", g_model, shapes_math, "attention heads; must divide --d-model (default 4)",
       1, 1024});
  add(make_field("model.d_model", &tc::model, &model_config::d_model),
      {"--d-model", "N", g_model, shapes_math, "embedding width (default 128)", 1, 65536});
  add(make_field("model.context", &tc::model, &model_config::context),
      {"--context", "N", g_model, shapes_math, "tokens per sequence (default 64)", 2, 65536});
  add(make_field("model.vocab", &tc::model, &model_config::vocab),
      {"--vocab", "N", g_model, shapes_math,
       "vocabulary size (default: the data's: 256 for a text file, its sidecar's vocab_size for "
       "a token file); at least the data's",
       0, 1 << 24, " (0 = the data's)"});
  add(make_field("model.experts", &tc::model, &model_config::experts),
      {"--experts", "E", g_model, shapes_math, "experts per MoE MLP; 0 = a dense MLP (default 0)",
       0, 1024, " (0 = dense MLP)"});
  add(make_field("model.top_k", &tc::model, &model_config::top_k),
      {"--top-k", "K", g_model, shapes_math, "experts each token is routed to (default 1)", 1, 2});
  add(make_field("model.capacity_factor", &tc::model, &model_config::capacity_factor),
      {.flag = "--capacity-factor",
       .value_name = "X",
       .group = g_model,
       .resumable = shapes_math,
       .help = "expert capacity = ceil(X x tokens x top-k / experts) (default 1.25)",
       .lo = 0,
       .hi = 64,
       .lo_open = true});
  add(make_field("model.aux_loss_coef", &tc::model, &model_config::aux_loss_coef),
      {"--aux-loss-coef", "X", g_model, shapes_math,
       "weight of the MoE load-balancing loss (default 0.01)", 0, 100});
  // ---- training
  add(make_field("world", &tc::world),
      {"--world", "N", g_train, may_change,
       "worker ranks (default 2); the global batch stays the same for any world", 1, 1 << 17});
  add(make_field("steps", &tc::steps),
      {"--steps", "N", g_train, may_change,
       "training steps: the learning-rate schedule's length (default 400); raised on "
       "--resume, the schedule decays on from where it is, without a jump",
       1, big});
  add(make_field("batch", &tc::batch),
      {"--batch", "N", g_train, shapes_math,
       "global batch in sequences per step, for any world size (default 16)", 1, 1 << 20});
  add(make_field("micro_batch", &tc::micro_batch),
      {"--micro-batch", "N", g_train, shapes_math,
       "sequences per forward/backward; divides --batch (default 4)"});
  add(make_field("seed", &tc::seed), {"--seed", "N", g_train, shapes_math,
                                      "seed for initialisation and data order (default 1337)"});
  add(make_field("optim.lr", &tc::optim, &optim_config::lr),
      {.flag = "--lr",
       .value_name = "X",
       .group = g_train,
       .resumable = shapes_math,
       .help = "peak learning rate of the warmup + cosine schedule (default 0.003)",
       .lo = 0,
       .hi = 1e6,
       .lo_open = true});
  add(make_field("optim.min_lr_ratio", &tc::optim, &optim_config::min_lr_ratio),
      {"--min-lr-ratio", "X", g_train, shapes_math,
       "the cosine decays to lr x X at --steps (default 0.1)", 0, 1});
  add(make_field("optim.warmup_steps", &tc::optim, &optim_config::warmup_steps),
      {"--warmup-steps", "N", g_train, shapes_math, "linear warmup steps (default 20)", 0, big});
  add(make_field("optim.weight_decay", &tc::optim, &optim_config::weight_decay),
      {"--weight-decay", "X", g_train, shapes_math, "AdamW's decoupled weight decay (default 0.1)",
       0, 100});
  add(make_field("optim.beta1", &tc::optim, &optim_config::beta1),
      {.flag = "--beta1",
       .value_name = "X",
       .group = g_train,
       .resumable = shapes_math,
       .help = "AdamW's beta1 (default 0.9)",
       .lo = 0,
       .hi = 1,
       .hi_open = true});
  add(make_field("optim.beta2", &tc::optim, &optim_config::beta2),
      {.flag = "--beta2",
       .value_name = "X",
       .group = g_train,
       .resumable = shapes_math,
       .help = "AdamW's beta2 (default 0.95)",
       .lo = 0,
       .hi = 1,
       .hi_open = true});
  add(make_field("optim.eps", &tc::optim, &optim_config::eps),
      {.flag = "--adam-eps",
       .value_name = "X",
       .group = g_train,
       .resumable = shapes_math,
       .help = "AdamW's epsilon (default 1e-8)",
       .lo = 0,
       .hi = 1,
       .lo_open = true});
  add(make_field("optim.grad_clip", &tc::optim, &optim_config::grad_clip),
      {"--grad-clip", "X", g_train, shapes_math,
       "clip the gradients' global L2 norm to X; 0 = off (default 1)", 0, 1e6, " (0 = off)"});
  add(section_string_field("optim.freeze", &tc::optim, &optim_config::freeze),
      {"--freeze", "PATTERN", g_train, may_change,
       "parameters whose name matches (substring, or a '*' glob of the whole name; "
       "comma-separated) are not trained; their checkpoint chunks are then shared, not "
       "rewritten"});
  // Written by a resume that changes --steps (optim_config): no flag, in config.json only.
  add(make_field("optim.rebase_step", &tc::optim, &optim_config::rebase_step),
      {"", "", g_train, may_change, "where a resumed run's schedule was re-based", 0, big});
  add(make_field("optim.rebase_lr", &tc::optim, &optim_config::rebase_lr),
      {"", "", g_train, may_change, "the learning rate it was re-based from", 0, 1e6});
  add(string_field("data", &tc::data),
      {"--data", "FILE", g_train, may_change,
       "training text, or a token file with its FILE.json sidecar (troupe tokenize) (default: "
       "the King James Bible corpus built at setup)"});
  add(string_field("val_data", &tc::val_data),
      {"--val-data", "FILE", g_train, may_change,
       "validation corpus, like --data (default: val.bin beside a token file train.bin, else "
       "the last --val-fraction of --data)"});
  add(make_field("val_fraction", &tc::val_fraction),
      {.flag = "--val-fraction",
       .value_name = "X",
       .group = g_train,
       .resumable = shapes_math,
       .help = "tail of the corpus held out for validation, without a validation file "
               "(default 0.05)",
       .lo = 0,
       .hi = 0.5,
       .lo_open = true,
       .hi_open = true});
  add(make_field("eval_every", &tc::eval_every),
      {"--eval-every", "K", g_train, may_change,
       "validation loss every K steps; 0 = only at the end (default 100)", 0, big,
       " (0 = only at the end)"});
  add(make_field("eval_batches", &tc::eval_batches),
      {"--eval-batches", "N", g_train, may_change,
       "micro-batches per validation estimate (default 8)", 1, 1 << 20});
  // ---- layout
  add(make_field("parallel.tp", &tc::parallel, &parallel_config::tp),
      {"--tp", "N", g_layout, may_change,
       "tensor-parallel size; dp is the rest of the world. The planner checks the layout (and "
       "picks one when --tp, --pp, --ep are left at 1), naming the constraint a layout breaks",
       1, 256});
  add(make_field("parallel.pp", &tc::parallel, &parallel_config::pp),
      {"--pp", "N", g_layout, may_change, "pipeline-parallel size (default 1)", 1, 256});
  add(make_field("parallel.ep", &tc::parallel, &parallel_config::ep),
      {"--ep", "N", g_layout, may_change, "expert-parallel size (default 1)", 1, 256});
  add(make_field("parallel.micro_batches", &tc::parallel, &parallel_config::micro_batches),
      {"--micro-batches", "M", g_layout, may_change,
       "pipeline micro-batches per step; 0 = batch / micro-batch (default 0)", 0, 1 << 20,
       " (0 = batch / micro_batch)"});
  add(section_string_field("parallel.schedule", &tc::parallel, &parallel_config::schedule),
      {.flag = "--schedule",
       .value_name = "NAME",
       .group = g_layout,
       .resumable = may_change,
       .help = "pipeline schedule (default 1f1b)",
       .choices = {"gpipe", "1f1b"}});
  add(make_field("parallel.zero", &tc::parallel, &parallel_config::zero),
      {"--zero", "0|1", g_layout, may_change,
       "1 = ZeRO-1: the optimizer state sharded over the data-parallel ranks (default 0)", 0, 1});
  add(section_string_field("parallel.reduction", &tc::parallel, &parallel_config::reduction),
      {.flag = "--reduction",
       .value_name = "MODE",
       .group = g_layout,
       .resumable = may_change,
       .help = "exact: the micro-batch gradients and the loss are summed in one order whatever "
               "the world, so a job gives the same bits on 1 or 4 ranks, through losses and "
               "rejoins (the built-in GPT under dp, --zero 1, and a fixed --tp and --pp); fast: "
               "each rank sums its own first; auto: exact where it applies (not with experts "
               "or a program of your own), else fast (default auto)",
       .choices = {"auto", "fast", "exact"}});
  // ---- run directory and checkpoints
  add(string_field("run_dir", &tc::run_dir),
      {"--run-dir", "DIR", g_ckpt, may_change,
       "where config.json, events.jsonl and the checkpoints go (default runs/latest)"});
  add(make_field("resume", &tc::resume),
      {"--resume", "", g_ckpt, may_change,
       "continue the run in --run-dir from its latest committed checkpoint, with its own "
       "config.json: options given beside it change only settings a resume may change"});
  add(make_field("checkpoint_every", &tc::checkpoint_every),
      {"--checkpoint-every", "K", g_ckpt, may_change,
       "checkpoint every K steps; 0 = only at the end (default 100)", 0, big,
       " (0 = only at the end)"});
  add(make_field("exit_after_step", &tc::exit_after_step),
      {"--exit-after-step", "N", g_ckpt, may_change,
       "stop cleanly after step N with a checkpoint (the schedule still runs to --steps; "
       "--resume continues); 0 = off"});
  add(make_field("checkpoint_async", &tc::checkpoint_async),
      {.flag = "--no-checkpoint-async",
       .value_name = "",
       .group = g_ckpt,
       .resumable = may_change,
       .help = "write checkpoints inside the step instead of in the background",
       .switch_sets = false});
  add(string_field("checkpoint_overlap", &tc::checkpoint_overlap),
      {.flag = "--checkpoint-overlap",
       .value_name = "wait|skip",
       .group = g_ckpt,
       .resumable = may_change,
       .help = "a checkpoint due while the previous one is still being written waits for it, or is "
               "skipped (default wait)",
       .choices = {"wait", "skip"}});
  add(string_field("verify_checkpoints", &tc::verify_checkpoints),
      {.flag = "--verify-checkpoints",
       .value_name = "after-write|off",
       .group = g_ckpt,
       .resumable = may_change,
       .help = "each rank reads every chunk it wrote back from the disk and checks it before the "
               "checkpoint may commit (default off)",
       .choices = {"after-write", "off"}});
  add(make_field("checkpoint_chunk_kib", &tc::checkpoint_chunk_kib),
      {"--checkpoint-chunk-kib", "K", g_ckpt, may_change,
       "chunk size of the deduplicating checkpoint store (default 1024)", 4, 262144});
  add(make_field("keep_last", &tc::keep_last),
      {"--keep-last", "K", g_ckpt, may_change,
       "committed checkpoints kept; older ones and their unshared chunks are removed; 0 = keep "
       "all (default 3)",
       0, big, " (0 = keep all)"});
  add(make_field("keep_every", &tc::keep_every),
      {"--keep-every", "N", g_ckpt, may_change,
       "also keep every checkpoint whose step is a multiple of N; 0 = off (default 0)", 0, big,
       " (0 = off)"});
  add(make_field("replicate_checkpoints", &tc::replicate_checkpoints),
      {"--replicate-checkpoints", "", g_ckpt, may_change,
       "also hold each rank's latest checkpoint chunks in the memory of a rank on another node "
       "(needs --nodes 2+); a restore reads them from there before the disk"});
  // ---- elastic
  add(make_field("elastic.nodes", &tc::elastic, &elastic_config::nodes),
      {"--nodes", "N", g_elastic, may_change,
       "agents (simulated nodes) troupe run starts on this machine, sharing the ranks "
       "(default 1)"});
  add(make_field("elastic.min_ranks", &tc::elastic, &elastic_config::min_ranks),
      {"--min-ranks", "N", g_elastic, may_change,
       "fewer live ranks than this ends the job (default 1)"});
  add(make_field("elastic.max_ranks", &tc::elastic, &elastic_config::max_ranks),
      {"--max-ranks", "N", g_elastic, may_change,
       "the world grows back up to this when workers join; 0 = --world (default 0)"});
  add(make_field("elastic.spares", &tc::elastic, &elastic_config::spares),
      {"--spares", "K", g_elastic, may_change,
       "started, idle workers that take a lost rank's place (default 0)", 0, 1 << 17});
  add(make_field("elastic.max_restarts", &tc::elastic, &elastic_config::max_restarts),
      {"--max-restarts", "N", g_elastic, may_change,
       "each agent restarts a dead worker up to N times and it rejoins in its old place "
       "(default 0). Unlike torchrun's, one worker is restarted, not the whole group: the "
       "others keep training",
       0, 1000000});
  add(make_field("elastic.heartbeat_timeout_ms", &tc::elastic,
                 &elastic_config::heartbeat_timeout_ms),
      {"--heartbeat-timeout-ms", "MS", g_elastic, may_change,
       "a worker silent this long is declared hung and replaced; a worker that hears nothing "
       "from the coordinator for twice this long stops computing (default 2000)",
       100, 3600000});
  add(make_field("elastic.coordinator_timeout_ms", &tc::elastic,
                 &elastic_config::coordinator_timeout_ms),
      {"--coordinator-timeout-ms", "MS", g_elastic, may_change,
       "workers wait this long for a silent coordinator before they fence themselves and exit, "
       "and agents stop their workers and look for the leader (--rejoin-timeout-ms); with "
       "--coordinators K both look for the new leader after a heartbeat timeout; longer than "
       "the heartbeat timeout; 0 = 5 x it (default 0)"});
  add(make_field("elastic.rejoin_timeout_ms", &tc::elastic, &elastic_config::rejoin_timeout_ms),
      {"--rejoin-timeout-ms", "MS", g_elastic, may_change,
       "an agent cut off from every coordinator stops its workers but keeps looking for the "
       "leader this long, then rejoins with new workers and the job grows back; past it the "
       "agent exits 1. 0 = it exits at once (default 600000: a switch's reboot)",
       0, 86400000, " (0 to 24 h)"});
  add(make_field("elastic.join_timeout_ms", &tc::elastic, &elastic_config::join_timeout_ms),
      {"--join-timeout-ms", "MS", g_elastic, may_change,
       "every first worker must join within this; one that dies before it joins is restarted "
       "or left out while --min-ranks allows (default 60000)",
       1000, 86400000, " (1 s to 24 h)"});
  add(make_field("elastic.replacement_wait_ms", &tc::elastic, &elastic_config::replacement_wait_ms),
      {"--replacement-wait-ms", "MS", g_elastic, may_change,
       "with --max-restarts: a recovery waits this long for a crashed worker's restart; 0 = "
       "shrink at once (default 1000)",
       0, 600000});
  add(make_field("elastic.relay", &tc::elastic, &elastic_config::relay),
      {"--relay", "", g_elastic, may_change,
       "each agent carries its node's votes and heartbeats to the coordinator as one message "
       "and hands out one commit for the node: a message per node instead of per rank "
       "(docs/benchmarks/scale.md); with --etcd the relays follow a takeover (default off)"});
  add(section_string_field("elastic.straggler_policy", &tc::elastic,
                           &elastic_config::straggler_policy),
      {.flag = "--straggler-policy",
       .value_name = "P",
       .group = g_elastic,
       .resumable = may_change,
       .help = "what is done about a rank whose compute stays --straggler-factor times the "
               "other ranks' (default warn)",
       .choices = {"warn", "rebalance", "evict"}});
  add(make_field("elastic.straggler_factor", &tc::elastic, &elastic_config::straggler_factor),
      {.flag = "--straggler-factor",
       .value_name = "X",
       .group = g_elastic,
       .resumable = may_change,
       .help = "a rank is a straggler when its compute CPU time stays X times the other "
               "ranks' for several steps; raise it on a host shared with other work "
               "(default 1.3)",
       .lo = 1,
       .hi = 100,
       .lo_open = true});
  // ---- faults, divergence, deadlines
  add(command_field(),
      {"", "", g_train, may_change,
       "the workers' program, set by `troupe run ... -- PROGRAM ARGS` (empty: the built-in "
       "GPT); a resume may name a fixed script"});
  add(faults_field(),
      {"--fault", "SPEC", g_safety, may_change,
       "inject a fault (repeatable): kill:rank=1:step=8, kill:node=1:step=12, "
       "stop:rank=2:step=5[:for=3s], slow:rank=0:factor=2:from=10, kill:coordinator:step=15"
       "[:commits=N], random:kills=10:seed=3, diverge:step=8[:rank=0]"});
  add(string_field("on_divergence", &tc::on_divergence),
      {.flag = "--on-divergence",
       .value_name = "stop|rollback",
       .group = g_safety,
       .resumable = may_change,
       .help =
           "a step with a non-finite loss or gradient norm is never committed: stop (exit 3), or "
           "roll back to the last checkpoint and skip the batch (default stop)",
       .choices = {"stop", "rollback"}});
  add(make_field("max_rollbacks", &tc::max_rollbacks),
      {"--max-rollbacks", "K", g_safety, may_change,
       "rollbacks before the job stops with exit 3 anyway (default 3)", 0, 1000});
  add(make_field("step_timeout_ms", &tc::step_timeout_ms),
      {"--step-timeout-ms", "MS", g_safety, may_change,
       "deadline for one step's collectives and votes (default 60000)", 100, 86400000,
       " (100 ms to 24 h)"});
  add(string_field("data_plane_auth", &tc::data_plane_auth),
      {.flag = "--data-plane-auth",
       .value_name = "tcp-md5|none",
       .group = g_safety,
       .resumable = may_change,
       .help =
           "the data plane's TCP pairs between nodes are signed with a key from the job's secret, "
           "so the kernel drops a stranger's connection, or open to whoever is first (default "
           "tcp-md5)",
       .choices = {"tcp-md5", "none"}});
  // ---- etcd
  add(section_string_field("etcd.endpoints", &tc::etcd, &etcd_config::endpoints),
      {"--etcd", "ENDPOINTS", g_etcd, may_change,
       "comma-separated http:// or https:// URLs of an etcd cluster, or `local` for one etcd "
       "member of the job's own (needs /usr/bin/etcd). The coordinator is elected leader and "
       "mirrors the job's state to /troupe/JOB_ID/; a leader that cannot renew its lease pauses "
       "the job; after --etcd-timeout-ms without etcd the job ends (exit 1)"});
  add(section_string_field("etcd.cacert", &tc::etcd, &etcd_config::cacert),
      {"--etcd-cacert", "FILE", g_etcd, may_change,
       "CA that signed etcd's certificate (required for https)"});
  add(section_string_field("etcd.cert", &tc::etcd, &etcd_config::cert),
      {"--etcd-cert", "FILE", g_etcd, may_change,
       "client certificate for etcd --client-cert-auth (with --etcd-key)"});
  add(section_string_field("etcd.key", &tc::etcd, &etcd_config::key),
      {"--etcd-key", "FILE", g_etcd, may_change, "the client certificate's key"});
  add(make_field("etcd.timeout_ms", &tc::etcd, &etcd_config::timeout_ms),
      {"--etcd-timeout-ms", "MS", g_etcd, may_change,
       "how long to wait for etcd and the election, and how long a job may go without a "
       "leader before it ends (default 60000)",
       100, 86400000, " (100 ms to 24 h)"});
  add(string_field("job_id", &tc::job_id),
      {"--job-id", "ID", g_etcd, may_change,
       "the job's name in etcd: letters, digits, '.', '_', '-' (default: one made unique for "
       "this run and kept in RUN_DIR/job_id)"});
  // ---- metrics and output
  add(make_field("metrics_port", &tc::metrics_port),
      {"--metrics-port", "PORT", g_out, may_change,
       "Prometheus metrics on HOST:PORT/metrics; 0 = no metrics (default 9400; with "
       "--coordinators K, coordinator i serves PORT+i)",
       0, 65535, " (0 = off)"});
  add(string_field("metrics_host", &tc::metrics_host),
      {"--metrics-host", "HOST", g_out, may_change,
       "address the metrics endpoint binds (default 127.0.0.1)"});
  add(string_field("metrics_token_file", &tc::metrics_token_file),
      {"--metrics-token", "FILE", g_out, may_change,
       "GET /metrics needs \"Authorization: Bearer <the file's first line>\" (mode 0600)"});
  add(make_field("metrics_rank_labels", &tc::metrics_rank_labels),
      {"--metrics-rank-labels", "N", g_out, may_change,
       "per-rank series up to N ranks; above N one series per node with its worst rank "
       "(default 64)",
       0, 100000, " (0 = always per node)"});
  add(make_field("peak_flops", &tc::peak_flops),
      {"--peak-flops", "F", g_out, may_change,
       "one rank's peak FLOP/s for the MFU estimate (troupe_mfu_ratio); 0 = measured when the job "
       "starts (a short "
       "sgemm) (default 0)",
       0, 1e21});
  add(make_field("blas_threads", &tc::blas_threads),
      {"--blas-threads", "N", g_out, may_change,
       "OpenBLAS threads per rank (default 1; ranks x threads should not exceed the cores)", 1,
       1024});
  add(make_field("bucket_bytes", &tc::bucket_bytes),
      {"--bucket-bytes", "N", g_out, may_change,
       "gradient all-reduce bucket size in bytes (default 4194304)", 1024, 1 << 30});
  add(make_field("progress", &tc::progress), {.flag = "--no-progress",
                                              .value_name = "",
                                              .group = g_out,
                                              .resumable = may_change,
                                              .help = "no progress line on stderr",
                                              .switch_sets = false});
  return t;
}

}  // namespace

std::string quoted_value(const json& v) { return shown(v); }

const std::vector<setting>& settings() {
  static const std::vector<setting> table = build_table();
  return table;
}

const setting* find_setting(const std::string& key) {
  for (const auto& s : settings())
    if (s.key == key) return &s;
  return nullptr;
}

const setting* find_setting_by_flag(const std::string& flag) {
  for (const auto& s : settings())
    if (s.flag == flag) return &s;
  return nullptr;
}

const std::vector<std::string>& setting_groups() {
  static const std::vector<std::string> groups = {g_model,   g_train,  g_layout, g_ckpt,
                                                  g_elastic, g_safety, g_etcd,   g_out};
  return groups;
}

std::string setting_text(const setting& s, const train_config& cfg) {
  const json v = s.get(cfg);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_array()) {
    std::string out;
    for (const auto& item : v) out += (out.empty() ? "" : ",") + item.get<std::string>();
    return out;
  }
  if (v.is_number_float()) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v.get<double>());
    return buf;
  }
  return v.dump();
}

}  // namespace troupe
