#include "actors/wire/tls_transport.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <caf/function_view.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/doorman.hpp>
#include <caf/io/middleman.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/acceptor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/io/scribe.hpp>
#include <caf/send.hpp>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "monitoring/log.hpp"
#include "runtime/auth/credentials.hpp"
#include "runtime/sys/descriptors.hpp"

namespace troupe::actors {
namespace {

namespace net = caf::io::network;
using clock_type = std::chrono::steady_clock;

const monitoring::log_context tls_ctx{"tls", -1, 0, -1};

// ---- refusals: counted, logged, handed to the process's listener ----

std::mutex listener_mutex;
rejection_listener on_rejection;
std::map<uint16_t, std::string> listener_names;  // local port -> "coordinator", "stage", ...
std::atomic<uint64_t> rejected{0};

std::string listener_name(uint16_t local_port) {
  std::lock_guard lock(listener_mutex);
  auto it = listener_names.find(local_port);
  return it == listener_names.end() ? std::string("control_plane") : it->second;
}

void reject(uint16_t local_port, const std::string& peer, const std::string& why) {
  const uint64_t n = rejected.fetch_add(1, std::memory_order_relaxed) + 1;
  const std::string name = listener_name(local_port);
  rejection_listener copy;
  {
    std::lock_guard lock(listener_mutex);
    copy = on_rejection;
  }
  if (copy)
    copy(name, peer, why);
  else if (n <= 20 || n % 500 == 0)  // a flood of strangers must not flood the log too
    monitoring::log(monitoring::level::warn, tls_ctx,
                    "refused a connection to the " + name + " listener from " + peer + ": " + why);
}

std::string openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "the peer closed the connection" : out;
}

std::string peer_of(int fd) {
  auto host = net::remote_addr_of_fd(fd);
  auto port = net::remote_port_of_fd(fd);
  return (host ? *host : std::string("?")) + ":" + (port ? std::to_string(*port) : "?");
}

uint16_t local_port_of(int fd) {
  auto port = net::local_port_of_fd(fd);
  return port ? *port : 0;
}

// ---- one TLS context per process, made from the join token ----

std::string job_of_certificate(X509* cert) {
  char cn[256] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof cn);
  const std::string text = cn;
  const std::string prefix = "troupe job ";
  return text.rfind(prefix, 0) == 0 ? text.substr(prefix.size())
                                    : "(not a troupe job: " + text + ")";
}

struct tls_context {
  SSL_CTX* ctx = nullptr;
  std::string job_id;

  explicit tls_context(const auth::job_credentials& creds) : job_id(creds.job_id) {
    ctx = SSL_CTX_new(TLS_method());
    if (!ctx) throw std::runtime_error("cannot make a TLS context: " + openssl_errors());
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    const char* file = creds.token_path.c_str();
    // The token file holds the certificate, its key and (self-signed) the only authority.
    if (SSL_CTX_use_certificate_chain_file(ctx, file) != 1 ||
        SSL_CTX_use_PrivateKey_file(ctx, file, SSL_FILETYPE_PEM) != 1 ||
        SSL_CTX_load_verify_locations(ctx, file, nullptr) != 1) {
      const std::string why = openssl_errors();
      SSL_CTX_free(ctx);
      throw std::runtime_error("cannot load the join token " + creds.token_path +
                               " for TLS: " + why);
    }
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    // Members reconnect rarely; no session tickets to keep or leak.
    SSL_CTX_set_num_tickets(ctx, 0);
  }
  ~tls_context() { SSL_CTX_free(ctx); }
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;
};

// Made on first use and never destroyed: OpenSSL cleans itself up at exit, and freeing a
// context after that crashes. Connections hold their own references and end with CAF.
std::mutex context_mutex;
std::shared_ptr<tls_context> process_context() {
  static auto* made = new std::shared_ptr<tls_context>();
  std::lock_guard lock(context_mutex);
  if (!*made) {
    // OpenSSL writes alerts with plain write(): a peer that already hung up would raise
    // SIGPIPE and end the process. A refused stranger must cost one connection, nothing more.
    struct sigaction current {};
    if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL)
      ::signal(SIGPIPE, SIG_IGN);
    *made = std::make_shared<tls_context>(auth::process_credentials());
  }
  return *made;
}

// ---- the handshake watchdog: closes connections that stay silent past their deadline ----

class handshake_watchdog {
 public:
  // Never destroyed: its thread may be waiting while the process exits.
  static handshake_watchdog& instance() {
    static auto* w = new handshake_watchdog;
    return *w;
  }

