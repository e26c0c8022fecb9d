// The typed events: every kind serialises to exactly the fields events.jsonl's readers expect
// (tests/integration/*.py, bench/troupe_events.py), reads back to itself, and moves the
// metrics it should when read from a line as the file holds it.
#include "monitoring/events/events.hpp"

#include <gtest/gtest.h>

#include "actors/coordinator/job_metrics.hpp"
#include "chaos/fault_spec.hpp"
#include "monitoring/metrics.hpp"

namespace troupe::events {
namespace {

using actors::job_metrics;

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
      // goodput and mfu so far since issue 35; phases left out (a log from before them).
      {step{7,
            2.5,
            0.001,
            4096,
            1000.5,
            4,
            2,
            0.25,
            0.125,
            0.0625,
            0.03125,
            0.5,
            100,
            {},
            0.375,
            0.0625},
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
        {"total_steps", 100},
        {"goodput", 0.375},
        {"mfu", 0.0625}}},
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
      {transport{2, "shm", 3, 1, 3, true},
       {{"event", "transport"},
        {"generation", 2},
        {"backend", "shm"},
        {"world", 3},
        {"nodes", 1},
        {"ranks_per_node", 3},
        {"shrunk", true}}},
      {agent_joined{"node-a", 77, 1, {2, 3}},
       {{"event", "agent_joined"},
        {"host", "node-a"},
        {"pid", 77},
        {"node", 1},
        {"members", {2, 3}}}},
      {leader{7, "host-a:41", "10.0.0.1:5000"},
       {{"event", "leader"}, {"epoch", 7}, {"id", "host-a:41"}, {"address", "10.0.0.1:5000"}}},
      {etcd_state_lost{"etcd holds no state of this run", 10, 9},
       {{"event", "etcd_state_lost"},
        {"reason", "etcd holds no state of this run"},
        {"checkpoint_step", 10},
        {"epoch", 9}}},
      {goodput{12, 3, 6.5, 2, 13.0, nlohmann::json{{"compute", 9.0}, {"forming", 4.0}}, 0.69, 0.12,
               9.5e10, 4096},
       {{"event", "goodput"},
        {"step", 12},
        {"generation", 3},
        {"wall_s", 6.5},
        {"slots", 2},
        {"rank_seconds", 13.0},
        {"phases", {{"compute", 9.0}, {"forming", 4.0}}},
        {"goodput", 0.69},
        {"mfu", 0.12},
        {"peak_flops", 9.5e10},
        {"tokens", 4096}}},
      {rank_joined{4, 4, 88, "node-b", 1, 2},
       {{"event", "rank_joined"},
        {"member", 4},
        {"rank", 4},
        {"pid", 88},
        {"host", "node-b"},
        {"node", 1},
        {"generation", 2}}},
      {connect_failed{3, 5, 1, "unreachable", "10.1.2.3:4000", "no route"},
       {{"event", "connect_failed"},
        {"generation", 3},
        {"member", 5},
        {"rank", 1},
        {"cause", "unreachable"},
        {"address", "10.1.2.3:4000"},
        {"error", "no route"}}},
      {restored{1, 5, 3, "peer", 4096, 0.25, 20, 1024, 0, std::nullopt},
       {{"event", "restored"},
        {"rank", 1},
        {"member", 5},
        {"generation", 3},
        {"from", "peer"},
        {"bytes", 4096},
        {"seconds", 0.25},
        {"step", 20},
        {"from_memory_bytes", 1024},
        {"peer_rank", 0}}},
      {restored{2, 6, 3, "checkpoint", 8192, 0.5, 20, std::nullopt, std::nullopt, 20},
       {{"event", "restored"},
        {"rank", 2},
        {"member", 6},
        {"generation", 3},
        {"from", "checkpoint"},
        {"bytes", 8192},
        {"seconds", 0.5},
        {"step", 20},
        {"checkpoint_step", 20}}},
      // ... and for where its ranks' state came from.
      {restored_summary{3,
                        20,
                        100,
                        {{"checkpoint", 10}, {"peer", 90}},
                        409600,
                        1024,
                        {2048, 4096, 8192},
                        {0.25, 0.5, 1.0},
                        20},
       {{"event", "restored_summary"},
        {"generation", 3},
        {"step", 20},
        {"ranks", 100},
        {"from", {{"checkpoint", 10}, {"peer", 90}}},
        {"bytes", 409600},
        {"from_memory_bytes", 1024},
        {"rank_bytes", {{"min", 2048}, {"median", 4096}, {"max", 8192}}},
        {"rank_seconds", {{"min", 0.25}, {"median", 0.5}, {"max", 1.0}}},
        {"checkpoint_step", 20}}},
      {training_started{4, 1, 0, json{{"dp", 4}}},
       {{"event", "training_started"},
        {"world", 4},
        {"generation", 1},
        {"start_step", 0},
        {"layout", {{"dp", 4}}}}},
      {straggler{2, 6, 2.5, 1, 30, "evict"},
       {{"event", "straggler"},
        {"rank", 2},
        {"member", 6},
        {"factor", 2.5},
        {"generation", 1},
        {"step", 30},
        {"policy", "evict"}}},
      {memory{0, 5, 3, 1024, 1 << 20, 1},
       {{"event", "memory"},
        {"rank", 0},
        {"step", 5},
        {"generation", 3},
        {"optimizer_state_bytes", 1024},
        {"peak_rss_bytes", 1 << 20},
        {"zero", 1}}},
      // A job of more ranks than --metrics-rank-labels: one line for a generation's memory.
      {memory_summary{5, 3, 100, {1024, 2048, 4096}, {1 << 20, 1 << 21, 1 << 22}, 1},
       {{"event", "memory_summary"},
        {"step", 5},
        {"generation", 3},
        {"ranks", 100},
        {"optimizer_state_bytes", {{"min", 1024}, {"median", 2048}, {"max", 4096}}},
        {"peak_rss_bytes", {{"min", 1 << 20}, {"median", 1 << 21}, {"max", 1 << 22}}},
        {"zero", 1}}},
      {replacement_wait{2, 1, 2000},
       {{"event", "replacement_wait"}, {"generation", 2}, {"workers", 1}, {"wait_ms", 2000}}},
      {fault{"stop",
             "rank",
             1,
             8,
             500,
             std::nullopt,
             std::nullopt,
             "stop:rank=1:step=8:for=500ms",
             {4242}},
       {{"event", "fault"},
        {"what", "stop"},
        {"target", "rank"},
        {"id", 1},
        {"step", 8},
        {"for_ms", 500},
        {"spec", "stop:rank=1:step=8:for=500ms"},
        {"pids", {4242}}}},
      {fault{"continue",
             std::nullopt,
             std::nullopt,
             std::nullopt,
             std::nullopt,
             std::nullopt,
             std::nullopt,
             std::nullopt,
             {4242}},
       {{"event", "fault"}, {"what", "continue"}, {"pids", {4242}}}},
      {expert_load{9, 2, 4, 2, {{1, 2, 3, 4}, {5, 6, 7, 8}}, {0, 1}},
       {{"event", "expert_load"},
        {"step", 9},
        {"generation", 2},
        {"experts", 4},
        {"top_k", 2},
        {"tokens", {{1, 2, 3, 4}, {5, 6, 7, 8}}},
        {"dropped", {0, 1}}}},
      {expert_load_rejected{3, "8 blocks, expected 4"},
       {{"event", "expert_load_rejected"}, {"rank", 3}, {"error", "8 blocks, expected 4"}}},
      {checkpoint_gc{{"chunks/odd"}, {10, 20}, 5, 2, 40, 3000, 0.125},
       {{"event", "checkpoint_gc"},
        {"foreign", {"chunks/odd"}},
        {"removed_steps", {10, 20}},
        {"chunks_removed", 5},
        {"chunks_recycled", 2},
        {"chunks_kept", 40},
        {"bytes_freed", 3000},
        {"seconds", 0.125}}},
      {job_start{4, 100, true, 30, json{{"lr", 0.001}}, 999, json{{"dp", 4}}},
       {{"event", "job_start"},
        {"world", 4},
        {"steps", 100},
        {"resume", true},
        {"start_step", 30},
        {"config", {{"lr", 0.001}}},
        {"pid", 999},
        {"layout", {{"dp", 4}}}}},
      {checkpoint_fallback{40, "/run/ckpt/40", "bad crc", "/run/quarantine/40", 30},
       {{"event", "checkpoint_fallback"},
        {"step", 40},
        {"path", "/run/ckpt/40"},
        {"error", "bad crc"},
        {"quarantined", "/run/quarantine/40"},
        {"resumed_step", 30}}},
      {resume{30, "dp=4", 3, true, {40}},
       {{"event", "resume"},
        {"step", 30},
        {"written_by", "dp=4"},
        {"format_version", 3},
        {"latest_repaired", true},
        {"latest_was", 40}}},
      {resume{30, "dp=4", 3, false, {}},
       {{"event", "resume"},
        {"step", 30},
        {"written_by", "dp=4"},
        {"format_version", 3},
        {"latest_repaired", false},
        {"latest_was", nullptr}}},
  };
}

