// make_host_communicator: one round through the store to learn where every rank runs, then
// the shm, the hierarchical or the gloo backend.
#include "runtime/comm/host_communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "runtime/comm/null_communicator.hpp"

namespace troupe::comm {

std::string this_host_identity() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  // Agents name their node (TROUPE_NODE): simulated nodes on one machine are hosts of their
  // own, so a group across them takes the network path a real cluster would.
  const char* node = std::getenv("TROUPE_NODE");
  return std::string(name) + " " + boot_id +
         (node && *node ? std::string(" node ") + node : std::string());
}

std::string transport_identity() {
  const char* v = std::getenv("TROUPE_TRANSPORT");
  return std::string(v == nullptr || *v == '\0' ? "auto" : v) + "\n" + this_host_identity();
}

std::string requested_transport() {
  const char* v = std::getenv("TROUPE_TRANSPORT");
  const std::string s = v == nullptr || *v == '\0' ? "auto" : v;
  if (s != "auto" && s != "tcp" && s != "shm" && s != "null") {
    throw comm_error(comm_errc::invalid,
                     "TROUPE_TRANSPORT must be auto, tcp, shm or null, not '" + s + "'");
  }
  return s;
}

transport_kind choose_transport(const std::vector<std::string>& requested,
                                const std::vector<std::string>& hosts) {
  const auto nulls = std::count(requested.begin(), requested.end(), "null");
  if (nulls > 0 && static_cast<size_t>(nulls) == requested.size()) return transport_kind::null;
  if (nulls > 0) {
    throw comm_error(comm_errc::invalid,
                     "TROUPE_TRANSPORT=null for " + std::to_string(nulls) + " of the group's " +
                         std::to_string(requested.size()) +
                         " ranks: the null data plane needs it set for every rank");
  }
  bool want_shm = false;
  for (const auto& r : requested) {
    if (r == "tcp") return transport_kind::tcp;
    if (r == "shm") want_shm = true;
  }
  bool one_host = true;
  for (const auto& h : hosts) one_host = one_host && h == hosts.front();
  if (one_host) return transport_kind::shm;
  if (want_shm) {
    throw comm_error(comm_errc::invalid,
                     "TROUPE_TRANSPORT=shm, but the group's ranks run on more than one host");
  }
  return node_layout::of_hosts(hosts).worth_a_hierarchy() ? transport_kind::hierarchical
                                                          : transport_kind::tcp;
}

