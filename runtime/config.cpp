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
#include "runtime/settings.hpp"

namespace troupe {
namespace {

using json = nlohmann::json;

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
    {"val_data", "validate on a share of --data", "a corpus file", true},
    {"metrics_token_file", "serve /metrics without a token", "a token file", true},
    {"optim.freeze", "train every parameter", "a pattern", true},
};

// Refuses an explicit "" for a field where "" means "not set" (empty_rules).
void refuse_empty(const setting& f, const json& v, bool in_file) {
  if (!v.is_string() || !v.get_ref<const std::string&>().empty()) return;
  for (const auto& rule : empty_rules)
    if (f.key == rule.name && !(in_file && rule.in_files))
      throw config_error("config: '" + f.key + "' is empty; give " + rule.give +
                         ", or leave it out to " + rule.means +
                         ": an empty value is not read as left out");
}

std::string known_names() {
  std::string out;
  for (const auto& f : settings()) out += (out.empty() ? "" : ", ") + f.key;
  return out;
}

// True when `name` is a section of the config ("model", "optim", ...), not a field.
bool is_section(const std::string& name) {
  for (const auto& f : settings())
    if (f.key.size() > name.size() && f.key.compare(0, name.size(), name) == 0 &&
        f.key[name.size()] == '.')
      return true;
  return false;
}

// The keys a config file may hold inside `prefix` ("" = the top level; sections end in '.').
std::string keys_in(const std::string& prefix) {
  std::vector<std::string> out;
  const std::string lead = prefix.empty() ? "" : prefix + ".";
  for (const auto& f : settings()) {
    if (f.key.compare(0, lead.size(), lead) != 0) continue;
    std::string rest = f.key.substr(lead.size());
    if (auto dot = rest.find('.'); dot != std::string::npos) rest = rest.substr(0, dot) + ".";
    if (std::find(out.begin(), out.end(), rest) == out.end()) out.push_back(rest);
  }
  std::string text;
  for (const auto& k : out) text += (text.empty() ? "" : ", ") + k;
  return text;
}

// A config file says what a value is: a number where a number goes (not its text), true or
// false for a switch, a string for a name. The field's own value says which.
void require_json_type(const setting& f, const train_config& cfg, const json& v) {
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
    throw config_error("config: '" + f.key + "' must be " + want + ", got " +
                       std::string(v.type_name()) + " " + quoted_value(v));
}

// `from_file`: a user's config file (an explicit "" is refused where it means "not set"); else
// troupe's own JSON (config_from_json), which holds "" for what is not set.
void apply_object(train_config& cfg, const json& obj, const std::string& prefix, bool from_file) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
    const setting* f = find_setting(name);
    if (!f && is_section(name)) {
      if (!it.value().is_object())
        throw config_error("config: '" + name + "' must be an object with the keys " +
                           keys_in(name) + ", got " + std::string(it.value().type_name()) + " " +
                           quoted_value(it.value()));
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
  const setting* f = find_setting(name);
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

// The bounds and choices the settings table declares (runtime/settings.cpp).
void check_table_bounds(const train_config& c) {
  for (const auto& s : settings()) {
    const json v = s.get(c);
    if (!s.choices.empty()) {
      one_of(v.get<std::string>(), s.key.c_str(), s.flag.c_str(), s.choices);
    } else if (!std::isnan(s.lo)) {
      if (v.is_number_integer())
        int_in(v.get<int64_t>(), s.key.c_str(), s.flag.c_str(), static_cast<int64_t>(s.lo),
               static_cast<int64_t>(s.hi), s.bound_note);
      else
        real_in(v.get<double>(), s.key.c_str(), s.flag.c_str(), s.lo, s.lo_open, s.hi, s.hi_open,
                s.bound_note);
    }
  }
}
}  // namespace

void validate(const train_config& c) {
  check_table_bounds(c);
  // The table bounds one shape's sizes so that every product of them (parameters,
  // activations, buffers) fits the types that hold it; the memory check
  // (runtime/preflight.hpp) then asks whether this machine has room.
  const auto& m = c.model;
  require(m.d_model % m.n_head == 0,
          "config: model.n_head (" + std::to_string(m.n_head) + ") must divide model.d_model (" +
              std::to_string(m.d_model) + "); pick a head count that divides it");
  require(m.experts == 0 || m.top_k <= m.experts,
          "config: model.top_k (--top-k) must not exceed model.experts (--experts), got top_k " +
              std::to_string(m.top_k) + " with " + std::to_string(m.experts) + " experts");
  const auto& p = c.parallel;
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
  // share. For plain data parallelism every rank is a replica with at least one micro-batch of
  // the step; they need not split evenly (3 ranks take 2, 1 and 1 of 4), as after a shrink.
  require(p.tp > 1 || p.pp > 1 || micro_batches >= c.world,
          "config: world (" + std::to_string(c.world) + ") is more than the " +
              std::to_string(micro_batches) + " micro-batches of a step (" + origin +
              "): a rank would have nothing to compute; use --world " +
              std::to_string(micro_batches) + " or fewer, or change " +
              (p.micro_batches > 0 ? "--micro-batches" : "batch/micro_batch"));
  require(!c.run_dir.empty(), "config: run_dir (--run-dir) must not be empty");
  require(!c.replicate_checkpoints || c.elastic.nodes >= 2,
          "config: replicate_checkpoints (--replicate-checkpoints) holds each rank's checkpoint in "
          "the memory of a rank on another node, so it needs --nodes 2 or more");
  int_in(c.exit_after_step, "exit_after_step", "--exit-after-step", 0, c.steps,
         " (0 = off; at most steps)");
  require(!c.metrics_host.empty() && c.metrics_host.size() <= 253 &&
              c.metrics_host.find_first_of(" \t\r\n/") == std::string::npos,
          "config: metrics_host (--metrics-host) must be a host name or address, got '" +
              c.metrics_host.substr(0, 60) + "'");
  const auto& e = c.elastic;
  int_in(e.nodes, "elastic.nodes", "--nodes", 1, c.world + e.spares, " (world + spares)");
  int_in(e.min_ranks, "elastic.min_ranks", "--min-ranks", 1, c.world, " (at most world)");
  require(e.max_ranks == 0 || (e.max_ranks >= c.world && e.max_ranks <= 256),
          "config: elastic.max_ranks (--max-ranks) must be 0 (= world) or in world..256, got " +
              std::to_string(e.max_ranks));
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
  if (p.reduction == "exact") {
    // What the exact sum covers so far: the built-in GPT's dense layouts (dp, tp, pp, ZeRO-1).
    const auto refuse = [](bool bad, const std::string& what) {
      require(!bad, "config: parallel.reduction exact (--reduction exact) does not combine with " +
                        what +
                        " yet: it sums the built-in GPT's gradients under dp, tp, pp and "
                        "--zero 1; leave it out or use --reduction fast");
    };
    refuse(c.external_workload(), "a workload of your own (`-- PROGRAM`)");
    refuse(p.ep > 1, "parallel.ep (--ep)");
    refuse(m.experts > 0, "model.experts (--experts)");
  }
  if (c.external_workload()) {
    // The user's program is opaque to the planner: it can only be replicated.
    const auto refuse = [](bool bad, const std::string& what) {
      require(!bad, "config: " + what +
                        " cannot be used with a workload of your own (`-- PROGRAM`): it runs "
                        "data parallelism only; see docs/WORKLOAD.md");
    };
    refuse(p.tp > 1, "parallel.tp (--tp)");
    refuse(p.pp > 1, "parallel.pp (--pp)");
    refuse(p.ep > 1, "parallel.ep (--ep)");
    refuse(p.zero != 0, "parallel.zero (--zero)");
    refuse(m.experts > 0, "model.experts (--experts)");
  }
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

liveness_timeouts liveness_of(const elastic_config& e) {
  using std::chrono::milliseconds;
  return {milliseconds(e.heartbeat_timeout_ms), milliseconds(coordinator_timeout_ms(e)),
          milliseconds(e.rejoin_timeout_ms)};
}

json to_json(const train_config& cfg) {
  json out = json::object();
  for (const auto& f : settings()) {
    auto dot = f.key.find('.');
    if (dot == std::string::npos)
      out[f.key] = f.get(cfg);
    else
      out[f.key.substr(0, dot)][f.key.substr(dot + 1)] = f.get(cfg);
  }
  return out;
}

json to_config_file(const train_config& cfg) {
  json out = to_json(cfg);
  for (const auto& rule : empty_rules) {
    const std::string key = rule.name;
    const auto dot = key.find('.');
    json& holder = dot == std::string::npos ? out : out[key.substr(0, dot)];
    const std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
    if (holder.contains(leaf) && holder[leaf] == "") holder.erase(leaf);
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
