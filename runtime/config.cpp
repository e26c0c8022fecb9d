#include "runtime/config.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "runtime/preflight.hpp"

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
              throw config_error("config: '" + name + "' must be a string, got " + shown(v));
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

field string_field(std::string name, std::string train_config::*member) {
  return {name,
          [name, member](train_config& c, const json& v) {
            if (!v.is_string())
              throw config_error("config: '" + name + "' must be a string, got " + shown(v));
            c.*member = v.get<std::string>();
          },
          [member](const train_config& c) { return json(c.*member); }};
}

// The string fields whose empty value means "not set". A user's explicit "" is refused, never
// read as not set: `--data "$CORPUS"` with CORPUS unset must not train on the default corpus,
// nor `--metrics-token "$FILE"` serve /metrics to anyone.
struct unset_when_empty {
  const char* name;
  const char* means;  ///< what "" means, for the message
  const char* give;   ///< what to give instead
  /// A config file may hold "" for it: troupe's own RUN_DIR/config.json writes "" for "not
  /// set" there, and must read back with --config.
  bool in_files;
};
constexpr unset_when_empty empty_rules[] = {
    {"data", "train on the default corpus", "a corpus file", false},
    {"metrics_token_file", "serve /metrics without a token", "a token file", true},
    {"optim.freeze", "train every parameter", "a pattern", true},
};

