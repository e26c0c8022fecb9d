// The typed events: every kind serialises to exactly the fields events.jsonl's readers expect
// (tests/integration/*.py, bench/troupe_events.py), reads back to itself, and moves the
// metrics it should when read from a line as the file holds it.
#include "actors/job/events.hpp"

#include <gtest/gtest.h>

#include "actors/job_metrics.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::actors::events {
namespace {

using nlohmann::json;

struct golden {
  job_event event;
  json expected;  // the events.jsonl object, less "ts" and "unix_ms"
};

std::vector<golden> table() {
  return {
      {state{"forming", "training", 1, 2, 10, "generation 2 formed"},
       {{"event", "state"},
        {"from", "forming"},
        {"to", "training"},
        {"value", 1},
        {"generation", 2},
        {"step", 10},
        {"reason", "generation 2 formed"}}},
      {step{7, 2.5, 0.001, 4096, 1000.5, 4, 2, 0.25, 0.125, 0.0625, 0.03125, 0.5, 100},
       {{"event", "step"},
        {"step", 7},
        {"loss", 2.5},
        {"lr", 0.001},
        {"tokens", 4096},
        {"tokens_per_s", 1000.5},
        {"world", 4},
        {"generation", 2},
        {"step_s", 0.25},
        {"compute_s", 0.125},
        {"comm_s", 0.0625},
        {"control_s", 0.03125},
        {"peer_wait_s", 0.5},
        {"total_steps", 100}}},
      {generation{3, 3, 1, json{{"dp", 3}}, "rank 1 lost", "exit", 20, true, true, 1.5},
       {{"event", "generation"},
        {"number", 3},
        {"world", 3},
        {"spares", 1},
        {"plan", {{"dp", 3}}},
        {"reason", "rank 1 lost"},
        {"cause", "exit"},
        {"start_step", 20},
        {"planned_with_abort", true},
        {"shrunk", true},
        {"recovery_s", 1.5}}},
      {rank_lost{1, 5, 0, 4242, "exit", "exited with 9", 20, 2},
       {{"event", "rank_lost"},
        {"rank", 1},
        {"member", 5},
        {"node", 0},
        {"pid", 4242},
        {"cause", "exit"},
        {"reason", "exited with 9"},
        {"step", 20},
        {"generation", 2}}},
      {stale_message{"step_done", 5, 1, 2},
       {{"event", "stale_message"},
        {"message", "step_done"},
        {"member", 5},
        {"message_generation", 1},
        {"generation", 2}}},
      {checkpoint{30, "/run/ckpt/30", 2, 1000, 24, 0.01, 0.5, 4096, 512, std::nullopt},
       {{"event", "checkpoint"},
        {"step", 30},
        {"path", "/run/ckpt/30"},
        {"generation", 2},
        {"bytes_written", 1000},
        {"bytes_deduplicated", 24},
        {"stall_s", 0.01},
        {"write_s", 0.5},
        {"snapshot_buffer_bytes", 4096},
        {"replicated_bytes", 512}}},
      {checkpoint{31, "/run/ckpt/31", 3, 1, 2, 0.5, 0.25, 3, 4, 20},
       {{"event", "checkpoint"},
        {"step", 31},
        {"path", "/run/ckpt/31"},
        {"generation", 3},
        {"bytes_written", 1},
        {"bytes_deduplicated", 2},
        {"stall_s", 0.5},
        {"write_s", 0.25},
        {"snapshot_buffer_bytes", 3},
        {"replicated_bytes", 4},
        {"replaces", 20}}},
      {checkpoint_failed{40, 2, "disk full"},
       {{"event", "checkpoint_failed"}, {"step", 40}, {"ranks_failed", 2}, {"error", "disk full"}}},
      {checkpoint_failed{41, std::nullopt, "rename failed"},
       {{"event", "checkpoint_failed"}, {"step", 41}, {"error", "rename failed"}}},
      {checkpoint_abandoned{50, 2, 3, 4, "generation 2 ended", 50, "retake"},
       {{"event", "checkpoint_abandoned"},
        {"step", 50},
        {"generation", 2},
        {"ranks_reported", 3},
        {"world", 4},
        {"reason", "generation 2 ended"},
        {"retake_from", 50},
        {"then", "retake"}}},
      {checkpoint_gc_failed{"permission denied"},
       {{"event", "checkpoint_gc_failed"}, {"error", "permission denied"}}},
      {diverged{60, 2, "loss is nan", "rollback", "rollback", 1, 3, 50, {60}},
       {{"event", "diverged"},
        {"step", 60},
        {"generation", 2},
        {"what", "loss is nan"},
        {"policy", "rollback"},
        {"action", "rollback"},
        {"rollbacks", 1},
        {"max_rollbacks", 3},
        {"committed_step", 50},
        {"skipped_steps", {60}}}},
      {validation{70, 1.25, 2},
       {{"event", "validation"}, {"step", 70}, {"val_loss", 1.25}, {"generation", 2}}},
      {job_ended{0, "done", 100, 2},
       {{"event", "job_done"},
        {"exit_code", 0},
        {"message", "done"},
        {"step", 100},
        {"generation", 2}}},
      {job_ended{75, "preempted", 80, 3},
       {{"event", "job_failed"},
        {"exit_code", 75},
        {"message", "preempted"},
        {"step", 80},
        {"generation", 3}}},
      {checkpoint_skipped{80, "overlap"},
       {{"event", "checkpoint_skipped"}, {"step", 80}, {"reason", "overlap"}}},
      {interrupted{81, 2}, {{"event", "interrupted"}, {"step", 81}, {"generation", 2}}},
      {preempted{82, 2, "training"},
       {{"event", "preempted"}, {"step", 82}, {"generation", 2}, {"state", "training"}}},
      {worker_exited{5, 4242, 1, 9},
       {{"event", "worker_exited"}, {"member", 5}, {"pid", 4242}, {"exit_code", 1}, {"signal", 9}}},
      {agent_lost{"connection closed"}, {{"event", "agent_lost"}, {"reason", "connection closed"}}},
      {untyped{{{"event", "fault"}, {"what", "kill"}}}, {{"event", "fault"}, {"what", "kill"}}},
  };
}

TEST(events, every_kind_serialises_to_the_fields_its_readers_expect) {
  for (const auto& g : table()) {
    EXPECT_EQ(to_json(g.event), g.expected) << kind(g.event);
    EXPECT_EQ(to_json(g.event).dump(), g.expected.dump()) << kind(g.event);  // byte for byte
    EXPECT_EQ(kind(g.event), g.expected["event"]);
  }
}

TEST(events, every_kind_reads_back_what_it_wrote) {
  for (const auto& g : table()) {
    json line = g.expected;  // as events.jsonl holds it
    line["ts"] = "2026-01-01T00:00:00.000Z";
    line["unix_ms"] = 1767225600000;
    const job_event back = from_json(line);
    EXPECT_EQ(back.index(), g.event.index()) << kind(g.event);
    if (std::holds_alternative<untyped>(back)) continue;  // keeps "ts" as it came
    EXPECT_EQ(to_json(back), g.expected) << kind(g.event);
  }
}

TEST(events, a_typed_kind_missing_a_field_is_an_error_not_a_zero) {
  json e = {{"event", "step"}, {"step", 7}, {"loss", 2.5}};  // tokens, lr, ... renamed away
  EXPECT_THROW((void)from_json(e), json::exception);
  EXPECT_TRUE(std::holds_alternative<untyped>(from_json({{"event", "new_kind"}, {"x", 1}})));
}

// The metrics, computed from lines as events.jsonl holds them: a field the serialiser renamed
// would make from_json throw here rather than export 0.
TEST(events, metrics_follow_the_lines_of_the_events_file) {
  monitoring::metrics_registry registry;
  job_metrics m(registry);
  for (const auto& g : table()) m.observe(from_json(g.expected));
  EXPECT_EQ(m.steps->value(), 1);
  EXPECT_EQ(m.tokens->value(), 4096);
  EXPECT_EQ(m.loss->value(), 2.5);
  EXPECT_EQ(m.lr->value(), 0.001);
  EXPECT_EQ(m.tokens_per_s->value(), 1000.5);
  EXPECT_EQ(m.compute_s->value(), 0.125);
  EXPECT_EQ(m.comm_s->value(), 0.0625);
  EXPECT_EQ(m.control_s->value(), 0.03125);
  EXPECT_EQ(m.state->value(), 1);
  EXPECT_EQ(m.world->value(), 3);
  EXPECT_EQ(m.generation->value(), 3);
  EXPECT_EQ(m.step->value(), 20);  // the generation's start_step came after the step
  EXPECT_EQ(m.ranks_lost->value(), 1);
  EXPECT_EQ(m.stale->value(), 1);
  EXPECT_EQ(m.checkpoints->value(), 2);
  EXPECT_EQ(m.ckpt_bytes_written->value(), 1001);
  EXPECT_EQ(m.ckpt_bytes_deduplicated->value(), 26);
  EXPECT_EQ(m.ckpt_last_step->value(), 31);
  EXPECT_EQ(m.ckpt_snapshot_bytes->value(), 3);
  EXPECT_EQ(m.ckpt_failures->value(), 2);
  EXPECT_EQ(m.divergences->value(), 1);
  EXPECT_EQ(m.rollbacks->value(), 1);
  EXPECT_EQ(m.val_loss->value(), 1.25);
  const std::string text = registry.render_prometheus();
  EXPECT_NE(text.find("troupe_recoveries_total{cause=\"exit\"} 1"), std::string::npos) << text;
}

}  // namespace
}  // namespace troupe::actors::events