  /// Whether another handshake may start now; registers it if so.
  bool admit(const void* who, int fd, uint16_t local_port, const std::string& peer) {
    std::lock_guard lock(mutex_);
    if (static_cast<int>(pending_.size()) >= max_pending_handshakes) return false;
    pending_[who] = entry{fd, local_port, peer, clock_type::now() + tls_handshake_deadline};
    if (!started_) {
      std::thread([this] { run(); }).detach();
      started_ = true;
    }
    wake_.notify_one();
    return true;
  }

  /// The handshake finished or the connection is gone: stop watching it. Called before the
  /// socket is closed, so the watchdog never touches a descriptor that was reused.
  /// Returns false when the watchdog had already timed it out (and counted it).
  bool forget(const void* who) {
    std::lock_guard lock(mutex_);
    return pending_.erase(who) > 0;
  }

 private:
  struct entry {
    int fd;
    uint16_t local_port;
    std::string peer;
    clock_type::time_point deadline;
  };

  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      if (pending_.empty()) {
        wake_.wait(lock);
        continue;
      }
      auto next = clock_type::time_point::max();
      for (const auto& [who, e] : pending_) next = std::min(next, e.deadline);
      wake_.wait_until(lock, next);
      const auto now = clock_type::now();
      for (auto it = pending_.begin(); it != pending_.end();) {
        if (it->second.deadline > now) {
          ++it;
          continue;
        }
        // Counted before the socket goes down, so whoever sees the close sees the count.
        // Shutting the socket down (not closing it) makes the I/O thread see the end of the
        // stream and close the connection itself; the lock keeps the descriptor from being
        // closed and reused in between.
        reject(it->second.local_port, it->second.peer,
               "no TLS handshake within " + std::to_string(tls_handshake_deadline.count()) + " ms");
        ::shutdown(it->second.fd, SHUT_RDWR);
        it = pending_.erase(it);
      }
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::map<const void*, entry> pending_;
  bool started_ = false;
};

// ---- the I/O policy CAF's stream and acceptor templates drive ----

// One connection's TLS state. On the accepting side the handshake runs inside the I/O
// thread's reads; whatever CAF wants to write before it is done is held back and sent after.
class tls_policy {
 public:
  tls_policy(std::shared_ptr<tls_context> context, SSL* ssl, bool handshake_done, int fd)
      : context_(std::move(context)), ssl_(ssl), done_(handshake_done), fd_(fd) {
    if (!done_) {
      peer_ = peer_of(fd);
      local_port_ = local_port_of(fd);
      // Descriptors near the limit are kept for checkpoints and the data plane.
      const bool reserve_reached = sys::in_descriptor_reserve(fd);
      admitted_ =
          !reserve_reached && handshake_watchdog::instance().admit(this, fd, local_port_, peer_);
      if (!admitted_) {
        reject(local_port_, peer_,
               reserve_reached ? "the process's descriptor reserve is reached"
                               : "too many TLS handshakes in progress");
        ::shutdown(fd, SHUT_RDWR);  // the I/O thread sees the end of the stream and closes it
      }
    }
  }
  ~tls_policy() {
    if (!done_ && admitted_) handshake_watchdog::instance().forget(this);
    SSL_free(ssl_);
  }
  tls_policy(const tls_policy&) = delete;
  tls_policy& operator=(const tls_policy&) = delete;

  net::rw_state read_some(size_t& result, net::native_socket, void* buf, size_t len) {
    result = 0;
    if (!done_ && !finish_handshake()) return net::rw_state::failure;
    if (!done_) return net::rw_state::indeterminate;
    if (!flush_held_back()) return net::rw_state::failure;
    if (len == 0) return net::rw_state::indeterminate;
    ERR_clear_error();
    const int n = SSL_read(ssl_, buf, static_cast<int>(std::min<size_t>(len, 1 << 30)));
    if (n > 0) {
      result = static_cast<size_t>(n);
      return net::rw_state::success;
    }
    return retry_later(n) ? net::rw_state::indeterminate : net::rw_state::failure;
  }

  net::rw_state write_some(size_t& result, net::native_socket, const void* buf, size_t len) {
    result = 0;
    if (!done_ || !held_back_.empty()) {
      // Claimed as written so that CAF stops asking for write events (a stranger that never
      // answers must not keep the I/O thread spinning); sent once the handshake is done.
      const char* p = static_cast<const char*>(buf);
      held_back_.insert(held_back_.end(), p, p + len);
      result = len;
      if (done_ && !flush_held_back()) return net::rw_state::failure;
      return net::rw_state::success;
    }
    if (len == 0) return net::rw_state::success;
    ERR_clear_error();
    const int n = SSL_write(ssl_, buf, static_cast<int>(std::min<size_t>(len, 1 << 30)));
    if (n > 0) {
      result = static_cast<size_t>(n);
      return net::rw_state::success;
    }
    return retry_later(n) ? net::rw_state::success : net::rw_state::failure;
  }

