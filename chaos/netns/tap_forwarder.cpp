// A network link with delay, jitter and loss in user space, for kernels without `netem`.
//
// The forwarder owns two TAP devices: the inner one is created inside a node's network
// namespace (it becomes the node's interface), the outer one in the namespace the forwarder
// runs in (the harness attaches it to the cluster's bridge). Every Ethernet frame read from
// one is written to the other, after being held for delay ± jitter and subject to loss, both
// drawn from seeded generators so that a run replays exactly. Each direction keeps FIFO
// order: a frame is never released before the one ahead of it, so TCP sees delay, never
// reordering. The harness in chaos/netns/cluster.py starts one forwarder per shaped link
// and drives it through stdin, one command a line; the forwarder exits when stdin closes,
// so a harness that dies takes its links with it.
//
// Commands (each answered with one line, "ok ..." or "error ..."):
//   delay in|out|both DELAY_US JITTER_US SEED   hold each frame DELAY ± JITTER (uniform)
//   loss in|out|both PROBABILITY SEED           drop each IPv4 frame with this probability
//   stats                                       counters of both directions
//   quit
// "in" is toward the node (outer -> inner), "out" is from the node (inner -> outer). Setting
// a generator's parameters restarts it from its seed: the same seed and the same frames give
// the same drops and the same delays. Loss is drawn for IPv4 frames only, so that ARP and the
// IPv6 chatter of the root namespace neither die nor shift the pattern.

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <sstream>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t stop_requested = 0;
void on_signal(int) { stop_requested = 1; }

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "tap_forwarder: %s\n", what.c_str());
  std::exit(1);
}

std::string errno_text(const std::string& what) { return what + ": " + std::strerror(errno); }

/// splitmix64: tiny, seedable, and the same on every compiler (std:: distributions are not).
struct seeded_rng {
  uint64_t state = 0;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

/// A generator per direction and purpose, so that changing one never shifts another.
seeded_rng make_rng(uint64_t seed, int direction, int purpose) {
  seeded_rng r;
  r.state = seed ^ (0xd1b54a32d192ed03ULL * static_cast<uint64_t>(1 + direction * 2 + purpose));
  r.next();
  return r;
}

struct held_frame {
  int64_t release_ns = 0;
  std::vector<uint8_t> bytes;
};

struct direction {
  const char* name = "";
  int index = 0;
  int from_fd = -1;
  int to_fd = -1;
  int64_t delay_ns = 0;
  int64_t jitter_ns = 0;
  seeded_rng jitter_rng;
  double loss = 0;
  seeded_rng loss_rng;
  std::deque<held_frame> queue;
  size_t queued_bytes = 0;
  int64_t last_release_ns = 0;
  uint64_t rx = 0, tx = 0, lost = 0, overflow = 0, write_errors = 0;
};

size_t queue_limit_bytes = size_t{64} << 20;

int open_tap(const std::string& name) {
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) die(errno_text("open /dev/net/tun"));
  ifreq ifr{};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  if (name.size() >= IFNAMSIZ) die("interface name too long: " + name);
  std::memcpy(ifr.ifr_name, name.c_str(), name.size());
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) die(errno_text("TUNSETIFF " + name));
  return fd;
}