// Refuses an explicit "" for a field where "" means "not set" (empty_rules).
void refuse_empty(const field& f, const json& v, bool in_file) {
  if (!v.is_string() || !v.get_ref<const std::string&>().empty()) return;
  for (const auto& rule : empty_rules)
    if (f.name == rule.name && !(in_file && rule.in_files))
      throw config_error("config: '" + f.name + "' is empty; give " + rule.give +
                         ", or leave it out to " + rule.means +
                         ": an empty value is not read as left out");
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
      make_field("elastic.coordinator_timeout_ms", &train_config::elastic,
                 &elastic_config::coordinator_timeout_ms),
      make_field("elastic.join_timeout_ms", &train_config::elastic,
                 &elastic_config::join_timeout_ms),
      make_field("elastic.replacement_wait_ms", &train_config::elastic,
                 &elastic_config::replacement_wait_ms),
      section_string_field("elastic.straggler_policy", &train_config::elastic,
                           &elastic_config::straggler_policy),
      faults_field(),
      section_string_field("etcd.endpoints", &train_config::etcd, &etcd_config::endpoints),
      section_string_field("etcd.cacert", &train_config::etcd, &etcd_config::cacert),
      section_string_field("etcd.cert", &train_config::etcd, &etcd_config::cert),
      section_string_field("etcd.key", &train_config::etcd, &etcd_config::key),
      make_field("etcd.timeout_ms", &train_config::etcd, &etcd_config::timeout_ms),
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
      string_field("verify_checkpoints", &train_config::verify_checkpoints),
      make_field("checkpoint_chunk_kib", &train_config::checkpoint_chunk_kib),
      make_field("keep_last", &train_config::keep_last),
      make_field("keep_every", &train_config::keep_every),
      make_field("replicate_checkpoints", &train_config::replicate_checkpoints),
      make_field("metrics_port", &train_config::metrics_port),
      string_field("metrics_host", &train_config::metrics_host),
      string_field("metrics_token_file", &train_config::metrics_token_file),
      make_field("metrics_rank_labels", &train_config::metrics_rank_labels),
      make_field("blas_threads", &train_config::blas_threads),
      make_field("peak_flops", &train_config::peak_flops),
      make_field("step_timeout_ms", &train_config::step_timeout_ms),
      make_field("bucket_bytes", &train_config::bucket_bytes),
      make_field("progress", &train_config::progress),
      string_field("on_divergence", &train_config::on_divergence),
      make_field("max_rollbacks", &train_config::max_rollbacks),
      string_field("data_plane_auth", &train_config::data_plane_auth),
      string_field("job_id", &train_config::job_id),
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

// True when `name` is a section of the config ("model", "optim", ...), not a field.
bool is_section(const std::string& name) {
  for (const auto& f : fields())
    if (f.name.size() > name.size() && f.name.compare(0, name.size(), name) == 0 &&
        f.name[name.size()] == '.')
      return true;
  return false;
}

// The keys a config file may hold inside `prefix` ("" = the top level; sections end in '.').
std::string keys_in(const std::string& prefix) {
  std::vector<std::string> out;
  const std::string lead = prefix.empty() ? "" : prefix + ".";
  for (const auto& f : fields()) {
    if (f.name.compare(0, lead.size(), lead) != 0) continue;
    std::string rest = f.name.substr(lead.size());
    if (auto dot = rest.find('.'); dot != std::string::npos) rest = rest.substr(0, dot) + ".";
    if (std::find(out.begin(), out.end(), rest) == out.end()) out.push_back(rest);
  }
  std::string text;
  for (const auto& k : out) text += (text.empty() ? "" : ", ") + k;
  return text;
}

// A config file says what a value is: a number where a number goes (not its text), true or
// false for a switch, a string for a name. The field's own value says which.
void require_json_type(const field& f, const train_config& cfg, const json& v) {
  const json now = f.get(cfg);
  bool ok = false;
  std::string want;
  if (now.is_boolean()) {
    ok = v.is_boolean();
    want = "true or false";
  } else if (now.is_number_integer()) {
    ok = v.is_number_integer();
    want = "an integer (a JSON number without a fraction or exponent)";
  } else if (now.is_number()) {
    ok = v.is_number();
    want = "a number";
  } else if (now.is_string()) {
    ok = v.is_string();
    want = "a string";
  } else {
    ok = v.is_string() || v.is_array();
    want = "a string or an array of strings";
  }
  if (!ok)
    throw config_error("config: '" + f.name + "' must be " + want + ", got " +
                       std::string(v.type_name()) + " " + shown(v));
}

// `from_file`: a user's config file (an explicit "" is refused where it means "not set"); else
// troupe's own JSON (config_from_json), which holds "" for what is not set.
void apply_object(train_config& cfg, const json& obj, const std::string& prefix, bool from_file) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
    const field* f = find_field(name);
    if (!f && is_section(name)) {
      if (!it.value().is_object())
        throw config_error("config: '" + name + "' must be an object with the keys " +
                           keys_in(name) + ", got " + std::string(it.value().type_name()) + " " +
                           shown(it.value()));
      apply_object(cfg, it.value(), name, from_file);
      continue;
    }
    if (!f)
      throw config_error(
          "config: unknown key '" + name + "'; the keys allowed " +
          (prefix.empty() ? std::string("at the top level") : "in '" + prefix + "'") + " are " +
          keys_in(prefix));
    require_json_type(*f, cfg, it.value());
    if (from_file) refuse_empty(*f, it.value(), true);
    f->set(cfg, it.value());
  }
}

// Config files are parsed within limits: a size cap (read no more than it), a nesting depth
// counted before parsing (so no deep document is ever built or recursed into), and no key
// twice in one object (JSON would silently keep the last).
constexpr size_t max_config_bytes = size_t{1} << 20;
constexpr int max_config_depth = 64;

void check_depth(const std::string& text, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (ch == '\\')
        escaped = true;
      else if (ch == '"')
        in_string = false;
      continue;
    }
    const char next = i + 1 < text.size() ? text[i + 1] : '\0';
    if (ch == '"') {
      in_string = true;
    } else if (ch == '/' && next == '/') {  // comments are allowed; brackets in them are not JSON
      i = text.find('\n', i);
      if (i == std::string::npos) break;
    } else if (ch == '/' && next == '*') {
      i = text.find("*/", i + 2);
      if (i == std::string::npos) break;
      ++i;
    } else if (ch == '{' || ch == '[') {
      if (++depth > max_config_depth)
        throw config_error("config: " + what + " nests objects and arrays deeper than " +
                           std::to_string(max_config_depth) + " levels (at byte " +
                           std::to_string(i) + "); the limit is " +
                           std::to_string(max_config_depth) + " (a troupe config is 3 deep)");
    } else if ((ch == '}' || ch == ']') && depth > 0) {
      --depth;
    }
  }
}

