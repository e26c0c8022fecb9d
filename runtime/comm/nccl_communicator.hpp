#pragma once
// The GPU backend of the data plane: a communicator over NCCL whose collectives run on device
// memory, with deadlines and abort built on NCCL's non-blocking communicators.

#include <chrono>
#include <memory>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::comm {

/// How an NCCL communicator is created.
struct nccl_options {
  /// Bound on fetching the unique id from the store and on ncclCommInitRank.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
};

/// Creates rank `id.rank` of an NCCL communicator on CUDA device `device`. Rank 0 makes the
/// ncclUniqueId and publishes it in `store` under "g<generation>/<group>/nccl_unique_id"; the
/// others read it from there. Collectives take DEVICE pointers, run on the communicator's own
/// stream and return when the stream has finished them (the caller must have finished writing
/// the input). Throws comm_error: timeout, internal (CUDA/NCCL failures), invalid.
std::unique_ptr<communicator> make_nccl_communicator(kv_store& store, const comm_identity& id,
                                                     int device, const nccl_options& opts = {});

}  // namespace troupe::comm
