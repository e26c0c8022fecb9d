// `troupe status` and `troupe top` (cli/status_tool.hpp): ask the job's coordinator for its
// status document (GET /status, bearer token like /metrics), or, when none answers, fold the
// run's events.jsonl into the same document.

#include "cli/status_tool.hpp"

#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "cli/options.hpp"
#include "monitoring/http_client.hpp"
#include "monitoring/status_board.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/sys/run_paths.hpp"

namespace troupe::cli {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::size_t max_document_bytes = 4 * 1024 * 1024;

struct status_args {
  std::string target;
  std::string token_file;
  bool json_out = false;
  int interval_ms = 1000;
  int timeout_ms = 3000;
};

struct endpoint {
  std::string host;
  uint16_t port = 0;
  [[nodiscard]] std::string words() const { return host + ":" + std::to_string(port); }
};

// The target cannot be read: exit 2 with the words given.
struct target_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int parse_ms(const std::string& command, const std::string& flag, const std::string& v, int lo,
             int hi) {
  try {
    std::size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < lo || x > hi) throw std::invalid_argument(flag);
    return static_cast<int>(x);
  } catch (const std::exception&) {
    throw usage_error("troupe " + command + ": " + flag + " must be an integer from " +
                      std::to_string(lo) + " to " + std::to_string(hi) + ", got '" + v + "'");
  }
}

status_args parse_args(const std::vector<std::string>& args, bool top) {
  const std::string command = top ? "top" : "status";
  command_line cl("troupe " + command);
  cl.value("--token-file");
  cl.value("--timeout-ms");
  if (top)
    cl.value("--interval-ms");
  else
    cl.flag("--json");
  cl.parse(args, 1, "targets (one: RUN_DIR or HOST:PORT)");
  status_args a;
  for (const auto& [flag, value] : cl.given()) {
    if (flag == "--token-file") {
      a.token_file = value;
      if (a.token_file.empty())
        throw usage_error("troupe " + command + ": --token-file needs a file name");
    } else if (flag == "--json") {
      a.json_out = true;
    } else if (flag == "--interval-ms") {
      a.interval_ms = parse_ms(command, flag, value, 100, 3600 * 1000);
    } else if (flag == "--timeout-ms") {
      a.timeout_ms = parse_ms(command, flag, value, 100, 60000);
    }
  }
  if (!cl.positional().empty()) {
    a.target = cl.positional().front();
    if (a.target.empty()) throw usage_error("troupe " + command + ": an empty target");
  }
  if (a.target.empty()) a.target = "runs/latest";
  return a;
}

std::optional<endpoint> parse_endpoint(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' '))
    text.pop_back();
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= text.size()) return std::nullopt;
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port_text = text.substr(colon + 1);
  if (port_text.size() > 5 ||
      !std::all_of(port_text.begin(), port_text.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  const int port = std::stoi(port_text);
  if (port < 1 || port > 65535) return std::nullopt;
  // A server listening on every address is asked on this machine's loopback.
  if (host == "0.0.0.0") host = "127.0.0.1";
  if (host == "::") host = "::1";
  return endpoint{host, static_cast<uint16_t>(port)};
}

// A small file of the run directory (an address), or nothing.
std::optional<std::string> read_small(const fs::path& path, std::uintmax_t max_bytes = 4096) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec) || fs::file_size(path, ec) > max_bytes) return std::nullopt;
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return in ? std::optional<std::string>(text) : std::nullopt;
}

// The coordinators a run directory names: its own metrics.addr, then every one of several.
std::vector<endpoint> run_dir_endpoints(const fs::path& run_dir) {
  std::vector<endpoint> out;
  if (auto text = read_small(run_paths::metrics_address(run_dir)))
    if (auto e = parse_endpoint(*text)) out.push_back(*e);
  std::error_code ec;
  for (fs::directory_iterator it(run_dir / "coordinators", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() < 13 || name.substr(name.size() - 13) != ".metrics.addr") continue;
    if (auto text = read_small(it->path()))
      if (auto e = parse_endpoint(*text)) out.push_back(*e);
  }
  return out;
}

// The token: --token-file, else the one the job's config names.
std::string bearer_token(const status_args& a, const std::optional<fs::path>& run_dir) {
  std::string path = a.token_file;
  std::string whence = "--token-file";
  if (path.empty() && run_dir) {
    if (auto text = read_small(run_paths::config(*run_dir), 1 << 20)) {
      const json cfg = json::parse(*text, nullptr, false);
      if (cfg.is_object() && cfg.contains("metrics_token_file") &&
          cfg["metrics_token_file"].is_string()) {
        path = cfg["metrics_token_file"].get<std::string>();
        whence = "the job's metrics_token_file (" + run_paths::config(*run_dir).string() + ")";
      }
    }
  }
  if (path.empty()) return "";
  try {
    return auth::read_bearer_token(path);
  } catch (const std::exception& e) {
    throw target_error("cannot read the metrics token named by " + whence + ": " + e.what() +
                       "; give a readable copy with --token-file FILE");
  }
}

