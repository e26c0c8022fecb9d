// Reshard on restore, through real engines: a checkpoint written by one layout (each rank
// writing only its share of the boxes it holds, no gather) is read back by another, each rank
// reading only the chunks of its new boxes. The state gathered from the new layout must be
// bit-identical to the state gathered from the old one. Ranks are threads with real gloo
// communicators over a store on a free port.

#include <gtest/gtest.h>

#include <barrier>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include "checkpoint/checkpoint.hpp"
#include "checkpoint/chunk_file.hpp"
#include "runtime/comm/gloo_communicator.hpp"
#include "runtime/comm/store.hpp"
#include "strategies/engine.hpp"
#include "strategies/mesh.hpp"
#include "strategies/state_layout.hpp"
#include "tests/checkpoint/test_support.hpp"
#include "tests/strategies/gather_state.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

train_config tiny_config() {
  train_config cfg;
  cfg.model.n_layer = 2;
  cfg.model.n_head = 4;
  cfg.model.d_model = 32;
  cfg.model.context = 16;
  cfg.batch = 8;
  cfg.micro_batch = 2;
  cfg.steps = 10;
  cfg.optim.warmup_steps = 1;
  return cfg;
}

token_dataset tiny_data() {
  std::vector<uint8_t> bytes(20000);
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<uint8_t>("a stitch in time saves nine "[i % 28] + (i / 89) % 5);
  return token_dataset::from_bytes(std::move(bytes), 0.1);
}

struct layout_case {
  const char* name;
  int dp, tp, pp, zero;
  int ep = 1;       ///< expert-parallel shards (divides dp)
  int experts = 0;  ///< an MoE model when > 0
};

train_config config_for(const layout_case& c) {
  train_config cfg = tiny_config();
  cfg.parallel.tp = c.tp;
  cfg.parallel.pp = c.pp;
  cfg.parallel.zero = c.zero;
  cfg.parallel.ep = c.ep;
  cfg.model.experts = c.experts;
  cfg.world = c.dp * c.tp * c.pp;
  return cfg;
}

strategies::layout shape_of(const layout_case& c) {
  strategies::layout s;
  s.dp = c.dp;
  s.tp = c.tp;
  s.pp = c.pp;
  s.ep = c.ep;
  return s;
}

