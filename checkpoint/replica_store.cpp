// The replica server and client over ZeroMQ.

#include "checkpoint/replica_store.hpp"

#include <sys/random.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "checkpoint/little_endian.hpp"

namespace troupe::ckpt {

namespace {

void key_bytes(const chunk_key& k, unsigned char* out) {
  le::put(out, k.high, 8);
  le::put(out + 8, k.low, 8);
}

chunk_key key_from(const unsigned char* in) { return {le::get(in, 8), le::get(in + 8, 8)}; }

// Constant time: how long a refusal takes says nothing about how much of the token matched.
bool same_token(const void* bytes, const replica_token& token) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= static_cast<unsigned char>(p[i] ^ token[i]);
  return diff == 0;
}

}  // namespace

replica_token random_replica_token() {
  replica_token t{};
  size_t got = 0;
  while (got < t.size()) {
    const ssize_t n = ::getrandom(t.data() + got, t.size() - got, 0);
    if (n < 0) throw std::runtime_error("replica token: getrandom failed");
    got += static_cast<size_t>(n);
  }
  return t;
}

struct replica_server::impl {
  zmq::context_t context{1};
  zmq::socket_t socket{context, zmq::socket_type::router};
  zmq::socket_t stop_pull{context, zmq::socket_type::pair};
  zmq::socket_t stop_push{context, zmq::socket_type::pair};
  replica_token token;
  size_t max_chunk_bytes;
  size_t max_reply_bytes;    // of one 'M' answer: a peer cannot make the server copy more
  mutable std::mutex mutex;  // the chunks and their index: the server thread and copy_out
  std::map<chunk_key, std::vector<unsigned char>> chunks;
  // per source: the steps held (newest two) and the keys each step uses
  std::map<uint32_t, std::map<int64_t, std::set<chunk_key>>> by_source;
};

