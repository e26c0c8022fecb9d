#pragma once
// In-memory replicas of checkpoint chunks (--replicate-checkpoints): every rank runs a
// replica_server that holds, in memory, the chunks a rank on another node pushed to it with
// its latest checkpoints; a rank restoring after a loss asks the servers of the live ranks
// for each chunk before it reads the disk. Over ZeroMQ (cppzmq), loopback or LAN.
//
// Wire (multipart, request/reply): [token 16][op 1][...]
//   'P' put:  [source u32 LE, step i64 LE][key 16][float bytes]  -> ["ok"] | ["no"]
//   'G' get:  [key 16]                                          -> ["ok"][bytes] | ["no"]
//   'M' many: [key 16 x n], 1 <= n <= max_batch_keys  -> ["ok"][bytes or empty] x n
//            (chunks past max_reply_bytes in all are answered empty, as if not held)
// A request with the wrong token, the wrong shape or more than max_chunk_bytes is answered
// "no" and changes nothing; one source's chunks older than its two newest steps are dropped.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/chunk_file.hpp"

namespace troupe::ckpt {

/// A shared secret of the job: requests without it are refused.
using replica_token = std::array<unsigned char, 16>;

/// The most keys one 'M' request may name.
inline constexpr size_t max_batch_keys = 1024;

class replica_server {
 public:
  /// Listens on tcp://`host`:(a free port). Throws std::runtime_error when it cannot bind.
  /// One 'M' answer carries at most `max_reply_bytes` of chunks.
  replica_server(const std::string& host, replica_token token, size_t max_chunk_bytes,
                 size_t max_reply_bytes = size_t{64} << 20);
  ~replica_server();
  replica_server(const replica_server&) = delete;
  replica_server& operator=(const replica_server&) = delete;

  /// "tcp://host:port", for peers.
  [[nodiscard]] const std::string& endpoint() const { return endpoint_; }
  /// Bytes of chunks held now.
  [[nodiscard]] size_t bytes_held() const { return held_.load(); }
  /// Copies the held chunk `key` into `out` (floats) without a round trip, for a restore in
  /// the server's own process; false when it is not held.
  bool copy_out(const chunk_key& key, std::vector<float>& out) const;
  /// Whether the chunk `key` is held now.
  [[nodiscard]] bool holds(const chunk_key& key) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::string endpoint_;
  std::atomic<size_t> held_{0};
  std::thread thread_;
};

/// Talks to replica servers; one per thread (ZeroMQ sockets are not thread-safe).
class replica_client {
 public:
  replica_client(replica_token token, std::chrono::milliseconds timeout);
  ~replica_client();
  replica_client(const replica_client&) = delete;
  replica_client& operator=(const replica_client&) = delete;

  /// Stores a chunk of `source`'s checkpoint at `step` on `endpoint`; false when refused or
  /// unanswered within the timeout.
  bool put(const std::string& endpoint, int source, int64_t step, const chunk_key& key,
           std::span<const unsigned char> bytes);
  /// The chunk `key` from `endpoint`, nullopt when it does not hold it or does not answer.
  /// The bytes are not verified here: the caller checks them against `key`.
  std::optional<std::vector<unsigned char>> get(const std::string& endpoint, const chunk_key& key);
  /// Many chunks in one round trip (at most max_batch_keys): the i-th result is keys[i]'s
  /// floats, or empty when `endpoint` does not hold it; nullopt when it refuses or does not
  /// answer. Not verified here either.
  std::optional<std::vector<std::vector<float>>> get_many(const std::string& endpoint,
                                                          std::span<const chunk_key> keys);

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// A random token (from the kernel's generator).
replica_token random_replica_token();

}  // namespace troupe::ckpt