json parse_limited(const std::string& text, const std::string& what) {
  check_depth(text, what);
  struct open_value {
    bool object = false;
    std::string last_key;
    std::set<std::string> keys;
  };
  std::vector<open_value> open;
  const json::parser_callback_t refuse_duplicates = [&](int, json::parse_event_t event,
                                                        json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        open.push_back({event == json::parse_event_t::object_start, {}, {}});
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key: {
        if (open.empty()) break;
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open.back().keys.insert(key).second) {
          std::string path;
          for (size_t i = 0; i + 1 < open.size(); ++i)
            if (open[i].object) path += open[i].last_key + ".";
          throw config_error("config: " + what + " has the key '" + path + key +
                             "' twice in one object; keep one of them");
        }
        open.back().last_key = key;
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text, refuse_duplicates, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    throw config_error("config: " + what + " is not valid JSON (" + e.what() + ")");
  } catch (const json::out_of_range& e) {
    // A number no double holds (1e999): the parser gives up on the whole text, before the
    // value reaches a field. The keys open when it stopped name where the number was.
    std::string key;
    for (const auto& level : open)
      if (level.object) key += (key.empty() ? "" : ".") + level.last_key;
    const std::string said = e.what();  // "... number overflow parsing '1e999'"
    const auto from = said.find("parsing '");
    const auto to = said.rfind('\'');
    std::string number =
        from != std::string::npos && to > from + 9 ? said.substr(from + 9, to - from - 9) : "";
    if (number.size() > 64) number = number.substr(0, 60) + "...";
    if (key.empty() || number.empty())
      throw config_error("config: " + what + " holds a number out of range (" + said +
                         "); every number must be finite");
    throw config_error("config: " + what + ": '" + key + "'" +
                       (open.back().object ? "" : " holds an element that") + " is " + number +
                       ", which is out of range for a double; every number must be finite "
                       "(at most about 1.8e308)");
  } catch (const json::exception& e) {
    throw config_error("config: " + what + " cannot be read (" + e.what() + ")");
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw config_error(message);
}

}  // namespace

void load_config_file(const std::string& path, train_config& cfg) {
  namespace fs = std::filesystem;
  check_path_length(path, "config file", "--config");
  const std::string what = "config file '" + path + "'";
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status))
    throw config_error("config: cannot open " + what + " (no such file); check the --config path");
  if (fs::is_directory(status))
    throw config_error("config: " + what + " is a directory; --config takes a JSON file");
  if (fs::is_regular_file(status)) {
    const auto size = fs::file_size(path, ec);
    if (!ec && size > max_config_bytes)
      throw config_error("config: " + what + " is " + std::to_string(size) +
                         " bytes, the limit is 1 MiB (" + std::to_string(max_config_bytes) +
                         " bytes)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw config_error("config: cannot open " + what + " (" + std::strerror(errno) +
                       "); check the --config path and its permissions");
  // Never read more than the limit, whatever the file is (a pipe, a file that grows).
  std::string text(max_config_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad())
    throw config_error("config: cannot read " + what + " (" + std::strerror(errno) + ")");
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_config_bytes)
    throw config_error("config: " + what + " is more than 1 MiB (" +
                       std::to_string(max_config_bytes) + " bytes), the limit");
  const json doc = parse_limited(text, what);
  if (!doc.is_object())
    throw config_error("config: " + what +
                       " must hold a JSON object ({\"steps\": 100, ...}), got " +
                       std::string(doc.type_name()));
  apply_object(cfg, doc, "", true);
}

void set_config_field(train_config& cfg, const std::string& name, const std::string& value) {
  const field* f = find_field(name);
  if (!f) throw config_error("config: unknown setting '" + name + "'; known: " + known_names());
  refuse_empty(*f, json(value), false);
  f->set(cfg, json(value));
}

