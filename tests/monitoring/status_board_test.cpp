// The status board (monitoring/status_board.hpp): events folded into the document, the rank
// table from the tick, the summary text, and GET /status on the metrics endpoint (bearer token,
// bounded client). Events are built from their structs (monitoring/events), as the job writes
// them: the board reads each as its typed kind, and one that lacks a field is not read.

#include "monitoring/status_board.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "monitoring/events/events.hpp"
#include "monitoring/http_client.hpp"
#include "monitoring/http_server.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::monitoring {
namespace {

using nlohmann::json;

// An event of kind T as a line of events.jsonl: the fields `set` gives, the others at their
// defaults (every field is written, as the job writes it).
template <class T, class F>
json line_of(F&& set) {
  T e;
  set(e);
  return events::to_json(e);
}

events::step step_of(int64_t step, double loss) {
  events::step e;
  e.step = step;
  e.loss = loss;
  e.lr = 1e-3;
  e.tokens = 256;
  e.tokens_per_s = 1000.0;
  e.world = 4;
  e.generation = 2;
  e.step_s = 0.25;
  e.compute_s = 0.2;
  e.comm_s = 0.03;
  e.control_s = 0.01;
  e.peer_wait_s = 0.001;
  e.total_steps = 100;
  return e;
}

json step_event(int64_t step, double loss) { return events::to_json(step_of(step, loss)); }

TEST(StatusBoard, FoldsTheEventsOfAJob) {
  status_board board;
  board.set_job("/runs/x", 100, 4, "dp4");
  board.observe(events::to_json(events::generation{.number = 2,
                                                   .world = 3,
                                                   .spares = 1,
                                                   .plan = {{"describe", "dp3"}},
                                                   .reason = "rank 2 lost",
                                                   .cause = "exit",
                                                   .start_step = 10,
                                                   .recovery_s = 0.5}));
  board.observe(events::to_json(events::state{.from = "recovering",
                                              .to = "training",
                                              .value = 1,
                                              .generation = 2,
                                              .step = 10,
                                              .reason = "generation 2 formed"}));
  board.observe(step_event(11, 2.5));
  board.observe(events::to_json(events::validation{.step = 11, .val_loss = 2.75}));
  board.observe(line_of<events::checkpoint>([](auto& e) {
    e.step = 11;
    e.path = "/runs/x/checkpoints/step-11";
  }));
  const json doc = board.snapshot();
  EXPECT_EQ(doc["format"], status_board::format_version);
  EXPECT_EQ(doc["source"], "live");
  EXPECT_EQ(doc["state"], "training");
  EXPECT_EQ(doc["generation"], 2);
  EXPECT_EQ(doc["world"], 4);  // the step's world is the newest word
  EXPECT_EQ(doc["spares"], 1);
  EXPECT_EQ(doc["layout"], "dp3");
  EXPECT_EQ(doc["step"], 11);
  EXPECT_EQ(doc["total_steps"], 100);
  EXPECT_DOUBLE_EQ(doc["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(doc["val_loss"].get<double>(), 2.75);
  EXPECT_DOUBLE_EQ(doc["tokens_per_s"].get<double>(), 1000.0);
  EXPECT_DOUBLE_EQ(doc["step_breakdown"]["compute_s"].get<double>(), 0.2);
  EXPECT_EQ(doc["checkpoint"]["step"], 11);
  EXPECT_EQ(doc["last_generation"]["reason"], "rank 2 lost");
  EXPECT_EQ(doc["run_dir"], "/runs/x");
  ASSERT_EQ(doc["events"].size(), 5u);
  EXPECT_EQ(doc["events"][0]["event"], "generation");
  EXPECT_FALSE(doc["events"][0].contains("plan"));  // big nested documents are left out
  EXPECT_TRUE(doc["events"][0].contains("unix_ms"));
  EXPECT_FALSE(doc.contains("step_phases"));
  EXPECT_FALSE(doc.contains("goodput"));
}

TEST(StatusBoard, KeepsTheLastEventsWithOnlyTheNewestOfARunOfSteps) {
  status_board board(5);
  for (int i = 1; i <= 50; ++i) board.observe(step_event(i, 3.0));
  board.observe(line_of<events::fault>([](auto& e) { e.what = "kill"; }));
  board.observe(step_event(51, 3.0));
  json doc = board.snapshot();
  ASSERT_EQ(doc["events"].size(), 3u);
  EXPECT_EQ(doc["events"][0]["step"], 50);
  EXPECT_EQ(doc["events"][1]["event"], "fault");
  EXPECT_EQ(doc["events"][2]["step"], 51);
  for (int i = 0; i < 10; ++i)
    board.observe(line_of<events::straggler>([i](auto& e) { e.rank = i; }));
  doc = board.snapshot();
  ASSERT_EQ(doc["events"].size(), 5u);  // bounded
  EXPECT_EQ(doc["events"][4]["rank"], 9);
  EXPECT_EQ(doc["events"][0]["rank"], 5);
}

TEST(StatusBoard, ShowsPhasesAndGoodputWhenTheJobRecordsThem) {
  status_board board;
  events::step step = step_of(3, 2.0);
  step.phases = json{{"compute", 0.8}, {"exposed_comm", 0.15}, {"control", 0.05}};
  board.observe(events::to_json(step));
  board.observe(events::to_json(events::goodput{.step = 3,
                                                .generation = 1,
                                                .wall_s = 10.0,
                                                .rank_seconds = 40.0,
                                                .phases = {{"compute", 30.0}, {"forming", 10.0}},
                                                .goodput = 0.75,
                                                .mfu = 0.1,
                                                .peak_flops = 1e11}));
  const json doc = board.snapshot();
  EXPECT_DOUBLE_EQ(doc["step_phases"]["compute"].get<double>(), 0.8);
  EXPECT_DOUBLE_EQ(doc["goodput"]["goodput"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(doc["goodput"]["phases"]["forming"].get<double>(), 10.0);
  const std::string text = render_status(doc, "here");
  EXPECT_NE(text.find("goodput 75.0%"), std::string::npos) << text;
  EXPECT_NE(text.find("compute 75.0%"), std::string::npos) << text;  // 30 of 40
  EXPECT_NE(text.find("compute 80.0%"), std::string::npos) << text;  // the last step
  EXPECT_NE(text.find("exposed_comm 15.0%"), std::string::npos) << text;
}

// Issue 35: between goodput records (a generation change, the end) the view showed the last
// record's goodput (0 through a healthy run). Each step brings it forward to its commit.
TEST(StatusBoard, EachStepBringsTheGoodputAndMfuForward) {
  status_board board;
  board.observe(events::to_json(events::goodput{.step = 0,
                                                .generation = 1,
                                                .wall_s = 2.0,
                                                .rank_seconds = 8.0,
                                                .phases = {{"compute", 0.0}, {"forming", 8.0}},
                                                .goodput = 0.0,
                                                .mfu = 0.0,
                                                .peak_flops = 1e11}));
  for (int64_t s = 1; s <= 2; ++s) {
    events::step step = step_of(s, 2.0);
    step.phases = json{{"compute", 3.0}, {"control", 1.0}};
    step.goodput = 3.0 * static_cast<double>(s) / (8.0 + 4.0 * static_cast<double>(s));
    step.mfu = 0.01 * static_cast<double>(s);
    board.observe(events::to_json(step));
  }
  const json doc = board.snapshot();
  EXPECT_DOUBLE_EQ(doc["goodput"]["goodput"].get<double>(), 0.375);
  EXPECT_DOUBLE_EQ(doc["goodput"]["mfu"].get<double>(), 0.02);
  EXPECT_EQ(doc["goodput"]["step"], 2);
  EXPECT_DOUBLE_EQ(doc["goodput"]["rank_seconds"].get<double>(), 16.0);
  EXPECT_DOUBLE_EQ(doc["goodput"]["phases"]["compute"].get<double>(), 6.0);
  EXPECT_DOUBLE_EQ(doc["goodput"]["phases"]["control"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(doc["goodput"]["phases"]["forming"].get<double>(), 8.0);
  const std::string text = render_status(doc, "here");
  EXPECT_NE(text.find("up to step 2 (goodput 37.5%, MFU 2.0%)"), std::string::npos) << text;
  EXPECT_NE(text.find("compute 37.5%"), std::string::npos) << text;  // 6 of 16

  // A log written before steps carried them leaves the last record as it was.
  status_board old;
  old.observe(line_of<events::goodput>([](auto& e) { e.goodput = 0.25; }));
  old.observe(step_event(1, 2.0));
  EXPECT_DOUBLE_EQ(old.snapshot()["goodput"]["goodput"].get<double>(), 0.25);
}

TEST(StatusBoard, RankTableFromTheTickWithEachRanksLastStep) {
  status_board board;
  board.note_rank_step(3, 1, 0.4, 0.3);
  board.note_rank_step(2, 0, 9.0, 9.0);  // an older generation's vote: not shown
  status_rank r0{0, 7, 0, "host-a", 100, 0.05, 1.0};
  status_rank r1{1, 8, 1, "host-b", 200, 1.5, 2.5};
  status_rank r2{2, 9, 1, "host-b", 201, 0.1, std::numeric_limits<double>::quiet_NaN()};
  board.set_ranks(3, {r0, r1, r2});
  const json doc = board.snapshot();
  ASSERT_EQ(doc["ranks"].size(), 3u);
  EXPECT_EQ(doc["ranks"][0]["member"], 7);
  EXPECT_TRUE(doc["ranks"][0]["step_s"].is_null());
  EXPECT_EQ(doc["ranks"][1]["host"], "host-b");
  EXPECT_EQ(doc["ranks"][1]["node"], 1);
  EXPECT_EQ(doc["ranks"][1]["pid"], 200);
  EXPECT_DOUBLE_EQ(doc["ranks"][1]["step_s"].get<double>(), 0.4);
  EXPECT_DOUBLE_EQ(doc["ranks"][1]["compute_s"].get<double>(), 0.3);
  EXPECT_DOUBLE_EQ(doc["ranks"][1]["heartbeat_age_s"].get<double>(), 1.5);
  EXPECT_DOUBLE_EQ(doc["ranks"][1]["straggler_score"].get<double>(), 2.5);
  EXPECT_TRUE(doc["ranks"][2]["straggler_score"].is_null());
  const std::string text = render_status(doc, "here");
  EXPECT_NE(text.find("host-b"), std::string::npos) << text;
  EXPECT_NE(text.find("2.50"), std::string::npos) << text;
  EXPECT_NE(text.find("1.50 s"), std::string::npos) << text;
}

TEST(StatusBoard, RankTableFromEventsAndTheJobsEnd) {
  status_board board;
  board.set_source("events.jsonl");
  board.observe(events::to_json(events::job_start{.world = 2,
                                                  .steps = 50,
                                                  .start_step = 0,
                                                  .config = {{"run_dir", "/r"}},
                                                  .layout = {{"describe", "dp2"}}}));
  for (int r = 0; r < 2; ++r)
    board.observe(events::to_json(events::rank_joined{
        .member = r, .rank = r, .pid = 10 + r, .host = "h", .node = 0, .generation = 1}));
  board.observe(line_of<events::rank_lost>([](auto& e) { e.rank = e.member = 1; }));
  board.observe(
      events::to_json(events::job_ended{.exit_code = 1, .message = "too few ranks", .step = 7}));
  const json doc = board.snapshot();
  EXPECT_EQ(doc["source"], "events.jsonl");
  EXPECT_EQ(doc["state"], "failed");
  EXPECT_EQ(doc["ended"]["exit_code"], 1);
  EXPECT_EQ(doc["layout"], "dp2");
  EXPECT_EQ(doc["total_steps"], 50);
  ASSERT_EQ(doc["ranks"].size(), 2u);
  EXPECT_EQ(doc["ranks"][1]["pid"], 11);
  EXPECT_TRUE(doc["ranks"][1].value("lost", false));
  const std::string text = render_status(doc, "/r");
  EXPECT_NE(text.find("failed, exit 1: too few ranks"), std::string::npos) << text;
  EXPECT_NE(text.find("from events.jsonl"), std::string::npos) << text;

  // A second session in the same file (a resume) starts afresh.
  board.observe(line_of<events::job_start>([](auto& e) {
    e.world = 3;
    e.steps = 80;
  }));
  const json again = board.snapshot();
  EXPECT_EQ(again["state"], "forming");
  EXPECT_FALSE(again.contains("ended"));
  EXPECT_TRUE(again["ranks"].empty());
  EXPECT_EQ(again["world"], 3);
}

TEST(StatusBoard, IgnoresWhatIsNotAnEventAndKnownKindsThatDoNotRead) {
  status_board board;
  board.observe(json::array({1, 2}));
  board.observe({{"no_event", 1}});
  board.observe({{"event", 5}});
  board.observe(step_event(4, std::nan("")));  // live: NaN stays a number, and is not shown
  json doc = board.snapshot();
  EXPECT_EQ(doc["step"], 4);
  EXPECT_FALSE(doc.contains("loss"));
  EXPECT_EQ(doc["events"].size(), 1u);

  // A step with a field of the wrong type, one without a field (a renamed one), and one as a
  // file holds a NaN loss (null): none is read, so none moves the document or is listed.
  json mistyped = step_event(5, 2.0);
  mistyped["step"] = "five";
  json renamed = step_event(6, 2.0);
  renamed["steps"] = renamed["step"];
  renamed.erase("step");
  json null_loss = step_event(7, 2.0);
  null_loss["loss"] = nullptr;
  for (const json& e : {mistyped, renamed, null_loss}) board.observe(e);
  doc = board.snapshot();
  EXPECT_EQ(doc["step"], 4);
  ASSERT_EQ(doc["events"].size(), 1u);
  EXPECT_EQ(doc["events"][0]["step"], 4);
}

// A kind this build has no struct for (a newer troupe's log) changes no field of the document,
// even one named like a field it knows, and is listed as it came.
TEST(StatusBoard, AnUnknownKindIsListedAsItCame) {
  status_board board;
  board.observe(step_event(3, 2.0));
  board.observe({{"event", "from_the_future"}, {"step", 99}, {"loss", 0.5}, {"note", "hi"}});
  board.observe(step_event(4, 2.0));
  const json doc = board.snapshot();
  EXPECT_EQ(doc["step"], 4);
  EXPECT_DOUBLE_EQ(doc["loss"].get<double>(), 2.0);
  ASSERT_EQ(doc["events"].size(), 3u);  // the steps are not a run: the unknown kind parts them
  EXPECT_EQ(doc["events"][1]["event"], "from_the_future");
  EXPECT_EQ(doc["events"][1]["note"], "hi");
  EXPECT_NE(event_line(doc["events"][1], 200).find("from_the_future    step=99"), std::string::npos)
      << event_line(doc["events"][1], 200);
}

// The lines of a fitted summary.
std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::size_t from = 0;
  for (;;) {
    const auto nl = text.find('\n', from);
    out.push_back(text.substr(from, nl == std::string::npos ? std::string::npos : nl - from));
    if (nl == std::string::npos) return out;
    from = nl + 1;
  }
}

TEST(StatusBoard, AnEventLineStartsWithTimeKindAndStep) {
  json step = step_event(1234, 2.5);
  step["unix_ms"] = 1796563698000;
  const std::string line = event_line(step, 200);
  EXPECT_EQ(line.rfind("  ", 0), 0u) << line;
  EXPECT_EQ(line.find("step               step=1234 loss=2.500 world=4 generation=2"), 12u) << line;
  // Cut to the width, the cut marked.
  const std::string narrow = event_line(step, 50);
  EXPECT_EQ(narrow.size(), 50u) << narrow;
  EXPECT_EQ(narrow.substr(47), "...") << narrow;
  EXPECT_NE(narrow.find("step=1234"), std::string::npos) << narrow;
  // A kind longer than its column is not cut; fields that say most come first.
  const std::string lost = event_line({{"event", "checkpoint_abandoned"},
                                       {"aaa", 1},
                                       {"step", 7},
                                       {"reason", "rank lost"},
                                       {"unix_ms", 1796563698000}},
                                      200);
  EXPECT_NE(lost.find("checkpoint_abandoned step=7 reason=rank lost aaa=1"), std::string::npos)
      << lost;
}

// A job of `ranks` ranks with a run of events, as the summary sees it.
json busy_document(int ranks) {
  status_board board;
  board.set_job("/runs/busy", 1000, ranks, "dp" + std::to_string(ranks));
  board.observe(line_of<events::state>([](auto& e) {
    e.from = "forming";
    e.to = "training";
    e.generation = 1;
  }));
  std::vector<status_rank> rows;
  for (int r = 0; r < ranks; ++r)
    rows.push_back({r, r, 0, "a-host-with-a-rather-long-name", 100 + r, 0.1, 1.0});
  board.set_ranks(1, rows);
  for (int i = 0; i < 30; ++i) {
    board.observe(step_event(i + 1, 3.0));
    board.observe(line_of<events::checkpoint>([i](auto& e) {
      e.step = i + 1;
      e.path = "/runs/busy/ckpt";
    }));
  }
  return board.snapshot();
}

TEST(StatusBoard, AFittedSummaryKeepsTheStateAndTheRankTable) {
  const json doc = busy_document(4);
  const auto lines = lines_of(render_status(doc, "/runs/busy", {80, 24}));
  ASSERT_EQ(lines.size(), 24u);
  for (const auto& l : lines) EXPECT_LE(l.size(), 80u) << l;
  EXPECT_EQ(lines[0].rfind("troupe status: /runs/busy", 0), 0u);
  EXPECT_EQ(lines[1].rfind("job         training", 0), 0u);
  std::size_t table = 0;
  while (table < lines.size() && lines[table].rfind("rank member node host", 0) != 0) ++table;
  ASSERT_LT(table + 4, lines.size());
  EXPECT_EQ(lines[table + 4].substr(0, 4), "   3");
  // The newest events fill the rest: the last line is the newest step.
  EXPECT_NE(lines.back().find("step=30"), std::string::npos) << lines.back();

  // Too short for the table: as many ranks as fit, and how many are not shown.
  const auto short_lines = lines_of(render_status(doc, "/runs/busy", {80, 9}));
  ASSERT_EQ(short_lines.size(), 9u);
  EXPECT_EQ(short_lines[1].rfind("job         training", 0), 0u);
  EXPECT_EQ(short_lines[6].rfind("rank member node host", 0), 0u);
  EXPECT_EQ(short_lines[7].substr(0, 4), "   0");
  EXPECT_EQ(short_lines[8].rfind("... 3 more ranks", 0), 0u) << short_lines[8];

  // No limit on lines: everything, cut to the width; the note wrapped at the end.
  const std::string note(150, 'x');
  const auto all = lines_of(render_status(doc, "/runs/busy", {60, 0}, note));
  EXPECT_EQ(all[all.size() - 3], std::string(60, 'x'));
  EXPECT_EQ(all.back(), std::string(30, 'x'));
  for (const auto& l : all) EXPECT_LE(l.size(), 60u) << l;
}

TEST(StatusBoard, ReadersAndAWriterAtOnce) {
  status_board board;
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 1; !stop; ++i) {
      board.observe(step_event(i, 1.0));
      board.set_ranks(1, {status_rank{0, 0, 0, "h", 1, 0.1, 1.0}});
    }
  });
  for (int i = 0; i < 2000; ++i) {
    const json doc = json::parse(board.document());
    ASSERT_TRUE(doc.is_object());
  }
  stop = true;
  writer.join();
}

TEST(StatusEndpoint, ServesTheDocumentBehindTheTokenAndHealthzOpen) {
  metrics_registry registry;
  status_board board;
  board.observe(step_event(5, 2.0));
  metrics_server_limits limits;
  limits.bearer_token = "tok3n";
  metrics_server server(registry, "127.0.0.1", 0, limits, &board);
  const auto get = [&](const std::string& path, const std::string& token) {
    return http_get("127.0.0.1", server.port(), path, token);
  };
  EXPECT_EQ(get("/status", "").status, 401);
  EXPECT_EQ(get("/status", "wrong").status, 401);
  EXPECT_EQ(server.rejected(), 2u);
  const auto ok = get("/status", "tok3n");
  ASSERT_EQ(ok.status, 200);
  EXPECT_EQ(ok.content_type, "application/json");
  const json doc = json::parse(ok.body);
  EXPECT_EQ(doc["step"], 5);
  EXPECT_EQ(get("/healthz", "").status, 200);

  // Without a board the route does not exist.
  metrics_server plain(registry, "127.0.0.1", 0);
  EXPECT_EQ(http_get("127.0.0.1", plain.port(), "/status").status, 404);
}

TEST(StatusEndpoint, TheClientBoundsSizeAndTime) {
  metrics_registry registry;
  status_board board;
  for (int i = 0; i < 20; ++i)
    board.observe({{"event", "note"}, {"text", std::string(100, 'x')}, {"i", i}});
  metrics_server server(registry, "127.0.0.1", 0, {}, &board);
  EXPECT_THROW(http_get("127.0.0.1", server.port(), "/status", "", std::chrono::seconds(5), 512),
               http_get_error);
  EXPECT_NO_THROW(http_get("127.0.0.1", server.port(), "/status", "", std::chrono::seconds(5)));

  // A listener that never answers (connections wait in its backlog): the deadline ends it.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(fd, 4), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_THROW(
        http_get("127.0.0.1", ntohs(addr.sin_port), "/status", "", std::chrono::milliseconds(300)),
        http_get_error);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
    ::close(fd);
  }
  // Nothing listens: refused at once, with the address in the words.
  const uint16_t gone = [&] {
    metrics_server s(registry, "127.0.0.1", 0);
    return s.port();
  }();
  try {
    http_get("127.0.0.1", gone, "/status", "", std::chrono::milliseconds(2000));
    FAIL() << "expected an error";
  } catch (const http_get_error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(gone)), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::monitoring
