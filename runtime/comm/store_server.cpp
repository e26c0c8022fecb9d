// tcp_store_server: one I/O thread owns all state, so no handler needs a lock; a get or wait
// on a missing key is parked under that key and answered by the set that completes it or by
// its own deadline timer. With an identity, a connection runs the handshake
// (runtime/auth/handshake.hpp) before its first byte reaches the request decoder; every bound
// (connections, pending handshakes, frame size, stored bytes) is in store_limits.
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
// clang-format off
#include <utility>  // Boost 1.74's asio uses std::exchange without including it
#include <boost/asio.hpp>
// clang-format on
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "runtime/auth/handshake.hpp"
#include "runtime/comm/store.hpp"
#include "runtime/comm/store_wire.hpp"
#include "runtime/sys/descriptors.hpp"

namespace troupe::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;

namespace {

struct session;
struct server_state;

/// A get or wait parked until its keys appear or its deadline passes.
struct waiter {
  waiter(asio::io_context& io, std::shared_ptr<session> s, wire::opcode o,
         std::vector<std::string> k)
      : owner(std::move(s)), op(o), keys(std::move(k)), timer(io) {}
  std::shared_ptr<session> owner;
  wire::opcode op;
  std::vector<std::string> keys;
  asio::steady_timer timer;
  std::string parked_on;  ///< the missing key it is indexed under
  bool done = false;
};

/// Longest wait the server honours, so a client's huge timeout cannot overflow the timer.
constexpr uint64_t max_wait_ms = 7ull * 24 * 3600 * 1000;
/// A body is read (and its buffer grown) this much at a time, so that memory follows the bytes
/// that really arrived, not what a length prefix promised.
constexpr size_t body_chunk_bytes = size_t{256} << 10;
/// What one stored key costs beyond its bytes (map node, string headers), for the byte bound.
constexpr size_t entry_overhead_bytes = 64;

size_t entry_cost(const std::string& key, size_t value_bytes) {
  return key.size() + value_bytes + entry_overhead_bytes;
}

/// Everything the server owns. Touched by the I/O thread only, except where atomic.
struct server_state {
  asio::io_context io;  // first member: destroyed last, after every socket and timer
  tcp::acceptor acceptor{io};
  tcp protocol = tcp::v4();
  asio::steady_timer accept_pause{io};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  uint16_t port = 0;
  std::atomic<size_t> n_waiting{0};
  std::atomic<uint64_t> n_rejected{0};

  // Set before the I/O thread starts, read-only afterwards.
  std::optional<auth::handshake_identity> identity;
  store_limits limits;
  store_rejection_callback on_rejection;

  // Touched only on the I/O thread (or after it has been joined).
  std::unordered_map<std::string, std::vector<char>> data;
  size_t stored_bytes = 0;
  std::unordered_map<std::string, std::vector<std::shared_ptr<waiter>>> parked;
  std::unordered_set<std::shared_ptr<session>> sessions;
  size_t n_pending = 0;     ///< sessions still in the handshake
  uint64_t n_accepted = 0;  ///< orders sessions by age

  void accept();
  void admit(tcp::socket sock);
  void reject(const std::shared_ptr<session>& s, const std::string& why);
  void rejected(const std::string& peer, const std::string& why);
  void handle(const std::shared_ptr<session>& s, const std::vector<char>& body);
  void park(const std::shared_ptr<session>& s, wire::opcode op, std::vector<std::string> keys,
            uint64_t timeout_ms);
  void wake(const std::string& key);
  const std::string* first_missing(const std::vector<std::string>& keys) const;
  void complete(const std::shared_ptr<waiter>& w);
  void expire(const std::shared_ptr<waiter>& w);
  void shutdown_state();
};

/// One client connection: proves itself (when the server has an identity), then reads a
/// request, answers it (maybe later), reads the next.
struct session : std::enable_shared_from_this<session> {
  session(server_state& srv, tcp::socket sock, std::string from, uint64_t n)
      : server(srv), socket(std::move(sock)), timer(srv.io), peer(std::move(from)), serial(n) {}