/// Runs `body(engine, rank)` on every rank of `c`, each in its own thread.
template <class Body>
void on_every_rank(const layout_case& c, uint64_t generation, Body body) {
  const train_config cfg = config_for(c);
  const auto shape = shape_of(c);
  comm::tcp_store_server server;
  std::vector<std::string> errors(static_cast<size_t>(shape.world()));
  std::vector<std::thread> threads;
  // No rank tears its communicators down while a peer may still be finishing its handshake.
  std::barrier done(shape.world());
  for (int r = 0; r < shape.world(); ++r)
    threads.emplace_back([&, r] {
      bool arrived = false;
      try {
        auto store = comm::connect_tcp_store("127.0.0.1", server.port(), 10s);
        auto connect = [&](const comm::comm_identity& id) {
          return comm::make_gloo_communicator(*store, id);
        };
        strategies::training_engine engine(cfg, shape, r, generation, connect);
        body(engine, r);
        arrived = true;
        done.arrive_and_wait();
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      if (!arrived) done.arrive_and_drop();
    });
  for (auto& t : threads) t.join();
  for (size_t r = 0; r < errors.size(); ++r) ASSERT_EQ(errors[r], "") << c.name << " rank " << r;
}

/// Trains `steps` steps under `c` and writes a checkpoint of the result to `run_dir`; returns
/// the state gathered from the ranks.
testing::full_model_state train_and_save(const layout_case& c, const std::string& run_dir,
                                         int steps, ckpt::manifest& committed) {
  const train_config cfg = config_for(c);
  const token_dataset data = tiny_data();
  testing::full_model_state saved;
  std::mutex mu;
  std::vector<ckpt::shard_report> reports(static_cast<size_t>(cfg.world));
  on_every_rank(c, 1, [&](strategies::training_engine& engine, int rank) {
    engine.init(cfg.seed);
    const comm::op_options opts{20s};
    for (int s = 0; s < steps; ++s) {
      engine.compute(data, s);
      engine.reduce(opts);
      engine.apply(s, opts);
    }
    testing::place_rank_state(engine, cfg.model, saved, mu);
    auto state = engine.state();
    const std::vector<std::span<const float>> buffers(state.buffers.begin(), state.buffers.end());
    ckpt::snapshot snap;
    snap.rank = rank;
    snap.world = cfg.world;
    snap.step = steps;
    snap.adam_t = *state.adam_t;
    ckpt::capture(engine.state_map(), buffers, snap);
    // A small chunk size, so pieces span several chunks and reads start mid-chunk.
    reports[static_cast<size_t>(rank)] = ckpt::make_fs_shard_writer(run_dir, 4096)->write(snap);
  });
  ckpt::manifest m;
  m.step = steps;
  m.world = cfg.world;
  m.seed = cfg.seed;
  m.config_json = "{}";
  for (const auto& t : strategies::tensor_table(cfg.model)) {
    m.tensors.push_back({t.name, t.shape, t.offset});
    const auto [rows, cols] = ckpt::as_matrix(t.shape);
    m.global_numel += static_cast<size_t>(rows * cols);
  }
  m.adam_t = reports.front().adam_t;
  m.chunk_floats = 4096 / sizeof(float);
  m.layout = c.name;
  for (const auto& r : reports) m.pieces.insert(m.pieces.end(), r.pieces.begin(), r.pieces.end());
  ckpt::commit_manifest(run_dir, m);
  committed = *ckpt::latest_committed(run_dir);
  return saved;
}

/// Restores the checkpoint under `c` and returns the state gathered from its ranks, with the
/// bytes the ranks read.
testing::full_model_state restore_as(const layout_case& c, const std::string& run_dir,
                                     const ckpt::manifest& m, uint64_t& bytes_read,
                                     int64_t& adam_t) {
  const train_config cfg = config_for(c);
  testing::full_model_state got;
  std::mutex mu;
  bytes_read = 0;
  on_every_rank(c, 2, [&](strategies::training_engine& engine, int) {
    auto state = engine.state();
    const auto stats = ckpt::restore_into(run_dir, m, engine.state_map(), state.buffers);
    *state.adam_t = m.adam_t;
    testing::place_rank_state(engine, cfg.model, got, mu);
    std::lock_guard lock(mu);
    bytes_read += stats.bytes_read;
    adam_t = *state.adam_t;
  });
  return got;
}

const layout_case save_layouts[] = {
    {"dp1", 1, 1, 1, 0}, {"dp2", 2, 1, 1, 0},     {"dp2-zero1", 2, 1, 1, 1},
    {"tp2", 1, 2, 1, 0}, {"dp2xpp2", 2, 1, 2, 0}, {"tp2xpp2-zero1", 1, 2, 2, 1},
};
const layout_case restore_layouts[] = {
    {"dp3", 3, 1, 1, 0}, {"dp4-zero1", 4, 1, 1, 1}, {"tp4", 1, 4, 1, 0},
    {"pp2", 1, 1, 2, 0}, {"dp2xtp2", 2, 2, 1, 0},   {"dp2xpp2-zero1", 2, 1, 2, 1},
};

class ReshardMatrix : public ::testing::TestWithParam<layout_case> {};

TEST_P(ReshardMatrix, EveryOtherLayoutRestoresTheSavedStateBitForBit) {
  set_blas_threads(1);
  const layout_case save = GetParam();
  ckpt::testing::temp_dir dir;
  ckpt::manifest m;
  const testing::full_model_state saved = train_and_save(save, dir.str(), 3, m);
  ASSERT_EQ(m.adam_t, 3);
  for (const layout_case& target : restore_layouts) {
    uint64_t bytes = 0;
    int64_t adam_t = 0;
    const testing::full_model_state got = restore_as(target, dir.str(), m, bytes, adam_t);
    EXPECT_EQ(adam_t, 3) << save.name << " -> " << target.name;
    EXPECT_TRUE(got.params == saved.params) << save.name << " -> " << target.name << ": params";
    EXPECT_TRUE(got.exp_avg == saved.exp_avg) << save.name << " -> " << target.name;
    EXPECT_TRUE(got.exp_avg_sq == saved.exp_avg_sq) << save.name << " -> " << target.name;
    EXPECT_GT(bytes, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReshardMatrix, ::testing::ValuesIn(save_layouts),
                         [](const auto& param_info) {
                           std::string n = param_info.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// An MoE model: experts sharded over ep in one layout are restored whole, or sharded
// differently, in another, bit for bit.
TEST(Reshard, ExpertsMoveBetweenExpertParallelLayouts) {
  set_blas_threads(1);
  ckpt::testing::temp_dir dir;
  ckpt::manifest m;
  const layout_case save{"dp2xep2-moe", 4, 1, 1, 0, 2, 4};
  const testing::full_model_state saved = train_and_save(save, dir.str(), 2, m);
  for (const layout_case& target :
       {layout_case{"dp1-moe", 1, 1, 1, 0, 1, 4}, layout_case{"ep2-moe", 2, 1, 1, 0, 2, 4},
        layout_case{"dp2-moe", 2, 1, 1, 0, 1, 4}}) {
    uint64_t bytes = 0;
    int64_t adam_t = 0;
    const testing::full_model_state got = restore_as(target, dir.str(), m, bytes, adam_t);
    EXPECT_EQ(adam_t, 2) << target.name;
    EXPECT_TRUE(got.params == saved.params) << target.name;
    EXPECT_TRUE(got.exp_avg == saved.exp_avg) << target.name;
    EXPECT_TRUE(got.exp_avg_sq == saved.exp_avg_sq) << target.name;
  }
}

// A rank reads only the chunks that overlap its own boxes. Chunks hold whole rows of a saved
// box, so a column slice (row-parallel weights under tp) still reads every chunk of its
// matrix; a pipeline stage reads about its own half of the layers.
TEST(Reshard, ARankOfAShardedLayoutReadsOnlyTheChunksItNeeds) {
  set_blas_threads(1);
  ckpt::testing::temp_dir dir;
  ckpt::manifest m;
  train_and_save({"dp1", 1, 1, 1, 0}, dir.str(), 1, m);
  uint64_t total = 0;
  for (const auto& p : m.pieces) total += p.where.numel() * sizeof(float);
  for (const layout_case c : {layout_case{"pp2", 1, 1, 2, 0}, layout_case{"tp4", 1, 4, 1, 0}}) {
    std::vector<uint64_t> per_rank(static_cast<size_t>(c.dp * c.tp * c.pp), 0);
    on_every_rank(c, 2, [&](strategies::training_engine& engine, int rank) {
      auto state = engine.state();
      per_rank[static_cast<size_t>(rank)] =
          ckpt::restore_into(dir.str(), m, engine.state_map(), state.buffers).bytes_read;
    });
    uint64_t sum = 0;
    for (uint64_t b : per_rank) {
      EXPECT_GT(b, 0u) << c.name;
      EXPECT_LT(b, total * 8 / 10) << c.name << ": a rank read (nearly) everything";
      sum += b;
    }
    if (c.pp == 2) {
      // Once, plus wte a second time for the last stage's tied copy.
      EXPECT_LT(sum, total * 13 / 10) << "the stages together read about it once";
    }
  }
}

// With --replicate-checkpoints a restore asks a memory source first. It announces the chunks
// ahead, in the order it fetches them, each once; every chunk is read once however many
// row-runs use it (buffers are recycled after a chunk's last use); and a damaged answer from
// memory is caught by its hash and read from the disk instead.
TEST(Reshard, AMemorySourceLearnsEachChunkOnceAheadAndABadAnswerFallsBackToTheDisk) {
  set_blas_threads(1);
  ckpt::testing::temp_dir dir;
  ckpt::manifest m;
  const testing::full_model_state saved = train_and_save({"dp1", 1, 1, 1, 0}, dir.str(), 1, m);
  const layout_case target{"tp2xpp2", 1, 2, 2, 0};
  const train_config cfg = config_for(target);
  testing::full_model_state got;
  std::mutex mu;
  on_every_rank(target, 2, [&](strategies::training_engine& engine, int rank) {
    std::vector<ckpt::chunk_key> announced, fetched;
    std::optional<ckpt::chunk_key> damaged;
    size_t damaged_bytes = 0;
    ckpt::memory_source memory;
    memory.prefetch = [&](std::span<const ckpt::chunk_key> keys) {
      announced.insert(announced.end(), keys.begin(), keys.end());
    };
    memory.fetch = [&](const ckpt::chunk_key& key, std::vector<float>& out) {
      fetched.push_back(key);
      out = ckpt::chunk_file::read_range(dir.str(), key, 1, m.chunk_floats, "test");
      if (!damaged && out.size() > 1) {  // the first chunk answered is damaged on the way
        damaged = key;
        damaged_bytes = out.size() * sizeof(float);
        out[0] += 1.0f;
      }
      return true;
    };
    auto state = engine.state();
    const ckpt::restore_stats stats =
        ckpt::restore_into(dir.str(), m, engine.state_map(), state.buffers, memory);
    *state.adam_t = m.adam_t;
    testing::place_rank_state(engine, cfg.model, got, mu);
    std::lock_guard lock(mu);
    EXPECT_EQ(announced, fetched) << "rank " << rank << ": announced ahead, in fetch order";
    EXPECT_EQ(std::set<ckpt::chunk_key>(fetched.begin(), fetched.end()).size(), fetched.size())
        << "rank " << rank << ": each chunk fetched once";
    EXPECT_EQ(stats.chunks_read, fetched.size()) << "rank " << rank;
    ASSERT_TRUE(damaged);
    EXPECT_EQ(stats.bytes_from_memory + damaged_bytes, stats.bytes_read) << "rank " << rank;
  });
  EXPECT_TRUE(got.params == saved.params);
  EXPECT_TRUE(got.exp_avg == saved.exp_avg);
  EXPECT_TRUE(got.exp_avg_sq == saved.exp_avg_sq);
}

}  // namespace
}  // namespace troupe