/// Creates the TAP inside the namespace at `netns_path`: the device belongs to the namespace
/// its /dev/net/tun file was opened in, so both the open and the ioctl happen there.
int open_tap_in(const std::string& netns_path, const std::string& name) {
  int here = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (here < 0) die(errno_text("open /proc/self/ns/net"));
  int there = open(netns_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (there < 0) die(errno_text("open " + netns_path));
  if (setns(there, CLONE_NEWNET) < 0) die(errno_text("setns " + netns_path));
  int fd = open_tap(name);
  if (setns(here, CLONE_NEWNET) < 0) die(errno_text("setns back to the original namespace"));
  close(here);
  close(there);
  return fd;
}

void write_frame(direction& d, const uint8_t* data, size_t len) {
  if (write(d.to_fd, data, len) < 0)
    ++d.write_errors;  // the other side is down (EIO) or full: the frame is lost, as on a wire
  else
    ++d.tx;
}

void receive(direction& d, uint8_t* buf, size_t buf_size) {
  for (int batch = 0; batch < 256; ++batch) {
    ssize_t n = read(d.from_fd, buf, buf_size);
    if (n < 0) {
      if (errno != EAGAIN && errno != EINTR) die(errno_text(std::string("read ") + d.name));
      return;
    }
    if (n == 0) return;
    ++d.rx;
    const bool ipv4 = n >= 14 && buf[12] == 0x08 && buf[13] == 0x00;
    if (ipv4 && d.loss > 0 && d.loss_rng.uniform() < d.loss) {
      ++d.lost;
      continue;
    }
    if (d.delay_ns == 0 && d.jitter_ns == 0 && d.queue.empty()) {
      write_frame(d, buf, static_cast<size_t>(n));
      continue;
    }
    if (d.queued_bytes + static_cast<size_t>(n) > queue_limit_bytes) {
      ++d.overflow;
      continue;
    }
    int64_t hold = d.delay_ns;
    if (d.jitter_ns > 0)
      hold +=
          static_cast<int64_t>((2 * d.jitter_rng.uniform() - 1) * static_cast<double>(d.jitter_ns));
    const int64_t release = std::max(now_ns() + std::max<int64_t>(hold, 0), d.last_release_ns);
    d.last_release_ns = release;
    d.queue.push_back({release, std::vector<uint8_t>(buf, buf + n)});
    d.queued_bytes += static_cast<size_t>(n);
  }
}

/// Writes every held frame whose time has come; returns the next release time (0 = none).
int64_t release_due(direction& d, int64_t now) {
  while (!d.queue.empty() && d.queue.front().release_ns <= now) {
    auto& f = d.queue.front();
    write_frame(d, f.bytes.data(), f.bytes.size());
    d.queued_bytes -= f.bytes.size();
    d.queue.pop_front();
  }
  return d.queue.empty() ? 0 : d.queue.front().release_ns;
}

std::string stats_of(const direction& d) {
  std::ostringstream s;
  s << d.name << " rx=" << d.rx << " tx=" << d.tx << " lost=" << d.lost
    << " overflow=" << d.overflow << " write_errors=" << d.write_errors
    << " queued=" << d.queue.size();
  return s.str();
}

/// Runs one command line; returns the reply (without newline) and sets `quit`.
std::string run_command(const std::string& line, std::array<direction, 2>& dirs, bool& quit) {
  std::istringstream in(line);
  std::string verb, which;
  in >> verb;
  if (verb.empty()) return "error empty command";
  if (verb == "quit") {
    quit = true;
    return "ok quit";
  }
  if (verb == "stats") return "stats " + stats_of(dirs[0]) + " " + stats_of(dirs[1]);
  in >> which;
  std::vector<direction*> targets;
  if (which == "in" || which == "both") targets.push_back(&dirs[0]);
  if (which == "out" || which == "both") targets.push_back(&dirs[1]);
  if (targets.empty()) return "error direction must be in, out or both, got '" + which + "'";
  if (verb == "delay") {
    int64_t delay_us = -1, jitter_us = -1;
    uint64_t seed = 0;
    if (!(in >> delay_us >> jitter_us >> seed) || delay_us < 0 || jitter_us < 0 ||
        jitter_us > delay_us)
      return "error usage: delay DIR DELAY_US JITTER_US SEED (0 <= JITTER_US <= DELAY_US)";
    for (direction* d : targets) {
      d->delay_ns = delay_us * 1000;
      d->jitter_ns = jitter_us * 1000;
      d->jitter_rng = make_rng(seed, d->index, 0);
    }
    return "ok " + line;
  }
  if (verb == "loss") {
    double p = -1;
    uint64_t seed = 0;
    if (!(in >> p >> seed) || p < 0 || p > 1)
      return "error usage: loss DIR PROBABILITY SEED (0 <= PROBABILITY <= 1)";
    for (direction* d : targets) {
      d->loss = p;
      d->loss_rng = make_rng(seed, d->index, 1);
    }
    return "ok " + line;
  }
  return "error unknown command '" + verb + "' (delay, loss, stats, quit)";
}

void usage() {
  std::fputs(
      "usage: tap_forwarder --netns PATH --outer NAME [--inner NAME] [--queue-mib N]\n"
      "Creates TAP device --inner (default eth0) inside the network namespace PATH and TAP\n"
      "device --outer here, and forwards frames between them with the delay, jitter and loss\n"
      "set by commands on stdin (delay, loss, stats, quit). Exits when stdin closes.\n",
      stderr);
}

}  // namespace