  /// Sends the hello and waits, at most handshake_timeout, for the answer.
  void start_handshake() {
    pending = true;
    ++server.n_pending;
    hello = auth::make_server_hello(*server.identity, auth::random_nonce());
    timer.expires_after(server.limits.handshake_timeout);
    timer.async_wait([self = shared_from_this()](const error_code& ec) {
      if (ec || self->closed) return;
      if (self->pending) {
        self->server.reject(
            self, "no handshake within " +
                      std::to_string(self->server.limits.handshake_timeout.count()) + " ms");
      }
    });
    asio::async_write(socket, asio::buffer(hello),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (ec) return self->lost("the handshake");
                      });
    asio::async_read(socket, asio::buffer(answer),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->lost("the handshake");
                       self->finish_handshake();
                     });
  }

  void finish_handshake() {
    const auth::handshake_outcome o =
        auth::check_client_answer(*server.identity, hello, answer, verdict);
    if (!o.ok()) {
      // The verdict tells an honest client of another job why; then the connection ends (the
      // timer still bounds a peer that does not read it).
      server.reject(shared_from_this(), "handshake refused: " + o.message);
      return;
    }
    end_pending();
    timer.cancel();
    asio::async_write(socket, asio::buffer(verdict),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (ec) return self->close();
                        self->read_header();
                      });
  }

  void read_header() {
    asio::async_read(socket, asio::buffer(header),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->close();
                       const uint32_t n = wire::frame_length(self->header);
                       if (n == 0 || n > self->server.limits.max_frame_bytes) {
                         return self->server.reject(
                             self, "a frame of " + std::to_string(n) + " bytes (the limit is " +
                                       std::to_string(self->server.limits.max_frame_bytes) + ")");
                       }
                       self->expected = n;
                       self->body.clear();
                       self->read_body();
                     });
  }

  void read_body() {
    const size_t have = body.size();
    const size_t more = std::min(expected - have, body_chunk_bytes);
    body.resize(have + more);
    asio::async_read(socket, asio::buffer(body.data() + have, more),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->close();
                       if (self->body.size() < self->expected) return self->read_body();
                       self->server.handle(self, self->body);
                     });
  }

  void respond(std::vector<char> frame) {
    out = std::move(frame);
    asio::async_write(socket, asio::buffer(out),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (ec || self->server.stopping) return self->close();
                        self->read_header();
                      });
  }

  /// The peer went away or failed mid-handshake: a rejection unless we closed it ourselves.
  void lost(const char* during) {
    if (closed || server.stopping) return close();
    if (pending) return server.reject(shared_from_this(), std::string("closed during ") + during);
    close();
  }

  void end_pending() {
    if (pending) {
      pending = false;
      --server.n_pending;
    }
  }

  /// Closes the socket and cancels the timer; handlers still queued see `closed`. Idempotent.
  void shut() {
    closed = true;
    end_pending();
    error_code ignored;
    socket.close(ignored);
    timer.cancel();
  }

  void close() {
    shut();
    server.sessions.erase(shared_from_this());
  }

  server_state& server;
  tcp::socket socket;
  asio::steady_timer timer;  ///< the handshake deadline
  std::string peer;          ///< host:port, for rejections
  uint64_t serial;           ///< accept order
  bool pending = false;      ///< in the handshake
  bool closed = false;
  auth::server_hello hello{};
  auth::client_answer answer{};
  auth::server_verdict verdict{};
  unsigned char header[4] = {};
  size_t expected = 0;  ///< the body length the header announced
  std::vector<char> body;
  std::vector<char> out;
};

std::vector<char> ok_frame() { return wire::writer().u8(uint8_t(wire::status::ok)).finish(); }

std::vector<char> error_frame(wire::status st, const std::string& msg) {
  return wire::writer().u8(uint8_t(st)).str(msg).finish();
}

std::string describe(const tcp::endpoint& ep) {
  const auto a = ep.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(ep.port());
}

}  // namespace

struct tcp_store_server::impl : server_state {};

store_auth store_auth::from_process() {
  store_auth a;
  if (const auto& creds = auth::process_credentials(); creds.valid()) {
    a.identity = auth::make_identity(creds, "store");
  }
  return a;
}