namespace {

// Range checks that say it all: "config: KEY (--flag) must be ALLOWED, got VALUE". The key is
// the config file's name, the flag the command line's (when there is one), so whichever the
// user wrote is named.
std::string named(const char* key, const char* flag) {
  return flag[0] ? std::string(key) + " (" + flag + ")" : std::string(key);
}

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

void int_in(int64_t v, const char* key, const char* flag, int64_t lo, int64_t hi,
            const std::string& note = "") {
  if (v < lo || v > hi)
    throw config_error("config: " + named(key, flag) + " must be in " + std::to_string(lo) + ".." +
                       std::to_string(hi) + note + ", got " + std::to_string(v));
}

// A finite number in [lo, hi], or (lo, hi] / [lo, hi) / (lo, hi) as the flags say.
void real_in(double v, const char* key, const char* flag, double lo, bool lo_open, double hi,
             bool hi_open, const std::string& note = "") {
  const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  if (!ok)
    throw config_error("config: " + named(key, flag) + " must be a finite number in " +
                       (lo_open ? "(" : "[") + number_text(lo) + ", " + number_text(hi) +
                       (hi_open ? ")" : "]") + note + ", got " + number_text(v));
}

void one_of(const std::string& v, const char* key, const char* flag,
            const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
  std::string list;
  for (size_t i = 0; i < allowed.size(); ++i)
    list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + allowed[i];
  throw config_error("config: " + named(key, flag) + " must be " + list + ", got '" +
                     (v.size() > 60 ? v.substr(0, 60) + "..." : v) + "'");
}

}  // namespace

namespace {
void validate_etcd(const train_config& c);
}  // namespace

