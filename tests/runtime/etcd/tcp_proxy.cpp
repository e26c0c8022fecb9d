#include "tests/runtime/etcd/tcp_proxy.hpp"

#include <array>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace troupe::etcd::testing {

namespace net = boost::asio;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

namespace {

// One relayed connection: bytes go both ways until either side ends, then both are closed.
class relay : public std::enable_shared_from_this<relay> {
 public:
  relay(tcp::socket client, net::io_context& ioc, std::atomic<std::size_t>& open)
      : client_(std::move(client)), server_(ioc), open_(open) {}
  ~relay() { close(); }

  void start(const tcp::endpoint& upstream) {
    server_.async_connect(upstream, [self = shared_from_this()](error_code ec) {
      if (ec) return self->close();
      self->pump(self->client_, self->server_, self->up_);
      self->pump(self->server_, self->client_, self->down_);
    });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    error_code ec;
    for (auto* s : {&client_, &server_}) {
      s->shutdown(tcp::socket::shutdown_both, ec);
      s->close(ec);
    }
    --open_;
  }

 private:
  void pump(tcp::socket& from, tcp::socket& to, std::array<char, 16384>& buf) {
    from.async_read_some(net::buffer(buf), [self = shared_from_this(), &from, &to, &buf](
                                               error_code ec, std::size_t n) {
      if (ec || self->closed_) return self->close();
      net::async_write(to, net::buffer(buf.data(), n),
                       [self, &from, &to, &buf](error_code wec, std::size_t) {
                         if (wec || self->closed_) return self->close();
                         self->pump(from, to, buf);
                       });
    });
  }

  tcp::socket client_;
  tcp::socket server_;
  std::atomic<std::size_t>& open_;
  std::array<char, 16384> up_{};
  std::array<char, 16384> down_{};
  bool closed_ = false;
};

tcp::endpoint parse_upstream(const std::string& upstream) {
  std::string rest = upstream;
  if (const auto scheme = rest.find("://"); scheme != std::string::npos) rest.erase(0, scheme + 3);
  const auto colon = rest.rfind(':');
  if (colon == std::string::npos) throw std::invalid_argument("tcp_proxy: no port in " + upstream);
  const std::string host =
      rest.substr(0, colon) == "localhost" ? "127.0.0.1" : rest.substr(0, colon);
  return {net::ip::make_address(host),
          static_cast<unsigned short>(std::stoi(rest.substr(colon + 1)))};
}

}  // namespace

struct tcp_proxy::impl {
  explicit impl(const std::string& upstream) : target(parse_upstream(upstream)) {}

  // Before the io_context: relays destroyed with its handlers still count down here.
  std::atomic<std::size_t> accepted{0};
  std::atomic<std::size_t> open{0};
  tcp::endpoint target;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc, tcp::endpoint(net::ip::make_address("127.0.0.1"), 0)};
  std::uint16_t port = acceptor.local_endpoint().port();
  std::vector<std::weak_ptr<relay>> relays;  // touched on the io thread only
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](error_code ec, tcp::socket socket) {
      if (ec) {
        if (acceptor.is_open()) accept();
        return;
      }
      ++accepted;
      ++open;
      auto r = std::make_shared<relay>(std::move(socket), ioc, open);
      relays.push_back(r);
      r->start(target);
      accept();
    });
  }

  template <class F>
  void on_io_thread(F f) {
    std::promise<void> done;
    net::post(ioc, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }

  void close_all() {
    for (const auto& weak : relays) {
      if (auto r = weak.lock()) r->close();
    }
    relays.clear();
  }
};

tcp_proxy::tcp_proxy(const std::string& upstream) : impl_(std::make_unique<impl>(upstream)) {
  impl_->accept();
  impl_->thread = std::thread([this] { impl_->ioc.run(); });
}

tcp_proxy::~tcp_proxy() {
  impl_->on_io_thread([this] {
    error_code ec;
    impl_->acceptor.close(ec);
    impl_->close_all();
  });
  impl_->ioc.stop();
  impl_->thread.join();
}

std::uint16_t tcp_proxy::port() const { return impl_->port; }

std::string tcp_proxy::url(const std::string& scheme) const {
  return scheme + "://127.0.0.1:" + std::to_string(port());
}

std::size_t tcp_proxy::connections_accepted() const { return impl_->accepted.load(); }
std::size_t tcp_proxy::open_connections() const { return impl_->open.load(); }

void tcp_proxy::cut_all() {
  impl_->on_io_thread([this] { impl_->close_all(); });
}

}  // namespace troupe::etcd::testing
