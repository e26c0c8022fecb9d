// tcp_signature: TCP MD5 signatures on the sockets gloo opens while a thread holds a scope,
// through interposed bind() and connect().
#include "runtime/comm/tcp_signature.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace troupe::comm {
namespace {

thread_local tcp_signature_scope* current_scope = nullptr;
thread_local connect_watch* current_watch = nullptr;

bool is_inet(int family) { return family == AF_INET || family == AF_INET6; }

bool is_tcp_socket(int fd) {
  int protocol = 0;
  socklen_t length = sizeof(protocol);
  return getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &protocol, &length) == 0 &&
         protocol == IPPROTO_TCP;
}

/// Same family, address and port.
bool same_endpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto& x = reinterpret_cast<const sockaddr_in&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    const auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    const auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port &&
           std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
  }
  return false;
}

sockaddr_storage copy_address(const sockaddr* address, socklen_t length) {
  sockaddr_storage out{};
  std::memcpy(&out, address, std::min<size_t>(length, sizeof(out)));
  return out;
}

/// Sets (key non-empty) or removes (key empty) the key for `peer`; every peer of the
/// address family when `any_peer`.
int set_key(int fd, const sockaddr_storage& peer, std::string_view key, bool any_peer) {
  tcp_md5sig sig{};
  sig.tcpm_addr.ss_family = peer.ss_family;
  if (any_peer) {
    sig.tcpm_flags = TCP_MD5SIG_FLAG_PREFIX;
    sig.tcpm_prefixlen = 0;  // the wildcard address of the family, prefix 0: everyone
  } else {
    sig.tcpm_addr = peer;
  }
  sig.tcpm_keylen = static_cast<uint16_t>(key.size());
  std::memcpy(sig.tcpm_key, key.data(), key.size());
  return setsockopt(fd, IPPROTO_TCP, any_peer ? TCP_MD5SIG_EXT : TCP_MD5SIG, &sig, sizeof(sig));
}

template <typename F>
F next_symbol(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f == nullptr) std::abort();  // the C library always has it: nothing sane to do otherwise
  return reinterpret_cast<F>(f);
}

}  // namespace

bool tcp_signatures_supported(std::string* why) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    if (why) *why = std::string("socket: ") + std::strerror(errno);
    return false;
  }
  sockaddr_storage any{};
  any.ss_family = AF_INET;
  const bool ok = set_key(fd, any, "troupe-probe", true) == 0;
  if (!ok && why) {
    *why = std::string("setsockopt(TCP_MD5SIG_EXT): ") + std::strerror(errno) +
           " (the kernel needs CONFIG_TCP_MD5SIG)";
  }
  ::close(fd);
  return ok;
}

tcp_signature_scope::tcp_signature_scope(std::string key) : key_(std::move(key)) {
  if (key_.empty() || key_.size() > TCP_MD5SIG_MAXKEYLEN) {
    throw std::invalid_argument("tcp_signature_scope: the key must have 1 to 80 bytes");
  }
  if (current_scope != nullptr) {
    throw std::logic_error("tcp_signature_scope: this thread already holds one");
  }
  current_scope = this;
}

tcp_signature_scope::~tcp_signature_scope() { current_scope = nullptr; }

tcp_signature_scope* current_tcp_signature_scope() { return current_scope; }

void tcp_signature_scope::allow_peer(const sockaddr_storage& address) {
  for (const auto& p : peers_) {
    if (same_endpoint(p, address)) return;
  }
  peers_.push_back(address);
}

void tcp_signature_scope::on_bind(int fd, const sockaddr* address, socklen_t length) {
  if (address == nullptr || !is_inet(address->sa_family) || !is_tcp_socket(fd)) return;
  const int saved = errno;
  if (set_key(fd, copy_address(address, length), key_, true) == 0) {
    signed_unbound_fd_ = fd;
  } else if (error_.empty()) {
    error_ =
        std::string("cannot require TCP signatures on a listening socket: ") + std::strerror(errno);
  }
  errno = saved;
}

