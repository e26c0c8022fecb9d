// The event log writes whole, timestamped JSON lines, appends across reopen, and keeps lines
// whole under concurrent writers and when a full disk cuts a write short.
#include "monitoring/event_log.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "subprocess.hpp"

namespace troupe::monitoring {
namespace {

using nlohmann::json;

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::int64_t now_ms() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

TEST(event_log, lines_are_json_with_timestamps_first) {
  testing::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  const std::int64_t before = now_ms();
  {
    event_log events = event_log::open(path);
    events.write({{"event", "rank_joined"}, {"rank", 3}, {"generation", 1}});
    events.write(json::object());
    events.write({{"event", "x"}, {"ts", "caller's ts is replaced"}});
  }
  const std::int64_t after = now_ms();
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  const std::regex iso(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$)");
  for (const std::string& line : lines) {
    EXPECT_EQ(line.rfind("{\"ts\":\"", 0), 0u) << line;
    const json doc = json::parse(line);
    ASSERT_TRUE(doc.is_object());
    EXPECT_TRUE(std::regex_match(doc.at("ts").get<std::string>(), iso)) << line;
    const auto ms = doc.at("unix_ms").get<std::int64_t>();
    EXPECT_GE(ms, before);
    EXPECT_LE(ms, after);
    EXPECT_EQ(doc.at("ts").get<std::string>(), format_iso8601_utc(ms));
  }
  const json first = json::parse(lines[0]);
  EXPECT_EQ(first.at("event"), "rank_joined");
  EXPECT_EQ(first.at("rank"), 3);
  EXPECT_EQ(json::parse(lines[1]).size(), 2u);  // just ts and unix_ms
  EXPECT_NE(json::parse(lines[2]).at("ts"), "caller's ts is replaced");
}

TEST(event_log, iso8601_formatting_is_exact) {
  EXPECT_EQ(format_iso8601_utc(0), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(format_iso8601_utc(1714564800123), "2024-05-01T12:00:00.123Z");
  EXPECT_EQ(format_iso8601_utc(-1), "1969-12-31T23:59:59.999Z");
}

TEST(event_log, reopening_appends) {
  testing::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  event_log::open(path).write({{"n", 1}});
  event_log::open(path).write({{"n", 2}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(json::parse(lines[0]).at("n"), 1);
  EXPECT_EQ(json::parse(lines[1]).at("n"), 2);
}

TEST(event_log, each_line_is_on_disk_before_write_returns) {
  testing::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  event_log events = event_log::open(path);
  events.write({{"event", "commit"}, {"step", 7}});
  // Still open: a crash now must not lose the line, so it is already in the file.
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(json::parse(lines[0]).at("step"), 7);
}

TEST(event_log, concurrent_writers_produce_whole_lines) {
  testing::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  constexpr int threads = 8;
  constexpr int per_thread = 500;
  event_log shared = event_log::open(path);
  // A second handle on the same file stands in for another process appending.
  event_log other = event_log::open(path);
  const std::string padding(3000, 'p');  // long lines make tearing likelier if it could happen
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      event_log& log = t % 2 == 0 ? shared : other;
      for (int i = 0; i < per_thread; ++i) log.write({{"thread", t}, {"i", i}, {"pad", padding}});
    });
  }
  for (auto& w : workers) w.join();
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), static_cast<std::size_t>(threads * per_thread));
  std::set<std::pair<int, int>> seen;
  for (const std::string& line : lines) {
    const json doc = json::parse(line);  // throws, failing the test, on a torn line
    seen.emplace(doc.at("thread").get<int>(), doc.at("i").get<int>());
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(threads * per_thread));
}

