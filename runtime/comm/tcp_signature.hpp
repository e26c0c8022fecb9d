#pragma once
// Kernel-checked membership for gloo's TCP pairs. Gloo (Debian's 2022 snapshot) opens a
// listening socket per pair and accepts whoever connects first; garbage read on such a pair
// reaches Gloo's decoder, whose failed checks end the process. Gloo has no hook to
// authenticate a connection, so troupe asks the kernel to: with TCP MD5 signatures
// (RFC 2385, TCP_MD5SIG) every segment of a pair's connection, its SYN included, carries a
// keyed digest, and the kernel drops, before any accept(), a segment from a process that does
// not hold the job's key. Once every pair of a group is connected the keys are removed again
// (signing every data segment costs most of the loopback bandwidth); after that the pairs are
// ordinary connections between members.
//
// Gloo creates and connects its sockets inside connectFullMesh() with no way to reach them,
// so this file interposes the C library's bind() and connect() for the whole process: they
// call through unchanged unless the calling thread holds a tcp_signature_scope or a
// connect_watch (which records those sockets, so that a connect can be ended from another
// thread and a failed one explained).

#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::comm {

/// Whether this kernel can sign TCP segments (CONFIG_TCP_MD5SIG); the reason if not.
bool tcp_signatures_supported(std::string* why = nullptr);

/// While alive, makes the calling thread's TCP sockets signed: a socket it binds requires
/// `key` from every peer (before it listens), and a connect it makes to an address given to
/// allow_peer() signs with `key`. Sockets of other threads, and connects to other addresses
/// (the store's), are untouched. One scope per thread at a time; not copyable.
class tcp_signature_scope {
 public:
  /// `key`: 1 to 80 bytes (the kernel's limit).
  explicit tcp_signature_scope(std::string key);
  ~tcp_signature_scope();
  tcp_signature_scope(const tcp_signature_scope&) = delete;
  tcp_signature_scope& operator=(const tcp_signature_scope&) = delete;

  /// A member's listening address: this thread's connects to it are signed.
  void allow_peer(const sockaddr_storage& address);

  /// Removes the key from every connection made under the scope: those this thread opened,
  /// and those accepted (by any thread) on a socket this thread bound. Call once no segment of
  /// these connections is in flight and before the peers send again: a segment that reaches a
  /// side whose key is already gone while the other still signs is dropped (and resent).
  /// False (and error() says why) when the accepted connections could not be listed: their
  /// keys stay, and the peers' unsigned segments would be dropped.
  bool unsign_connections();

  /// Waits until the peers have acknowledged every byte sent on the connections made under
  /// the scope (each send queue is empty), or until `deadline` or `stop()` (false; error()
  /// says which connection still waits). Every side of a group does this, and then waits for
  /// the others to have done it, before unsign_connections(): a segment lost on the way is
  /// resent after its sender's keys are gone, unsigned, and a peer that still signs drops it
  /// (and the other way round), so the pair never finishes connecting on a lossy network.
  bool await_acknowledged(std::chrono::steady_clock::time_point deadline,
                          const std::function<bool()>& stop = {});

  /// The first failure to sign a socket ("" when none), so that a connect error can be
  /// explained: bind() fails with this errno when the kernel refuses the key.
  const std::string& error() const { return error_; }

  // Called by the interposed functions.
  void on_bind(int fd, const sockaddr* address, socklen_t length);
  void after_bind(int fd);
  void on_connect(int fd, const sockaddr* address, socklen_t length);

 private:
  std::string key_;
  std::vector<sockaddr_storage> peers_;  // members' listening addresses
  std::vector<sockaddr_storage> bound_;  // local addresses this thread bound, signed
  std::vector<int> connected_;           // sockets this thread connected, signed
  // Those and the connections accepted on the sockets in bound_ (found by their local
  // address: gloo accepts on its own thread); false when /proc/self/fd cannot be listed.
  bool signed_connections(std::vector<int>& out);
  int signed_unbound_fd_ = -1;  // signed by on_bind, waiting for after_bind
  std::string error_;
};

/// The scope the calling thread holds, or nullptr.
tcp_signature_scope* current_tcp_signature_scope();

/// While alive, records the TCP sockets the calling thread binds and the addresses it connects
/// them to (gloo makes a pair's sockets on the thread that connects the group). Another thread
/// may then end the connect at once: interrupt() shuts down every recorded socket that still
/// listens or still connects, which wakes gloo's loop with an error for its pair (gloo's own
/// wait for a pair cannot be cancelled). One watch per thread at a time; not copyable.
class connect_watch {
 public:
  connect_watch();
  ~connect_watch();
  connect_watch(const connect_watch&) = delete;
  connect_watch& operator=(const connect_watch&) = delete;

  /// From any thread. Sockets already connected are left alone.
  void interrupt();
  bool interrupted() const { return interrupted_.load(); }
  /// Whether this thread called connect() to `address` under the watch: it was the connecting
  /// side of that pair (gloo's lower address listens, the higher one connects).
  bool connected_to(const sockaddr_storage& address) const;
  /// The errno with which connect() to `address` failed at once (ENETUNREACH, ...); 0 when it
  /// did not (it went on in the background, or was never called).
  int connect_errno(const sockaddr_storage& address) const;

  // Called by the interposed functions.
  void on_bind(int fd);
  void on_connect(int fd, const sockaddr* address, socklen_t length, int error);

 private:
  struct socket_entry {
    int fd = -1;
    sockaddr_storage local{};  // so that a descriptor number reused since is never touched
  };
  struct target {
    sockaddr_storage address{};
    int error = 0;
  };
  mutable std::mutex m_;
  std::vector<socket_entry> sockets_;
  std::vector<target> targets_;
  std::atomic<bool> interrupted_{false};
};

/// The kernel's count of TCP segments it dropped for a missing, unexpected or wrong TCP-MD5
/// signature in this network namespace (/proc/net/netstat); -1 when it cannot be read. A rise
/// while a signed group connects means a peer signs with another key, or none.
long tcp_signature_drops();

}  // namespace troupe::comm
