#include "tests/runtime/etcd/fake_etcd.hpp"

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "tests/runtime/etcd/fake_etcd_store.hpp"

namespace troupe::etcd::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;

namespace {

class session;

struct queued_failure {
  failure how;
  std::string path;
  std::size_t left = 0;
};

constexpr auto kSweepInterval = std::chrono::milliseconds(10);
// Far above any request the client sends; etcd itself refuses requests over 1.5 MiB.
constexpr std::size_t kMaxRequestBytes = 4u << 20;

}  // namespace

struct fake_etcd::impl {
  explicit impl(fake_options o) : options(o), store(o.min_lease_ttl) {}

  // Declared before the io_context: sessions destroyed with its handlers still count down here.
  fake_options options;
  mutable std::mutex mutex;  // guards store, failures and requests
  fake_store store;
  std::vector<queued_failure> failures;
  std::map<std::string, std::size_t> requests;
  std::size_t total_requests = 0;
  std::atomic<std::size_t> accepted{0};
  std::atomic<std::size_t> open{0};
  std::atomic<std::size_t> watches{0};

  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::steady_timer sweep{ioc};
  std::uint16_t port = 0;
  std::vector<std::weak_ptr<session>> sessions;  // touched on the io thread only
  std::thread thread;

  void listen();
  void accept();
  void sweep_leases();
  /// From any thread: lets every watch send what is new.
  void notify_watchers();
  void flush_watchers();
  /// Runs `f` on the io thread and waits for it.
  template <class F>
  void on_io_thread(F f) {
    std::promise<void> done;
    net::post(ioc, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
  template <class F>
  void each_session(F f) {
    std::vector<std::shared_ptr<session>> live;
    for (const auto& weak : sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
    sessions.clear();
    for (const auto& s : live) sessions.push_back(s);
    for (const auto& s : live) f(*s);
  }
};

namespace {

// One accepted connection: HTTP/1.1 requests one after the other, or one watch stream.
class session : public std::enable_shared_from_this<session> {
 public:
  session(fake_etcd::impl& owner, tcp::socket socket) : owner_(owner), socket_(std::move(socket)) {}
  ~session() { close(); }

  // Where a connection is: waiting for a request's first byte, reading it, writing its
  // answer, holding it unanswered (a hang), or streaming a watch.
  enum class state { idle, reading, answering, hung, watching };

  void start() { wait_for_request(); }
  state where() const { return state_; }
  bool watching() const { return watching_; }
  bool closed() const { return closed_; }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    // A FIN, as a server that closes a connection sends: the request, if any, was read whole.
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    --owner_.open;
    if (watching_) --owner_.watches;
  }

  void flush_watch() {
    if (!watching_ || closed_ || watch_over_) return;
    json message;
    {
      std::lock_guard lock(owner_.mutex);
      const auto events = owner_.store.events(watch_next_, watch_key_, watch_end_);
      if (!events) {
        // etcd cancels a watch whose start revision is compacted and says from where it has.
        message = {{"header", owner_.store.header()},
                   {"canceled", true},
                   {"compact_revision", std::to_string(owner_.store.compact_revision())}};
        watch_over_ = true;
      } else if (!events->empty()) {
        json list = json::array();
        for (const auto& e : *events) {
          json one = {{"kv", fake_store::to_json(e.kv)}};
          if (e.what == watch_event::type::del) one["type"] = "DELETE";
          list.push_back(std::move(one));
        }
        message = {{"header", owner_.store.header()}, {"events", std::move(list)}};
        watch_next_ = events->back().kv.mod_revision + 1;
      }
    }
    if (!message.is_null()) send_chunk(json{{"result", message}}.dump() + "\n");
  }

 private:
  // Idle until the next request's first byte arrives: only then is a request under way.
  void wait_for_request() {
    state_ = state::idle;
    if (buffer_.size() > 0) return read_request();
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      if (ec || self->closed_) return self->close();
      self->read_request();
    });
  }

  void read_request() {
    state_ = state::reading;
    parser_.emplace();
    parser_->body_limit(kMaxRequestBytes);
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec || self->closed_) return self->close();
                       self->handle();
                     });
  }

  std::optional<failure> count_and_pick_failure(const std::string& path) {
    std::lock_guard lock(owner_.mutex);
    ++owner_.requests[path];
    ++owner_.total_requests;
    for (auto it = owner_.failures.begin(); it != owner_.failures.end(); ++it) {
      if (!it->path.empty() && it->path != path) continue;
      failure how = it->how;
      if (--it->left == 0) owner_.failures.erase(it);
      return how;
    }
    return std::nullopt;
  }

  void handle() {
    const auto& req = parser_->get();
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    keep_alive_ = req.keep_alive() && owner_.options.keep_alive;
    json body = req.body().empty() ? json::object() : json::parse(req.body(), nullptr, false);
    const auto fail = count_and_pick_failure(path);
    if (fail && fail->what == failure::kind::close) return close();
    if (fail && fail->what == failure::kind::hang) {
      state_ = state::hung;
      return notice_close();
    }
    if (fail && fail->what == failure::kind::error) {
      return respond(fake_store::error_answer(fail->code, fail->message));
    }
    if (body.is_discarded() || !body.is_object()) {
      return respond(fake_store::error_answer(3, "invalid character in the request body"));
    }
    if (path == "/v3/watch" && !fail) return start_watch(body);
    gateway_answer answer;
    {
      std::lock_guard lock(owner_.mutex);
      answer = owner_.store.call(path, body);
    }
    owner_.notify_watchers();
    if (fail) return close();  // apply_then_close
    respond(answer);
  }

  void respond(const gateway_answer& answer) {
    http::response<http::string_body> res{static_cast<http::status>(answer.status), 11};
    if (answer.body.is_null()) {
      // etcd's HTTP mux for a path it does not serve.
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "404 page not found\n";
    } else {
      res.set(http::field::content_type, "application/json");
      res.body() = answer.body.dump();
    }
    res.keep_alive(keep_alive_);
    res.prepare_payload();
    std::ostringstream text;
    text << res;
    state_ = state::answering;
    auto bytes = std::make_shared<std::string>(text.str());
    net::async_write(socket_, net::buffer(*bytes),
                     [self = shared_from_this(), bytes](beast::error_code ec, std::size_t) {
                       if (ec || !self->keep_alive_) return self->close();
                       self->wait_for_request();
                     });
  }

  // A hung request: nothing more is read or written, but a client that gives up and closes
  // its end is noticed, so that the connection counts as closed.
  void notice_close() {
    socket_.async_read_some(net::buffer(sink_),
                            [self = shared_from_this()](beast::error_code ec, std::size_t) {
                              if (ec || self->closed_) return self->close();
                              self->notice_close();
                            });
  }

  // The gateway answers a watch with one chunked response that never ends: a "created"
  // message, then one message per batch of events, each a line of JSON.
  void start_watch(const json& body) {
    const json create = body.value("create_request", json::object());
    const auto b64 = [&](const char* name) {
      const auto it = create.find(name);
      return it != create.end() && it->is_string() ? base64_decode(it->get<std::string>())
                                                   : std::string();
    };
    watch_key_ = b64("key");
    watch_end_ = b64("range_end");
    json created;
    {
      std::lock_guard lock(owner_.mutex);
      const auto start = create.find("start_revision");
      watch_next_ = start == create.end()        ? 0
                    : start->is_string()         ? std::stoll(start->get<std::string>())
                    : start->is_number_integer() ? start->get<std::int64_t>()
                                                 : 0;
      if (watch_next_ == 0) watch_next_ = owner_.store.revision() + 1;
      created = {{"result", {{"header", owner_.store.header()}, {"created", true}}}};
    }
    watching_ = true;
    state_ = state::watching;
    ++owner_.watches;
    send_raw(std::make_shared<std::string>(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
    send_chunk(created.dump() + "\n");
    flush_watch();
    notice_close();
  }

  void send_chunk(const std::string& data) {
    std::ostringstream chunk;
    chunk << std::hex << data.size() << "\r\n" << data << "\r\n";
    send_raw(std::make_shared<std::string>(chunk.str()));
  }

  // Watch writes come at any time: they queue, one on the wire at a time.
  void send_raw(std::shared_ptr<std::string> bytes) {
    out_.push_back(std::move(bytes));
    if (out_.size() == 1) write_next();
  }

  void write_next() {
    if (out_.empty() || closed_) return;
    net::async_write(socket_, net::buffer(*out_.front()),
                     [self = shared_from_this()](beast::error_code ec, std::size_t) {
                       if (ec) return self->close();
                       self->out_.pop_front();
                       self->write_next();
                     });
  }

  fake_etcd::impl& owner_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  state state_ = state::idle;
  bool closed_ = false;
  bool keep_alive_ = true;
  std::deque<std::shared_ptr<std::string>> out_;
  std::array<char, 512> sink_{};
  bool watching_ = false;
  bool watch_over_ = false;
  std::string watch_key_;
  std::string watch_end_;
  std::int64_t watch_next_ = 0;
};

}  // namespace

