#include "strategies/data_parallel.hpp"

#include <algorithm>
#include <chrono>

namespace troupe::strategies {

gradient_allreducer::gradient_allreducer(size_t bucket_bytes)
    : bucket_floats_(std::max<size_t>(1, bucket_bytes / sizeof(float))) {}

void gradient_allreducer::all_reduce(comm::communicator& comm, float* grads, size_t n,
                                     const comm::op_options& opts) const {
  if (comm.size() == 1) return;
  using clock = std::chrono::steady_clock;
  const auto deadline = clock::now() + opts.timeout;
  for (size_t first = 0; first < n; first += bucket_floats_) {
    size_t count = std::min(bucket_floats_, n - first);
    comm::op_options bucket_opts = opts;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now());
    bucket_opts.timeout = std::max(left, std::chrono::milliseconds(1));
    comm.all_reduce(grads + first, count, comm::reduce_op::sum, bucket_opts);
  }
}

}  // namespace troupe::strategies
