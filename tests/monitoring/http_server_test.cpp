// The metrics endpoint answered by a real HTTP client (Boost.Beast): routes, content type,
// keep-alive, concurrent scrapes, port conflicts and a prompt stop().
#include "monitoring/http_server.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <thread>
#include <vector>

namespace troupe::monitoring {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

struct reply {
  unsigned status = 0;
  std::string content_type;
  std::string body;
};

// One request on an open stream (keep-alive friendly).
reply request(beast::tcp_stream& stream, http::verb method, const std::string& target,
              bool keep_alive = false) {
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, "127.0.0.1");
  req.keep_alive(keep_alive);
  stream.expires_after(std::chrono::seconds(10));
  http::write(stream, req);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.skip(method == http::verb::head);
  http::read(stream, buffer, parser);
  const auto& res = parser.get();
  return {res.result_int(), std::string(res[http::field::content_type]), res.body()};
}

reply get(std::uint16_t port, const std::string& target, http::verb method = http::verb::get) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  return request(stream, method, target);
}

struct fixture {
  metrics_registry registry;
  counter& steps = registry.add_counter("troupe_steps_total", "Steps.", {{"rank", "0"}});
  gauge& loss = registry.add_gauge("troupe_loss", "Loss.");
  histogram& step_time = registry.add_histogram("troupe_step_seconds", "Step time.", {0.1, 1});
};

TEST(metrics_server, serves_metrics_on_an_os_chosen_port) {
  fixture f;
  f.steps.inc(5);
  f.loss.set(3.25);
  f.step_time.observe(0.5);
  metrics_server server(f.registry, "127.0.0.1", 0);
  ASSERT_NE(server.port(), 0);
  EXPECT_EQ(server.host(), "127.0.0.1");

  const reply r = get(server.port(), "/metrics");
  EXPECT_EQ(r.status, 200u);
  EXPECT_EQ(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, f.registry.render_prometheus());
  EXPECT_NE(r.body.find("troupe_steps_total{rank=\"0\"} 5\n"), std::string::npos);
  EXPECT_NE(r.body.find("troupe_loss 3.25\n"), std::string::npos);

  // Each scrape renders afresh.
  f.steps.inc();
  EXPECT_NE(get(server.port(), "/metrics").body.find("troupe_steps_total{rank=\"0\"} 6\n"),
            std::string::npos);
  // A query string does not change the route.
  EXPECT_EQ(get(server.port(), "/metrics?x=1").status, 200u);
}

TEST(metrics_server, healthz_unknown_paths_and_methods) {
  fixture f;
  metrics_server server(f.registry, "127.0.0.1", 0);
  const reply health = get(server.port(), "/healthz");
  EXPECT_EQ(health.status, 200u);
  EXPECT_EQ(health.body, "ok");
  EXPECT_EQ(get(server.port(), "/").status, 404u);
  EXPECT_EQ(get(server.port(), "/metricsx").status, 404u);
  EXPECT_EQ(get(server.port(), "/metrics", http::verb::post).status, 405u);
  const reply head = get(server.port(), "/metrics", http::verb::head);
  EXPECT_EQ(head.status, 200u);
  EXPECT_TRUE(head.body.empty());
}

TEST(metrics_server, keep_alive_connection_serves_several_requests) {
  fixture f;
  metrics_server server(f.registry, "127.0.0.1", 0);
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), server.port()));
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(request(stream, http::verb::get, "/metrics", true).status, 200u);
    EXPECT_EQ(request(stream, http::verb::get, "/healthz", true).body, "ok");
  }
}

TEST(metrics_server, concurrent_scrapes_while_metrics_change) {
  fixture f;
  metrics_server server(f.registry, "127.0.0.1", 0);
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    while (!done) {
      f.steps.inc();
      f.step_time.observe(0.05);
    }
  });
  std::atomic<int> ok{0};
  std::vector<std::thread> scrapers;
  for (int t = 0; t < 8; ++t) {
    scrapers.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        const reply r = get(server.port(), "/metrics");
        if (r.status == 200 && r.body.find("troupe_step_seconds_count") != std::string::npos) ++ok;
      }
    });
  }
  for (auto& s : scrapers) s.join();
  done = true;
  trainer.join();
  EXPECT_EQ(ok.load(), 8 * 25);
}

TEST(metrics_server, port_in_use_is_a_typed_error_naming_the_port_and_the_fix) {
  fixture f;
  metrics_server first(f.registry, "127.0.0.1", 0);
  try {
    metrics_server second(f.registry, "127.0.0.1", first.port());
    FAIL() << "a second server on port " << first.port() << " should not start";
  } catch (const metrics_port_in_use& e) {
    EXPECT_EQ(e.port(), first.port());
    const std::string what = e.what();
    EXPECT_NE(what.find(std::to_string(first.port())), std::string::npos) << what;
    EXPECT_NE(what.find("--metrics-port"), std::string::npos) << what;
  }
  // A foreign listener (not a metrics_server) is detected the same way.
  asio::io_context ioc;
  tcp::acceptor other(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  EXPECT_THROW(metrics_server(f.registry, "127.0.0.1", other.local_endpoint().port()),
               metrics_port_in_use);
  // The first server is unaffected.
  EXPECT_EQ(get(first.port(), "/healthz").status, 200u);
}

TEST(metrics_server, bad_host_is_a_typed_error) {
  fixture f;
  EXPECT_THROW(metrics_server(f.registry, "no-such-host.invalid", 0), metrics_server_error);
  EXPECT_THROW(metrics_server(f.registry, "192.0.2.1", 0), metrics_server_error);  // not ours
}

TEST(metrics_server, hostname_is_resolved) {
  fixture f;
  metrics_server server(f.registry, "localhost", 0);
  EXPECT_NE(server.port(), 0);
}

TEST(metrics_server, stop_is_prompt_with_idle_clients_and_frees_the_port) {
  fixture f;
  auto server = std::make_unique<metrics_server>(f.registry, "127.0.0.1", 0);
  const std::uint16_t port = server->port();

  // An idle client that connected but sends nothing, and a keep-alive client mid-session.
  asio::io_context ioc;
  tcp::socket idle(ioc);
  idle.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  beast::tcp_stream kept(ioc);
  kept.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  EXPECT_EQ(request(kept, http::verb::get, "/metrics", true).status, 200u);

  const auto start = std::chrono::steady_clock::now();
  server->stop();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::milliseconds(500));
  server->stop();  // idempotent

  // Open connections were closed, not left hanging until their idle timeout.
  char byte = 0;
  beast::error_code ec;
  idle.read_some(asio::buffer(&byte, 1), ec);
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();

  // The port is free again: a new server can take it.
  server.reset();
  metrics_server again(f.registry, "127.0.0.1", port);
  EXPECT_EQ(get(port, "/healthz").status, 200u);
}

TEST(metrics_server, destructor_stops_without_explicit_stop) {
  fixture f;
  const auto start = std::chrono::steady_clock::now();
  {
    metrics_server server(f.registry, "127.0.0.1", 0);
    EXPECT_EQ(get(server.port(), "/healthz").status, 200u);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
}

}  // namespace
}  // namespace troupe::monitoring