void tcp_signature_scope::after_bind(int fd) {
  if (fd != signed_unbound_fd_) return;
  signed_unbound_fd_ = -1;
  const int saved = errno;
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) bound_.push_back(local);
  errno = saved;
}

void tcp_signature_scope::on_connect(int fd, const sockaddr* address, socklen_t length) {
  if (address == nullptr || !is_inet(address->sa_family)) return;
  const sockaddr_storage to = copy_address(address, length);
  bool member = false;
  for (const auto& p : peers_) member = member || same_endpoint(p, to);
  if (!member || !is_tcp_socket(fd)) return;
  const int saved = errno;
  if (set_key(fd, to, key_, false) == 0) {
    connected_.push_back(fd);
  } else if (error_.empty()) {
    error_ = std::string("cannot sign a connection: ") + std::strerror(errno);
  }
  errno = saved;
}

bool tcp_signature_scope::signed_connections(std::vector<int>& out) {
  out = connected_;
  if (bound_.empty()) return true;
  // Connections accepted on a signed listener inherit its key; gloo accepted them on its own
  // thread and keeps their descriptors to itself, so find them by their local address.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    error_ = std::string("cannot list /proc/self/fd to find the accepted connections: ") +
             std::strerror(errno);
    return false;
  }
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        !is_inet(local.ss_family)) {
      continue;
    }
    for (const auto& b : bound_) {
      if (same_endpoint(b, local)) {
        out.push_back(static_cast<int>(fd));
        break;
      }
    }
  }
  closedir(dir);
  return true;
}

bool tcp_signature_scope::unsign_connections() {
  std::vector<int> fds;
  if (!signed_connections(fds)) return false;
  for (int fd : fds) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0) {
      set_key(fd, peer, {}, false);  // ENOENT: no key for it (not one of ours)
    }
  }
  connected_.clear();
  bound_.clear();
  return true;
}

bool tcp_signature_scope::await_acknowledged(std::chrono::steady_clock::time_point deadline,
                                             const std::function<bool()>& stop) {
  std::vector<int> fds;
  if (!signed_connections(fds)) return false;
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    int waiting = -1, unacknowledged = 0;
    for (int fd : fds) {
      int queued = 0;  // bytes not yet acknowledged by the peer (or not yet sent)
      if (ioctl(fd, SIOCOUTQ, &queued) == 0 && queued > 0) {
        waiting = fd;
        unacknowledged = queued;
        break;
      }
    }
    if (waiting < 0) return true;
    if (stop && stop()) {
      error_ = "stopped while waiting for the peers to acknowledge the connects";
      return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      sockaddr_storage peer{};
      socklen_t length = sizeof(peer);
      std::string to = "a peer";
      char host[INET6_ADDRSTRLEN] = "";
      if (getpeername(waiting, reinterpret_cast<sockaddr*>(&peer), &length) == 0 &&
          inet_ntop(
              peer.ss_family,
              peer.ss_family == AF_INET
                  ? static_cast<const void*>(&reinterpret_cast<sockaddr_in&>(peer).sin_addr)
                  : static_cast<const void*>(&reinterpret_cast<sockaddr_in6&>(peer).sin6_addr),
              host, sizeof host) != nullptr)
        to = host;
      error_ = std::to_string(unacknowledged) + " bytes sent to " + to +
               " while connecting were never acknowledged";
      return false;
    }
    std::this_thread::sleep_for(pause);  // the peers' kernels acknowledge without us
    pause = std::min(pause * 2, std::chrono::microseconds(10000));
  }
}

connect_watch::connect_watch() {
  if (current_watch != nullptr)
    throw std::logic_error("connect_watch: this thread already holds one");
  current_watch = this;
}

connect_watch::~connect_watch() { current_watch = nullptr; }

void connect_watch::on_bind(int fd) {
  if (!is_tcp_socket(fd)) return;
  socket_entry e;
  e.fd = fd;
  socklen_t length = sizeof(e.local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&e.local), &length) != 0) return;
  std::lock_guard<std::mutex> lock(m_);
  sockets_.push_back(e);
}