std::unique_ptr<communicator> make_host_communicator(kv_store& store, const comm_identity& id,
                                                     const gloo_options& opts) {
  using clock_type = std::chrono::steady_clock;
  const std::string where = "host connect (group " + id.group + ", generation " +
                            std::to_string(id.generation) + ", rank " + std::to_string(id.rank) +
                            " of " + std::to_string(id.size) + ")";
  if (id.size < 1 || id.rank < 0 || id.rank >= id.size || id.group.empty() ||
      id.group.find('/') != std::string::npos || opts.connect_timeout.count() <= 0) {
    throw comm_error(comm_errc::invalid, where + ": invalid identity or options");
  }
  const std::string mine = requested_transport();
  // Meets no one: the null ranks of a group cannot see whether the others asked for null too
  // (the coordinator can: its generation event says "invalid" when they did not).
  if (mine == "null") return make_null_communicator(id);
  const auto start = clock_type::now();
  const auto left = [&] {  // what is left of the one connect deadline
    return std::max(std::chrono::milliseconds(1),
                    opts.connect_timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                                               clock_type::now() - start));
  };
  shm_options shm;  // default chunks whatever the group's size: see shm_staging.hpp
  shm.cancelled = opts.cancelled;
  // Every wait of the connect, in the store or in the segment, gives up once a newer
  // generation has begun: peers lost meanwhile would never arrive.
  std::optional<interruptible_store> guarded;
  if (opts.cancelled) guarded.emplace(store, opts.cancelled);
  kv_store& meet = guarded ? static_cast<kv_store&>(*guarded) : store;
  if (id.size == 1) {
    if (mine == "tcp") return make_gloo_communicator(store, id, opts);
    shm.connect_timeout = opts.connect_timeout;
    return make_shm_communicator(store, id, shm);
  }
  // Rank 0 reads every rank's request and host and publishes the verdict, which the others
  // read: 3n store round trips instead of n^2 (a 64-rank group rebuilt after a failure spent
  // most of its time here). When the verdict is shm it carries the segment's address too,
  // which rank 0 creates while the others arrive: one round less for every rank.
  std::string verdict;
  try {
    prefix_store scoped(meet, "g" + std::to_string(id.generation) + "/" + id.group + "/host");
    if (opts.known_one_host) {
      // Nothing to ask the others: rank 0 publishes its segment as soon as it is here, and
      // each rank opens it whenever it comes; they meet once, in the segment.
      if (mine == "tcp")
        throw comm_error(comm_errc::invalid,
                         where +
                             ": told that no rank asked for tcp, but this one did "
                             "(TROUPE_TRANSPORT=tcp)");
      shm.connect_timeout = left();
      if (auto c = shm_detail::connect_if_shm(scoped, "verdict", id, shm, {}, verdict)) return c;
      throw comm_error(comm_errc::internal,
                       where + ": rank 0 published '" + verdict +
                           "' although every rank was told the group is on one host");
    }
    if (id.rank != 0)
      scoped.set_string(std::to_string(id.rank), mine + "\n" + this_host_identity());
    const auto decide = [&]() -> std::string {
      std::vector<std::string> keys, requested{mine}, hosts{this_host_identity()};
      for (int j = 1; j < id.size; ++j) keys.push_back(std::to_string(j));
      scoped.wait(keys, left());
      for (const auto& k : keys) {
        const std::string v = scoped.get_string(k, left());
        const auto nl = v.find('\n');
        requested.push_back(v.substr(0, nl));
        hosts.push_back(nl == std::string::npos ? std::string() : v.substr(nl + 1));
      }
      try {
        switch (choose_transport(requested, hosts)) {
          case transport_kind::shm:
            return "shm";
          case transport_kind::hierarchical:
            // The layout travels with the verdict: only rank 0 has read every rank's host.
            return "hier " + node_layout::of_hosts(hosts).to_string();
          case transport_kind::tcp:
            break;
          case transport_kind::null:  // every rank asked for null, this one did not
            return "error this rank did not ask for the null data plane";
        }
        return "tcp";
      } catch (const comm_error& e) {
        return std::string("error ") + e.what();
      }
    };
    if (mine != "tcp") {
      shm.connect_timeout = left();
      if (auto c = shm_detail::connect_if_shm(scoped, "verdict", id, shm, decide, verdict))
        return c;
    } else if (id.rank == 0) {
      verdict = decide();
      scoped.set_string("verdict", verdict);
    } else {
      verdict = scoped.get_string("verdict", left());
    }
  } catch (const store_error& e) {
    throw as_connect_error(e, where);
  }
  if (verdict.rfind("error ", 0) == 0)
    throw comm_error(comm_errc::invalid, where + ": " + verdict.substr(6));
  // A rank that asked for tcp must never be put on shm (rank 0 counted its request).
  if (verdict.rfind("shm", 0) == 0)
    throw comm_error(comm_errc::internal,
                     where + ": rank 0 chose shm although this rank asked for tcp");
  if (verdict.rfind("hier ", 0) == 0) {
    const node_layout layout = node_layout::parse(verdict.substr(5));
    if (layout.node_of.size() != static_cast<size_t>(id.size) || !layout.worth_a_hierarchy())
      throw comm_error(comm_errc::internal,
                       where + ": rank 0 published a node layout that does not fit the group ('" +
                           verdict + "')");
    if (mine == "tcp")
      throw comm_error(comm_errc::internal,
                       where + ": rank 0 chose shared memory inside nodes although this rank " +
                           "asked for tcp");
    gloo_options g = opts;
    g.connect_timeout = left();
    shm_options s;
    s.cancelled = opts.cancelled;
    return make_hierarchical_communicator(meet, id, layout, g, s);
  }
  if (verdict != "tcp")
    throw comm_error(comm_errc::internal,
                     where + ": rank 0 published no transport ('" + verdict + "')");
  gloo_options g = opts;
  g.connect_timeout = left();
  return make_gloo_communicator(meet, id, g);
}

}  // namespace troupe::comm
