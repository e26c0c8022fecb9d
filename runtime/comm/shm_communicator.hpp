#pragma once
// The same-host backend of the data plane: a communicator whose ranks are processes on one
// machine and move data through one shared-memory segment instead of loopback TCP.

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::comm {

/// How a shared-memory communicator connects, moves data and waits. Every knob has its
/// default here.
struct shm_options {
  /// Bound on the rendezvous: rank 0 publishing the segment and every rank mapping it.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  /// Once this returns true (a newer generation was opened), the rendezvous gives up within
  /// ~50 ms (comm_errc::aborted), whether it waits in the store or in the segment. Empty: never.
  cancel_check cancelled;
  /// Bytes each rank stages per round; collectives move larger buffers in rounds of this
  /// size. Each rank's region is two of these (rounds alternate between them, so one round's
  /// data is never overwritten while a peer still reads it). Allocated once, faulted in by
  /// the collectives that stage through it: first touch of fresh memory is slow, reuse is
  /// not. (4 MiB: on 4 ranks, 1 MiB chunks gave about half the staged bandwidth, the extra
  /// rounds costing scheduler time.)
  size_t chunk_bytes = size_t{4} << 20;
  /// Bytes a send stages per step in its (sender, receiver) channel; two steps in flight.
  size_t p2p_chunk_bytes = size_t{256} << 10;
  /// All-reduces of at most this many bytes take one round in which every rank sums every
  /// contribution in rank order (one wait instead of two); larger ones reduce a slice each.
  size_t small_all_reduce_bytes = size_t{32} << 10;
  /// All-reduces and reduce-scatters (input size) of at least this many bytes read the peers'
  /// buffers directly (process_vm_readv: three waits for the whole buffer instead of two per
  /// chunk, and no staging copy), when every rank may read every other's memory (same user,
  /// ptrace allowed: probed at connect). SIZE_MAX turns it off. Measured here (a VM):
  /// process_vm_readv copies at ~1.1 GB/s against memcpy's ~3.5, so it pays for reductions
  /// (fewer rounds, no staging) but not for plain copies; see single_copy_gathers.
  size_t single_copy_bytes = size_t{1} << 20;
  /// Whether all-gathers (output size) and all-to-alls (one rank's send buffer) take the
  /// single-copy path too (off: staged through chunk_bytes was as fast or faster here).
  bool single_copy_gathers = false;
  /// A wait first polls for this long (with a pause instruction), then yields the core for
  /// yield_time, then sleeps on a futex in the segment until a peer's progress wakes it.
  /// Bounded, because ranks may outnumber cores; not zero, because a wake-up after a futex
  /// sleep can cost a scheduler tick on a busy machine. (Measured on 2 loaded cores: 5 us of
  /// polling gave 4 KiB all-reduces of 15 us on 2 ranks and 40 us on 4; 20-50 us of polling
  /// took 2-4x longer, the polling stealing the core a peer needed.)
  std::chrono::microseconds spin_time{5};
  std::chrono::microseconds yield_time{50};
  /// While sleeping, how often a wait checks that its peers' processes are still alive.
  std::chrono::milliseconds liveness_interval{50};
};

/// Connects rank `id.rank` of group `id.group`, generation `id.generation`, through `store`
/// and returns its communicator. Every rank of the group must be a process on this host, in
/// the same pid namespace (peers are watched by pid), call this with the same group,
/// generation, size and options. Keys live under "g<generation>/<group>/shm/", so a new
/// generation never sees an older one's; one (generation, group) is created only once per store.
///
/// Rank 0 creates the segment with memfd_create and publishes "/proc/<pid>/fd/<fd>" with a
/// random nonce; the others open that path and check the nonce. The segment has no name in
/// any file system, so it is freed when the last rank unmaps it, even if every rank is
/// SIGKILLed: nothing can leak (a POSIX shm name would outlive a rank 0 killed before it
/// unlinked it).
///
/// Throws comm_error: timeout if not every rank arrives within opts.connect_timeout,
/// peer_lost if rank 0 went away before the segment was opened, invalid for a bad identity or
/// options that differ between ranks, internal if the segment cannot be created or opened.
///
/// Collectives: results are bit-identical on every rank, and sums are taken in rank order
/// 0..size-1 (as a single-process reference would). A peer that dies is detected within about
/// opts.liveness_interval (peer_lost); a peer whose communicator failed, was aborted or was
/// destroyed is seen at once (peer_lost). send() returns once the receiver has taken the whole
/// message (as gloo's does), so the same pairing rules hold on both backends.
std::unique_ptr<communicator> make_shm_communicator(kv_store& store, const comm_identity& id,
                                                    const shm_options& opts = {});

namespace shm_detail {

/// make_shm_communicator for a group that may turn out not to be on one host
/// (make_host_communicator): rank 0 creates the segment first, then asks `decide` (which may
/// wait for the other ranks) whether the group takes shared memory; its answer travels under
/// `key` of `meet`, with the segment's address when it is "shm", so the transport's verdict
/// and the segment cost the group one store round instead of two. Returns nullptr with that
/// answer in `verdict` when it is not "shm". `decide` is used on rank 0 only.
std::unique_ptr<communicator> connect_if_shm(kv_store& meet, const std::string& key,
                                             const comm_identity& id, const shm_options& opts,
                                             const std::function<std::string()>& decide,
                                             std::string& verdict);

}  // namespace shm_detail

}  // namespace troupe::comm
