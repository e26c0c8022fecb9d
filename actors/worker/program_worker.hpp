#pragma once
// A C++ program of the user's own as the workers of a troupe job:
//
//   int main() {
//     if (!troupe::started_by_troupe()) return train_alone();  // debugging without a job
//     return troupe::run_as_worker([](const troupe::job_settings& job) {
//       return std::make_unique<my_workload>(job);
//     });
//   }
//
// run as `troupe run --world 4 [job options] -- ./my_program ARGS`. Installed with the workload
// interface (`cmake --install`), linked as troupe::program (find_package(troupe)); the whole
// worker runtime (membership, the step transaction, the data plane, checkpoints, recovery) is
// in that library, in the program's process.

#include "runtime/workload/workload.hpp"

namespace troupe {

/// Whether this process was started as a worker of a troupe job (its agent set
/// TROUPE_COORDINATOR and the rest of its environment).
bool started_by_troupe();

/// Runs this process as that worker until the job ends or lets it go: joins the job, builds the
/// workload with `make` from the job's settings, and lets the runtime drive it. Returns the
/// process's exit code (0: stopped normally; 1: failed, the reason logged on stderr; 3: removed
/// from the job, its agent starts it again). Throws std::invalid_argument when the environment
/// is not a job's (see started_by_troupe()).
int run_as_worker(const workload_factory& make);

}  // namespace troupe