void connect_watch::on_connect(int fd, const sockaddr* address, socklen_t length, int error) {
  if (address == nullptr || !is_inet(address->sa_family) || !is_tcp_socket(fd)) return;
  target t;
  t.address = copy_address(address, length);
  t.error = error == EINPROGRESS ? 0 : error;
  socket_entry e;
  e.fd = fd;
  socklen_t local_length = sizeof(e.local);
  const bool bound = getsockname(fd, reinterpret_cast<sockaddr*>(&e.local), &local_length) == 0;
  std::lock_guard<std::mutex> lock(m_);
  targets_.push_back(t);
  if (bound && t.error == 0) sockets_.push_back(e);
}

bool connect_watch::connected_to(const sockaddr_storage& address) const {
  std::lock_guard<std::mutex> lock(m_);
  for (const auto& t : targets_)
    if (same_endpoint(t.address, address)) return true;
  return false;
}

int connect_watch::connect_errno(const sockaddr_storage& address) const {
  std::lock_guard<std::mutex> lock(m_);
  for (auto t = targets_.rbegin(); t != targets_.rend(); ++t)
    if (same_endpoint(t->address, address)) return t->error;
  return 0;
}

void connect_watch::interrupt() {
  interrupted_ = true;
  std::lock_guard<std::mutex> lock(m_);
  const int saved = errno;
  for (const auto& e : sockets_) {
    // Only the socket recorded: the same local address, still listening or connecting. A
    // descriptor gloo closed and the process reused for anything else fails these checks.
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (!is_tcp_socket(e.fd) ||
        getsockname(e.fd, reinterpret_cast<sockaddr*>(&local), &length) != 0 ||
        !same_endpoint(local, e.local))
      continue;
    tcp_info info{};
    socklen_t info_length = sizeof(info);
    if (getsockopt(e.fd, IPPROTO_TCP, TCP_INFO, &info, &info_length) != 0) continue;
    if (info.tcpi_state == TCP_LISTEN || info.tcpi_state == TCP_SYN_SENT)
      ::shutdown(e.fd, SHUT_RDWR);  // wakes gloo's loop: accept() or SO_ERROR then fail
  }
  errno = saved;
}

long tcp_signature_drops() {
  std::ifstream in("/proc/net/netstat");
  std::string names, values;
  while (std::getline(in, names) && std::getline(in, values)) {
    if (names.rfind("TcpExt:", 0) != 0) continue;
    std::istringstream n(names), v(values);
    std::string name, value;
    long sum = 0;
    int found = 0;
    while (n >> name && v >> value) {
      if (name == "TCPMD5NotFound" || name == "TCPMD5Unexpected" || name == "TCPMD5Failure") {
        sum += std::strtol(value.c_str(), nullptr, 10);
        ++found;
      }
    }
    return found > 0 ? sum : -1;
  }
  return -1;
}

}  // namespace troupe::comm

using troupe::comm::current_scope;
using troupe::comm::current_watch;

// The interposed C library functions. The executable defines them, so the dynamic linker
// resolves libgloo's (and every other library's) calls here; they forward to the C library's.
extern "C" int bind(int fd, const struct sockaddr* address, socklen_t length) __THROW {
  static const auto real =
      troupe::comm::next_symbol<int (*)(int, const sockaddr*, socklen_t)>("bind");
  auto* scope = current_scope;
  if (scope != nullptr) scope->on_bind(fd, address, length);
  const int rv = real(fd, address, length);
  if (rv == 0 && scope != nullptr) scope->after_bind(fd);
  if (rv == 0 && current_watch != nullptr) {
    const int saved = errno;
    current_watch->on_bind(fd);
    errno = saved;
  }
  return rv;
}

extern "C" int connect(int fd, const struct sockaddr* address, socklen_t length) {
  static const auto real =
      troupe::comm::next_symbol<int (*)(int, const sockaddr*, socklen_t)>("connect");
  if (auto* scope = current_scope) scope->on_connect(fd, address, length);
  const int rv = real(fd, address, length);
  if (auto* watch = current_watch) {
    const int saved = errno;
    watch->on_connect(fd, address, length, rv == 0 ? 0 : saved);
    errno = saved;
  }
  return rv;
}