replica_server::replica_server(const std::string& host, replica_token token, size_t max_chunk_bytes,
                               size_t max_reply_bytes)
    : impl_(std::make_unique<impl>()) {
  impl_->token = token;
  impl_->max_chunk_bytes = max_chunk_bytes;
  impl_->max_reply_bytes = max_reply_bytes;
  // Nothing larger than a chunk (or a batch of keys) plus its frames' headers is received.
  impl_->socket.set(zmq::sockopt::maxmsgsize,
                    static_cast<int64_t>(std::max(max_chunk_bytes, 16 * max_batch_keys) + 64));
  impl_->socket.set(zmq::sockopt::linger, 0);
  try {
    impl_->socket.bind("tcp://" + host + ":0");
  } catch (const zmq::error_t& e) {
    throw std::runtime_error("replica server: cannot listen on " + host + ": " + e.what());
  }
  endpoint_ = impl_->socket.get(zmq::sockopt::last_endpoint);
  const std::string stop =
      "inproc://replica-stop-" + std::to_string(reinterpret_cast<uintptr_t>(this));
  impl_->stop_pull.bind(stop);
  impl_->stop_push.connect(stop);
  thread_ = std::thread([this] {
    impl& s = *impl_;
    zmq::pollitem_t items[] = {{s.socket.handle(), 0, ZMQ_POLLIN, 0},
                               {s.stop_pull.handle(), 0, ZMQ_POLLIN, 0}};
    for (;;) {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
      if (items[1].revents & ZMQ_POLLIN) return;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(s.socket, std::back_inserter(frames), zmq::recv_flags::dontwait))
        continue;
      if (frames.empty()) continue;
      // ROUTER: [identity][empty][token][op][...] from a REQ peer.
      auto reply = [&](std::vector<zmq::message_t> body) {
        std::vector<zmq::message_t> out;
        out.emplace_back(frames[0].data(), frames[0].size());
        out.emplace_back();
        for (auto& b : body) out.push_back(std::move(b));
        (void)zmq::send_multipart(s.socket, out, zmq::send_flags::dontwait);
      };
      auto no = [&] {
        std::vector<zmq::message_t> b;
        b.emplace_back("no", 2);
        reply(std::move(b));
      };
      if (frames.size() < 4 || frames[1].size() != 0 || frames[2].size() != s.token.size() ||
          !same_token(frames[2].data(), s.token) || frames[3].size() != 1) {
        no();
        continue;
      }
      const char op = *static_cast<const char*>(frames[3].data());
      std::lock_guard held_lock(s.mutex);
      if (op == 'P' && frames.size() == 7 && frames[4].size() == 12 && frames[5].size() == 16 &&
          frames[6].size() <= s.max_chunk_bytes && frames[6].size() % sizeof(float) == 0) {
        const auto* meta = static_cast<const unsigned char*>(frames[4].data());
        const auto source = static_cast<uint32_t>(le::get(meta, 4));
        const uint64_t step = le::get(meta + 4, 8);
        const chunk_key key = key_from(static_cast<const unsigned char*>(frames[5].data()));
        const auto* data = static_cast<const unsigned char*>(frames[6].data());
        if (key_of(data, frames[6].size()) != key) {  // damaged on the way: not kept
          no();
          continue;
        }
        auto [it, fresh] = s.chunks.try_emplace(key, data, data + frames[6].size());
        if (fresh) held_ += frames[6].size();
        auto& steps = s.by_source[source];
        steps[static_cast<int64_t>(step)].insert(key);
        while (steps.size() > 2) {  // the source's two newest checkpoints only
          const std::set<chunk_key> old = std::move(steps.begin()->second);
          steps.erase(steps.begin());
          for (const chunk_key& k : old) {
            bool used = false;
            for (const auto& [src, st] : s.by_source)
              for (const auto& [n, keys] : st) used = used || keys.contains(k);
            if (used) continue;
            if (auto c = s.chunks.find(k); c != s.chunks.end()) {
              held_ -= c->second.size();
              s.chunks.erase(c);
            }
          }
        }
        std::vector<zmq::message_t> b;
        b.emplace_back("ok", 2);
        reply(std::move(b));
      } else if (op == 'G' && frames.size() == 5 && frames[4].size() == 16) {
        const auto c = s.chunks.find(key_from(static_cast<const unsigned char*>(frames[4].data())));
        if (c == s.chunks.end()) {
          no();
          continue;
        }
        std::vector<zmq::message_t> b;
        b.emplace_back("ok", 2);
        b.emplace_back(c->second.data(), c->second.size());
        reply(std::move(b));
      } else if (op == 'M' && frames.size() == 5 && frames[4].size() % 16 == 0 &&
                 frames[4].size() >= 16 && frames[4].size() <= 16 * max_batch_keys) {
        const auto* keys = static_cast<const unsigned char*>(frames[4].data());
        std::vector<zmq::message_t> b;
        b.emplace_back("ok", 2);
        size_t answered = 0;
        for (size_t at = 0; at < frames[4].size(); at += 16) {
          const auto c = s.chunks.find(key_from(keys + at));
          if (c == s.chunks.end() || answered + c->second.size() > s.max_reply_bytes) {
            b.emplace_back();
          } else {
            b.emplace_back(c->second.data(), c->second.size());
            answered += c->second.size();
          }
        }
        reply(std::move(b));
      } else {
        no();
      }
    }
  });
}

bool replica_server::holds(const chunk_key& key) const {
  std::lock_guard lock(impl_->mutex);
  return impl_->chunks.contains(key);
}

bool replica_server::copy_out(const chunk_key& key, std::vector<float>& out) const {
  std::lock_guard lock(impl_->mutex);
  const auto c = impl_->chunks.find(key);
  if (c == impl_->chunks.end() || c->second.size() % sizeof(float) != 0) return false;
  out.resize(c->second.size() / sizeof(float));
  std::memcpy(out.data(), c->second.data(), c->second.size());
  return true;
}

replica_server::~replica_server() {
  try {
    impl_->stop_push.send(zmq::str_buffer("stop"), zmq::send_flags::none);
  } catch (const zmq::error_t&) {
  }
  thread_.join();
}

struct replica_client::impl {
  zmq::context_t context{1};
  replica_token token;
  std::chrono::milliseconds timeout;
  std::map<std::string, std::unique_ptr<zmq::socket_t>> sockets;