TEST(events, every_kind_has_a_golden_object) {
  std::vector<bool> seen(std::variant_size_v<job_event>, false);
  for (const auto& g : table()) seen[g.event.index()] = true;
  for (size_t i = 0; i < seen.size(); ++i) {
    if (i == job_event(untyped{}).index()) continue;  // read back only, never emitted
    EXPECT_TRUE(seen[i]) << "the kind at index " << i << " of job_event has no golden object";
  }
}

TEST(events, every_kind_serialises_to_the_fields_its_readers_expect) {
  for (const auto& g : table()) {
    EXPECT_EQ(to_json(g.event), g.expected) << kind(g.event);
    EXPECT_EQ(to_json(g.event).dump(), g.expected.dump()) << kind(g.event);  // byte for byte
    EXPECT_EQ(kind(g.event), g.expected["event"]);
  }
}

TEST(events, every_kind_round_trips_to_the_same_struct) {
  for (const auto& g : table()) {
    const job_event back = from_json(to_json(g.event));
    EXPECT_EQ(back.index(), g.event.index()) << kind(g.event);
    EXPECT_TRUE(back == g.event) << kind(g.event) << ": " << to_json(back).dump();
  }
}

TEST(events, every_kind_reads_back_from_a_line_of_the_file) {
  for (const auto& g : table()) {
    json line = g.expected;  // as events.jsonl holds it
    line["ts"] = "2026-01-01T00:00:00.000Z";
    line["unix_ms"] = 1767225600000;
    const job_event back = from_json(line);
    EXPECT_TRUE(back == g.event) << kind(g.event) << ": " << to_json(back).dump();
  }
}