struct fetched {
  std::optional<json> doc;
  std::string problem;  // why not, when no document
  bool unauthorized = false;
};

fetched fetch(const endpoint& at, const std::string& token, int timeout_ms) {
  fetched f;
  try {
    const auto answer =
        monitoring::http_get(at.host, at.port, "/status", token,
                             std::chrono::milliseconds(timeout_ms), max_document_bytes);
    if (answer.status == 401) {
      f.unauthorized = true;
      f.problem = "http://" + at.words() + "/status refused the request (401): " +
                  (token.empty() ? "the job asks for its metrics token; give --token-file FILE"
                                 : "the token given is not the job's; give the job's "
                                   "--metrics-token file with --token-file FILE");
      return f;
    }
    if (answer.status == 404) {
      f.problem = "http://" + at.words() +
                  "/status is not there (404): is that the metrics port of a troupe job of this "
                  "version?";
      return f;
    }
    if (answer.status != 200) {
      f.problem = "http://" + at.words() + "/status answered " + std::to_string(answer.status);
      return f;
    }
    json doc = json::parse(answer.body, nullptr, false);
    if (!doc.is_object() || !doc.contains("format")) {
      f.problem = "http://" + at.words() + "/status did not answer a status document";
      return f;
    }
    f.doc = std::move(doc);
  } catch (const monitoring::http_get_error& e) {
    f.problem = e.what();
  }
  return f;
}

// The run's history folded into a status document (the last session of the file).
std::optional<json> fold_events(const fs::path& run_dir) {
  std::ifstream in(run_paths::events(run_dir));
  if (!in) return std::nullopt;
  monitoring::status_board board;
  board.set_job(run_dir.string(), 0, 0, "");
  board.set_source("events.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line.size() > (16u << 20)) continue;
    const json e = json::parse(line, nullptr, false);
    if (e.is_object()) board.observe(e);  // a torn or foreign line is skipped
  }
  return board.snapshot();
}

// What one look at the target found.
struct look {
  std::optional<json> doc;
  std::string where;  // the target, and how it was read
  std::string note;   // a line after the summary, when there is something to say
};

// One look at the target. Throws target_error when nothing can be said about it.
look look_once(const status_args& a) {
  std::error_code ec;
  const fs::path as_path(a.target);
  if (fs::is_directory(as_path, ec)) {
    const std::vector<endpoint> candidates = run_dir_endpoints(as_path);
    const std::string token = candidates.empty() ? "" : bearer_token(a, as_path);
    std::optional<json> best;
    std::string best_at, problems;
    bool unauthorized = false;
    for (const auto& at : candidates) {
      fetched f = fetch(at, token, a.timeout_ms);
      if (!f.doc) {
        unauthorized = unauthorized || f.unauthorized;
        problems += (problems.empty() ? "" : "; ") + f.problem;
        continue;
      }
      // Of several coordinators, the leader (the newest epoch) speaks for the job.
      const auto rank = [](const json& d) {
        return std::make_pair(d.value("role", std::string()) == "leader" ? 1 : 0,
                              d.value("epoch", int64_t{0}));
      };
      if (!best || rank(*f.doc) > rank(*best)) {
        best = std::move(f.doc);
        best_at = at.words();
      }
    }
    if (best) return {std::move(best), a.target + " via http://" + best_at + "/status", ""};
    if (unauthorized) throw target_error(problems);
    auto doc = fold_events(as_path);
    if (!doc)
      throw target_error(a.target +
                         " has no events.jsonl: no job has run there (is it a run "
                         "directory?)");
    look l{std::move(doc), a.target, ""};
    const std::string state = l.doc->value("state", std::string());
    if (state == "done" || state == "failed")
      l.note = "the job has ended; this is its record in events.jsonl";
    else if (candidates.empty())
      l.note =
          "this run directory names no metrics endpoint (RUN_DIR/metrics.addr): the job "
          "runs with --metrics-port 0, has not started listening, or was killed before; "
          "events.jsonl does not record the job's end";
    else
      l.note = "no coordinator answers" + (problems.empty() ? "" : " (" + problems + ")") +
               ", and events.jsonl does not record the job's end: it is starting, or its "
               "coordinator was killed";
    return l;
  }
  const auto at = parse_endpoint(a.target);
  if (!at)
    throw target_error(a.target +
                       " is neither a run directory nor HOST:PORT (the job's metrics address)");
  fetched f = fetch(*at, bearer_token(a, std::nullopt), a.timeout_ms);
  if (!f.doc)
    throw target_error(f.problem + (f.unauthorized ? ""
                                                   : "; is the job running, and is that its "
                                                     "--metrics-port?"));
  return {std::move(f.doc), "http://" + at->words() + "/status", ""};
}

std::string frame_of(const look& l) {
  std::string out = monitoring::render_status(*l.doc, l.where);
  if (!l.note.empty()) out += "\n" + l.note + "\n";
  return out;
}

// The terminal on stdout, asked anew for every frame (it may have been resized since); nothing
// when stdout is not a terminal or does not say.
std::optional<monitoring::screen_size> terminal_size() {
  if (isatty(STDOUT_FILENO) != 1) return std::nullopt;
  struct winsize ws {};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0 || ws.ws_row == 0)
    return std::nullopt;
  return monitoring::screen_size{ws.ws_col, ws.ws_row};
}

