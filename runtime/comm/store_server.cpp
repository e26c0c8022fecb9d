// tcp_store_server: one I/O thread owns all state, so no handler needs a lock; a get or wait
// on a missing key is parked under that key and answered by the set that completes it or by
// its own deadline timer.
#include <atomic>
// clang-format off
#include <utility>  // Boost 1.74's asio uses std::exchange without including it
#include <boost/asio.hpp>
// clang-format on
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "runtime/comm/store.hpp"
#include "runtime/comm/store_wire.hpp"

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

/// Everything the server owns. Touched by the I/O thread only, except where atomic.
struct server_state {
  asio::io_context io;  // first member: destroyed last, after every socket and timer
  tcp::acceptor acceptor{io};
  asio::executor_work_guard<asio::io_context::executor_type> work{io.get_executor()};
  std::thread thread;
  std::atomic<bool> stopping{false};
  std::mutex stop_mutex;
  uint16_t port = 0;
  std::atomic<size_t> n_waiting{0};

  // Touched only on the I/O thread (or after it has been joined).
  std::unordered_map<std::string, std::vector<char>> data;
  std::unordered_map<std::string, std::vector<std::shared_ptr<waiter>>> parked;
  std::unordered_set<std::shared_ptr<session>> sessions;

  void accept();
  void handle(const std::shared_ptr<session>& s, const std::vector<char>& body);
  void park(const std::shared_ptr<session>& s, wire::opcode op, std::vector<std::string> keys,
            uint64_t timeout_ms);
  void wake(const std::string& key);
  const std::string* first_missing(const std::vector<std::string>& keys) const;
  void complete(const std::shared_ptr<waiter>& w);
  void expire(const std::shared_ptr<waiter>& w);
  void shutdown_state();
};

/// One client connection: reads a request, answers it (maybe later), reads the next.
struct session : std::enable_shared_from_this<session> {
  session(server_state& srv, tcp::socket sock) : server(srv), socket(std::move(sock)) {}

  void read_header() {
    asio::async_read(socket, asio::buffer(header),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->close();
                       const uint32_t n = wire::frame_length(self->header);
                       if (n == 0 || n > wire::max_frame_bytes) return self->close();
                       self->body.resize(n);
                       self->read_body();
                     });
  }

  void read_body() {
    asio::async_read(socket, asio::buffer(body),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->close();
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

  void close() {
    error_code ignored;
    socket.close(ignored);
    server.sessions.erase(shared_from_this());
  }

  server_state& server;
  tcp::socket socket;
  unsigned char header[4] = {};
  std::vector<char> body;
  std::vector<char> out;
};

std::vector<char> ok_frame() { return wire::writer().u8(uint8_t(wire::status::ok)).finish(); }

std::vector<char> error_frame(wire::status st, const std::string& msg) {
  return wire::writer().u8(uint8_t(st)).str(msg).finish();
}

std::vector<std::string> read_keys(wire::reader& rd) {
  const uint32_t n = rd.u32();
  std::vector<std::string> keys;
  for (uint32_t i = 0; i < n; ++i) keys.push_back(rd.str());
  return keys;
}

}  // namespace

struct tcp_store_server::impl : server_state {};

void server_state::accept() {
  acceptor.async_accept([this](const error_code& ec, tcp::socket sock) {
    if (stopping || !acceptor.is_open()) return;
    if (!ec) {
      error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
      auto s = std::make_shared<session>(*this, std::move(sock));
      sessions.insert(s);
      s->read_header();
    }
    accept();
  });
}

void server_state::handle(const std::shared_ptr<session>& s, const std::vector<char>& body) {
  if (stopping) return s->close();
  try {
    wire::reader rd(body.data(), body.size());
    const auto op = static_cast<wire::opcode>(rd.u8());
    switch (op) {
      case wire::opcode::set: {
        auto key = rd.str();
        data[key] = rd.blob();
        s->respond(ok_frame());
        wake(key);
        return;
      }
      case wire::opcode::get:
      case wire::opcode::wait: {
        std::vector<std::string> keys;
        if (op == wire::opcode::get) {
          keys.push_back(rd.str());
        } else {
          keys = read_keys(rd);
        }
        const uint64_t timeout_ms = rd.u64();
        if (keys.empty()) {
          return s->respond(error_frame(wire::status::error, "wait on an empty key list"));
        }
        if (first_missing(keys) == nullptr) {
          if (op == wire::opcode::get) {
            return s->respond(
                wire::writer().u8(uint8_t(wire::status::ok)).blob(data[keys[0]]).finish());
          }
          return s->respond(ok_frame());
        }
        return park(s, op, std::move(keys), timeout_ms);
      }
      case wire::opcode::add: {
        auto key = rd.str();
        const auto delta = static_cast<int64_t>(rd.u64());
        int64_t value = 0;
        if (auto it = data.find(key); it != data.end()) {
          try {
            size_t used = 0;
            const std::string text(it->second.begin(), it->second.end());
            value = std::stoll(text, &used);
            if (used != text.size()) throw std::invalid_argument(text);
          } catch (const std::exception&) {
            return s->respond(
                error_frame(wire::status::error, "add: " + key + " is not a counter"));
          }
        }
        value += delta;
        const auto text = std::to_string(value);
        data[key] = std::vector<char>(text.begin(), text.end());
        s->respond(wire::writer().u8(uint8_t(wire::status::ok)).u64(uint64_t(value)).finish());
        wake(key);
        return;
      }
      case wire::opcode::check: {
        const auto keys = read_keys(rd);
        const bool all = first_missing(keys) == nullptr;
        return s->respond(wire::writer().u8(uint8_t(wire::status::ok)).u8(all ? 1 : 0).finish());
      }
    }
    s->respond(error_frame(wire::status::error, "unknown opcode"));
  } catch (const store_error&) {
    s->close();  // a truncated frame: the stream cannot be trusted any more
  }
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
  for (const auto& s : all) s->socket.close(ignored);
}

tcp_store_server::tcp_store_server(const std::string& bind_host, uint16_t port)
    : impl_(std::make_unique<impl>()) {
  auto& d = *impl_;
  error_code ec;
  tcp::resolver resolver(d.io);
  const auto endpoints = resolver.resolve(bind_host, std::to_string(port), ec);
  if (ec || endpoints.empty()) {
    throw std::system_error(ec, "store server: cannot resolve " + bind_host);
  }
  const tcp::endpoint ep = endpoints.begin()->endpoint();
  d.acceptor.open(ep.protocol());
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