void validate(const train_config& c) {
  // One shape's sizes, bounded so every product of them (parameters, activations, buffers)
  // fits the types that hold it; the memory check (runtime/preflight.hpp) then asks whether
  // this machine has room.
  const auto& m = c.model;
  int_in(m.n_layer, "model.n_layer", "--layers", 1, 1024);
  int_in(m.n_head, "model.n_head", "--heads", 1, 1024);
  int_in(m.d_model, "model.d_model", "--d-model", 1, 65536);
  require(m.d_model % m.n_head == 0,
          "config: model.n_head (" + std::to_string(m.n_head) + ") must divide model.d_model (" +
              std::to_string(m.d_model) + "); pick a head count that divides it");
  int_in(m.context, "model.context", "--context", 2, 65536);
  int_in(m.vocab, "model.vocab", "", 256, 256, " (the model reads bytes)");
  int_in(m.experts, "model.experts", "--experts", 0, 1024, " (0 = dense MLP)");
  int_in(m.top_k, "model.top_k", "--top-k", 1, 2);
  require(m.experts == 0 || m.top_k <= m.experts,
          "config: model.top_k (--top-k) must not exceed model.experts (--experts), got top_k " +
              std::to_string(m.top_k) + " with " + std::to_string(m.experts) + " experts");
  real_in(m.capacity_factor, "model.capacity_factor", "", 0, true, 64, false);
  real_in(m.aux_loss_coef, "model.aux_loss_coef", "", 0, false, 100, false);
  const auto& o = c.optim;
  real_in(o.lr, "optim.lr", "--lr", 0, true, 1e6, false);
  real_in(o.min_lr_ratio, "optim.min_lr_ratio", "", 0, false, 1, false);
  int_in(o.warmup_steps, "optim.warmup_steps", "", 0, 1000000000);
  real_in(o.weight_decay, "optim.weight_decay", "", 0, false, 100, false);
  real_in(o.beta1, "optim.beta1", "", 0, false, 1, true);
  real_in(o.beta2, "optim.beta2", "", 0, false, 1, true);
  real_in(o.eps, "optim.eps", "", 0, true, 1, false);
  real_in(o.grad_clip, "optim.grad_clip", "", 0, false, 1e6, false, " (0 = off)");
  const auto& p = c.parallel;
  int_in(p.tp, "parallel.tp", "--tp", 1, 256);
  int_in(p.pp, "parallel.pp", "--pp", 1, 256);
  int_in(p.ep, "parallel.ep", "--ep", 1, 256);
  one_of(p.schedule, "parallel.schedule", "--schedule", {"gpipe", "1f1b"});
  int_in(p.zero, "parallel.zero", "--zero", 0, 1);
  int_in(p.micro_batches, "parallel.micro_batches", "--micro-batches", 0, 1 << 20,
         " (0 = batch / micro_batch)");
  int_in(c.world, "world", "--world", 1, 256);
  int_in(c.steps, "steps", "--steps", 1, 1000000000);
  int_in(c.batch, "batch", "--batch", 1, 1 << 20);
  int_in(c.micro_batch, "micro_batch", "--micro-batch", 1, c.batch, " (at most batch)");
  require(c.batch % c.micro_batch == 0, "config: batch (" + std::to_string(c.batch) +
                                            ") must be a multiple of micro_batch (" +
                                            std::to_string(c.micro_batch) + ")");
  // A step's micro-batches: --micro-batches when given, else batch / micro_batch.
  require(p.micro_batches == 0 || c.batch % p.micro_batches == 0,
          "config: parallel.micro_batches (--micro-batches) must divide batch (" +
              std::to_string(c.batch) + "), got " + std::to_string(p.micro_batches));
  const int micro_batches = p.micro_batches > 0 ? p.micro_batches : c.batch / c.micro_batch;
  const std::string origin =
      p.micro_batches > 0
          ? "--micro-batches " + std::to_string(p.micro_batches)
          : "batch " + std::to_string(c.batch) + " / micro_batch " + std::to_string(c.micro_batch);
  // With model parallelism fixed by the user the layout planner checks the data-parallel
  // share; for plain data parallelism every rank is a replica, so say it here in its terms.
  require(p.tp > 1 || p.pp > 1 || micro_batches % c.world == 0,
          "config: world (" + std::to_string(c.world) + ") must divide the " +
              std::to_string(micro_batches) + " micro-batches of a step (" + origin +
              "); use --world " + std::to_string(micro_batches) +
              " or fewer that divides it, or change " +
              (p.micro_batches > 0 ? "--micro-batches" : "batch/micro_batch"));
  real_in(c.val_fraction, "val_fraction", "", 0, true, 0.5, true);
  int_in(c.eval_every, "eval_every", "--eval-every", 0, 1000000000, " (0 = only at the end)");
  int_in(c.eval_batches, "eval_batches", "", 1, 1 << 20);
  require(!c.run_dir.empty(), "config: run_dir (--run-dir) must not be empty");
  int_in(c.checkpoint_every, "checkpoint_every", "--checkpoint-every", 0, 1000000000,
         " (0 = only at the end)");
  one_of(c.checkpoint_overlap, "checkpoint_overlap", "--checkpoint-overlap", {"wait", "skip"});
  one_of(c.verify_checkpoints, "verify_checkpoints", "--verify-checkpoints",
         {"after-write", "off"});
  int_in(c.checkpoint_chunk_kib, "checkpoint_chunk_kib", "--checkpoint-chunk-kib", 4, 262144);
  int_in(c.keep_last, "keep_last", "--keep-last", 0, 1000000000, " (0 = keep all)");
  int_in(c.keep_every, "keep_every", "--keep-every", 0, 1000000000, " (0 = off)");
  require(!c.replicate_checkpoints || c.elastic.nodes >= 2,
          "config: replicate_checkpoints (--replicate-checkpoints) holds each rank's checkpoint in "
          "the memory of a rank on another node, so it needs --nodes 2 or more");
  int_in(c.exit_after_step, "exit_after_step", "--exit-after-step", 0, c.steps,
         " (0 = off; at most steps)");
  int_in(c.metrics_port, "metrics_port", "--metrics-port", 0, 65535, " (0 = off)");
  require(!c.metrics_host.empty() && c.metrics_host.size() <= 253 &&
              c.metrics_host.find_first_of(" \t\r\n/") == std::string::npos,
          "config: metrics_host (--metrics-host) must be a host name or address, got '" +
              c.metrics_host.substr(0, 60) + "'");
  int_in(c.blas_threads, "blas_threads", "--blas-threads", 1, 1024);
  int_in(c.metrics_rank_labels, "metrics_rank_labels", "--metrics-rank-labels", 0, 100000,
         " (0 = always per node)");
  real_in(c.peak_flops, "peak_flops", "--peak-flops", 0, false, 1e21, false);
  // Deadlines are added to clocks and doubled in places: a day is far past any step and far
  // from overflowing a millisecond count.
  int_in(c.step_timeout_ms, "step_timeout_ms", "--step-timeout-ms", 100, 86400000,
         " (100 ms to 24 h)");
  int_in(c.bucket_bytes, "bucket_bytes", "", 1024, 1 << 30);
  one_of(c.on_divergence, "on_divergence", "--on-divergence", {"stop", "rollback"});
  int_in(c.max_rollbacks, "max_rollbacks", "--max-rollbacks", 0, 1000);
  one_of(c.data_plane_auth, "data_plane_auth", "--data-plane-auth", {"tcp-md5", "none"});
  const auto& e = c.elastic;
  int_in(e.max_restarts, "elastic.max_restarts", "--max-restarts", 0, 1000000);
  int_in(e.spares, "elastic.spares", "--spares", 0, 256);
  int_in(e.nodes, "elastic.nodes", "--nodes", 1, c.world + e.spares, " (world + spares)");
  int_in(e.min_ranks, "elastic.min_ranks", "--min-ranks", 1, c.world, " (at most world)");
  require(e.max_ranks == 0 || (e.max_ranks >= c.world && e.max_ranks <= 256),
          "config: elastic.max_ranks (--max-ranks) must be 0 (= world) or in world..256, got " +
              std::to_string(e.max_ranks));
  int_in(e.heartbeat_timeout_ms, "elastic.heartbeat_timeout_ms", "--heartbeat-timeout-ms", 100,
         3600000);
  // Both ways the same bound would make a stopped coordinator and its members give up on
  // each other at once: the members must outwait the coordinator's own verdict on them.
  require(e.coordinator_timeout_ms == 0 || (e.coordinator_timeout_ms > e.heartbeat_timeout_ms &&
                                            e.coordinator_timeout_ms <= 18000000),
          "config: elastic.coordinator_timeout_ms (--coordinator-timeout-ms) must be longer than "
          "elastic.heartbeat_timeout_ms (--heartbeat-timeout-ms, " +
              std::to_string(e.heartbeat_timeout_ms) +
              " ms), at most 5 h, or 0 for 5 x the heartbeat timeout: workers and agents must "
              "wait for a silent coordinator longer than it waits for them; got " +
              std::to_string(e.coordinator_timeout_ms));
  int_in(e.join_timeout_ms, "elastic.join_timeout_ms", "--join-timeout-ms", 1000, 86400000,
         " (1 s to 24 h)");
  int_in(e.replacement_wait_ms, "elastic.replacement_wait_ms", "--replacement-wait-ms", 0, 600000);
  one_of(e.straggler_policy, "elastic.straggler_policy", "--straggler-policy",
         {"warn", "rebalance", "evict"});
  validate_etcd(c);
}