// Asio (1.74) opens and accepts sockets without close-on-exec, so a process the coordinator
// spawns would inherit them: connections are taken here with accept4(SOCK_CLOEXEC).
void server_state::accept() {
  acceptor.async_wait(tcp::acceptor::wait_read, [this](const error_code& ec) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) return accept();
    for (int i = 0; i < 64; ++i) {  // what is ready, but not forever: timers must run too
      const int fd =
          ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
          break;
        }
        // Out of descriptors or memory: the connection waits in the backlog; try again soon
        // instead of spinning on a listening socket that stays readable.
        accept_pause.expires_after(std::chrono::milliseconds(50));
        accept_pause.async_wait([this](const error_code& e) {
          if (!e && !stopping) accept();
        });
        return;
      }
      tcp::socket sock(io);
      error_code assigned;
      sock.assign(protocol, fd, assigned);
      if (assigned) {
        ::close(fd);
        continue;
      }
      admit(std::move(sock));
    }
    accept();
  });
}

void server_state::admit(tcp::socket sock) {
  error_code ec;
  const auto remote = sock.remote_endpoint(ec);
  std::string peer = ec ? std::string("an unknown peer") : describe(remote);
  if (sessions.size() >= limits.max_connections) {
    sock.close(ec);
    return rejected(peer,
                    "over the cap of " + std::to_string(limits.max_connections) + " connections");
  }
  if (sys::in_descriptor_reserve(sock.native_handle())) {  // kept for checkpoints and data
    sock.close(ec);
    return rejected(peer, "the process's descriptor reserve is reached");
  }
  sock.set_option(tcp::no_delay(true), ec);
  auto s = std::make_shared<session>(*this, std::move(sock), std::move(peer), ++n_accepted);
  sessions.insert(s);
  if (!identity) return s->read_header();
  if (n_pending >= limits.max_pending_handshakes) {
    // The oldest pending handshake goes, not the newest: a member finishes its handshake in
    // one round trip, so it outlives a flood of silent connections.
    std::shared_ptr<session> oldest;
    for (const auto& o : sessions) {
      if (o->pending && (!oldest || o->serial < oldest->serial)) oldest = o;
    }
    if (oldest) {
      reject(oldest, "evicted: more than " + std::to_string(limits.max_pending_handshakes) +
                         " handshakes pending");
    }
  }
  s->start_handshake();
}

void server_state::rejected(const std::string& peer, const std::string& why) {
  n_rejected.fetch_add(1, std::memory_order_relaxed);
  if (!on_rejection) return;
  try {
    on_rejection(peer, why);
  } catch (const std::exception&) {
    // A listener's logging failure must not take the store down.
  }
}

void server_state::reject(const std::shared_ptr<session>& s, const std::string& why) {
  if (s->closed) return;
  rejected(s->peer, why);
  if (s->pending && s->verdict[0] != 0) {
    // Tell an honest client of another job why (33 bytes), then close. A peer that does not
    // read its verdict is cut off at the handshake deadline.
    s->end_pending();
    asio::async_write(s->socket, asio::buffer(s->verdict),
                      [s](const error_code&, size_t) { s->close(); });
    s->timer.expires_after(limits.handshake_timeout);
    s->timer.async_wait([s](const error_code& ec) {
      if (!ec) s->close();
    });
    return;
  }
  s->close();
}