TEST(event_log, a_torn_last_line_is_ended_before_the_next_line) {
  testing::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  event_log::open(path).write({{"n", 1}});
  {  // a writer the disk cut short, mid-line
    std::ofstream out(path, std::ios::app);
    out << "{\"ts\":\"2024-05-01T12:00";
  }
  event_log::open(path).write({{"n", 2}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(json::parse(lines[0]).at("n"), 1);
  EXPECT_FALSE(json::accept(lines[1])) << "the torn fragment stays a line of its own";
  EXPECT_EQ(json::parse(lines[2]).at("n"), 2) << "the new line is whole";
}

// A file-size limit cuts a write short as a full disk does (the bytes that fit land, the
// write returns fewer), without taking the disk from other tests. SIGXFSZ, which a write
// that fits nothing at all would raise, is ignored meanwhile.
class file_size_limit {
 public:
  explicit file_size_limit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit r = saved_;
    r.rlim_cur = bytes;
    ok_ = ::setrlimit(RLIMIT_FSIZE, &r) == 0;
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
  }
  ~file_size_limit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, old_handler_);
  }
  file_size_limit(const file_size_limit&) = delete;
  file_size_limit& operator=(const file_size_limit&) = delete;
  bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
  void (*old_handler_)(int) = SIG_DFL;
};

// A line a full disk cut short is taken back: the file keeps only whole lines, the error
// says so, and the next line that fits lands whole after the last one.
TEST(event_log, a_line_the_disk_cut_short_is_taken_back) {
  testing::temp_dir dir;
  const std::string path = dir.file("events.jsonl");
  event_log log = event_log::open(path);
  log.write({{"n", 1}});
  const auto whole = std::filesystem::file_size(path);
  {
    file_size_limit limit(whole + 10);  // room for 10 bytes of the next line
    ASSERT_TRUE(limit.ok());
    try {
      log.write({{"n", 2}, {"padding", std::string(100, 'x')}});
      ADD_FAILURE() << "a write the disk cut short did not throw";
    } catch (const event_log_error& e) {
      EXPECT_NE(std::string(e.what()).find("the partial line was removed"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(std::filesystem::file_size(path), whole) << "the 10 bytes that fitted were kept";
  }
  log.write({{"n", 3}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(json::parse(lines[0]).at("n"), 1);
  EXPECT_EQ(json::parse(lines[1]).at("n"), 3);
}

TEST(event_log, errors_are_typed) {
  EXPECT_THROW(event_log::open("/nonexistent-dir/for/sure/events.jsonl"), event_log_error);
  try {
    event_log::open("/nonexistent-dir/for/sure/events.jsonl");
  } catch (const event_log_error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/for/sure/events.jsonl"),
              std::string::npos);
  }
  testing::temp_dir dir;
  event_log events = event_log::open(dir.file("e.jsonl"));
  EXPECT_THROW(events.write(json::array({1, 2})), event_log_error);
  EXPECT_THROW(events.write(42), event_log_error);
  event_log moved = std::move(events);
  EXPECT_THROW(events.write(json::object()), event_log_error);  // NOLINT(bugprone-use-after-move)
  EXPECT_NO_THROW(moved.write(json::object()));
}

TEST(event_log, text_from_outside_is_escaped_never_thrown) {
  testing::temp_dir dir;
  const std::string path = dir.file("e.jsonl");
  // Bytes of a damaged manifest in an error, a control sequence, a key that is not UTF-8:
  // the line is valid UTF-8 JSON.
  event_log events = event_log::open(path);
  events.write({{"msg", std::string("bad \xff byte \x1b[31m")}, {std::string("k\xfe"), 1}});
  const auto lines = read_lines(path);
  ASSERT_EQ(lines.size(), 1u);
  const json line = json::parse(lines[0]);
  EXPECT_EQ(line.at("msg"), "bad \\xff byte \\x1b[31m");
  EXPECT_EQ(line.at("k\\xfe"), 1);
  // What travels between threads as text is encoded the same way, and never throws.
  EXPECT_EQ(json::parse(event_log::encode({{"error", std::string("\xc3\x28")}})).at("error"),
            "\\xc3(");
}

TEST(event_log, a_link_in_its_place_is_not_followed) {
  testing::temp_dir dir;
  const std::string target = dir.file("elsewhere");
  { std::ofstream(target) << "precious\n"; }
  const std::string path = dir.file("events.jsonl");
  ASSERT_EQ(::symlink(target.c_str(), path.c_str()), 0);
  try {
    event_log::open(path);
    ADD_FAILURE() << "opened through a symbolic link";
  } catch (const event_log_error& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic link"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_lines(target), std::vector<std::string>{"precious"});
}

}  // namespace
}  // namespace troupe::monitoring