namespace {

// One endpoint: scheme, then host[:port], nothing after (etcd's gateway paths are ours to add).
bool etcd_url_ok(const std::string& url) {
  std::string rest;
  if (url.rfind("http://", 0) == 0)
    rest = url.substr(7);
  else if (url.rfind("https://", 0) == 0)
    rest = url.substr(8);
  else
    return false;
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.empty() || rest.size() > 260 || rest.find_first_of("/ \t\r\n?#@") != std::string::npos)
    return false;
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos || rest.back() == ']') return true;
  const std::string port = rest.substr(colon + 1);
  if (colon == 0 || port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos)
    return false;
  return std::stoi(port) >= 1 && std::stoi(port) <= 65535;
}

bool is_key_safe(char ch) {
  return std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-';
}

void validate_etcd(const train_config& c) {
  const auto& e = c.etcd;
  require(c.job_id.size() <= 128 && std::all_of(c.job_id.begin(), c.job_id.end(), is_key_safe),
          "config: job_id (--job-id) names the job's keys in etcd, so it must be letters, "
          "digits, '.', '_' and '-', at most 128 of them; got '" +
              c.job_id.substr(0, 60) + "'");
  int_in(e.timeout_ms, "etcd.timeout_ms", "--etcd-timeout-ms", 100, 86400000, " (100 ms to 24 h)");
  const bool any_tls_file = !e.cacert.empty() || !e.cert.empty() || !e.key.empty();
  require(!e.endpoints.empty() || !any_tls_file,
          "config: etcd.cacert/cert/key (--etcd-cacert, --etcd-cert, --etcd-key) must come "
          "with etcd endpoints: give --etcd https://HOST:PORT, or leave them out");
  require(e.cert.empty() == e.key.empty(),
          "config: etcd.cert (--etcd-cert) and etcd.key (--etcd-key) must be given together: a "
          "client certificate is useless without its private key; give both or neither");
  if (e.endpoints.empty() || e.endpoints == "local") {
    require(e.endpoints.empty() || !any_tls_file,
            "config: --etcd local starts a plain-http etcd of the job's own; leave out "
            "--etcd-cacert, --etcd-cert and --etcd-key, or give https endpoints");
    return;
  }
  bool https = false;
  size_t from = 0;
  while (true) {
    const auto comma = e.endpoints.find(',', from);
    const std::string url =
        e.endpoints.substr(from, comma == std::string::npos ? comma : comma - from);
    require(etcd_url_ok(url),
            "config: etcd.endpoints (--etcd) must be comma-separated http://HOST:PORT or "
            "https://HOST:PORT URLs, or the word local; '" +
                url.substr(0, 80) + "' is not one");
    https = https || url.rfind("https://", 0) == 0;
    if (comma == std::string::npos) break;
    from = comma + 1;
  }
  require(!https || !e.cacert.empty(),
          "config: etcd.endpoints (--etcd) are https, so the coordinator must know the CA "
          "that signed etcd's certificate: give it with --etcd-cacert FILE");
  require(https || !any_tls_file,
          "config: --etcd-cacert, --etcd-cert and --etcd-key are for https endpoints; the "
          "--etcd endpoints given are plain http");
}

}  // namespace

