#pragma once
// Inside a worker process, as a generation forms (rank_generation.cpp): a workload whose
// gradients the runtime reduces (reduction::by_runtime) gets its data-parallel group and a
// bucket reducer here, around its own generation. The workload computes into its buckets and
// announces each one final through step_work::sink; the reducer all-reduces it in place on its
// own thread while compute goes on, and measures the gradient norm on the way. The workload
// itself never sees a communicator (docs/WORKLOAD.md "Gradients").

#include <memory>

#include "runtime/workload/workload.hpp"

namespace troupe::actors {

/// `inner`, as the runtime drives a by_runtime workload: compute() announces buckets to the
/// reducer, reduce() waits for their sum over env.dp, replica_group() is that group, and
/// abort() stops the reduction and the workload. Connects the group (size > 1) now; throws
/// what env.connect throws.
std::unique_ptr<workload_generation> reduced_by_runtime(std::unique_ptr<workload_generation> inner,
                                                        const generation_env& env);

}  // namespace troupe::actors
