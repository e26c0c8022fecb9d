#pragma once
// Data parallelism's synchronisation: sums every rank's gradients over the data-parallel
// group, bucket by bucket, so each rank ends the step with the gradient of the global batch.

#include <cstddef>

#include "runtime/comm/communicator.hpp"

namespace troupe::strategies {

/// Splits a flat gradient buffer into buckets of at most `bucket_bytes` and all-reduces
/// each (sum). Buckets bound the size of one collective, so a later version can start a
/// bucket's reduction while backward is still producing the rest.
class gradient_allreducer {
 public:
  explicit gradient_allreducer(size_t bucket_bytes);
  /// Sums `grads` (n floats) over `comm`. Throws comm::comm_error on failure; the deadline
  /// in `opts` is for the whole reduction, not per bucket.
  void all_reduce(comm::communicator& comm, float* grads, size_t n,
                  const comm::op_options& opts) const;

 private:
  size_t bucket_floats_;
};

}  // namespace troupe::strategies