void fake_etcd::impl::listen() {
  const tcp::endpoint where(net::ip::make_address("127.0.0.1"), port);
  acceptor.open(where.protocol());
  acceptor.set_option(net::socket_base::reuse_address(true));
  acceptor.bind(where);
  acceptor.listen();
  port = acceptor.local_endpoint().port();
}

void fake_etcd::impl::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (acceptor.is_open()) accept();  // a failed accept, not a closed listener
      return;
    }
    ++accepted;
    ++open;
    auto s = std::make_shared<session>(*this, std::move(socket));
    sessions.push_back(s);
    s->start();
    accept();
  });
}

void fake_etcd::impl::sweep_leases() {
  sweep.expires_after(kSweepInterval);
  sweep.async_wait([this](beast::error_code ec) {
    if (ec) return;
    std::size_t expired = 0;
    if (options.expire_leases) {
      std::lock_guard lock(mutex);
      expired = store.expire_due(fake_store::clock_type::now());
    }
    if (expired > 0) flush_watchers();
    sweep_leases();
  });
}

void fake_etcd::impl::notify_watchers() {
  net::post(ioc, [this] { flush_watchers(); });
}

void fake_etcd::impl::flush_watchers() {
  each_session([](session& s) {
    if (s.watching()) s.flush_watch();
  });
}

