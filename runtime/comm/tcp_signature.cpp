// tcp_signature: TCP MD5 signatures on the sockets gloo opens while a thread holds a scope,
// through interposed bind() and connect().
#include "runtime/comm/tcp_signature.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace troupe::comm {
namespace {

thread_local tcp_signature_scope* current_scope = nullptr;

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

bool tcp_signature_scope::unsign_connections() {
  auto unsign = [](int fd) {
    sockaddr_storage peer{};
    socklen_t length = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &length) == 0) {
      set_key(fd, peer, {}, false);  // ENOENT: no key for it (not one of ours)
    }
  };
  for (int fd : connected_) unsign(fd);
  connected_.clear();
  if (bound_.empty()) return true;
  // Connections accepted on a signed listener inherit its key; gloo accepted them on its own
  // thread and keeps their descriptors to itself, so find them by their local address.
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) {
    error_ = std::string("cannot list /proc/self/fd to unsign accepted connections: ") +
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
        unsign(static_cast<int>(fd));
        break;
      }
    }
  }
  closedir(dir);
  bound_.clear();
  return true;
}

}  // namespace troupe::comm

using troupe::comm::current_scope;

// The interposed C library functions. The executable defines them, so the dynamic linker
// resolves libgloo's (and every other library's) calls here; they forward to the C library's.
extern "C" int bind(int fd, const struct sockaddr* address, socklen_t length) __THROW {
  static const auto real =
      troupe::comm::next_symbol<int (*)(int, const sockaddr*, socklen_t)>("bind");
  auto* scope = current_scope;
  if (scope != nullptr) scope->on_bind(fd, address, length);
  const int rv = real(fd, address, length);
  if (rv == 0 && scope != nullptr) scope->after_bind(fd);
  return rv;
}

extern "C" int connect(int fd, const struct sockaddr* address, socklen_t length) {
  static const auto real =
      troupe::comm::next_symbol<int (*)(int, const sockaddr*, socklen_t)>("connect");
  if (auto* scope = current_scope) scope->on_connect(fd, address, length);
  return real(fd, address, length);
}
