#pragma once
// The checkpoint shares of simulated ranks: what a real data-parallel rank writes when a
// commit asks for a checkpoint (its balanced share of every tensor's parameters and AdamW
// moments, as content-addressed chunks in RUN_DIR/checkpoints) and the report it sends, so
// that the coordinator collects N real shares and commits a manifest of them. Written on one
// thread per simulator process, in the background, as a rank's checkpointer writes.

#include <caf/actor.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/wire/messages.hpp"
#include "bench/control_plane/sim_ledger.hpp"
#include "checkpoint/shard_writer.hpp"

namespace troupe::bench::control_plane {

struct share_request {
  int32_t rank = 0;
  int32_t world = 1;
  uint64_t generation = 0;
  int64_t step = 0;
  caf::actor coordinator;  ///< where the report goes
};

class share_writer {
 public:
  /// From the job's config as the coordinator sent it (welcome::config_json): the model whose
  /// state is saved, the run directory and the chunk size. Throws std::runtime_error for a job
  /// whose shares it cannot simulate (another layout than plain data parallelism, a program).
  share_writer(const std::string& config_json, sim_ledger& ledger);
  ~share_writer();
  share_writer(const share_writer&) = delete;
  share_writer& operator=(const share_writer&) = delete;

  /// Queues a share; its report goes to the request's coordinator once it is durable.
  void enqueue(share_request r);

 private:
  void run();
  actors::shard_written write(const share_request& r);

  sim_ledger& ledger_;
  std::vector<ckpt::placed_piece> pieces_;  ///< the single-rank model's tensors, whole
  std::vector<float> params_, moments_;     ///< a rank's buffers (its values, zeros)
  std::unique_ptr<ckpt::shard_writer> writer_;
  ckpt::snapshot snapshot_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<share_request> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

/// This process's share writer, made from the first config handed to it. Null (and `error`
/// says why) when the job's shares cannot be simulated; every member then reports its share
/// as failed with that reason.
share_writer* process_share_writer(const std::string& config_json, sim_ledger& ledger,
                                   std::string& error);

}  // namespace troupe::bench::control_plane
