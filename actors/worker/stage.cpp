#include "actors/worker/stage.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <stdexcept>
#include <thread>

#include "actors/wire/connect.hpp"
#include "runtime/comm/communicator.hpp"

namespace troupe::actors {
namespace {

using clock_type = std::chrono::steady_clock;

/// The stage actor: forwards the rank's notices to a neighbour and posts the neighbours'
/// notices on the board. Event-based; it owns no state the rank does not share.
/// Neighbours it watches: a neighbour's process that dies closes the board, so a rank waiting
/// for its notice fails at once instead of at the deadline.
caf::behavior stage_actor(caf::event_based_actor* self, std::shared_ptr<notice_board> board,
                          uint64_t generation) {
  self->set_down_handler([=](caf::down_msg& dm) {
    board->close("a neighbouring stage's actor is gone (" + self->system().render(dm.reason) + ")");
  });
  return {
      [=](const pipe_notice& n) {
        if (n.generation == generation) board->post(n);  // a stale generation's notice is dropped
      },
      [=](watch_atom, const caf::actor& neighbour) { self->monitor(neighbour); },
      [=](introduce_atom, const caf::actor& prev) {
        self->monitor(prev);
        board->introduce(prev);
      },
  };
}

std::string key_of(uint64_t generation, const std::string& group, int stage) {
  return "g" + std::to_string(generation) + "/stage/" + group + "/" + std::to_string(stage);
}

}  // namespace

void notice_board::post(const pipe_notice& n) {
  {
    std::lock_guard lock(m_);
    posted_.insert({n.step, n.micro_batch, n.backward});
  }
  cv_.notify_all();
}

bool notice_board::take(int64_t step, int micro_batch, bool backward,
                        clock_type::time_point deadline) {
  const key k{step, micro_batch, backward};
  const auto spin_until = clock_type::now() + std::chrono::microseconds(300);
  std::unique_lock lock(m_);
  while (true) {
    if (auto it = posted_.find(k); it != posted_.end()) {
      posted_.erase(it);
      return true;
    }
    if (closed_) return false;
    const auto now = clock_type::now();
    if (now >= deadline) return false;
    if (now < spin_until) {
      // A sleeping thread may lose a whole scheduler tick when it is woken; spin first.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      cv_.wait_until(lock, deadline);
    }
  }
}

void notice_board::close(const std::string& why) {
  {
    std::lock_guard lock(m_);
    if (!closed_) why_ = why;
    closed_ = true;
  }
  cv_.notify_all();
}

void notice_board::introduce(const caf::actor& prev) {
  {
    std::lock_guard lock(m_);
    prev_ = prev;
  }
  cv_.notify_all();
}

caf::actor notice_board::await_prev(clock_type::time_point deadline) {
  std::unique_lock lock(m_);
  cv_.wait_until(lock, deadline, [&] { return prev_ != nullptr || closed_; });
  return prev_;
}

std::string notice_board::why_closed() {
  std::lock_guard lock(m_);
  return why_;
}

stage_link::stage_link(caf::actor_system& sys, comm::kv_store& store, uint64_t generation,
                       const std::string& group, int stage, int stages, int next_slots,
                       std::chrono::milliseconds timeout, const std::string& advertise)
    : sys_(sys),
      generation_(generation),
      stage_(stage),
      stages_(stages),
      timeout_(timeout),
      board_(std::make_shared<notice_board>()),
      credits_(next_slots) {
  self_ = sys.spawn(stage_actor, board_, generation);
  auto fail = [&](const std::string& why) {
    caf::anon_send_exit(self_, caf::exit_reason::user_shutdown);
    throw std::runtime_error("stage " + std::to_string(stage) + ": " + why);
  };
  if (stage > 0) {
    // On the node's own address (loopback when the job is), never on every interface.
    auto port = publish_for_job(sys, self_, 0, advertise, false, "stage");
    if (!port) fail("cannot publish the stage actor: " + sys.render(port.error()));
    port_ = *port;
    store.set_string(key_of(generation, group, stage), advertise + ":" + std::to_string(port_));
  }
  if (stage + 1 < stages) {
    const std::string where = store.get_string(key_of(generation, group, stage + 1), timeout);
    const auto colon = where.rfind(':');
    auto peer = remote_job_actor_until(sys, where.substr(0, colon),
                                       static_cast<uint16_t>(std::stoi(where.substr(colon + 1))),
                                       clock_type::now() + timeout);
    if (!peer || !*peer)
      fail("cannot reach stage " + std::to_string(stage + 1) + "'s actor at " + where + " within " +
           std::to_string(timeout.count() / 1000) +
           " s: " + (peer ? std::string("nothing is published there") : sys.render(peer.error())));
    next_ = *peer;
    caf::anon_send(next_, introduce_atom::value, self_);
    caf::anon_send(self_, watch_atom::value, next_);
  }
  if (stage > 0) {
    prev_ = board_->await_prev(clock_type::now() + timeout);
    if (!prev_)
      fail("stage " + std::to_string(stage - 1) + " did not introduce its actor within " +
           std::to_string(timeout.count() / 1000) + " s");
  }
}

stage_link::~stage_link() {
  board_->close("the stage is shutting down");
  if (port_ != 0) unpublish_for_job(sys_, self_, port_);
  caf::anon_send_exit(self_, caf::exit_reason::user_shutdown);
}

void stage_link::begin_step(int64_t step) { step_ = step; }

void stage_link::waiting(const strategies::pipe_op& op) {
  const bool backward = op.pass == strategies::pipe_pass::backward;
  if (board_->take(step_, op.micro_batch, backward, clock_type::now() + timeout_)) {
    if (backward) ++credits_;  // the next stage freed that micro-batch's slot
    return;
  }
  const int from = backward ? stage_ + 1 : stage_ - 1;
  if (const std::string why = board_->why_closed(); !why.empty())
    throw comm::comm_error(comm::comm_errc::peer_lost,
                           "pipeline stage " + std::to_string(stage_) + " waiting for " +
                               (backward ? "B" : "F") + std::to_string(op.micro_batch) +
                               " from stage " + std::to_string(from) + ": " + why);
  throw comm::comm_error(comm::comm_errc::timeout,
                         "pipeline stage " + std::to_string(stage_) + " waited " +
                             std::to_string(timeout_.count() / 1000) + " s for stage " +
                             std::to_string(from) + "'s notice of " + (backward ? "B" : "F") +
                             std::to_string(op.micro_batch) + " (step " + std::to_string(step_) +
                             ", generation " + std::to_string(generation_) + ")");
}

void stage_link::done(const strategies::timed_op& op) {
  pipe_notice n;
  n.generation = generation_;
  n.step = step_;
  n.micro_batch = op.op.micro_batch;
  n.from_stage = stage_;
  if (op.op.pass == strategies::pipe_pass::forward) {
    if (!next_) return;  // the last stage's forward feeds its own backward
    if (credits_ <= 0)
      throw std::logic_error("pipeline stage " + std::to_string(stage_) + " would send F" +
                             std::to_string(op.op.micro_batch) + " to stage " +
                             std::to_string(stage_ + 1) +
                             ", which has no free activation slot: the schedule overruns it");
    --credits_;
    n.backward = false;
    caf::anon_send(next_, n);
  } else {
    if (!prev_) return;
    n.backward = true;
    caf::anon_send(prev_, n);
  }
}

}  // namespace troupe::actors
