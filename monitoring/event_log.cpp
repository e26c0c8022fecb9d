#include "monitoring/event_log.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "runtime/sys/printable.hpp"

namespace troupe::monitoring {

namespace {

std::int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct event_log::state {
  std::string path;
  int fd = -1;  // O_APPEND: every write lands whole at the end, whoever else appends
  std::mutex mutex;
  bool torn = false;  // a short write left part of a line that could not be taken back

  ~state() {
    if (fd >= 0) ::close(fd);
  }
};

std::string format_iso8601_utc(std::int64_t unix_ms) {
  // Floor division, so times before 1970 still get a millisecond part in [0, 999].
  std::int64_t seconds = unix_ms / 1000;
  std::int64_t millis = unix_ms % 1000;
  if (millis < 0) {
    millis += 1000;
    seconds -= 1;
  }
  const auto t = static_cast<std::time_t>(seconds);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<int>(millis));
  return buf;
}

event_log::event_log(std::unique_ptr<state> s) : state_(std::move(s)) {}
event_log::event_log(event_log&&) noexcept = default;
event_log& event_log::operator=(event_log&&) noexcept = default;
event_log::~event_log() = default;

void event_log::make_printable(nlohmann::json& value) {
  if (value.is_string()) {
    auto& text = value.get_ref<std::string&>();
    text = sys::printable(text, 65536);
  } else if (value.is_array()) {
    for (auto& item : value) make_printable(item);
  } else if (value.is_object()) {
    nlohmann::json escaped = nlohmann::json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      make_printable(*it);
      escaped[sys::printable(it.key(), 256)] = std::move(*it);
    }
    value = std::move(escaped);
  }
}

std::string event_log::encode(const nlohmann::json& event) {
  nlohmann::json copy = event;
  make_printable(copy);
  return copy.dump();
}

event_log event_log::open(const std::string& path) {
  auto s = std::make_unique<state>();
  s->path = path;
  // O_NOFOLLOW: a link planted in the run directory must not point this process's writes at
  // another file (docs/SECURITY.md: the run directory is untrusted input).
  s->fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (s->fd < 0) {
    throw event_log_error(
        "event log: cannot open '" + sys::printable(path) + "' for appending: " +
        (errno == ELOOP ? std::string("it is a symbolic link, which troupe does not follow in a "
                                      "run directory; remove it")
                        : std::string(std::strerror(errno))));
  }
  // A file that does not end in a newline holds the torn tail of an earlier writer: the first
  // line written ends it, so that the new line is not glued to it.
  struct stat st {};
  char last = '\n';
  if (::fstat(s->fd, &st) == 0 && st.st_size > 0) {
    const int reader = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (reader >= 0) {
      if (::pread(reader, &last, 1, st.st_size - 1) != 1) last = '\n';
      ::close(reader);
    }
  }
  s->torn = last != '\n';
  return event_log(std::move(s));
}

const std::string& event_log::path() const {
  static const std::string empty;
  return state_ ? state_->path : empty;
}

void event_log::write(nlohmann::json object) {
  if (!state_) throw event_log_error("event log: write() on a moved-from event_log");
  if (!object.is_object()) {
    throw event_log_error("event log: an event must be a JSON object, got " +
                          std::string(object.type_name()));
  }
  object.erase("ts");
  object.erase("unix_ms");
  make_printable(object);
  const std::int64_t unix_ms = now_unix_ms();

  // Built by hand so that the time comes first on each line, where a reader looks for it;
  // nlohmann::json would sort it among the other keys.
  std::string line =
      "{\"ts\":\"" + format_iso8601_utc(unix_ms) + "\",\"unix_ms\":" + std::to_string(unix_ms);
  const std::string rest = object.dump();  // "{...}", every string printable already
  if (rest.size() > 2) {
    line += ',';
    line.append(rest, 1, rest.size() - 1);
  } else {
    line += '}';
  }
  line += '\n';

  {
    std::lock_guard lock(state_->mutex);
    // After a torn line that stayed in the file, end it first: it becomes a line of its own
    // that readers skip, and this one stays whole.
    if (state_->torn) line.insert(line.begin(), '\n');
    struct stat before {};
    const bool sized = ::fstat(state_->fd, &before) == 0;
    ssize_t n = 0;
    do {
      n = ::write(state_->fd, line.data(), line.size());  // one write: the line lands whole
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      throw event_log_error("event log: writing to '" + state_->path +
                            "' failed: " + std::strerror(errno));
    }
    if (static_cast<std::size_t>(n) != line.size()) {
      // A full disk takes part of the line. Take it back when nobody appended since, so the
      // file holds only whole lines.
      struct stat after {};
      state_->torn =
          !(sized && ::fstat(state_->fd, &after) == 0 && after.st_size == before.st_size + n &&
            ::ftruncate(state_->fd, before.st_size) == 0);
      throw event_log_error(
          "event log: writing to '" + state_->path + "' stopped after " + std::to_string(n) +
          " of " + std::to_string(line.size()) + " bytes (is the disk full?); " +
          (state_->torn ? "the partial line stays" : "the partial line was removed"));
    }
    state_->torn = false;
  }
}

}  // namespace troupe::monitoring
