#include "coordinator/ha/local_etcd.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "monitoring/log.hpp"
#include "runtime/sys/child_process.hpp"

namespace troupe::coordinator::ha {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

const monitoring::log_context etcd_ctx{"coordinator", -1, 0, -1};
constexpr const char* etcd_binary = "/usr/bin/etcd";

void require_readable(const std::string& path, const char* option) {
  if (path.empty()) return;
  std::ifstream in(path);
  if (!in || in.peek() == std::ifstream::traits_type::eof())
    throw config_error(std::string(option) + " '" + path +
                       "' cannot be read (or is empty); give a readable PEM file");
}

// A port the kernel hands out now; etcd binds it a moment later. Another process could take it
// in between, which shows as etcd failing to start, named with its log.
uint16_t free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("etcd: cannot open a socket to find a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    throw std::runtime_error("etcd: cannot find a free loopback port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

std::string shell_quoted(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

std::vector<std::string> split_endpoints(const std::string& text) {
  std::vector<std::string> out;
  size_t from = 0;
  while (true) {
    const auto comma = text.find(',', from);
    out.push_back(text.substr(from, comma == std::string::npos ? comma : comma - from));
    if (comma == std::string::npos) return out;
    from = comma + 1;
  }
}

}  // namespace

void check_etcd_options(const train_config& cfg) {
  if (cfg.etcd.endpoints == "local" && access(etcd_binary, X_OK) != 0)
    throw config_error(std::string("--etcd local needs etcd at ") + etcd_binary +
                       ", which is not there; install etcd-server (apt-get install etcd-server) "
                       "or give --etcd the endpoints of a running etcd");
  require_readable(cfg.etcd.cacert, "--etcd-cacert");
  require_readable(cfg.etcd.cert, "--etcd-cert");
  require_readable(cfg.etcd.key, "--etcd-key");
}

etcd_link::etcd_link(const train_config& cfg, const std::string& job) : cfg_(cfg), job_(job) {
  etcd::client_options options;
  if (cfg.etcd.endpoints != "local") {
    options.endpoints = split_endpoints(cfg.etcd.endpoints);
    options.ca_file = cfg.etcd.cacert;
    options.cert_file = cfg.etcd.cert;
    options.key_file = cfg.etcd.key;
    words_ = cfg.etcd.endpoints;
    client_urls_ = cfg.etcd.endpoints;
    client_.emplace(options);
    return;
  }
  const uint16_t client_port = free_loopback_port();
  uint16_t peer_port = free_loopback_port();
  while (peer_port == client_port) peer_port = free_loopback_port();
  const std::string client_url = "http://127.0.0.1:" + std::to_string(client_port);
  const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer_port);
  const std::string data_dir = cfg.run_dir + "/etcd";
  local_log_ = cfg.run_dir + "/etcd.log";
  // Through a shell only to send its output to the log; exec keeps etcd's pid the child's. Its
  // own process group keeps a Ctrl-C at the terminal from stopping it before the job ends.
  const std::string command =
      "exec " + std::string(etcd_binary) + " --name troupe-" + shell_quoted(job) + " --data-dir " +
      shell_quoted(data_dir) + " --listen-client-urls " + client_url + " --advertise-client-urls " +
      client_url + " --listen-peer-urls " + peer_url + " --initial-advertise-peer-urls " +
      peer_url + " --initial-cluster troupe-" + shell_quoted(job) + "=" + peer_url + " >>" +
      shell_quoted(local_log_) + " 2>&1";
  local_pid_ = sys::spawn_child({"/bin/sh", "-c", command}, true, SIGKILL);
  words_ = client_url + " (the job's own etcd, log " + local_log_ + ")";
  client_urls_ = client_url;
  options.endpoints = {client_url};
  client_.emplace(options);
}

etcd_link::~etcd_link() { stop(); }

void etcd_link::stop() {
  client_.reset();
  if (local_pid_ <= 0) return;
  kill(local_pid_, SIGTERM);
  if (!sys::wait_for_exit(local_pid_, std::chrono::seconds(10))) {
    monitoring::log(monitoring::level::warn, etcd_ctx,
                    "the job's etcd did not stop within 10 s of SIGTERM; killing it");
    kill(local_pid_, SIGKILL);
    sys::wait_for_exit(local_pid_, std::chrono::seconds(10));
  }
  local_pid_ = 0;
}

void etcd_link::wait_until_answering(steady_clock::time_point deadline) {
  const bool local = local_pid_ > 0;
  std::string last;
  int bad_answers = 0;  // it answered, but not as etcd does (too large, not JSON, ...)
  std::string last_bad;
  while (true) {
    if (local && sys::try_reap(local_pid_)) {
      local_pid_ = 0;
      throw std::runtime_error("etcd: the job's etcd (" + std::string(etcd_binary) +
                               ") exited before it answered; see its log " + local_log_);
    }
    try {
      etcd::call_options call;
      call.deadline = std::min(deadline, steady_clock::now() + milliseconds(2000));
      client_->get("/troupe/" + job_ + "/leader", call);
      return;
    } catch (const etcd::etcd_error& e) {
      if (e.kind() == etcd::error_kind::tls)
        throw config_error(
            "etcd: TLS with " + words_ +
            " failed: the CA given with --etcd-cacert does not verify etcd's certificate, or "
            "etcd refused the client certificate (--etcd-cert, --etcd-key); check that they "
            "belong to this etcd (" +
            e.what() + ")");
      last = e.what();
      if (e.kind() == etcd::error_kind::protocol) {
        ++bad_answers;
        last_bad = e.what();
      }
    }
    if (steady_clock::now() >= deadline && bad_answers > 0)
      throw std::runtime_error("etcd: " + words_ + " answered " + std::to_string(bad_answers) +
                               " times within --etcd-timeout-ms (" +
                               std::to_string(cfg_.etcd.timeout_ms) +
                               " ms), but never as etcd does: " + last_bad);
    if (steady_clock::now() >= deadline)
      throw std::runtime_error(
          "etcd: " + words_ + " did not answer within --etcd-timeout-ms (" +
          std::to_string(cfg_.etcd.timeout_ms) + " ms): " + last +
          (local ? "" : "; check that etcd runs there and this machine reaches it"));
    std::this_thread::sleep_for(milliseconds(100));
  }
}

}  // namespace troupe::coordinator::ha
