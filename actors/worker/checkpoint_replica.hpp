#pragma once
// A worker's part in --replicate-checkpoints: the replica server that holds a peer's chunks
// in this process's memory, the route of this rank's own chunks to a rank on another node,
// and the lookup a restore makes in the live ranks' memory before it reads the disk. The
// ranks of a generation find each other through the job's key-value store.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/replica_store.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::actors {

class checkpoint_replica {
 public:
  /// Starts the server on `host`; the job's token comes from (or goes into) `store`.
  checkpoint_replica(comm::kv_store& store, const std::string& host, size_t max_chunk_bytes,
                     std::chrono::milliseconds timeout);
  ~checkpoint_replica();

  /// Publishes this rank's endpoint and node for `generation` and learns every rank's;
  /// picks as buddy the next rank on another node (or, on one node, the next rank).
  void enter_generation(comm::kv_store& store, uint64_t generation, int rank, int world, int node);

  /// The chunk observer of this rank's shard writer: sends each chunk to the buddy (on the
  /// writer's thread). Failures cost only the replica, never the checkpoint.
  ckpt::chunk_observer observer();
  /// Bytes sent since the last call.
  uint64_t take_sent_bytes();

  /// Looks chunks up in the memory of the live ranks of the current generation: this
  /// process's own server without a round trip, each peer with one request per window.
  ckpt::memory_source memory();

 private:
  ckpt::replica_token token_;
  std::unique_ptr<ckpt::replica_server> server_;
  std::chrono::milliseconds timeout_;
  std::mutex mutex_;  // guards the route below; the writer's thread reads it
  std::string buddy_;
  std::vector<std::string> peers_;
  std::atomic<uint64_t> sent_{0};
  std::unique_ptr<ckpt::replica_client> writer_client_;   // the writer's thread only
  std::unique_ptr<ckpt::replica_client> restore_client_;  // the rank's thread only
};

}  // namespace troupe::actors
