// The store's client side: the kv_store helpers, prefix_store, and the TCP client that talks to
// tcp_store_server with a deadline on every call.
#include "runtime/comm/store.hpp"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
// clang-format off
#include <utility>  // Boost 1.74's asio uses std::exchange without including it
#include <boost/asio.hpp>
// clang-format on
#include <mutex>
#include <thread>

#include "runtime/comm/store_wire.hpp"

namespace troupe::comm {

namespace asio = boost::asio;
using asio::ip::tcp;
using clock_type = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* to_string(store_errc code) {
  switch (code) {
    case store_errc::timeout:
      return "timeout";
    case store_errc::unreachable:
      return "unreachable";
    case store_errc::connection_lost:
      return "connection_lost";
    case store_errc::protocol:
      return "protocol";
    case store_errc::invalid:
      return "invalid";
    case store_errc::refused:
      return "refused";
    case store_errc::full:
      return "full";
    case store_errc::cancelled:
      return "cancelled";
  }
  return "unknown";
}

void kv_store::set_string(const std::string& key, std::string_view value) {
  set(key, std::vector<char>(value.begin(), value.end()));
}

std::string kv_store::get_string(const std::string& key, milliseconds timeout) {
  const auto v = get(key, timeout);
  return std::string(v.begin(), v.end());
}

comm_error as_connect_error(const store_error& e, const std::string& where) {
  const comm_errc code = e.code() == store_errc::timeout     ? comm_errc::timeout
                         : e.code() == store_errc::cancelled ? comm_errc::aborted
                                                             : comm_errc::internal;
  return comm_error(code, where + ": store: " + e.what());
}

// ---- interruptible_store ----

interruptible_store::interruptible_store(kv_store& base, cancel_check cancelled, milliseconds poll)
    : base_(base), cancelled_(std::move(cancelled)), poll_(std::max(poll, milliseconds(1))) {}

template <class Wait>
auto interruptible_store::in_slices(const std::string& what, milliseconds timeout, Wait wait_for) {
  if (timeout.count() < 0) throw store_error(store_errc::invalid, "negative timeout for " + what);
  const auto deadline = clock_type::now() + timeout;
  for (;;) {
    if (cancelled_ && cancelled_())
      throw store_error(store_errc::cancelled, "stopped waiting for " + what + ": cancelled");
    const auto left =
        std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline - clock_type::now()));
    const bool last = left <= poll_;
    try {
      return wait_for(last ? left : poll_);
    } catch (const store_error& e) {
      if (e.code() != store_errc::timeout) throw;
      if (last)
        throw store_error(store_errc::timeout, std::string(e.what()) + " (" +
                                                   std::to_string(timeout.count()) + " ms in all)");
    }
  }
}

void interruptible_store::set(const std::string& key, const std::vector<char>& value) {
  base_.set(key, value);
}

std::vector<char> interruptible_store::get(const std::string& key, milliseconds timeout) {
  return in_slices(key, timeout, [&](milliseconds slice) { return base_.get(key, slice); });
}

void interruptible_store::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  in_slices(std::to_string(keys.size()) + " keys", timeout,
            [&](milliseconds slice) { base_.wait(keys, slice); });
}

int64_t interruptible_store::add(const std::string& key, int64_t delta) {
  return base_.add(key, delta);
}

bool interruptible_store::check(const std::vector<std::string>& keys) { return base_.check(keys); }

// ---- prefix_store ----

prefix_store::prefix_store(kv_store& base, std::string prefix)
    : base_(base), prefix_(std::move(prefix)) {
  if (!prefix_.empty() && prefix_.back() != '/') prefix_ += '/';
}

std::vector<std::string> prefix_store::full(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(full(k));
  return out;
}

void prefix_store::set(const std::string& key, const std::vector<char>& value) {
  base_.set(full(key), value);
}
std::vector<char> prefix_store::get(const std::string& key, milliseconds timeout) {
  return base_.get(full(key), timeout);
}
void prefix_store::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  base_.wait(full(keys), timeout);
}
int64_t prefix_store::add(const std::string& key, int64_t delta) {
  return base_.add(full(key), delta);
}
bool prefix_store::check(const std::vector<std::string>& keys) { return base_.check(full(keys)); }

// ---- tcp client ----

