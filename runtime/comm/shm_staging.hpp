#pragma once
// The shared-memory backend's staging memory, kept by the process across communicators.
//
// On the VMs this runs on, the first access of a process to a shared page costs ~5 us (even
// after MAP_POPULATE) and the first write of a fresh one ~11 us. A collective of n ranks
// reads every peer's staging, so a group whose staging is new in every generation paid n
// times its staging pages in every process after each rebuild: at 64 ranks on two cores the
// first two steps after a recovery took ~150 ms each, against 25 ms for later ones. Here
// each process owns its staging (a memfd of its own) and hands it to the next communicator
// of the same kind once the previous one is dead; peers keep their mapping of it. A survivor
// of a failure then touches no new page in the rebuilt group except the newcomer's.
//
// Reuse is safe because a communicator gives its staging up only when it is dead (aborted
// or failed) and runs no operation, and a new generation connects only after every member
// has reported that its old generation stopped: no peer still reads the old contents.

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::comm::shm_detail {

/// Where a process's staging is found by its peers: /proc/<pid>/fd/<fd>, proven by the
/// nonce written at its start.
struct staging_address {
  int32_t pid = 0;
  int32_t fd = -1;
  uint64_t nonce = 0;
};

/// A random value that proves a /proc path leads to what its owner published.
uint64_t random_nonce();
/// An fd that becomes readable when process `pid` exits (zombies included), or -1.
int open_pidfd(int32_t pid);

/// A communicator that holds staging from the pool.
class staging_holder {
 public:
  /// Gives the staging up if this communicator will never touch it again (it is dead and no
  /// operation of it is running); true when it did.
  virtual bool give_up_staging() = 0;

 protected:
  ~staging_holder() = default;
};

/// This process's staging lent to one communicator: `bytes` writable at `data`.
struct own_staging {
  size_t slot = 0;
  char* data = nullptr;
  size_t bytes = 0;
  staging_address address;
};

class staging_pool {
 public:
  /// The one pool of this process.
  static staging_pool& process();

  /// Staging of at least `bytes` for a new communicator of group kind `kind` (the group name
  /// up to its first '.'): a free piece of that kind if any (its pages are already faulted
  /// in here and mapped by earlier peers), else a new memfd. Throws comm_error (internal).
  own_staging acquire(const std::string& kind, size_t bytes, staging_holder* holder);
  /// Hands a piece from `from` to `to` (a communicator taking over what its connect acquired).
  void hand_over(size_t slot, const staging_holder* from, staging_holder* to);
  /// Returns a piece (no-op when `holder` no longer holds it).
  void release(size_t slot, const staging_holder* holder);

  /// A peer's staging as attached here.
  struct peer_view {
    const char* data = nullptr;  ///< the staging, mapped read-only
    int pidfd = -1;              ///< readable once the peer exited; -1 if none could be opened
    int readable = -1;           ///< process_vm_readv of its memory works: 1, fails: 0, unknown: -1
  };
  /// A peer's staging (at least `bytes`), its pidfd (the pool's, valid until detach) and what
  /// is known of reading its memory. A peer met before costs nothing: no mapping, no page
  /// fault, no system call. Throws comm_error: peer_lost if its process is gone, invalid if
  /// the address leads to something else, internal otherwise.
  peer_view attach(const staging_address& peer, size_t bytes);
  /// Records whether this process can read the peer's memory (it stays true for its life).
  void note_readable(const staging_address& peer, bool readable);
  /// Drops one use of a peer's staging; mappings of processes that exited are unmapped at
  /// the next attach.
  void detach(const staging_address& peer);

  struct usage {
    size_t own = 0;     ///< pieces this process owns (one memfd each)
    size_t peers = 0;   ///< peers' pieces mapped here
    size_t pidfds = 0;  ///< descriptors kept to notice those peers' exit
  };
  /// What the pool holds now, after unmapping the pieces of peers that exited (for tests).
  usage current();

 private:
  struct own_piece {
    std::string kind;
    int fd = -1;
    char* base = nullptr;  ///< header page, then the staging
    size_t bytes = 0;      ///< of staging
    uint64_t nonce = 0;
    staging_holder* holder = nullptr;
  };
  struct peer_mapping {
    char* base = nullptr;
    size_t bytes = 0;   ///< of staging
    size_t mapped = 0;  ///< the whole mapping
    int pidfd = -1;     ///< readable once the peer exited
    int readable = -1;  ///< as in peer_view
    int uses = 0;
  };
  void unmap_exited_peers();

  std::mutex m_;
  std::vector<own_piece> own_;
  std::map<std::pair<int32_t, uint64_t>, peer_mapping> peers_;
};

}  // namespace troupe::comm::shm_detail