  bool must_read_more(net::native_socket, size_t) { return done_ && SSL_has_pending(ssl_) == 1; }

  bool try_accept(net::native_socket&, net::native_socket) { return false; }

 private:
  bool retry_later(int ret) {
    const int err = SSL_get_error(ssl_, ret);
    return err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE;
  }

  // Advances the server side of the handshake; false when the peer is refused.
  bool finish_handshake() {
    if (!admitted_) return false;
    ERR_clear_error();
    const int ret = SSL_do_handshake(ssl_);
    if (ret == 1) {
      done_ = true;
      handshake_watchdog::instance().forget(this);
      return true;
    }
    if (retry_later(ret)) return true;
    std::string why = openssl_errors();
    if (X509* cert = SSL_get_peer_certificate(ssl_)) {
      why = "it showed the certificate of job " + job_of_certificate(cert) + ", this is job " +
            context_->job_id + " (" + why + ")";
      X509_free(cert);
    }
    const bool still_watched = handshake_watchdog::instance().forget(this);
    admitted_ = false;  // forgotten already
    // A connection the watchdog shut down was counted there, with the better reason.
    if (still_watched) reject(local_port_, peer_, "TLS handshake failed: " + why);
    return false;
  }

  // Sends what CAF wrote during the handshake. The amount is one BASP handshake (a few hundred
  // bytes), which fits a fresh socket's buffer; a peer that does not read it is dropped.
  bool flush_held_back() {
    while (!held_back_.empty()) {
      ERR_clear_error();
      const int n = SSL_write(ssl_, held_back_.data(), static_cast<int>(held_back_.size()));
      if (n > 0) {
        held_back_.erase(held_back_.begin(), held_back_.begin() + n);
        continue;
      }
      return retry_later(n);
    }
    return true;
  }

  std::shared_ptr<tls_context> context_;
  SSL* ssl_;
  bool done_;
  int fd_;
  bool admitted_ = false;
  std::string peer_;
  uint16_t local_port_ = 0;
  std::vector<char> held_back_;
};

// Accepting side: accept() only; the handshake belongs to the new connection's stream.
struct accept_policy {
  net::rw_state read_some(size_t&, net::native_socket, void*, size_t) {
    return net::rw_state::failure;
  }
  net::rw_state write_some(size_t&, net::native_socket, const void*, size_t) {
    return net::rw_state::failure;
  }
  bool must_read_more(net::native_socket, size_t) { return false; }
  bool try_accept(net::native_socket& result, net::native_socket listener) {
    result = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (result < 0) {
      result = net::invalid_native_socket;
      return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED;
    }
    return true;
  }
};

// A control connection carries a few small messages at a time (heartbeats, votes, commits): a
// thin stream, where a lost segment holds up everything behind it until it is resent. With
// exponential backoff, a segment lost three times in a row on a link with a 200 ms round trip
// arrives after 0.4 + 0.8 + 1.6 s, and the heartbeats behind it miss the heartbeat timeout;
// Linux's linear timeouts for thin streams resend it at the same interval each time (for the
// first six tries). And a small message goes out at once, not after the acknowledgement of
// the one before it (Nagle: a round trip). Best effort: a kernel without the options keeps
// its defaults.
// The control sockets open now, for set_control_socket_timeout.
std::mutex control_sockets_mutex;
std::set<int> control_sockets;
unsigned control_user_timeout_ms = 0;  // guarded by control_sockets_mutex

void apply_user_timeout(int fd, unsigned ms) {
  if (ms > 0) ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms);
}

void tune_control_socket(int fd) {
  const int on = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, &on, sizeof on);
  std::lock_guard lock(control_sockets_mutex);
  apply_user_timeout(fd, control_user_timeout_ms);
}