namespace {

std::string describe(const std::vector<std::string>& keys) {
  std::string out;
  for (const auto& k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

/// One connection to a tcp_store_server. Calls are serialised by a mutex: the protocol is
/// strictly request/response, and a call that missed its deadline poisons the stream (its
/// answer may still arrive), so such a call closes the socket and the next one reconnects.
class tcp_store_client final : public kv_store {
 public:
  tcp_store_client(std::string host, uint16_t port, milliseconds io_timeout, store_auth auth)
      : host_(std::move(host)), port_(port), io_timeout_(io_timeout), auth_(std::move(auth)) {}

  /// Connects and, with an identity, runs the handshake. A server that closes or stays silent
  /// before the handshake is done is retried (it may be over its caps for a moment); one that
  /// refuses this process, or that this process refuses, fails at once with store_errc::refused.
  void connect(clock_type::time_point deadline, bool retry) {
    boost::system::error_code last;
    bool in_handshake = false;
    auto backoff = milliseconds(5);
    for (;;) {
      boost::system::error_code ec;
      tcp::resolver resolver(io_);
      const auto endpoints = resolver.resolve(host_, std::to_string(port_), ec);
      if (ec) {
        last = ec;
      } else {
        bool done = false;
        boost::system::error_code result;
        asio::async_connect(socket_, endpoints,
                            [&](const boost::system::error_code& e, const tcp::endpoint&) {
                              result = e;
                              done = true;
                            });
        run_until(deadline);
        if (!done) {
          drain();
          last = asio::error::timed_out;
        } else if (result) {
          last = result;
        } else {
          socket_.set_option(tcp::no_delay(true), ec);
          // Asio opens it without close-on-exec; a process this one spawns must not hold it.
          ::fcntl(socket_.native_handle(), F_SETFD, FD_CLOEXEC);
          if (!auth_.identity || handshake(deadline, last)) return;
          in_handshake = true;
        }
      }
      boost::system::error_code ignored;
      socket_.close(ignored);
      const auto now = clock_type::now();
      if (!retry || now >= deadline) break;
      std::this_thread::sleep_for(std::min<clock_type::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, milliseconds(200));
    }
    if (in_handshake) {
      throw store_error(store_errc::unreachable,
                        "the key-value store at " + endpoint() +
                            " closed the connection or stayed silent during the handshake (" +
                            last.message() +
                            "); is it over its connection cap, or not this job's store?");
    }
    throw store_error(store_errc::unreachable,
                      "no key-value store answered at " + endpoint() + " within " +
                          std::to_string(io_timeout_.count()) + " ms: " + last.message());
  }

  void set(const std::string& key, const std::vector<char>& value) override {
    auto req = wire::writer().u8(uint8_t(wire::opcode::set)).str(key).blob(value);
    call(req.finish(), clock_type::now() + io_timeout_, "set(" + key + ")");
  }

  std::vector<char> get(const std::string& key, milliseconds timeout) override {
    check_timeout(timeout, key);
    auto req = wire::writer().u8(uint8_t(wire::opcode::get)).str(key).u64(timeout.count());
    auto body = call(req.finish(), wait_deadline(timeout), "get(" + key + ")");
    wire::reader rd(body.data() + 1, body.size() - 1);
    return rd.blob();
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    check_timeout(timeout, describe(keys));
    auto w = wire::writer();
    w.u8(uint8_t(wire::opcode::wait)).u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    w.u64(timeout.count());
    call(w.finish(), wait_deadline(timeout), "wait(" + describe(keys) + ")");
  }

  int64_t add(const std::string& key, int64_t delta) override {
    auto req = wire::writer().u8(uint8_t(wire::opcode::add)).str(key).u64(uint64_t(delta));
    auto body = call(req.finish(), clock_type::now() + io_timeout_, "add(" + key + ")");
    wire::reader rd(body.data() + 1, body.size() - 1);
    return static_cast<int64_t>(rd.u64());
  }

  bool check(const std::vector<std::string>& keys) override {
    auto w = wire::writer();
    w.u8(uint8_t(wire::opcode::check)).u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    auto body = call(w.finish(), clock_type::now() + io_timeout_, "check(" + describe(keys) + ")");
    wire::reader rd(body.data() + 1, body.size() - 1);
    return rd.u8() != 0;
  }

 private:
  std::string endpoint() const { return host_ + ":" + std::to_string(port_); }

  void check_timeout(milliseconds timeout, const std::string& what) const {
    if (timeout.count() < 0) {
      throw store_error(store_errc::invalid,
                        "store " + endpoint() + ": negative timeout for " + what);
    }
  }

  /// The server answers a blocked get/wait at its deadline; give it a little longer to be heard
  /// before treating the server as hung.
  clock_type::time_point wait_deadline(milliseconds timeout) const {
    return clock_type::now() + timeout + std::min(io_timeout_, milliseconds(2000));
  }

  /// Runs one read or write started by `start(handler)` until `deadline`. False (with `last`
  /// set, the socket closed) if it failed or did not finish in time.
  template <class Start>
  bool transfer(Start start, clock_type::time_point deadline, boost::system::error_code& last) {
    bool done = false;
    boost::system::error_code result;
    start([&](const boost::system::error_code& e, size_t) {
      result = e;
      done = true;
    });
    run_until(deadline);
    if (!done) {
      drain();
      last = asio::error::timed_out;
      return false;
    }
    if (result) {
      last = result;
      boost::system::error_code ignored;
      socket_.close(ignored);
      return false;
    }
    return true;
  }

  /// The client's half of runtime/auth/handshake.hpp on a fresh connection. False when the
  /// server went away or stalled; throws store_error{refused} when either side refused.
  bool handshake(clock_type::time_point deadline, boost::system::error_code& last) {
    const auth::handshake_identity& me = *auth_.identity;
    const std::string where = "the key-value store at " + endpoint();
    auth::server_hello hello{};
    if (!transfer([&](auto h) { asio::async_read(socket_, asio::buffer(hello), h); }, deadline,
                  last)) {
      return false;
    }
    const auth::handshake_outcome seen = auth::check_server_hello(me, hello, where);
    const auth::client_answer answer = auth::make_client_answer(me, hello, auth::random_nonce());
    boost::system::error_code ignored;
    if (!seen.ok()) {
      // Answer anyway (without a MAC), so that the server can count and log why.
      if (seen.status != auth::handshake_status::not_troupe) {
        transfer([&](auto h) { asio::async_write(socket_, asio::buffer(answer), h); },
                 std::min(deadline, clock_type::now() + milliseconds(500)), ignored);
      }
      socket_.close(ignored);
      throw store_error(store_errc::refused, seen.message);
    }
    auth::server_verdict verdict{};
    if (!transfer([&](auto h) { asio::async_write(socket_, asio::buffer(answer), h); }, deadline,
                  last) ||
        !transfer([&](auto h) { asio::async_read(socket_, asio::buffer(verdict), h); }, deadline,
                  last)) {
      return false;
    }
    const auth::handshake_outcome v = auth::check_server_verdict(me, hello, answer, verdict, where);
    if (!v.ok()) {
      socket_.close(ignored);
      throw store_error(store_errc::refused, v.message);
    }
    return true;
  }

  void run_until(clock_type::time_point deadline) {
    io_.restart();
    io_.run_until(deadline);
  }

  /// Cancels whatever is still pending and lets its handlers run, so none outlives the frame
  /// whose locals it captured.
  void drain() {
    boost::system::error_code ignored;
    socket_.close(ignored);
    io_.restart();
    io_.run();
  }

  /// Sends one request and returns the response body (status byte first) if the status is ok.
  std::vector<char> call(const std::vector<char>& request, clock_type::time_point deadline,
                         const std::string& what) {
    if (request.size() - 4 > wire::max_frame_bytes) {
      throw store_error(store_errc::invalid, "store " + endpoint() + ": " + what + " is " +
                                                 std::to_string(request.size() - 4) +
                                                 " bytes, over the store's limit of " +
                                                 std::to_string(wire::max_frame_bytes));
    }
    std::lock_guard<std::mutex> lock(m_);
    if (!socket_.is_open()) connect(std::min(deadline, clock_type::now() + io_timeout_), false);

    bool done = false;
    bool got_hello = false;
    boost::system::error_code result;
    unsigned char header[4];
    std::vector<char> body;
    auto finish = [&](const boost::system::error_code& e) {
      result = e;
      done = true;
    };
    asio::async_write(
        socket_, asio::buffer(request), [&](const boost::system::error_code& e, size_t) {
          if (e) return finish(e);
          asio::async_read(
              socket_, asio::buffer(header), [&](const boost::system::error_code& e2, size_t) {
                if (e2) return finish(e2);
                if (std::memcmp(header, auth::handshake_magic.data(), sizeof header) == 0) {
                  got_hello = true;
                  return finish(asio::error::message_size);
                }
                const uint32_t n = wire::frame_length(header);
                if (n == 0 || n > wire::max_frame_bytes + wire::max_answer_overhead) {
                  return finish(asio::error::message_size);
                }
                body.resize(n);
                asio::async_read(socket_, asio::buffer(body),
                                 [&](const boost::system::error_code& e3, size_t) { finish(e3); });
              });
        });
    run_until(deadline);
    if (!done) {
      drain();
      throw store_error(store_errc::timeout,
                        "store " + endpoint() + " did not answer " + what + " in time");
    }
    if (result) {
      boost::system::error_code ignored;
      socket_.close(ignored);
      if (got_hello) {
        throw store_error(store_errc::refused,
                          "the key-value store at " + endpoint() +
                              " admits only the job's members, and this process holds no job "
                              "credentials (start it with --join-token)");
      }
      throw store_error(
          store_errc::connection_lost,
          "store " + endpoint() + " lost the connection during " + what + ": " + result.message());
    }
    wire::reader rd(body.data(), body.size());
    switch (static_cast<wire::status>(rd.u8())) {
      case wire::status::ok:
        return body;
      case wire::status::timeout:
        throw store_error(store_errc::timeout,
                          "store " + endpoint() + ": " + what + " timed out; missing: " + rd.str());
      case wire::status::error:
        throw store_error(store_errc::protocol,
                          "store " + endpoint() + ": " + what + " failed: " + rd.str());
      case wire::status::full:
        throw store_error(store_errc::full,
                          "store " + endpoint() + ": " + what + " refused: " + rd.str());
    }
    throw store_error(store_errc::protocol, "store " + endpoint() + ": bad status for " + what);
  }

  std::string host_;
  uint16_t port_;
  milliseconds io_timeout_;
  store_auth auth_;
  std::mutex m_;
  asio::io_context io_;
  tcp::socket socket_{io_};
};

}  // namespace

std::unique_ptr<kv_store> connect_tcp_store(const std::string& host, uint16_t port,
                                            milliseconds timeout, store_auth auth) {
  auto client = std::make_unique<tcp_store_client>(host, port, timeout, std::move(auth));
  client->connect(clock_type::now() + timeout, true);
  return client;
}

}  // namespace troupe::comm