bool ended(const json& doc) {
  const std::string s = doc.value("state", std::string());
  return s == "done" || s == "failed";
}

std::atomic<bool> interrupted{false};
std::atomic<bool> resized{false};
extern "C" void on_interrupt(int) { interrupted = true; }
extern "C" void on_resize(int) { resized = true; }

// A size for terminals that do not say theirs (a serial console, a pipe under `script`).
constexpr monitoring::screen_size fallback_screen{80, 24};

int run_top(const status_args& a) {
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const bool tty = isatty(STDOUT_FILENO) == 1;
  if (tty) {
    struct sigaction wa {};
    wa.sa_handler = on_resize;
    sigemptyset(&wa.sa_mask);
    sigaction(SIGWINCH, &wa, nullptr);
  }
  bool seen_live = false;
  std::optional<look> shown;
  // Draws the last look again: a resize redraws at once, without asking the job again.
  const auto draw = [&] {
    if (tty) {
      const std::string text = monitoring::render_status(
          *shown->doc, shown->where, terminal_size().value_or(fallback_screen), shown->note);
      // Home, then each line over the last frame's (erasing its rest), then below: no flicker
      // of a cleared screen, and never a line more than the screen holds (it would scroll).
      std::string frame = "\x1b[H";
      for (std::size_t from = 0; from <= text.size();) {
        const auto nl = std::min(text.find('\n', from), text.size());
        frame += text.substr(from, nl - from) + "\x1b[K";
        if (nl < text.size()) frame += "\r\n";
        from = nl + 1;
      }
      std::printf("%s\x1b[J", frame.c_str());
    } else {
      std::printf("%s\n", frame_of(*shown).c_str());
    }
    std::fflush(stdout);
  };
  if (tty) std::printf("\x1b[2J");
  for (;;) {
    try {
      shown = look_once(a);
    } catch (const target_error& e) {
      if (!seen_live) throw;
      std::fprintf(stderr, "troupe top: %s; the job's coordinator stopped answering\n", e.what());
      return 0;
    }
    const bool live = shown->doc->value("source", std::string("live")) == "live";
    seen_live = seen_live || live;
    resized = false;
    draw();
    // Ends with the job, its last frame left on the screen; also when the coordinator that
    // answered is gone: the record in events.jsonl is then the last word.
    if (ended(*shown->doc) || (seen_live && !live)) {
      if (tty) std::printf("\n");
      return 0;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(a.interval_ms);
    while (std::chrono::steady_clock::now() < until) {
      if (interrupted) break;
      if (resized.exchange(false)) draw();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (interrupted) {
      if (tty) std::printf("\n");
      return 0;
    }
  }
}

}  // namespace

int run_status_tool(const std::vector<std::string>& args, bool top) {
  const std::string command = top ? "top" : "status";
  const status_args a = parse_args(args, top);
  try {
    if (top) return run_top(a);
    const look l = look_once(a);
    if (a.json_out) {
      std::printf("%s\n", l.doc->dump(2, ' ', false, json::error_handler_t::replace).c_str());
    } else {
      // On a terminal the lines are cut to its width rather than wrapped into one another.
      if (const auto screen = terminal_size())
        std::printf(
            "%s\n",
            monitoring::render_status(*l.doc, l.where, {screen->columns, 0}, l.note).c_str());
      else
        std::fputs(frame_of(l).c_str(), stdout);
    }
    return 0;
  } catch (const target_error& e) {
    std::fprintf(stderr, "troupe %s: %s\n", command.c_str(), e.what());
    return 2;
  }
}

std::string status_help() {
  return R"(usage: troupe status [RUN_DIR | HOST:PORT] [--token-file FILE] [--json] [--timeout-ms N]

The job's state now: generation, step, world and layout, each rank's node, step time, heartbeat
age and straggler score, where its time goes (phases), and the last events. It asks the job's
coordinator (GET /status on its metrics endpoint). RUN_DIR (default runs/latest) finds the
coordinator in RUN_DIR/metrics.addr (of several coordinators, the leader) and the token in the
job's config; when no coordinator answers, the job is summarised from RUN_DIR/events.jsonl.

  --token-file FILE   the job's --metrics-token file (needed with HOST:PORT when it has one)
  --json              print the status document itself
  --timeout-ms N      how long to wait for the coordinator (default 3000)

Exit 0; 2 for bad arguments or a target that cannot be read (unreachable, or refused: 401).
)";
}

std::string top_help() {
  return R"(usage: troupe top [RUN_DIR | HOST:PORT] [--token-file FILE] [--interval-ms N] [--timeout-ms N]

`troupe status`, redrawn every --interval-ms (default 1000) until Ctrl-C or the job ends. On a
terminal each frame replaces the last, fitted to the terminal's size (and redrawn at once when
it is resized): the job's state and the rank table stay, the newest events fill the lines left.
Otherwise the frames follow one another.
)";
}

}  // namespace troupe::cli