// A TCP connection to host:port within control_connect_deadline, as a blocking socket (the
// TLS handshake reads it with timeouts; CAF makes it non-blocking when it takes it over).
caf::expected<int> connect_within_deadline(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found)
    return caf::make_error(caf::sec::cannot_connect_to_node, "cannot resolve " + host);
  std::string last = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = std::strerror(errno);
      continue;
    }
    int error = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(control_connect_deadline.count()));
      if (ready == 1) {
        socklen_t len = sizeof error;
        if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) error = errno;
      } else {
        error = ready == 0 ? ETIMEDOUT : errno;
      }
    }
    if (error == 0 && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    last = std::strerror(error != 0 ? error : errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return caf::make_error(caf::sec::cannot_connect_to_node,
                         "cannot connect to " + host + ":" + std::to_string(port) + " within " +
                             std::to_string(control_connect_deadline.count()) + " ms: " + last);
}

// ---- CAF servants over the policies ----

class tls_scribe : public caf::io::scribe {
 public:
  tls_scribe(net::default_multiplexer& mpx, int fd, std::shared_ptr<tls_context> context, SSL* ssl,
             bool handshake_done)
      : scribe(net::conn_hdl_from_socket(fd)),
        stream_(mpx, fd, std::move(context), ssl, handshake_done, fd) {
    std::lock_guard lock(control_sockets_mutex);
    control_sockets.insert(fd);
  }
  ~tls_scribe() override {  // before stream_ closes the socket
    std::lock_guard lock(control_sockets_mutex);
    control_sockets.erase(stream_.fd());
  }

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) launch();
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = net::remote_addr_of_fd(stream_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = net::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  void launch() {
    launched_ = true;
    stream_.start(this);
  }

  bool launched_ = false;
  net::stream_impl<tls_policy> stream_;
};

class tls_doorman : public caf::io::doorman {
 public:
  tls_doorman(net::default_multiplexer& mpx, int fd, std::shared_ptr<tls_context> context)
      : doorman(net::accept_hdl_from_socket(fd)),
        acceptor_(mpx, fd),
        context_(std::move(context)) {}

  bool new_connection() override {
    if (detached()) return false;
    auto& mpx = acceptor_.backend();
    const int fd = acceptor_.accepted_socket();
    tune_control_socket(fd);
    SSL* ssl = SSL_new(context_->ctx);
    if (!ssl || SSL_set_fd(ssl, fd) != 1) {
      if (ssl) SSL_free(ssl);
      ::close(fd);
      return true;
    }
    SSL_set_accept_state(ssl);
    auto servant = caf::make_counted<tls_scribe>(mpx, fd, context_, ssl, false);
    auto hdl = servant->hdl();
    parent()->add_scribe(std::move(servant));
    return doorman::new_connection(&mpx, hdl);
  }
  void graceful_shutdown() override {
    acceptor_.graceful_shutdown();
    detach(&acceptor_.backend(), false);
  }
  void launch() override { acceptor_.start(this); }
  std::string addr() const override {
    auto x = net::local_addr_of_fd(acceptor_.fd());
    return x ? *x : std::string();
  }
  uint16_t port() const override {
    auto x = net::local_port_of_fd(acceptor_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { acceptor_.activate(this); }
  void remove_from_loop() override { acceptor_.passivate(); }

 private:
  net::acceptor_impl<accept_policy> acceptor_;
  std::shared_ptr<tls_context> context_;
};

// ---- the middleman actor that makes TLS sockets instead of plain ones ----

// The job named by the certificate the listener showed, captured while the connecting side
// verifies it (a certificate that fails verification is not kept by OpenSSL afterwards).
thread_local std::string shown_job;

int remember_shown_job(int preverify_ok, X509_STORE_CTX* store) {
  if (X509_STORE_CTX_get_error_depth(store) == 0)
    if (X509* cert = X509_STORE_CTX_get_current_cert(store)) shown_job = job_of_certificate(cert);
  return preverify_ok;
}

// The connecting side's handshake runs here, blocking this actor for at most the deadline,
// so that a refusal can be explained before CAF ever sees the socket.
caf::expected<SSL*> client_handshake(tls_context& context, int fd, const std::string& where) {
  timeval tv{static_cast<time_t>(tls_handshake_deadline.count() / 1000),
             static_cast<suseconds_t>((tls_handshake_deadline.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  SSL* ssl = SSL_new(context.ctx);
  if (!ssl) return caf::make_error(caf::sec::cannot_connect_to_node, "cannot make a TLS session");
  SSL_set_fd(ssl, fd);
  SSL_set_verify(ssl, SSL_VERIFY_PEER, remember_shown_job);
  shown_job.clear();
  ERR_clear_error();
  if (SSL_connect(ssl) != 1) {
    std::string why = openssl_errors();
    if (!shown_job.empty() && shown_job != context.job_id)
      why = where + " belongs to job " + shown_job + ", and this process's join token is for job " +
            context.job_id + "; use the join.token of the job you mean to join";
    SSL_free(ssl);
    return caf::make_error(caf::sec::cannot_connect_to_node,
                           "TLS handshake with " + where + " failed: " + why);
  }
  timeval none{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  return ssl;
}

class tls_middleman_actor : public caf::io::middleman_actor_impl {
 public:
  tls_middleman_actor(caf::actor_config& cfg, caf::actor basp, std::shared_ptr<tls_context> ctx)
      : caf::io::middleman_actor_impl(cfg, std::move(basp)), context_(std::move(ctx)) {}

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, uint16_t port) override {
    auto fd = connect_within_deadline(host, port);
    if (!fd) return std::move(fd.error());
    tune_control_socket(*fd);
    auto ssl = client_handshake(*context_, *fd, host + ":" + std::to_string(port));
    if (!ssl) {
      net::close_socket(*fd);
      return std::move(ssl.error());
    }
    return caf::make_counted<tls_scribe>(mpx(), *fd, context_, *ssl, true);
  }

  caf::expected<caf::io::doorman_ptr> open(uint16_t port, const char* addr, bool reuse) override {
    auto fd = net::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    // The processes this one starts (an agent's workers, the launcher's agents) must not hold
    // its listener open past its end; CAF 0.17's headers do not say whether it sees to that.
    sys::set_close_on_exec(*fd);
    return caf::make_counted<tls_doorman>(mpx(), *fd, context_);
  }

 private:
  net::default_multiplexer& mpx() {
    return static_cast<net::default_multiplexer&>(system().middleman().backend());
  }

  std::shared_ptr<tls_context> context_;
};

// One TLS middleman actor per actor system, stopped together with CAF's own middleman actor
// (an actor still alive when the system is destroyed crashes its teardown).
std::mutex spawn_mutex;
std::map<caf::actor_system*, caf::io::middleman_actor> tls_middlemen;

caf::io::middleman_actor tls_middleman(caf::actor_system& sys) {
  std::lock_guard lock(spawn_mutex);
  auto it = tls_middlemen.find(&sys);
  if (it != tls_middlemen.end()) return it->second;
  auto basp = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  // Detached, as CAF detaches its own middleman actor: connect() blocks in the TCP connect and
  // the TLS handshake (up to tls_handshake_deadline), which on the scheduler would hold one of
  // its two threads and leave the control actor (and the coordinator's heartbeats) one.
  caf::io::middleman_actor mm = sys.spawn<tls_middleman_actor, caf::detached + caf::hidden>(
      std::move(basp), process_context());
  tls_middlemen.emplace(&sys, mm);
  auto* plain = caf::actor_cast<caf::abstract_actor*>(sys.middleman().actor_handle());
  plain->attach_functor([sys_ptr = &sys] {
    caf::io::middleman_actor ours;
    {
      std::lock_guard inner(spawn_mutex);
      auto found = tls_middlemen.find(sys_ptr);
      if (found == tls_middlemen.end()) return;
      ours = std::move(found->second);
      tls_middlemen.erase(found);
    }
    caf::anon_send_exit(ours, caf::exit_reason::user_shutdown);
  });
  return mm;
}

}  // namespace

void set_control_socket_timeout(std::chrono::milliseconds timeout) {
  const auto ms = static_cast<unsigned>(std::max<int64_t>(0, timeout.count()));
  std::lock_guard lock(control_sockets_mutex);
  control_user_timeout_ms = ms;
  for (int fd : control_sockets) apply_user_timeout(fd, ms);
}

void set_rejection_listener(rejection_listener listener) {
  std::lock_guard lock(listener_mutex);
  on_rejection = std::move(listener);
}

uint64_t tls_rejected_connections() { return rejected.load(std::memory_order_relaxed); }

caf::expected<uint16_t> tls_publish(caf::actor_system& sys, const caf::actor& whom, uint16_t port,
                                    const std::string& host, bool reuse,
                                    const std::string& listener) {
  auto f = caf::make_function_view(tls_middleman(sys));
  auto result = f(caf::publish_atom::value, port, caf::actor_cast<caf::strong_actor_ptr>(whom),
                  sys.message_types(whom), host, reuse);
  if (!result) return std::move(result.error());
  const uint16_t actual = *result;
  std::lock_guard lock(listener_mutex);
  listener_names[actual] = listener;
  return actual;
}

caf::expected<caf::actor> tls_remote_actor(caf::actor_system& sys, const std::string& host,
                                           uint16_t port) {
  auto f = caf::make_function_view(tls_middleman(sys));
  auto result = f(caf::connect_atom::value, host, port);
  if (!result) return std::move(result.error());
  auto& ptr = std::get<1>(*result);
  if (!ptr)
    return caf::make_error(caf::sec::no_actor_published_at_port,
                           "nothing is published at " + host + ":" + std::to_string(port));
  return caf::actor_cast<caf::actor>(ptr);
}

}  // namespace troupe::actors
