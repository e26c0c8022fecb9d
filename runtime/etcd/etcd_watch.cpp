// Watches: one long streamed answer per watch, on a connection and a thread of its own, reopened
// on the next member from the revision after the last event delivered.

#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/etcd/etcd_client.hpp"
#include "runtime/etcd/etcd_transport.hpp"
#include "runtime/etcd/etcd_wire.hpp"

namespace troupe::etcd {

using namespace detail;

namespace {

class stream_watcher final : public watcher {
 public:
  stream_watcher(std::shared_ptr<etcd_client::impl> client, watch_request request,
                 watch_callback on_events, watch_error_callback on_error)
      : client_(std::move(client)),
        request_(std::move(request)),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)),
        next_revision_(request_.start_revision) {
    thread_ = std::thread([this] { run(); });
  }

  ~stream_watcher() override { cancel(); }

  void cancel() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    abort_ = true;
    ioc_.stop();
    wake_.notify_all();
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

  std::int64_t next_revision() const override { return next_revision_.load(); }

 private:
  bool stopping() {
    std::lock_guard lock(mutex_);
    return stop_;
  }

  void report(const etcd_error& e) {
    if (on_error_ && !stopping()) on_error_(e);
  }

  void run() {
    auto delay = request_.retry_delay;
    std::size_t index = client_->preferred.load();
    while (!stopping()) {
      const endpoint& ep = client_->endpoints[index % client_->endpoints.size()];
      bool delivered = false;
      bool idle = false;
      try {
        if (stream(ep, delivered, idle)) return;  // compacted: the owner must re-read
      } catch (const etcd_error& e) {
        if (stopping()) return;
        report(e);
      }
      ++index;  // the next attempt goes to the next member
      if (idle) continue;
      if (delivered) delay = request_.retry_delay;
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, delay, [this] { return stop_; });
      delay = std::min<std::chrono::milliseconds>(delay * 2, std::chrono::milliseconds(1000));
    }
  }

  // One stream from open to break. Returns true when the watch must end (compacted).
  bool stream(const endpoint& ep, bool& delivered, bool& idle) {
    json create = range_body(request_.key, request_.prefix);
    if (next_revision_ > 0) create["start_revision"] = std::to_string(next_revision_.load());
    const std::string body = json{{"create_request", create}}.dump();

    connection conn(ioc_, client_->tls.get(), ep, &abort_);
    const auto open_deadline = clock_type::now() + client_->options.request_timeout;
    conn.open(open_deadline);
    conn.send("/v3/watch", body, open_deadline);
    http::response_parser<http::string_body> parser;
    parser.body_limit(boost::none);  // a watch never ends; each message is bounded instead
    conn.read_header(parser, open_deadline);
    if (parser.get().result_int() != 200) {
      conn.read_all(parser, clock_type::now() + client_->options.request_timeout);
      parse_answer(ep, "/v3/watch", parser.get().result_int(), parser.get().body());
      throw etcd_error(error_kind::protocol,
                       ep.url + "/v3/watch: HTTP " + std::to_string(parser.get().result_int()));
    }
    std::string& pending = parser.get().body();
    while (!stopping()) {
      bool more = false;
      try {
        more = conn.read_some(parser, clock_type::now() + request_.idle_timeout);
      } catch (const etcd_error& e) {
        if (e.kind() != error_kind::timeout) throw;
        // Silence is not an error: a quiet key sends nothing. Reopening (on the next member)
        // only guards against a member that is paused or cut off from the others.
        idle = true;
        return false;
      }
      if (!more) throw etcd_error(error_kind::unreachable, ep.url + "/v3/watch: the stream ended");
      std::size_t start = 0;
      for (std::size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
        if (nl > start && handle(ep, pending.substr(start, nl - start), delivered)) return true;
      }
      pending.erase(0, start);
      if (pending.size() > client_->options.max_response_bytes) {
        throw etcd_error(error_kind::protocol,
                         ep.url + "/v3/watch: a message larger than max_response_bytes");
      }
    }
    return false;
  }

  // One message of the stream. Returns true when the watch must end.
  bool handle(const endpoint& ep, const std::string& line, bool& delivered) {
    json answer;
    try {
      answer = parse_answer(ep, "/v3/watch", 200, line);
    } catch (attempt_failure& f) {
      throw f.error;
    }
    if (answer.value("canceled", false)) {
      const std::int64_t compact = int_field(answer, "compact_revision");
      if (compact > 0) {
        if (on_error_ && !stopping()) {
          on_error_(etcd_error(error_kind::compacted,
                               ep.url + "/v3/watch: revision " +
                                   std::to_string(next_revision_.load()) +
                                   " is compacted (oldest kept: " + std::to_string(compact) +
                                   "); read the current state and watch again from its revision"));
        }
        return true;
      }
      throw etcd_error(error_kind::server,
                       ep.url + "/v3/watch: etcd cancelled the watch: " +
                           answer.value("cancel_reason", std::string("no reason given")));
    }
    if (answer.value("created", false) && next_revision_ == 0) {
      // Resuming "from now" after a break would skip what happened in between: pin it.
      next_revision_ = header_revision(answer) + 1;
    }
    std::vector<watch_event> events;
    if (const auto it = answer.find("events"); it != answer.end() && it->is_array()) {
      for (const auto& e : *it) {
        watch_event ev;
        ev.what = e.value("type", std::string()) == "DELETE" ? watch_event::type::del
                                                             : watch_event::type::put;
        if (const auto kv = e.find("kv"); kv != e.end()) ev.kv = parse_kv(*kv);
        events.push_back(std::move(ev));
      }
    }
    if (!events.empty()) {
      next_revision_ = events.back().kv.mod_revision + 1;
      delivered = true;
      if (on_events_ && !stopping()) on_events_(events);
    }
    return false;
  }

  std::shared_ptr<etcd_client::impl> client_;
  watch_request request_;
  watch_callback on_events_;
  watch_error_callback on_error_;
  std::atomic<std::int64_t> next_revision_;
  net::io_context ioc_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::atomic<bool> abort_{false};  // stop_ for run_op, which cannot take the mutex
  std::thread thread_;
};

}  // namespace

std::unique_ptr<watcher> etcd_client::watch(watch_request request, watch_callback on_events,
                                            watch_error_callback on_error) {
  return std::make_unique<stream_watcher>(impl_, std::move(request), std::move(on_events),
                                          std::move(on_error));
}

}  // namespace troupe::etcd