int main(int argc, char** argv) {
  std::string netns, inner = "eth0", outer;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("option " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--netns") {
      netns = value();
    } else if (a == "--inner") {
      inner = value();
    } else if (a == "--outer") {
      outer = value();
    } else if (a == "--queue-mib") {
      queue_limit_bytes = static_cast<size_t>(std::stoul(value())) << 20;
    } else if (a == "-h" || a == "--help") {
      usage();
      return 0;
    } else {
      usage();
      die("unknown option '" + a + "'");
    }
  }
  if (netns.empty() || outer.empty()) {
    usage();
    return 2;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  const int inner_fd = open_tap_in(netns, inner);
  const int outer_fd = open_tap(outer);
  std::array<direction, 2> dirs;
  dirs[0].name = "in";  // toward the node
  dirs[0].index = 0;
  dirs[0].from_fd = outer_fd;
  dirs[0].to_fd = inner_fd;
  dirs[1].name = "out";  // from the node
  dirs[1].index = 1;
  dirs[1].from_fd = inner_fd;
  dirs[1].to_fd = outer_fd;

  std::printf("ready inner=%s outer=%s\n", inner.c_str(), outer.c_str());
  std::fflush(stdout);

  std::vector<uint8_t> buf(70000);
  std::string pending;
  bool quit = false;
  while (!quit && !stop_requested) {
    const int64_t now = now_ns();
    int64_t next = 0;
    for (auto& d : dirs) {
      const int64_t t = release_due(d, now);
      if (t != 0 && (next == 0 || t < next)) next = t;
    }
    pollfd fds[3] = {{0, POLLIN, 0}, {inner_fd, POLLIN, 0}, {outer_fd, POLLIN, 0}};
    timespec timeout{};
    timespec* timeout_ptr = nullptr;
    if (next != 0) {
      const int64_t wait = std::max<int64_t>(next - now_ns(), 0);
      timeout.tv_sec = wait / 1'000'000'000;
      timeout.tv_nsec = wait % 1'000'000'000;
      timeout_ptr = &timeout;
    }
    const int ready = ppoll(fds, 3, timeout_ptr, nullptr);
    if (ready < 0) {
      if (errno == EINTR) continue;
      die(errno_text("ppoll"));
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char cmd[4096];
      ssize_t n = read(0, cmd, sizeof cmd);
      if (n <= 0) break;  // the harness is gone: so is the link
      pending.append(cmd, static_cast<size_t>(n));
      size_t eol;
      while ((eol = pending.find('\n')) != std::string::npos) {
        std::string line = pending.substr(0, eol);
        pending.erase(0, eol + 1);
        const std::string reply = run_command(line, dirs, quit);
        std::printf("%s\n", reply.c_str());
        std::fflush(stdout);
      }
    }
    if (fds[1].revents & POLLIN) receive(dirs[1], buf.data(), buf.size());
    if (fds[2].revents & POLLIN) receive(dirs[0], buf.data(), buf.size());
    if ((fds[1].revents | fds[2].revents) & (POLLERR | POLLNVAL)) die("a TAP device failed");
  }
  close(inner_fd);
  close(outer_fd);
  return 0;
}
