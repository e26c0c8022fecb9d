#pragma once
// Moving a rank's training state to the process that takes its place in a new generation:
// within a process (copy_state), or between two ranks over the data plane (send_state /
// receive_state, through the generation's data-parallel group when both ranks are in it, else a
// two-rank communicator of that generation).

#include <cstdint>
#include <vector>

#include "runtime/workload/workload.hpp"
#include "strategies/engine.hpp"

namespace troupe::actors {

/// Copies `from` into `to`. Throws std::runtime_error when their buffers differ in number or
/// size (the two states do not have the same coordinates).
void copy_state(const strategies::local_state& from, const strategies::local_state& to);

/// A communicator of the new generation that the caller already holds, with the generation's
/// ranks of its members in order (a rank's data-parallel group: the replicas of its state).
/// A transfer between two of its members goes through it, which saves a connect (the
/// rendezvous and a fresh shared-memory segment, ~15 ms here) on the recovery's path.
struct shared_group {
  comm::communicator* comm = nullptr;
  std::vector<int> ranks;
};

/// Sends the state a workload generation declares from rank `from` to rank `to` of
/// `generation` (both call, each with its own rank, and the same `via`): a header of region
/// sizes and the number of counters, then every region's bytes and the counters. Any
/// workload's state, whatever its dtypes. Returns the bytes moved. Throws comm::comm_error on
/// a data-plane failure, std::runtime_error when the receiver's regions do not match the
/// header.
uint64_t send_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                    const state_view& state, const comm::op_options& opts,
                    const shared_group& via = {});
uint64_t receive_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                       const state_view& state, const comm::op_options& opts,
                       const shared_group& via = {});

/// The same for a whole workload generation, whose table may differ from the receiver's (a
/// PyTorch optimizer makes its state at its first step): the sender's tensor table and
/// extras go first, the receiver makes room for them (`begin_restore`), the bytes follow,
/// and `end_restore` takes them in (`cancel_restore` when anything fails on the way).
uint64_t send_workload_state(const strategies::connect_fn& connect, uint64_t generation, int from,
                             int to, workload_generation& state, const comm::op_options& opts,
                             const shared_group& via = {});
uint64_t receive_workload_state(const strategies::connect_fn& connect, uint64_t generation,
                                int from, int to, workload_generation& state,
                                const comm::op_options& opts, const shared_group& via = {});

/// The same for the GPT's buffers and step count (strategies::local_state).
uint64_t send_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                    const strategies::local_state& state, const comm::op_options& opts,
                    const shared_group& via = {});
uint64_t receive_state(const strategies::connect_fn& connect, uint64_t generation, int from, int to,
                       const strategies::local_state& state, const comm::op_options& opts,
                       const shared_group& via = {});

}  // namespace troupe::actors
