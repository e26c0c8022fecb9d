#pragma once
// The CPU backend of the data plane: a communicator whose collectives are troupe's own
// abortable algorithms over gloo's TCP transport pairs.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::comm {

/// How a gloo communicator connects and moves data. Every knob has its default here.
struct gloo_options {
  /// Address the transport pairs listen on; peers connect to it, so it must be reachable from
  /// them (127.0.0.1 is enough when every rank is on this machine; a worker passes its node's
  /// address, actors/wire/node_address.hpp). Ranks of one group must not mix loopback and other
  /// addresses: such a group fails at once (connect_failure::loopback).
  std::string bind_host = "127.0.0.1";
  /// Bound on the whole rendezvous: waiting for every rank's address in the store and
  /// connecting every pair.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(30)};
  /// While connecting: once this returns true (a newer generation was opened), the connect
  /// gives up within ~50 ms (comm_errc::aborted), whether it waits in the store or for a pair
  /// (make_gloo_communicator asks it from a thread of its own). Empty: never.
  cancel_check cancelled;
  /// For make_host_communicator: the caller knows that every rank of the group runs on this
  /// host and that none asked for tcp (the coordinator saw it for the whole generation), so
  /// the group connects over shared memory without the ranks asking each other first. Every
  /// rank of the group must be told the same.
  bool known_one_host = false;
  /// Pipelining unit of the ring all-reduce and the chain broadcast.
  size_t segment_bytes = size_t{512} << 10;
  /// Segments in flight per ring step; the all-reduce keeps this many receive buffers.
  int pipeline_depth = 4;
  /// All-reduces of at most this many bytes exchange whole buffers in one round instead of
  /// running the ring (lower latency; every rank sums in rank order, so results are identical).
  size_t small_all_reduce_bytes = size_t{64} << 10;
  /// Broadcasts of at most this many bytes go from the root to each rank directly.
  size_t small_broadcast_bytes = size_t{256} << 10;
  /// When not empty (1 to 80 bytes), the pairs' TCP connections are signed with it while they
  /// are made (TCP MD5, runtime/comm/tcp_signature.hpp): the kernel drops every segment from
  /// a process without the key, so a stranger can never take a pair's place. Every rank of the
  /// group must use the same key. Empty: pairs accept whoever connects first.
  std::string pair_key;
};

/// Why a group could not connect its pairs, as a class that stays the same when the same
/// thing fails again (the coordinator does not retry forever what will fail the same way).
enum class connect_failure : uint8_t {
  refused,      ///< the peer's host answered, but nothing listens at the peer's address
  unreachable,  ///< no route from this host to the peer's address
  timed_out,    ///< no answer within the connect deadline (from either side of a pair)
  signature,    ///< the kernel dropped segments signed with another key, or with none
  loopback,     ///< one side of a pair listens on a loopback address, the other does not
};
const char* to_string(connect_failure f);

/// A group that could not connect: the comm_error, with the class of the failure and the
/// peer's address it concerns (the host, without a port). The message names the address
/// with its port, the peer's rank and what to check.
class connect_error : public comm_error {
 public:
  connect_error(comm_errc code, connect_failure why, std::string address, const std::string& what)
      : comm_error(code, what), why_(why), address_(std::move(address)) {}
  connect_failure why() const { return why_; }
  const std::string& address() const { return address_; }
  /// "<class> <address>", e.g. "unreachable 10.1.2.3" (reconfigured::error_cause).
  std::string cause() const { return std::string(to_string(why_)) + " " + address_; }

 private:
  connect_failure why_;
  std::string address_;
};

/// Throws `e` again with `context` put before its message, keeping its type: a connect_error
/// stays one (its class and address are what the coordinator compares), so a communicator
/// that connects gloo groups underneath can say which of them failed without losing why.
[[noreturn]] void rethrow_with_context(const comm_error& e, const std::string& context);

/// Connects rank `id.rank` of group `id.group`, generation `id.generation`, through `store`
/// and returns its communicator. Every rank of the group must call this with the same group,
/// generation and size. Keys live under "g<generation>/<group>/", so a new generation never
/// sees an older one's keys; one (generation, group) must be created only once per store.
/// Throws comm_error: timeout if not every rank arrives within opts.connect_timeout, aborted
/// when opts.cancelled says so, invalid for a bad identity or a pair_key this kernel cannot
/// sign with; a pair that cannot connect throws connect_error (refused, unreachable, timed out
/// or signed with another key), within opts.connect_timeout of the call.
/// All ranks must call the same collectives in the same order with the same sizes and roots;
/// ranks that disagree wait for each other until the deadline (comm_errc::timeout).
/// Side effect: SIGPIPE is ignored in this process if it was at its default (gloo writes to
/// sockets whose peer may be dead; the error is then reported, not fatal).
std::unique_ptr<communicator> make_gloo_communicator(kv_store& store, const comm_identity& id,
                                                     const gloo_options& opts = {});

}  // namespace troupe::comm
