#include "runtime/comm/shm_staging.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <utility>

#include "runtime/comm/communicator.hpp"

namespace troupe::comm::shm_detail {
namespace {

constexpr uint64_t staging_magic = 0x74726f7570657374ull;  // "troupest"
constexpr size_t header_bytes = 4096;                      // keeps the staging page-aligned

struct staging_header {
  uint64_t magic;
  uint64_t nonce;
  uint64_t bytes;
};

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

}  // namespace

uint64_t random_nonce() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^
         static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
         static_cast<uint64_t>(::getpid());
}

int open_pidfd(int32_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#endif
  return -1;
}

staging_pool& staging_pool::process() {
  // Never destroyed: communicators held in statics may outlive any destruction order.
  static auto* pool = new staging_pool();
  return *pool;
}

own_staging staging_pool::acquire(const std::string& kind, size_t bytes, staging_holder* holder) {
  std::lock_guard<std::mutex> lock(m_);
  unmap_exited_peers();
  auto lend = [&](size_t slot) {
    auto& p = own_[slot];
    p.holder = holder;
    return own_staging{slot, p.base + header_bytes, p.bytes,
                       staging_address{static_cast<int32_t>(::getpid()), p.fd, p.nonce}};
  };
  // A free piece of the same kind first, then one whose holder is dead: the group that
  // replaces a dead one reuses its memory, which its peers have mapped already.
  for (size_t i = 0; i < own_.size(); ++i) {
    if (own_[i].kind == kind && own_[i].bytes >= bytes && own_[i].holder == nullptr) return lend(i);
  }
  for (size_t i = 0; i < own_.size(); ++i) {
    if (own_[i].kind == kind && own_[i].bytes >= bytes && own_[i].holder->give_up_staging())
      return lend(i);
  }
  own_piece p;
  p.kind = kind;
  p.bytes = bytes;
  p.nonce = random_nonce();
  p.fd = static_cast<int>(
      ::syscall(SYS_memfd_create, ("troupe-staging-" + kind).c_str(), MFD_CLOEXEC));
  if (p.fd < 0) throw comm_error(comm_errc::internal, errno_text("shm staging: memfd_create"));
  const size_t total = header_bytes + bytes;
  void* base = MAP_FAILED;
  if (::ftruncate(p.fd, static_cast<off_t>(total)) == 0)
    base = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, p.fd, 0);
  if (base == MAP_FAILED) {
    const std::string why = errno_text("shm staging: ftruncate/mmap of " + std::to_string(total));
    ::close(p.fd);
    throw comm_error(comm_errc::internal, why);
  }
  p.base = static_cast<char*>(base);
  new (p.base) staging_header{staging_magic, p.nonce, bytes};
  own_.push_back(std::move(p));
  return lend(own_.size() - 1);
}

void staging_pool::hand_over(size_t slot, const staging_holder* from, staging_holder* to) {
  std::lock_guard<std::mutex> lock(m_);
  if (slot < own_.size() && own_[slot].holder == from) own_[slot].holder = to;
}

void staging_pool::release(size_t slot, const staging_holder* holder) {
  std::lock_guard<std::mutex> lock(m_);
  if (slot < own_.size() && own_[slot].holder == holder) own_[slot].holder = nullptr;
}

staging_pool::peer_view staging_pool::attach(const staging_address& peer, size_t bytes) {
  std::lock_guard<std::mutex> lock(m_);
  const auto key = std::make_pair(peer.pid, peer.nonce);
  if (auto it = peers_.find(key); it != peers_.end()) {
    if (it->second.bytes < bytes)
      throw comm_error(comm_errc::invalid, "shm staging of pid " + std::to_string(peer.pid) +
                                               " holds " + std::to_string(it->second.bytes) +
                                               " bytes, " + std::to_string(bytes) + " needed");
    ++it->second.uses;
    return {it->second.base + header_bytes, it->second.pidfd, it->second.readable};
  }
  unmap_exited_peers();
  const std::string path = "/proc/" + std::to_string(peer.pid) + "/fd/" + std::to_string(peer.fd);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const bool gone = errno == ENOENT || errno == ESRCH;
    throw comm_error(
        gone ? comm_errc::peer_lost : comm_errc::internal,
        errno_text("shm staging: open " + path) + (gone ? " (the peer went away)" : ""));
  }
  struct stat st {};
  const bool sized = ::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= header_bytes;
  const size_t total = sized ? static_cast<size_t>(st.st_size) : 0;
  void* base = sized ? ::mmap(nullptr, total, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED)
    throw comm_error(comm_errc::internal, errno_text("shm staging: map " + path));
  const auto* h = static_cast<const staging_header*>(base);
  if (h->magic != staging_magic || h->nonce != peer.nonce || h->bytes < bytes ||
      total < header_bytes + h->bytes) {
    ::munmap(base, total);
    throw comm_error(comm_errc::invalid, "shm staging: " + path +
                                             " is not the staging its peer published (or is "
                                             "smaller than this group's chunk_bytes need)");
  }
  peer_mapping m;
  m.base = static_cast<char*>(base);
  m.bytes = h->bytes;
  m.mapped = total;
  m.pidfd = open_pidfd(peer.pid);
  m.uses = 1;
  peers_.emplace(key, m);
  return {m.base + header_bytes, m.pidfd, m.readable};
}

void staging_pool::note_readable(const staging_address& peer, bool readable) {
  std::lock_guard<std::mutex> lock(m_);
  if (auto it = peers_.find(std::make_pair(peer.pid, peer.nonce)); it != peers_.end())
    it->second.readable = readable ? 1 : 0;
}

void staging_pool::detach(const staging_address& peer) {
  std::lock_guard<std::mutex> lock(m_);
  if (auto it = peers_.find(std::make_pair(peer.pid, peer.nonce)); it != peers_.end())
    --it->second.uses;
}

staging_pool::usage staging_pool::current() {
  std::lock_guard<std::mutex> lock(m_);
  unmap_exited_peers();
  usage u;
  u.own = own_.size();
  u.peers = peers_.size();
  for (const auto& [key, m] : peers_) u.pidfds += m.pidfd >= 0;
  return u;
}

void staging_pool::unmap_exited_peers() {
  for (auto it = peers_.begin(); it != peers_.end();) {
    auto& m = it->second;
    bool exited = false;
    if (m.uses == 0) {
      if (m.pidfd >= 0) {
        pollfd p{m.pidfd, POLLIN, 0};
        exited = ::poll(&p, 1, 0) > 0;
      } else {
        exited = ::kill(it->first.first, 0) != 0 && errno == ESRCH;
      }
    }
    if (!exited) {
      ++it;
      continue;
    }
    ::munmap(m.base, m.mapped);
    if (m.pidfd >= 0) ::close(m.pidfd);
    it = peers_.erase(it);
  }
}

}  // namespace troupe::comm::shm_detail