std::string etcd_job_id(const train_config& c) {
  if (!c.job_id.empty()) return c.job_id;
  std::string name = std::filesystem::path(c.run_dir).lexically_normal().filename().string();
  if (name.empty() || name == "." || name == "..")
    name = std::filesystem::path(c.run_dir).lexically_normal().parent_path().filename().string();
  for (char& ch : name)
    if (!is_key_safe(ch)) ch = '_';
  if (name.size() > 128) name.resize(128);
  return name.empty() ? "job" : name;
}

int coordinator_timeout_ms(const elastic_config& e) {
  return e.coordinator_timeout_ms > 0 ? e.coordinator_timeout_ms : 5 * e.heartbeat_timeout_ms;
}

json to_json(const train_config& cfg) {
  json out = json::object();
  for (const auto& f : fields()) {
    auto dot = f.name.find('.');
    if (dot == std::string::npos)
      out[f.name] = f.get(cfg);
    else
      out[f.name.substr(0, dot)][f.name.substr(dot + 1)] = f.get(cfg);
  }
  return out;
}

train_config config_from_json(const std::string& text) {
  train_config cfg;
  const json doc = parse_limited(text, "the config JSON");
  if (!doc.is_object()) throw config_error("config: the config JSON must hold a JSON object");
  apply_object(cfg, doc, "", false);
  return cfg;
}

}  // namespace troupe