void server_state::handle(const std::shared_ptr<session>& s, const std::vector<char>& body) {
  if (stopping) return s->close();
  wire::request r;
  try {
    r = wire::decode_request(body.data(), body.size());
  } catch (const store_error& e) {
    if (e.code() == store_errc::invalid) {
      return s->respond(error_frame(wire::status::error, e.what()));
    }
    // A truncated frame: the stream cannot be trusted any more.
    return reject(s, std::string("a malformed request: ") + e.what());
  }
  switch (r.op) {
    case wire::opcode::set: {
      auto& key = r.keys[0];
      const auto it = data.find(key);
      const size_t old_cost = it == data.end() ? 0 : entry_cost(key, it->second.size());
      const size_t new_cost = entry_cost(key, r.value.size());
      if (stored_bytes - old_cost + new_cost > limits.max_stored_bytes) {
        return s->respond(error_frame(
            wire::status::full, "the store holds " + std::to_string(stored_bytes) + " of its " +
                                    std::to_string(limits.max_stored_bytes) + " bytes; " +
                                    std::to_string(r.value.size()) + " more do not fit"));
      }
      stored_bytes = stored_bytes - old_cost + new_cost;
      if (it == data.end()) {
        data.emplace(key, std::move(r.value));
      } else {
        it->second = std::move(r.value);
      }
      s->respond(ok_frame());
      wake(key);
      return;
    }
    case wire::opcode::get:
    case wire::opcode::wait: {
      if (r.keys.empty()) {
        return s->respond(error_frame(wire::status::error, "wait on an empty key list"));
      }
      if (first_missing(r.keys) == nullptr) {
        if (r.op == wire::opcode::get) {
          return s->respond(
              wire::writer().u8(uint8_t(wire::status::ok)).blob(data[r.keys[0]]).finish());
        }
        return s->respond(ok_frame());
      }
      return park(s, r.op, std::move(r.keys), r.number);
    }
    case wire::opcode::add: {
      const auto& key = r.keys[0];
      const auto delta = static_cast<int64_t>(r.number);
      int64_t value = 0;
      size_t old_cost = 0;
      if (auto it = data.find(key); it != data.end()) {
        old_cost = entry_cost(key, it->second.size());
        try {
          size_t used = 0;
          const std::string text(it->second.begin(), it->second.end());
          value = std::stoll(text, &used);
          if (used != text.size()) throw std::invalid_argument(text);
        } catch (const std::exception&) {
          return s->respond(error_frame(wire::status::error, "add: " + key + " is not a counter"));
        }
      }
      // Wraps like the two's complement it travels as, instead of overflowing.
      value = static_cast<int64_t>(static_cast<uint64_t>(value) + static_cast<uint64_t>(delta));
      const auto text = std::to_string(value);
      const size_t new_cost = entry_cost(key, text.size());
      if (stored_bytes - old_cost + new_cost > limits.max_stored_bytes) {
        return s->respond(error_frame(
            wire::status::full, "the store holds " + std::to_string(stored_bytes) + " of its " +
                                    std::to_string(limits.max_stored_bytes) +
                                    " bytes; a new counter does not fit"));
      }
      stored_bytes = stored_bytes - old_cost + new_cost;
      data[key] = std::vector<char>(text.begin(), text.end());
      s->respond(wire::writer().u8(uint8_t(wire::status::ok)).u64(uint64_t(value)).finish());
      wake(key);
      return;
    }
    case wire::opcode::check: {
      const bool all = first_missing(r.keys) == nullptr;
      return s->respond(wire::writer().u8(uint8_t(wire::status::ok)).u8(all ? 1 : 0).finish());
    }
  }
  s->respond(error_frame(wire::status::error, "unknown opcode"));
}

const std::string* server_state::first_missing(const std::vector<std::string>& keys) const {
  for (const auto& k : keys) {
    if (!data.contains(k)) return &k;
  }
  return nullptr;
}

void server_state::park(const std::shared_ptr<session>& s, wire::opcode op,
                        std::vector<std::string> keys, uint64_t timeout_ms) {
  auto w = std::make_shared<waiter>(io, s, op, std::move(keys));
  w->parked_on = *first_missing(w->keys);
  parked[w->parked_on].push_back(w);
  ++n_waiting;
  w->timer.expires_after(std::chrono::milliseconds(std::min(timeout_ms, max_wait_ms)));
  w->timer.async_wait([this, w](const error_code& ec) {
    if (!ec && !w->done) expire(w);
  });
}

void server_state::wake(const std::string& key) {
  auto it = parked.find(key);
  if (it == parked.end()) return;
  auto list = std::move(it->second);
  parked.erase(it);
  for (auto& w : list) {
    if (w->done) continue;
    if (const auto* missing = first_missing(w->keys)) {
      w->parked_on = *missing;
      parked[w->parked_on].push_back(w);
    } else {
      complete(w);
    }
  }
}

