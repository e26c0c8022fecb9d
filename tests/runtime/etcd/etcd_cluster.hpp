#pragma once
// Test support: real etcd servers on free loopback ports in a temporary directory, killed by
// pid when the test ends, and a CA with server and client certificates made with openssl.

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/etcd/etcd_client.hpp"
#include "tests/runtime/comm/child_process.hpp"

namespace troupe::etcd::testing {

inline constexpr const char* kEtcd = "/usr/bin/etcd";

inline bool have_etcd() { return ::access(kEtcd, X_OK) == 0; }

/// A directory under /tmp removed with everything in it when the test ends.
class temp_dir {
 public:
  temp_dir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "troupe-etcd-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Files for an etcd that speaks TLS and asks clients for certificates.
struct tls_files {
  std::string ca, server_cert, server_key, client_cert, client_key, other_ca;
};

/// Makes a CA, a server certificate for 127.0.0.1/localhost, a client certificate, and a
/// second CA that signed neither.
inline tls_files make_tls_files(const std::filesystem::path& dir) {
  const std::string d = dir.string();
  std::ostringstream script;
  script << "set -e; cd '" << d << "'\n"
         << "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out $1; }\n"
         << "key ca.key; key other.key; key server.key; key client.key\n"
         << "openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj /CN=troupe-test-ca\n"
         << "openssl req -x509 -new -key other.key -out other.crt -days 2 -subj /CN=other-ca\n"
         << "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth,"
            "clientAuth\\n' > server.ext\n"
         << "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n"
         << "openssl req -new -key server.key -out server.csr -subj /CN=localhost\n"
         << "openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
            "-out server.crt -days 2 -extfile server.ext\n"
         << "openssl req -new -key client.key -out client.csr -subj /CN=troupe-client\n"
         << "openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
            "-out client.crt -days 2 -extfile client.ext\n";
  const std::string cmd =
      "bash -c \"$(cat <<'EOS'\n" + script.str() + "EOS\n)\" >'" + d + "/openssl.log' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir / "openssl.log");
    std::stringstream text;
    text << log.rdbuf();
    throw std::runtime_error("openssl could not make the test certificates: " + text.str());
  }
  return {d + "/ca.crt",     d + "/server.crt", d + "/server.key",
          d + "/client.crt", d + "/client.key", d + "/other.crt"};
}

/// One etcd member: started, stopped and restarted with the same data directory.
class etcd_member {
 public:
  etcd_member(std::string name, const std::filesystem::path& dir, const tls_files* tls = nullptr)
      : name_(std::move(name)),
        dir_(dir),
        client_port_(test::unused_port()),
        peer_port_(test::unused_port()),
        tls_(tls) {}

  const std::string& name() const { return name_; }
  std::string client_url() const {
    return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(client_port_);
  }
  std::string peer_url() const { return "http://127.0.0.1:" + std::to_string(peer_port_); }
  pid_t pid() const { return process_.pid(); }

  /// Starts the member; `cluster` is the --initial-cluster list (this member alone if empty).
  void start(const std::string& cluster = {}) {
    const std::string initial = cluster.empty() ? name_ + "=" + peer_url() : cluster;
    std::ostringstream cmd;
    cmd << "exec " << kEtcd << " --name " << name_ << " --data-dir '"
        << (dir_ / (name_ + ".data")).string() << "' --listen-client-urls " << client_url()
        << " --advertise-client-urls " << client_url() << " --listen-peer-urls " << peer_url()
        << " --initial-advertise-peer-urls " << peer_url() << " --initial-cluster " << initial
        << " --initial-cluster-token troupe-test --initial-cluster-state new"
        << " --heartbeat-interval 50 --election-timeout 500";
    if (tls_) {
      cmd << " --cert-file " << tls_->server_cert << " --key-file " << tls_->server_key
          << " --client-cert-auth --trusted-ca-file " << tls_->ca;
    }
    cmd << " >>'" << (dir_ / (name_ + ".log")).string() << "' 2>&1";
    process_ = test::child_process::spawn({"/bin/sh", "-c", cmd.str()});
  }

  /// SIGSTOPs the member and waits until every one of its threads has stopped: kill() returns
  /// before that, and a thread still running could answer one more request.
  void pause() {
    process_.signal(SIGSTOP);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    const std::filesystem::path tasks = "/proc/" + std::to_string(pid()) + "/task";
    for (;;) {
      bool all_stopped = true;
      std::error_code ec;
      for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
        std::ifstream stat(task.path() / "stat");
        std::string line;
        std::getline(stat, line);
        // The state follows the command name, which is in parentheses.
        const auto close = line.rfind(')');
        const char state =
            close != std::string::npos && close + 2 < line.size() ? line[close + 2] : '?';
        if (state != 'T' && state != 't') all_stopped = false;
      }
      if (all_stopped && !ec) return;
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("etcd did not stop");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void resume() { process_.signal(SIGCONT); }

  /// SIGKILLs the member and reaps it.
  void kill() { process_.kill(); }
  void signal(int sig) { process_.signal(sig); }

  /// The member's log, for a failing test's message.
  std::string log() const {
    std::ifstream in(dir_ / (name_ + ".log"));
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    return s.size() > 4000 ? s.substr(s.size() - 4000) : s;
  }

 private:
  std::string name_;
  std::filesystem::path dir_;
  std::uint16_t client_port_;
  std::uint16_t peer_port_;
  const tls_files* tls_;
  test::child_process process_;
};

/// Client options for the given members, with short timeouts so tests fail fast.
inline client_options options_for(
    const std::vector<std::string>& urls,
    std::chrono::milliseconds timeout = std::chrono::milliseconds(1000)) {
  client_options o;
  o.endpoints = urls;
  o.request_timeout = timeout;
  return o;
}

/// Waits until `client` answers a read, up to `limit`; false if it never did.
inline bool wait_ready(etcd_client& client,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(20000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    try {
      client.get("/troupe-test/ready");
      return true;
    } catch (const etcd_error&) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return false;
}

/// A cluster of `n` members on loopback, all started and answering.
class etcd_cluster {
 public:
  explicit etcd_cluster(int n, const tls_files* tls = nullptr) {
    std::string initial;
    for (int i = 0; i < n; ++i) {
      members_.push_back(std::make_unique<etcd_member>("m" + std::to_string(i), dir_.path(), tls));
      initial += (i ? "," : "") + members_.back()->name() + "=" + members_.back()->peer_url();
    }
    for (auto& m : members_) m->start(n > 1 ? initial : std::string());
    initial_ = initial;
  }

  etcd_member& member(int i) { return *members_.at(static_cast<std::size_t>(i)); }
  std::vector<std::string> urls() const {
    std::vector<std::string> out;
    for (const auto& m : members_) out.push_back(m->client_url());
    return out;
  }
  const std::string& initial_cluster() const { return initial_; }
  const std::filesystem::path& dir() const { return dir_.path(); }

  /// Restarts member i with its data (after kill()).
  void restart(int i) { member(i).start(members_.size() > 1 ? initial_ : std::string()); }

  std::string logs() const {
    std::string out;
    for (const auto& m : members_) out += "--- " + m->name() + " ---\n" + m->log();
    return out;
  }

 private:
  temp_dir dir_;
  std::string initial_;
  std::vector<std::unique_ptr<etcd_member>> members_;
};

}  // namespace troupe::etcd::testing