// ---- the interface ----

fake_etcd::fake_etcd(fake_options options) : impl_(std::make_unique<impl>(options)) {
  impl_->listen();
  impl_->accept();
  impl_->sweep_leases();
  impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

fake_etcd::~fake_etcd() {
  impl_->on_io_thread([this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->sweep.cancel();
    impl_->each_session([](session& s) { s.close(); });
  });
  impl_->ioc.stop();
  impl_->thread.join();
}

std::string fake_etcd::url() const { return "http://127.0.0.1:" + std::to_string(port()); }
std::uint16_t fake_etcd::port() const { return impl_->port; }

std::int64_t fake_etcd::revision() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->store.revision();
}

std::optional<key_value> fake_etcd::get(const std::string& key) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->store.get(key);
}

std::vector<key_value> fake_etcd::get_prefix(const std::string& prefix) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->store.range(prefix, prefix_range_end(prefix));
}

std::int64_t fake_etcd::put(const std::string& key, const std::string& value, std::int64_t lease) {
  std::int64_t rev = 0;
  {
    std::lock_guard lock(impl_->mutex);
    rev = impl_->store.put(key, value, lease);
  }
  impl_->notify_watchers();
  return rev;
}

std::int64_t fake_etcd::del(const std::string& key, bool prefix) {
  std::int64_t deleted = 0;
  {
    std::lock_guard lock(impl_->mutex);
    deleted = impl_->store.del(key, prefix ? prefix_range_end(key) : std::string());
  }
  impl_->notify_watchers();
  return deleted;
}

void fake_etcd::compact(std::int64_t revision) {
  std::lock_guard lock(impl_->mutex);
  impl_->store.compact(revision);
}

void fake_etcd::seed(std::vector<key_value> kvs, std::int64_t revision) {
  std::lock_guard lock(impl_->mutex);
  impl_->store.seed(std::move(kvs), revision);
}

std::int64_t fake_etcd::grant_lease(std::chrono::seconds ttl, std::int64_t id) {
  std::lock_guard lock(impl_->mutex);
  return impl_->store.grant(ttl, id);
}

bool fake_etcd::expire_lease(std::int64_t id) {
  bool found = false;
  {
    std::lock_guard lock(impl_->mutex);
    found = impl_->store.end_lease(id);
  }
  impl_->notify_watchers();
  return found;
}

std::vector<std::int64_t> fake_etcd::leases() const {
  std::lock_guard lock(impl_->mutex);
  return impl_->store.leases();
}

std::optional<std::chrono::milliseconds> fake_etcd::lease_remaining(std::int64_t id) const {
  std::lock_guard lock(impl_->mutex);
  const auto left = impl_->store.lease_remaining(id);
  if (!left) return std::nullopt;
  return std::chrono::duration_cast<std::chrono::milliseconds>(*left);
}

void fake_etcd::fail_next(std::size_t n, failure how, const std::string& path) {
  if (n == 0) return;
  std::lock_guard lock(impl_->mutex);
  impl_->failures.push_back({std::move(how), path, n});
}

void fake_etcd::clear_failures() {
  std::lock_guard lock(impl_->mutex);
  impl_->failures.clear();
}

void fake_etcd::close_idle_connections() {
  // An answer being written is let finish first: its connection turns idle once the write's
  // completion has run on the io thread, and is closed on a later round.
  for (bool answering = true; answering;) {
    answering = false;
    impl_->on_io_thread([&] {
      impl_->each_session([&](session& s) {
        if (s.closed()) return;
        if (s.where() == session::state::idle) s.close();
        if (s.where() == session::state::answering) answering = true;
      });
    });
  }
}

void fake_etcd::close_all_connections() {
  impl_->on_io_thread([this] { impl_->each_session([](session& s) { s.close(); }); });
}

void fake_etcd::stop_serving() {
  impl_->on_io_thread([this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->each_session([](session& s) { s.close(); });
  });
}

void fake_etcd::resume_serving() {
  impl_->on_io_thread([this] {
    if (impl_->acceptor.is_open()) return;
    impl_->listen();
    impl_->accept();
  });
}

std::size_t fake_etcd::connections_accepted() const { return impl_->accepted.load(); }
std::size_t fake_etcd::open_connections() const { return impl_->open.load(); }
std::size_t fake_etcd::open_watches() const { return impl_->watches.load(); }

std::size_t fake_etcd::requests(const std::string& path) const {
  std::lock_guard lock(impl_->mutex);
  if (path.empty()) return impl_->total_requests;
  const auto it = impl_->requests.find(path);
  return it == impl_->requests.end() ? 0 : it->second;
}

}  // namespace troupe::etcd::testing
