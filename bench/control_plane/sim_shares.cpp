#include "bench/control_plane/sim_shares.hpp"

#include <caf/send.hpp>
#include <chrono>
#include <stdexcept>

#include "checkpoint/checkpoint.hpp"
#include "runtime/config.hpp"
#include "runtime/model/gpt.hpp"
#include "strategies/state_layout.hpp"

namespace troupe::bench::control_plane {

share_writer::share_writer(const std::string& config_json, sim_ledger& ledger) : ledger_(ledger) {
  const train_config cfg = config_from_json(config_json);
  if (cfg.external_workload())
    throw std::runtime_error("simulated ranks write the built-in GPT's shares, not a program's");
  if (cfg.parallel.tp != 1 || cfg.parallel.pp != 1 || cfg.parallel.ep != 1 ||
      cfg.parallel.zero != 0 || cfg.model.experts != 0)
    throw std::runtime_error(
        "simulated ranks write the shares of plain data parallelism only (tp, pp, ep 1, no "
        "ZeRO, no experts)");
  const gpt model(cfg.model);
  pieces_ = strategies::pieces_of(model, 1, 0);
  // Values that differ from float to float, so that every rank's share is its own chunk (as
  // trained parameters are): the coordinator checks as many chunk files as a real job names.
  params_.resize(model.num_params());
  for (size_t i = 0; i < params_.size(); ++i) params_[i] = static_cast<float>(i) * 1e-3f;
  moments_.assign(model.num_params(), 0.0f);
  writer_ =
      ckpt::make_fs_shard_writer(cfg.run_dir, static_cast<size_t>(cfg.checkpoint_chunk_kib) * 1024);
  thread_ = std::thread([this] { run(); });
}

share_writer::~share_writer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void share_writer::enqueue(share_request r) {
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(r));
  }
  wake_.notify_one();
}

void share_writer::run() {
  for (;;) {
    std::unique_lock lock(mutex_);
    wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    share_request r = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    actors::shard_written report = write(r);
    if (auto* step = ledger_.step(r.step)) store_max(step->last_share_ns, now_ns());
    ledger_.shares_written.fetch_add(report.ok ? 1 : 0, std::memory_order_relaxed);
    caf::anon_send(r.coordinator, std::move(report));
  }
}

actors::shard_written share_writer::write(const share_request& r) {
  actors::shard_written out;
  out.generation = r.generation;
  out.step = r.step;
  out.rank = r.rank;
  out.adam_t = r.step;  // one optimizer step per committed step, as a fresh job's ranks
  try {
    std::vector<ckpt::placed_piece> mine = pieces_;
    for (ckpt::placed_piece& p : mine) {
      p.replicas = r.world;
      p.replica_index = r.rank;
    }
    const ckpt::state_map map = strategies::replicated_state_map(std::move(mine));
    // The step in the values too: each checkpoint's chunks are new, as training makes them.
    params_[0] = static_cast<float>(r.step);
    const std::span<const float> buffers[] = {params_, moments_, moments_};
    const auto t0 = std::chrono::steady_clock::now();
    ckpt::capture(map, buffers, snapshot_);
    snapshot_.rank = r.rank;
    snapshot_.world = r.world;
    snapshot_.generation = r.generation;
    snapshot_.step = r.step;
    snapshot_.adam_t = r.step;
    const ckpt::shard_report written = writer_->write(snapshot_);
    out.pieces_json = ckpt::encode_pieces(written.pieces);
    out.bytes_written = written.bytes_written;
    out.bytes_deduplicated = written.bytes_deduplicated;
    out.write_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } catch (const std::exception& e) {
    out.ok = false;
    out.error = std::string("a simulated rank's share could not be written: ") + e.what();
  }
  return out;
}

share_writer* process_share_writer(const std::string& config_json, sim_ledger& ledger,
                                   std::string& error) {
  static std::mutex made;
  static std::unique_ptr<share_writer> writer;
  static std::string why;
  static bool tried = false;
  std::lock_guard lock(made);
  if (!tried) {
    tried = true;
    try {
      writer = std::make_unique<share_writer>(config_json, ledger);
    } catch (const std::exception& e) {
      why = e.what();
    }
  }
  error = why;
  return writer.get();
}

}  // namespace troupe::bench::control_plane
