#include "chaos/faulty_communicator.hpp"

#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace troupe::chaos {

std::optional<fault_plan> parse_fault_plan(const std::string& text) {
  if (text.empty()) return std::nullopt;
  fault_plan plan;
  std::stringstream parts(text);
  std::string part;
  bool first = true;
  while (std::getline(parts, part, ',')) {
    if (first) {
      first = false;
      auto at = part.find('@');
      std::string kind = part.substr(0, at);
      if (kind == "fail")
        plan.kind = comm_fault::fail;
      else if (kind == "delay")
        plan.kind = comm_fault::delay;
      else if (kind == "hang")
        plan.kind = comm_fault::hang;
      else
        throw std::invalid_argument("fault plan '" + text + "': unknown fault '" + kind +
                                    "' (fail, delay, hang)");
      if (at != std::string::npos) {
        try {
          plan.at_call = std::stoull(part.substr(at + 1));
        } catch (const std::exception&) {
          throw std::invalid_argument("fault plan '" + text + "': '" + part +
                                      "' needs a call number after @");
        }
        if (plan.at_call == 0)
          throw std::invalid_argument("fault plan '" + text + "': calls count from 1");
      }
    } else if (part == "every") {
      plan.every = true;
    } else if (part.rfind("delay:", 0) == 0) {
      try {
        plan.delay = std::chrono::milliseconds(std::stoll(part.substr(6)));
      } catch (const std::exception&) {
        throw std::invalid_argument("fault plan '" + text + "': bad delay '" + part +
                                    "' (delay:MS)");
      }
    } else {
      throw std::invalid_argument("fault plan '" + text + "': unknown part '" + part + "'");
    }
  }
  // A delay of nothing would run the job unharmed while the test believes it was slowed.
  if (plan.kind == comm_fault::delay && plan.delay.count() <= 0)
    throw std::invalid_argument(
        "fault plan '" + text +
        "': a delay needs a positive delay:MS, e.g. delay@1,every,delay:250");
  if (plan.kind != comm_fault::delay && plan.delay.count() != 0)
    throw std::invalid_argument("fault plan '" + text + "': delay:MS belongs to a delay fault");
  return plan;
}

faulty_communicator::faulty_communicator(std::unique_ptr<comm::communicator> inner, fault_plan plan)
    : inner_(std::move(inner)), plan_(plan) {}

void faulty_communicator::before_collective(const char* op, const comm::op_options& opts) {
  const uint64_t call = ++calls_;
  const bool hit = plan_.kind != comm_fault::none &&
                   (call == plan_.at_call || (plan_.every && call > plan_.at_call));
  if (!hit) return;
  const auto& id = inner_->identity();
  const std::string where = std::string(op) + " #" + std::to_string(call) + " on group " +
                            id.group + " gen " + std::to_string(id.generation) + " rank " +
                            std::to_string(id.rank);
  switch (plan_.kind) {
    case comm_fault::fail:
      throw comm::comm_error(comm::comm_errc::internal, "injected fault: " + where);
    case comm_fault::delay:
      std::this_thread::sleep_for(plan_.delay);  // the fault is the delay itself
      return;
    case comm_fault::hang: {
      std::unique_lock lock(mutex_);
      if (!wake_.wait_for(lock, opts.timeout, [&] { return aborted_; }))
        throw comm::comm_error(comm::comm_errc::internal, "injected hang timed out: " + where);
      throw comm::comm_error(comm::comm_errc::aborted, "injected hang aborted: " + where);
    }
    case comm_fault::none:
      return;
  }
}

void faulty_communicator::all_reduce(float* data, size_t count, comm::reduce_op op,
                                     const comm::op_options& opts) {
  before_collective("all_reduce", opts);
  inner_->all_reduce(data, count, op, opts);
}

void faulty_communicator::broadcast(void* data, size_t bytes, int root,
                                    const comm::op_options& opts) {
  before_collective("broadcast", opts);
  inner_->broadcast(data, bytes, root, opts);
}

void faulty_communicator::barrier(const comm::op_options& opts) {
  before_collective("barrier", opts);
  inner_->barrier(opts);
}

void faulty_communicator::reduce_scatter(const float* in, float* out, size_t count,
                                         comm::reduce_op op, const comm::op_options& opts) {
  before_collective("reduce_scatter", opts);
  inner_->reduce_scatter(in, out, count, op, opts);
}

void faulty_communicator::all_gather(const void* in, void* out, size_t bytes,
                                     const comm::op_options& opts) {
  before_collective("all_gather", opts);
  inner_->all_gather(in, out, bytes, opts);
}

void faulty_communicator::all_to_all(const void* in, void* out, size_t bytes_per_rank,
                                     const comm::op_options& opts) {
  before_collective("all_to_all", opts);
  inner_->all_to_all(in, out, bytes_per_rank, opts);
}

void faulty_communicator::all_to_allv(const void* in, const std::vector<size_t>& send_bytes,
                                      void* out, const std::vector<size_t>& recv_bytes,
                                      const comm::op_options& opts) {
  before_collective("all_to_allv", opts);
  inner_->all_to_allv(in, send_bytes, out, recv_bytes, opts);
}

void faulty_communicator::all_reduce_tree(const comm::tree_sum_parts& parts, size_t begin,
                                          size_t end, float* out, const comm::op_options& opts) {
  before_collective("all_reduce_tree", opts);
  inner_->all_reduce_tree(parts, begin, end, out, opts);
}

void faulty_communicator::reduce_scatter_tree(const comm::tree_sum_parts& parts,
                                              std::span<const comm::extent> owned, float* out,
                                              const comm::op_options& opts) {
  before_collective("reduce_scatter_tree", opts);
  inner_->reduce_scatter_tree(parts, owned, out, opts);
}

void faulty_communicator::send(const void* data, size_t bytes, int peer, uint32_t tag,
                               const comm::op_options& opts) {
  before_collective("send", opts);
  inner_->send(data, bytes, peer, tag, opts);
}

void faulty_communicator::recv(void* data, size_t bytes, int peer, uint32_t tag,
                               const comm::op_options& opts) {
  before_collective("recv", opts);
  inner_->recv(data, bytes, peer, tag, opts);
}

void faulty_communicator::send_recv(const void* send_data, size_t send_bytes, int send_peer,
                                    void* recv_data, size_t recv_bytes, int recv_peer, uint32_t tag,
                                    const comm::op_options& opts) {
  before_collective("send_recv", opts);
  inner_->send_recv(send_data, send_bytes, send_peer, recv_data, recv_bytes, recv_peer, tag, opts);
}

void faulty_communicator::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  wake_.notify_all();
  inner_->abort();
}

std::unique_ptr<comm::communicator> inject_from_environment(
    std::unique_ptr<comm::communicator> inner, int rank) {
  const char* text = std::getenv(("TROUPE_CHAOS_RANK" + std::to_string(rank)).c_str());
  if (!text || !*text) return inner;
  auto plan = parse_fault_plan(text);
  if (!plan) return inner;
  return std::make_unique<faulty_communicator>(std::move(inner), *plan);
}

}  // namespace troupe::chaos
