#pragma once
// A data plane that moves nothing, for control-plane tests only (a job of real workers and
// simulated members, which have no data plane): every collective returns at once as a
// reduction over this rank's own contribution, so a rank trains on its own data alone.
// Chosen only by TROUPE_TRANSPORT=null in a worker's environment (make_host_communicator).

#include <memory>

#include "runtime/comm/communicator.hpp"

namespace troupe::comm {

/// What each operation does with no peers:
/// - all_reduce, broadcast, barrier: nothing (the buffer keeps this rank's values);
/// - reduce_scatter: `out` gets this rank's own block of `in`;
/// - all_gather, all_to_all, all_to_allv: this rank's own block lands in its own slot of
///   `out`; the other slots are left as they are;
/// - send, recv, send_recv of bytes: comm_error{invalid}, since a peer's bytes (a state
///   transfer, a pipeline stage's activations) cannot be made up; zero bytes complete at once;
/// - shrink: a null communicator of the new identity.
/// After abort() every operation throws comm_error{aborted}, as with the real backends.
/// The first one made in a process logs a warning, so that a job on it cannot pass for a real
/// one. Throws comm_error{invalid} for an identity no group can have.
std::unique_ptr<communicator> make_null_communicator(const comm_identity& id);

}  // namespace troupe::comm
