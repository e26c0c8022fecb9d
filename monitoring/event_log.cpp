#include "monitoring/event_log.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

namespace troupe::monitoring {

namespace {

// Lines larger than the stdio buffer would leave fflush to split them into several write()
// calls, and another process appending between those calls would cut the line in two.
constexpr std::size_t stdio_buffer_bytes = 1 << 20;

std::int64_t now_unix_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

}  // namespace

struct event_log::state {
  std::string path;
  std::FILE* file = nullptr;
  std::mutex mutex;
  std::function<void(const nlohmann::json&)> listener;
  std::unique_ptr<char[]> buffer;

  ~state() {
    if (file != nullptr) std::fclose(file);
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

event_log event_log::open(const std::string& path) {
  auto s = std::make_unique<state>();
  s->path = path;
  // "a" is O_APPEND: every write lands at the current end even with other writers.
  s->file = std::fopen(path.c_str(), "a");
  if (s->file == nullptr) {
    throw event_log_error("event log: cannot open '" + path +
                          "' for appending: " + std::strerror(errno));
  }
  s->buffer = std::make_unique<char[]>(stdio_buffer_bytes);
  std::setvbuf(s->file, s->buffer.get(), _IOFBF, stdio_buffer_bytes);
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
  const std::int64_t unix_ms = now_unix_ms();

  // Built by hand so that the time comes first on each line, where a reader looks for it;
  // nlohmann::json would sort it among the other keys.
  std::string line =
      "{\"ts\":\"" + format_iso8601_utc(unix_ms) + "\",\"unix_ms\":" + std::to_string(unix_ms);
  const std::string rest =
      object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);  // "{...}"
  if (rest.size() > 2) {
    line += ',';
    line.append(rest, 1, rest.size() - 1);
  } else {
    line += '}';
  }
  line += '\n';

  std::function<void(const nlohmann::json&)> listener;
  {
    std::lock_guard lock(state_->mutex);
    const std::size_t written = std::fwrite(line.data(), 1, line.size(), state_->file);
    if (written != line.size() || std::fflush(state_->file) != 0) {
      throw event_log_error("event log: writing to '" + state_->path +
                            "' failed: " + std::strerror(errno));
    }
    listener = state_->listener;
  }
  if (listener) listener(object);
}

void event_log::set_listener(std::function<void(const nlohmann::json&)> listener) {
  if (!state_) throw event_log_error("event log: set_listener() on a moved-from event_log");
  std::lock_guard lock(state_->mutex);
  state_->listener = std::move(listener);
}

}  // namespace troupe::monitoring