  zmq::socket_t& socket_for(const std::string& endpoint) {
    auto& s = sockets[endpoint];
    if (!s) {
      s = std::make_unique<zmq::socket_t>(context, zmq::socket_type::req);
      s->set(zmq::sockopt::linger, 0);
      s->set(zmq::sockopt::rcvtimeo, static_cast<int>(timeout.count()));
      s->set(zmq::sockopt::sndtimeo, static_cast<int>(timeout.count()));
      s->connect(endpoint);
    }
    return *s;
  }

  /// One request and its reply; a socket that timed out is dropped (REQ cannot recover).
  std::optional<std::vector<zmq::message_t>> ask(const std::string& endpoint,
                                                 std::vector<zmq::message_t> request) {
    try {
      zmq::socket_t& s = socket_for(endpoint);
      if (!zmq::send_multipart(s, request)) {
        sockets.erase(endpoint);
        return std::nullopt;
      }
      std::vector<zmq::message_t> reply;
      if (!zmq::recv_multipart(s, std::back_inserter(reply))) {
        sockets.erase(endpoint);
        return std::nullopt;
      }
      return reply;
    } catch (const zmq::error_t&) {
      sockets.erase(endpoint);
      return std::nullopt;
    }
  }
};

replica_client::replica_client(replica_token token, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<impl>()) {
  impl_->token = token;
  impl_->timeout = timeout;
}

replica_client::~replica_client() = default;

bool replica_client::put(const std::string& endpoint, int source, int64_t step,
                         const chunk_key& key, std::span<const unsigned char> bytes) {
  unsigned char meta[12];
  le::put(meta, static_cast<uint32_t>(source), 4);
  le::put(meta + 4, static_cast<uint64_t>(step), 8);
  unsigned char k[16];
  key_bytes(key, k);
  std::vector<zmq::message_t> request;
  request.emplace_back(impl_->token.data(), impl_->token.size());
  request.emplace_back("P", 1);
  request.emplace_back(meta, sizeof meta);
  request.emplace_back(k, sizeof k);
  request.emplace_back(bytes.data(), bytes.size());
  const auto reply = impl_->ask(endpoint, std::move(request));
  return reply && reply->size() == 1 && reply->front().to_string() == "ok";
}

std::optional<std::vector<unsigned char>> replica_client::get(const std::string& endpoint,
                                                              const chunk_key& key) {
  unsigned char k[16];
  key_bytes(key, k);
  std::vector<zmq::message_t> request;
  request.emplace_back(impl_->token.data(), impl_->token.size());
  request.emplace_back("G", 1);
  request.emplace_back(k, sizeof k);
  const auto reply = impl_->ask(endpoint, std::move(request));
  if (!reply || reply->size() != 2 || (*reply)[0].to_string() != "ok") return std::nullopt;
  const auto* data = static_cast<const unsigned char*>((*reply)[1].data());
  return std::vector<unsigned char>(data, data + (*reply)[1].size());
}

std::optional<std::vector<std::vector<float>>> replica_client::get_many(
    const std::string& endpoint, std::span<const chunk_key> keys) {
  if (keys.empty() || keys.size() > max_batch_keys) return std::nullopt;
  std::vector<unsigned char> named(keys.size() * 16);
  for (size_t i = 0; i < keys.size(); ++i) key_bytes(keys[i], named.data() + 16 * i);
  std::vector<zmq::message_t> request;
  request.emplace_back(impl_->token.data(), impl_->token.size());
  request.emplace_back("M", 1);
  request.emplace_back(named.data(), named.size());
  const auto reply = impl_->ask(endpoint, std::move(request));
  if (!reply || reply->size() != keys.size() + 1 || (*reply)[0].to_string() != "ok")
    return std::nullopt;
  std::vector<std::vector<float>> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const zmq::message_t& m = (*reply)[i + 1];
    if (m.size() % sizeof(float) != 0) continue;  // not a chunk: treated as not held
    out[i].resize(m.size() / sizeof(float));
    std::memcpy(out[i].data(), m.data(), m.size());
  }
  return out;
}

}  // namespace troupe::ckpt
