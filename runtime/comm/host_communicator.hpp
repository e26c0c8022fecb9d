#pragma once
// Picks the data plane's CPU transport for a group: shared memory when every rank is on this
// host, shared memory inside nodes and gloo across them when the group spans nodes with several
// ranks on some (hierarchical_communicator.hpp), gloo's TCP otherwise, unless TROUPE_TRANSPORT
// says which (or asks for the null data plane of control-plane tests, null_communicator.hpp).

#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/hierarchical_communicator.hpp"
#include "runtime/comm/shm_communicator.hpp"
#include "runtime/comm/store.hpp"

namespace troupe::comm {

/// tcp: one gloo group of every rank. shm: one shared-memory group. hierarchical: shm inside
/// each node, gloo across nodes (make_hierarchical_communicator). null: nothing moves
/// (make_null_communicator; control-plane tests only).
enum class transport_kind : uint8_t { tcp, shm, hierarchical, null };

/// This machine as its ranks see it: "<hostname> <boot_id>" (the boot id tells two machines
/// with the same hostname apart, and a host from itself before a reboot), plus " node <N>"
/// when the agent that started the process set TROUPE_NODE (simulated nodes).
std::string this_host_identity();

/// What a rank asks for: "auto", "tcp", "shm" or "null"; the value of TROUPE_TRANSPORT, "auto"
/// when unset or empty. Throws comm_error{invalid} for anything else.
std::string requested_transport();

/// What this process says about itself to whoever plans its groups: its request and its host,
/// "<TROUPE_TRANSPORT or auto>\n<this_host_identity()>". Never throws (the request is not
/// checked here; the connect refuses a bad one).
std::string transport_identity();

/// The transport of a group, from what each rank asked for and where each runs (both indexed
/// by rank): null if every rank asked for null, comm_error{invalid} if only some did (the
/// others would wait for ranks that never meet them); tcp if any rank asked for tcp (a flat gloo
/// group, whatever the layout); otherwise shm if every rank is on one host; otherwise
/// comm_error{invalid} if a rank asked for shm (shm cannot span hosts); otherwise hierarchical if
/// some host runs more than one of the group's ranks (node_layout::worth_a_hierarchy), tcp if each
/// runs one. Every rank computes it from the same inputs, so all agree.
transport_kind choose_transport(const std::vector<std::string>& requested,
                                const std::vector<std::string>& hosts);

/// Connects like make_gloo_communicator (same arguments, keys and errors), after the ranks
/// publish their host identities and requests under "g<generation>/<group>/host/<rank>" and
/// pick a transport with choose_transport(); on shm, the shm communicator with default
/// options (connect_timeout from `opts`); on hierarchical, make_hierarchical_communicator with
/// the hosts' layout (rank 0's verdict carries it) and default shm and hierarchical options. A
/// group of one uses shm unless tcp is requested. With opts.known_one_host the ranks skip
/// publishing and reading each other's hosts and go straight to shared memory (rank 0 then waits
/// for nobody's host before it publishes its segment). With TROUPE_TRANSPORT=null it meets
/// nobody: make_null_communicator(id), whatever the others asked for.
std::unique_ptr<communicator> make_host_communicator(kv_store& store, const comm_identity& id,
                                                     const gloo_options& opts = {});

}  // namespace troupe::comm
