#pragma once
// What the coordinator writes to etcd (--etcd local, the bench's --etcd), counted by etcd
// itself: its own /metrics, the mvcc store's puts, deletes and transactions so far.

#include <cstdint>
#include <optional>
#include <string>

namespace troupe::bench::control_plane {

struct etcd_counts {
  double puts = 0;     ///< etcd_mvcc_put_total: every key written, in a transaction or not
  double deletes = 0;  ///< etcd_mvcc_delete_total
  double txns = 0;     ///< etcd_mvcc_txn_total
  double writes() const { return puts + deletes; }
};

/// The client port of the job's own etcd under `run_dir` (started by the coordinator for
/// --etcd local), found in /proc by its data directory; nullopt while none runs.
std::optional<uint16_t> local_etcd_port(const std::string& run_dir);

/// One scrape of etcd's /metrics at 127.0.0.1:port; nullopt (and a line on stderr) if it
/// does not answer or lacks the counters.
std::optional<etcd_counts> scrape_etcd(uint16_t port);

}  // namespace troupe::bench::control_plane