void server_state::complete(const std::shared_ptr<waiter>& w) {
  w->done = true;
  --n_waiting;
  w->timer.cancel();
  auto owner = std::move(w->owner);
  if (w->op == wire::opcode::get) {
    owner->respond(wire::writer().u8(uint8_t(wire::status::ok)).blob(data[w->keys[0]]).finish());
  } else {
    owner->respond(ok_frame());
  }
}

void server_state::expire(const std::shared_ptr<waiter>& w) {
  w->done = true;
  --n_waiting;
  if (auto it = parked.find(w->parked_on); it != parked.end()) {
    std::erase(it->second, w);
    if (it->second.empty()) parked.erase(it);
  }
  std::string missing;
  for (const auto& k : w->keys) {
    if (data.contains(k)) continue;
    if (!missing.empty()) missing += ", ";
    missing += k;
  }
  auto owner = std::move(w->owner);
  owner->respond(error_frame(wire::status::timeout, missing));
}

void server_state::shutdown_state() {
  error_code ignored;
  acceptor.close(ignored);
  accept_pause.cancel();
  for (auto& [key, list] : parked) {
    for (auto& w : list) {
      w->timer.cancel();
      w->owner.reset();
    }
  }
  parked.clear();
  n_waiting = 0;
  auto all = std::move(sessions);
  sessions.clear();
  for (const auto& s : all) s->shut();
}

tcp_store_server::tcp_store_server(const std::string& bind_host, uint16_t port,
                                   store_server_options options)
    : impl_(std::make_unique<impl>()) {
  auto& d = *impl_;
  d.identity = std::move(options.auth.identity);
  d.limits = options.limits;
  d.on_rejection = std::move(options.on_rejection);
  error_code ec;
  tcp::resolver resolver(d.io);
  const auto endpoints = resolver.resolve(bind_host, std::to_string(port), ec);
  if (ec || endpoints.empty()) {
    throw std::system_error(ec, "store server: cannot resolve " + bind_host);
  }
  const tcp::endpoint ep = endpoints.begin()->endpoint();
  d.protocol = ep.protocol();
  const int listen_fd =
      ::socket(ep.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, IPPROTO_TCP);
  if (listen_fd < 0) {
    throw std::system_error(errno, std::generic_category(), "store server: cannot make a socket");
  }
  d.acceptor.assign(ep.protocol(), listen_fd, ec);
  if (ec) {
    ::close(listen_fd);
    throw std::system_error(ec, "store server: cannot make a socket");
  }
  d.acceptor.set_option(tcp::acceptor::reuse_address(true));
  d.acceptor.bind(ep, ec);
  if (ec) {
    throw std::system_error(
        ec, "store server: cannot listen on " + bind_host + ":" + std::to_string(port));
  }
  d.acceptor.listen(asio::socket_base::max_listen_connections);
  d.port = d.acceptor.local_endpoint().port();
  d.accept();
  d.thread = std::thread([&d] {
    // A handler that throws (only out of memory can) must not end the server's service.
    for (;;) {
      try {
        d.io.run();
        return;
      } catch (const std::exception&) {
      }
    }
  });
}

tcp_store_server::~tcp_store_server() {
  try {
    stop();
  } catch (const std::exception&) {
    // Only joining the I/O thread can throw here; nothing better to do in a destructor.
  }
}

uint16_t tcp_store_server::port() const { return impl_->port; }

size_t tcp_store_server::waiting() const { return impl_->n_waiting.load(); }

uint64_t tcp_store_server::rejected_connections() const {
  return impl_->n_rejected.load(std::memory_order_relaxed);
}

void tcp_store_server::stop() {
  auto& d = *impl_;
  std::lock_guard<std::mutex> lock(d.stop_mutex);
  if (d.stopping.exchange(true)) return;
  d.work.reset();
  d.io.stop();
  if (d.thread.joinable()) d.thread.join();
  // The I/O thread is gone: tear down here, then let the cancelled handlers run so they drop
  // their references to sessions and waiters.
  d.shutdown_state();
  d.io.restart();
  d.io.poll();
}

}  // namespace troupe::comm