// A field the writer renamed (or a reader's name that drifted) must not read back as the same
// event: a required field throws, an optional one goes missing.
TEST(events, a_renamed_field_never_reads_back_as_the_same_event) {
  for (const auto& g : table()) {
    for (const auto& [key, value] : g.expected.items()) {
      if (key == "event") continue;
      json renamed = g.expected;
      renamed.erase(key);
      renamed[key + "_renamed"] = value;
      bool same = false;
      try {
        same = from_json(renamed) == g.event;
      } catch (const json::exception&) {
      }
      EXPECT_FALSE(same) << kind(g.event) << ": field " << key;
    }
  }
}

TEST(events, a_typed_kind_missing_a_field_is_an_error_not_a_zero) {
  json e = {{"event", "step"}, {"step", 7}, {"loss", 2.5}};  // tokens, lr, ... renamed away
  EXPECT_THROW((void)from_json(e), json::exception);
}

// A kind this build does not know (a newer troupe's log) is kept as it came, not dropped.
TEST(events, an_unknown_kind_reads_back_as_its_object) {
  const json line = {{"event", "new_kind"}, {"x", 1}, {"ts", "2026-01-01T00:00:00.000Z"}};
  const job_event back = from_json(line);
  ASSERT_TRUE(std::holds_alternative<untyped>(back));
  EXPECT_EQ(kind(back), "new_kind");
  EXPECT_EQ(to_json(back), line);
}

// chaos spells a fault's fields (chaos::to_json); the supervisor reads them into the typed
// event, which must take every field chaos writes, for every kind of fault, and write back
// exactly what chaos wrote.
TEST(events, a_fault_reads_every_field_chaos_writes) {
  const chaos::fault_bounds bounds{4, 2, 100};
  for (const char* spec :
       {"kill:rank=1:step=8", "kill:node=1:step=9", "kill:coordinator:step=10",
        "kill:coordinator:step=10:commits=1", "stop:rank=2:step=5:for=500ms", "stop:rank=2:step=6",
        "slow:rank=3:factor=2.5:from=7", "diverge:step=11:rank=1"}) {
    for (const chaos::fault& f : chaos::parse_fault(spec, bounds)) {
      json written = chaos::to_json(f);
      written["pids"] = {4242};
      const fault e = read_fields<fault>(written);
      EXPECT_EQ(e.spec, f.spec) << spec;
      json expected = written;
      expected["event"] = "fault";
      EXPECT_EQ(to_json(e), expected) << spec;
    }
  }
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
}  // namespace troupe::events
