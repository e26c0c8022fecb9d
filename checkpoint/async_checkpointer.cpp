// The background writer of asynchronous checkpoints.

#include "checkpoint/async_checkpointer.hpp"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>

namespace troupe::ckpt {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

std::optional<overlap_policy> parse_overlap_policy(std::string_view text) {
  if (text == "wait") return overlap_policy::wait;
  if (text == "skip") return overlap_policy::skip;
  return std::nullopt;
}

async_checkpointer::async_checkpointer(std::unique_ptr<shard_writer> writer, overlap_policy policy,
                                       std::function<void(write_outcome)> done)
    : writer_(std::move(writer)), policy_(policy), done_(std::move(done)) {
  thread_ = std::thread([this] { run(); });
}

async_checkpointer::~async_checkpointer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (pending_) lane_.lift();
  }
  changed_.notify_all();
  thread_.join();
}

snapshot_outcome async_checkpointer::take(const state_map& map,
                                          std::span<const std::span<const float>> buffers,
                                          const snapshot_meta& meta) {
  const auto started = std::chrono::steady_clock::now();
  snapshot_outcome out;
  std::unique_lock lock(mutex_);
  if (pending_) {
    if (policy_ == overlap_policy::skip) return out;
    lane_.lift();
    changed_.wait(lock, [&] { return !pending_; });
    out.waited_s = seconds_since(started);
  }
  // The writer thread only reads buffer_ while pending_ is set, so it is ours to fill.
  lock.unlock();
  buffer_.rank = meta.rank;
  buffer_.world = meta.world;
  buffer_.generation = meta.generation;
  buffer_.step = meta.step;
  buffer_.adam_t = meta.adam_t;
  capture(map, buffers, buffer_);
  out.taken = true;
  out.stall_s = seconds_since(started);
  lock.lock();
  queued_meta_ = meta;
  queued_stall_s_ = out.stall_s;
  pending_ = true;
  lock.unlock();
  changed_.notify_all();
  return out;
}

void async_checkpointer::prepare(const state_map& map,
                                 std::span<const std::span<const float>> buffers) {
  std::lock_guard lock(mutex_);
  if (pending_) return;  // the writer reads buffer_; the next snapshot sizes it anyway
  lay_out(map, buffers, buffer_);
  writer_->prepare(buffer_);
}

void async_checkpointer::wait_idle() {
  std::unique_lock lock(mutex_);
  if (pending_) lane_.lift();
  changed_.wait(lock, [&] { return !pending_; });
}

bool async_checkpointer::busy() const {
  std::lock_guard lock(mutex_);
  return pending_;
}

size_t async_checkpointer::buffer_bytes() const {
  std::lock_guard lock(mutex_);
  return buffer_.data.capacity() * sizeof(float);
}

void async_checkpointer::run() {
  pthread_setname_np(pthread_self(), "troupe-ckpt-w");  // names it in top -H and perf
  // The write yields to training: it runs on cores the ranks leave idle (see
  // runtime/sys/idle_priority.hpp), and at nice 10 while a waiter has lifted it.
  (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  lane_.join();
  for (;;) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return pending_ || stopping_; });
    if (!pending_) return;  // stopping with nothing left to write
    write_outcome outcome;
    outcome.meta = queued_meta_;
    outcome.stall_s = queued_stall_s_;
    outcome.buffer_bytes = buffer_.data.capacity() * sizeof(float);
    lock.unlock();
    lane_.job_started();
    try {
      outcome.report = writer_->write(buffer_);
    } catch (const std::exception& e) {
      outcome.error = e.what();
    }
    // Tell the owner before releasing the buffer, so reports arrive in snapshot order.
    if (done_) done_(std::move(outcome));
    lane_.job_finished();
    lock.lock();
    pending_ = false;
    lock.unlock();
    changed_.notify_all();
  }
}

}  // namespace troupe::ckpt
